"""Helpers for the log compaction tests (tests/test_compaction*.py): a broker with fast
compaction and /metrics, a model of what was produced, and reading a partition whole."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from kafscale.storage import write_ahead
from tests.support.broker import free_port

# Compaction every 100 ms; merged- and compacted-away objects deleted after 0.3-0.5 s.
FAST_COMPACTION = ["--compaction-interval-ms", "100", "--merge-grace-ms", "500", "--merge-min-grace-ms", "300"]


def broker_args(merge_interval_ms: int = 0) -> tuple[list[str], int]:
    """(extra args, /metrics port) for a broker that compacts quickly."""
    port = free_port()
    return [*FAST_COMPACTION, "--merge-interval-ms", str(merge_interval_ms), "--http", f"127.0.0.1:{port}"], port


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def create_topic(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic]
    fut.result(15)


class Model:
    """What was acknowledged: offset -> (key, value)."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[bytes, bytes | None]] = {}

    def latest(self) -> list[tuple[int, bytes, bytes | None]]:
        """Per key, its last record, in offset order."""
        last: dict[bytes, int] = {}
        for off in sorted(self.records):
            last[self.records[off][0]] = off
        return sorted((off, *self.records[off]) for off in last.values())

    def compacted(self) -> list[tuple[int, bytes, bytes | None]]:
        """The log after compaction with every tombstone past its horizon: latest value per
        key, tombstoned keys gone."""
        return [r for r in self.latest() if r[2] is not None]

    def check_read(self, got: list[tuple[int, bytes, bytes | None]]) -> None:
        """A read of the log as compaction may leave it at any moment: offsets increasing,
        each record the one produced at its offset, every key's latest record there, and
        anything missing superseded by a later record of its key."""
        offsets = [g[0] for g in got]
        assert offsets == sorted(set(offsets)), "offsets read twice or out of order"
        for off, k, v in got:
            assert self.records.get(off) == (k, v), f"offset {off}: read {(k, v)}, produced {self.records.get(off)}"
        seen = set(offsets)
        latest = {off for off, _k, _v in self.latest()}
        later_of_key: dict[bytes, int] = {}
        for off in sorted(self.records):
            later_of_key[self.records[off][0]] = off
        for off, k, _v in got:  # no value back from the dead: a key's tombstone goes after its older values
            last = later_of_key[k]
            assert last in seen or self.records[last][1] is not None, f"offset {off} of {k!r} read, but its tombstone at {last} is gone"
        for off in self.records:
            if off in seen:
                continue
            key, value = self.records[off]
            assert off not in latest or value is None, f"the latest record of {key!r} (offset {off}) is missing"
            assert later_of_key[key] > off or value is None, f"offset {off} removed but not superseded"


def produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes | None]], model: Model, flush_every: int = 20, **conf) -> None:
    """Produce `items` in order, flushing every `flush_every` records (one segment each)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **conf})

    def acked(err, msg):
        assert err is None, err
        model.records[msg.offset()] = (msg.key(), msg.value())

    for i, (k, v) in enumerate(items):
        p.produce(topic, key=k, value=v, on_delivery=acked)
        if (i + 1) % flush_every == 0:
            assert p.flush(15) == 0
    assert p.flush(15) == 0


def read_all(
    bootstrap: str, topic: str, timeout: float = 30.0, fetch_max_bytes: int | None = None, isolation: str = "read_committed"
) -> list[tuple[int, bytes, bytes | None]]:
    """Every record from the log start to the high watermark, as (offset, key, value); the
    last record must sit just below the high watermark (tests end their topics with one)."""
    conf = {"bootstrap.servers": bootstrap, "group.id": "compaction-check", "enable.auto.commit": False, "fetch.wait.max.ms": 20, "isolation.level": isolation}
    if fetch_max_bytes:
        conf.update({"fetch.max.bytes": fetch_max_bytes, "max.partition.fetch.bytes": fetch_max_bytes, "message.max.bytes": min(fetch_max_bytes, 1000)})
    c = Consumer(conf)
    try:
        # the first request after a restart loads the partition (on S3 a listing and reads): a
        # busy machine takes more than a few seconds
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + timeout
        while (not got or got[-1][0] < high - 1) and time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append((m.offset(), m.key(), m.value()))
        assert got and got[-1][0] == high - 1, f"read up to {got[-1][0] if got else None}, high watermark {high}"
        return got
    finally:
        c.close()


def partition_bytes(data_dir: str, topic: str) -> int:
    """Bytes partition 0 of `topic` takes in a file store, wherever its data lives: its own
    objects, and its pieces in the write-ahead objects still there (storage/write_ahead.py;
    an object goes once no segment refers to it and it is --write-ahead-orphan-age-ms old)."""
    root = Path(data_dir) / "objects" / "default"
    pdir = root / topic / "0"
    own = sum(f.stat().st_size for f in pdir.iterdir()) if pdir.exists() else 0
    held = 0
    for f in (root / write_ahead.WAL_DIR).glob("*.wal"):
        try:
            _created, pieces = write_ahead.decode(f.read_bytes())
        except FileNotFoundError:
            continue  # deleted meanwhile
        held += sum(pc.length for pc in pieces if pc.topic == topic and pc.partition == 0)
    return own + held
