"""Brokers for tests: real `kafscale broker` processes on free loopback ports.

`broker` is one shared embedded broker for the session (tests use their own topic
names); `broker_factory` starts private ones for tests that restart or kill -9 them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on port {port} after {timeout}s")


# Data dirs made here (not given by the test): removed when the session ends, once their
# broker is stopped. Throughput tests write gigabytes; left behind, a few runs fill a disk.
_OWNED_DATA_DIRS: list["BrokerProcess"] = []

# Broker processes started this session and the seconds spent waiting for them to listen,
# printed at the end of the run: broker starts are a large share of the suite's time.
_STARTS = {"count": 0, "seconds": 0.0}


class BrokerProcess:
    def __init__(self, data_dir: str | None = None, port: int | None = None, extra_args: list[str] | None = None, env: dict | None = None):
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="kafscale-test-")
            _OWNED_DATA_DIRS.append(self)
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(self.data_dir) / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "BrokerProcess":
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        args = [
            sys.executable, "-m", "kafscale", "broker",
            "--listen", self.bootstrap, "--advertise", self.bootstrap,
            "--data-dir", self.data_dir, "--http", "",
            *self.extra_args,
        ]
        self._log = open(self.log_path, "ab")
        started = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        wait_port(self.port, proc=self.proc)
        _STARTS["count"] += 1
        _STARTS["seconds"] += time.monotonic() - started
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        self._log.close()
        return rc

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> "BrokerProcess":
        self.stop()
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class AclBroker(BrokerProcess):
    """A broker with ACLs on (`--authorizer acls`, `--super-users super_users`): a PLAINTEXT
    listener at `port`, whose clients are User:ANONYMOUS, and a SASL_PLAINTEXT (PLAIN) one at
    `sasl_port` for `users`, each with the password "<user>-secret" (a users file in the data
    dir); `extra_args` after those. `sasl_conf(user)`: a client's settings on the SASL listener."""

    def __init__(self, users, super_users: str, extra_args: list[str] | None = None, data_dir: str | None = None, env: dict | None = None):
        super().__init__(data_dir=data_dir, env=env)
        self.sasl_port = free_port()
        users_file = Path(self.data_dir) / "users.txt"
        users_file.write_text("".join(f"{u}:{u}-secret\n" for u in users))
        self.extra_args = [
            "--listeners", f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "--sasl-users-file", str(users_file), "--authorizer", "acls", "--super-users", super_users, *(extra_args or []),
        ]  # fmt: skip

    def sasl_conf(self, user: str) -> dict:
        return sasl_conf(self.sasl_port, user)


@contextlib.asynccontextmanager
async def in_process_broker(data_dir, **config):
    """A broker inside the test's event loop (no HTTP), flushing only when the test's
    `config` says, with merges off; stopped on exit."""
    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig

    broker = Broker(BrokerConfig(listen="127.0.0.1:0", data_dir=str(data_dir), http="", flush_interval_ms=600_000,
                                 merge_interval_ms=0, **config))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def sasl_conf(port: int, user: str) -> dict:
    """Client settings for `user` (password "<user>-secret") on a SASL_PLAINTEXT listener."""
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": f"{user}-secret"}


def pytest_terminal_summary(terminalreporter) -> None:
    if _STARTS["count"]:
        terminalreporter.write_line(f"kafscale brokers started: {_STARTS['count']}, {_STARTS['seconds']:.0f} s until they listened")


def pytest_sessionfinish(session, exitstatus) -> None:
    for b in _OWNED_DATA_DIRS:
        if b.proc is not None and b.proc.poll() is None:
            continue  # still running (a leak elsewhere): leave its files alone
        shutil.rmtree(b.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def broker():
    # Merging is off here: tests on this broker check the segments each flush makes (and
    # retention by segment); the merger has its own tests with private brokers.
    b = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0", "--retention-check-interval-ms", "500", "--merge-interval-ms", "0"]).start()
    yield b
    b.stop()


@pytest.fixture
def broker_factory():
    started: list[BrokerProcess] = []

    def make(**kwargs) -> BrokerProcess:
        b = BrokerProcess(**kwargs).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop(signal.SIGKILL)


@pytest.fixture
def topic_name(request) -> str:
    """A topic name unique to the test."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"{base}-{int(time.time() * 1000) % 10_000_000}"


def with_metadata(b, fn):
    """Run fn(MetadataStore) against a stopped broker's embedded metadata store (the state
    a lost or changed metadata store leaves, made as the broker itself would)."""
    import asyncio

    from kafscale.metadata.backends import open_kv
    from kafscale.metadata.store import MetadataStore

    async def go():
        md = MetadataStore(open_kv("embedded", b.data_dir, ""))
        try:
            return await fn(md)
        finally:
            await md.close()

    return asyncio.run(go())


def wait_for_leader(producer, topic: str, partition: int = 0, timeout: float = 15.0) -> None:
    """Until `producer` (confluent-kafka) knows the partition's leader. Tests that need each
    flushed group of records to leave as one request call this first: a record produced
    while the leader is still unknown may leave in a request of its own (seen in full runs,
    first group of a new topic split 1 + n)."""
    from tests.support.wait import wait_until

    def known() -> bool:
        md = producer.list_topics(topic, timeout=2)
        t = md.topics.get(topic)
        return t is not None and t.error is None and partition in t.partitions and t.partitions[partition].leader >= 0

    wait_until(known, timeout, f"the producer to know the leader of {topic}-{partition}")
