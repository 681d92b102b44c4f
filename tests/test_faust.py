"""Faust (faust-streaming) with processing_guarantee="exactly_once" on KafScale (issue #31):
Faust commits each input partition's offsets, table changelog and output records in one
transaction through aiokafka's send_offsets_to_transaction (TxnOffsetCommit v0, which names
no group member), which KafScale refused with UNKNOWN_MEMBER_ID while the worker's group had
members. Here an agent counts 1,000 records by key into a table; the worker is killed with
SIGKILL while a transaction is open and restarted: the table's counts are exact, the
output topic, read with read_committed, holds each "key:count" once and the group's offsets
end at the input's end. (The app works around a startup race of Faust's own, and the output
topic is one the worker consumes too, or Faust would send to it outside its transactions:
tests/support/faust_app.py says why.)

Faust runs in its own venv (`.venv-faust`, built by `make test` from the `faust` extra),
like Quix Streams: it brings its own aiokafka and aiohttp stack. KAFSCALE_FAUST_PYTHON names
another interpreter that has faust-streaming.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.support.wait import wait_until
from tests.test_produce_fetch import create_topic

ROOT = Path(__file__).resolve().parents[1]
FAUST_PYTHON = os.environ.get("KAFSCALE_FAUST_PYTHON") or str(ROOT / ".venv-faust" / "bin" / "python")
APP = ROOT / "tests" / "support" / "faust_app.py"
PARTITIONS = 4
# Seconds between Faust's commits. Faust commits while its agents go on processing, so a
# commit can carry outputs of records whose offsets it does not commit yet (a Faust trait,
# on any broker): the kill below must come before the first commit after the first half's,
# which it does with seconds to spare (it comes about a second after that commit).
COMMIT_INTERVAL = 6.0

pytestmark = pytest.mark.skipif(not Path(FAUST_PYTHON).exists(), reason=f"no Faust venv at {FAUST_PYTHON} (make test builds .venv-faust)")


class Worker:
    """One `faust worker` process of tests/support/faust_app.py, its output in a file."""

    def __init__(self, bootstrap: str, app_id: str, src: str, dst: str, data_dir: str):
        self.data_dir = data_dir
        self.log_path = Path(data_dir) / f"worker-{uuid.uuid4().hex[:6]}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["FAUST_COMMIT_INTERVAL"] = str(COMMIT_INTERVAL)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([FAUST_PYTHON, str(APP), bootstrap, app_id, src, dst, str(PARTITIONS), data_dir],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=data_dir)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def processed(self) -> int:
        """Records this process has counted so far (its last "processed N")."""
        assert self.proc.poll() is None, f"the Faust worker exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
        found = re.findall(r"processed (\d+)", self.log())
        return int(found[-1]) if found else 0

    def table(self) -> dict[str, int]:
        path = Path(self.data_dir) / "table.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def stop(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def produce(bootstrap: str, topic: str, records: list[tuple[str, str]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in records:
        p.produce(topic, key=key, value=value)
    assert p.flush(20) == 0


def read_committed(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """Every record of the topic up to its last stable offset, read_committed."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out, at_end = [], set()
    try:
        while len(at_end) < PARTITIONS:
            m = c.poll(10)
            assert m is not None, f"{topic}: no end of partition within 10 s"
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            out.append((m.key().decode(), m.value().decode()))
    finally:
        c.close()
    return out


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def test_exactly_once_table_survives_sigkill(broker):
    app_id = f"faust-{uuid.uuid4().hex[:8]}"
    src, dst = f"{app_id}-in", f"{app_id}-out"
    create_topic(broker.bootstrap, src, PARTITIONS)
    create_topic(broker.bootstrap, dst, PARTITIONS)
    records = [(f"k{i % 13}", f"v{i}") for i in range(1000)]
    expected = Counter(k for k, _ in records)
    results = sorted((k, f"{k}:{n}") for k in expected for n in range(1, expected[k] + 1))

    with tempfile.TemporaryDirectory(prefix="faust-") as data_dir:
        # First half, all committed: the worker is past startup, recovery and its first commits.
        produce(broker.bootstrap, src, records[:500])
        first = Worker(broker.bootstrap, app_id, src, dst, data_dir)
        try:
            wait_until(lambda: len(read_committed(broker.bootstrap, dst)) == 500, 120,
                       "the first 500 results, committed", interval=0.3)
            # Second half: killed with SIGKILL halfway through it, inside a transaction.
            produce(broker.bootstrap, src, records[500:])
            wait_until(lambda: first.processed() >= 750, 60, "the worker to count 250 of the second half", interval=0.02)
        finally:
            first.stop(signal.SIGKILL)
        assert first.proc.returncode == -signal.SIGKILL
        at_kill = len(read_committed(broker.bootstrap, dst))
        assert 500 <= at_kill < 1000, at_kill

        second = Worker(broker.bootstrap, app_id, src, dst, data_dir)
        try:
            wait_until(lambda: second.table() == dict(expected), 120, "the restarted worker's table to count all 1,000")
            wait_until(lambda: len(read_committed(broker.bootstrap, dst)) >= 1000, 60, "all results committed", interval=0.3)
            assert second.processed() == 1000 - at_kill, "the restart redid exactly what was not committed"
        finally:
            # Everything is committed by now. (On SIGTERM Faust 0.15 closes its loop and
            # then waits 30 s for its consumer thread; nothing is left to flush.)
            second.stop(signal.SIGKILL)
        log = first.log() + second.log()

    got = read_committed(broker.bootstrap, dst)
    assert sorted(got) == results, f"{len(got)} results, {len(set(got))} distinct\n{log[-3000:]}"
    assert committed_offsets(broker.bootstrap, app_id, src) == end_offsets(broker.bootstrap, src)
    assert sum(end_offsets(broker.bootstrap, src).values()) == 1000
