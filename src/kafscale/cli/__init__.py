"""The `kafscale` command line: `main.py` (the `broker` command and the parser), one module
per admin command family talking to a running cluster over the Kafka protocol (`topics.py`,
`groups.py`, `records.py` for offsets/produce/consume, `cluster.py`, `security.py` for certs
and users) over `common.py` (connecting, errors and exit codes, output, common options). Sits
above every other package; nothing in kafscale imports it."""
