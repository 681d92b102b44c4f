"""Real backing servers for tests: a single-node etcd and a moto S3 server.

Plain helpers (`start_etcd()`, `start_moto()`) give a private server a test may stop,
restart or freeze; the session fixtures `etcd_server` and `moto_server` share one of
each across the whole run (tests must not stop those, and should use their own key
prefix / bucket). Registered for pytest through `pytest_plugins` in tests/conftest.py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ETCD_BIN = shutil.which("etcd") or "/usr/bin/etcd"

# Dummy credentials and region for moto; the real AWS chain would look elsewhere.
MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            resp.read()
        return True
    except urllib.error.HTTPError:
        return True  # an HTTP error is still an answer
    except OSError:
        return False


class _Process:
    """A server subprocess with its log in a temp dir; stop/start keep ports and data."""

    name = "server"

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"kafscale-{self.name}-"))
        self.proc: subprocess.Popen | None = None
        self._log = None
        atexit.register(self.cleanup)

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def start(self, timeout: float = 30.0) -> None:
        if self.running:
            return
        self._log = open(self.workdir / "server.log", "ab")
        self.proc = subprocess.Popen(
            self._command(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env()
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)  # a paused process can't handle SIGTERM
            except ProcessLookupError:
                pass
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections open but nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


class EtcdServer(_Process):
    """Single-node etcd on free localhost ports; data survives stop()/restart()."""

    name = "etcd"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.peer_port = free_port()
        self.data_dir = self.workdir / "data"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The `--metadata` URL for this server."""
        return f"etcd://{self.endpoint}"

    def _command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD_BIN,
            "--name", "n0",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"n0={peer}",
            "--initial-cluster-state", "new",
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False


class MotoServer(_Process):
    """moto's S3 (and friends) server; in-memory, so a restart starts empty."""

    name = "moto"

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()

    @property
    def endpoint(self) -> str:
        """Value for KAFSCALE_S3_ENDPOINT."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment a process needs to use this server as its S3."""
        return {**MOTO_ENV, "KAFSCALE_S3_ENDPOINT": self.endpoint}

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def _env(self) -> dict[str, str]:
        return {**os.environ, **MOTO_ENV}

    def _ready(self) -> bool:
        return _answers(f"{self.endpoint}/moto-api/")


def start_etcd() -> EtcdServer:
    """A started private etcd; call .cleanup() (or use it as a context manager) when done."""
    server = EtcdServer()
    server.start()
    return server


def start_moto() -> MotoServer:
    """A started private moto server; call .cleanup() (or use `with`) when done."""
    server = MotoServer()
    server.start()
    return server


def _skip_without_etcd() -> None:
    if not os.path.exists(ETCD_BIN):
        pytest.skip("etcd binary not installed (make system-deps)")


@pytest.fixture(scope="session")
def etcd_server():
    """One etcd for the whole run. Do not stop it; use a unique key prefix per test."""
    _skip_without_etcd()
    with start_etcd() as server:
        yield server


@pytest.fixture(scope="session")
def moto_server():
    """One moto S3 for the whole run, with AWS_* and KAFSCALE_S3_ENDPOINT set in os.environ
    (restored afterwards). Do not stop it; use a unique bucket per test."""
    with start_moto() as server:
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
