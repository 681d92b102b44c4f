"""One bytecode cache for the Python processes the tests start (brokers, CLI runs, apps).

With PYTHONDONTWRITEBYTECODE set (some sandboxes and CI images set it), every
`python -m kafscale` a test starts compiled all of kafscale's modules again, about a
third of a broker's CPU time to listening, hundreds of times per run. For the session
those processes share a cache in a temp dir instead (PYTHONPYCACHEPREFIX): the first
process to import a module writes it, the source tree stays untouched. Nothing changes
when bytecode may be written anyway, or a cache prefix is already chosen.
Registered for pytest through `pytest_plugins` in tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_cache_dir: str | None = None


def pytest_configure(config) -> None:
    global _cache_dir
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    _cache_dir = tempfile.mkdtemp(prefix="kafscale-pycache-")
    os.environ["PYTHONPYCACHEPREFIX"] = _cache_dir
    del os.environ["PYTHONDONTWRITEBYTECODE"]


def pytest_unconfigure(config) -> None:
    global _cache_dir
    if _cache_dir is not None:
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        shutil.rmtree(_cache_dir, ignore_errors=True)
        _cache_dir = None
