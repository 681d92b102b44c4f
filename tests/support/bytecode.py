"""One bytecode cache for the Python processes the tests start (brokers, CLI runs, apps).

With PYTHONDONTWRITEBYTECODE set (some sandboxes and CI images set it), every
`python -m kafscale` a test starts compiled all of kafscale's modules again, about a
third of a broker's CPU time to listening, hundreds of times per run. Those processes
share a cache instead (PYTHONPYCACHEPREFIX) in pytest's cache dir, kept from run to run
(`--cache-clear` empties it): the first process to import a module writes it there, the
source tree and the venvs stay untouched. Nothing changes when bytecode may be written
anyway, or a cache prefix is already chosen.
Registered for pytest through `pytest_plugins` in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_temp_dir: str | None = None


def pytest_configure(config) -> None:
    global _temp_dir
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = getattr(config, "cache", None)  # None with -p no:cacheprovider
    try:
        path = str(cache.mkdir("pycache")) if cache is not None else None
    except OSError:  # a read-only checkout
        path = None
    if path is None:
        path = _temp_dir = tempfile.mkdtemp(prefix="kafscale-pycache-")
    os.environ["PYTHONPYCACHEPREFIX"] = path
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_unconfigure(config) -> None:
    global _temp_dir
    if _temp_dir is not None:
        shutil.rmtree(_temp_dir, ignore_errors=True)
        _temp_dir = None
