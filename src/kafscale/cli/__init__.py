"""The `kafscale` command line: `main.py` (the `broker` command and the parser), `admin.py`
(topics, groups, configs, produce/consume against a running cluster). Sits above every
other package; nothing in kafscale imports it."""
