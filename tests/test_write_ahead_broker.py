"""Write-ahead objects on a real broker (issue #32), a real client over TCP: a produce to
many partitions makes one object for all of them, and every record comes back at its
offset through consumers and ListOffsets; kill -9 between an object's upload and its
commit loses no acknowledged record and serves nothing twice."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.storage import segment, write_ahead
from tests.support.wait import wait_until

FLAG = ["--write-ahead-objects", "true", "--merge-interval-ms", "0"]


def _wal_objects(data_dir: str) -> list[Path]:
    d = Path(data_dir) / "objects" / "default" / "~wal"
    return sorted(d.glob("*.wal")) if d.exists() else []


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wal-{time.monotonic_ns()}", "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout
    n = 0
    while n < expected and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            got[m.partition()].append((m.offset(), m.value()))
            n += 1
    c.close()
    return got


def test_one_object_per_flush_for_all_partitions_and_every_record_back(broker_factory, topic_name):
    b = broker_factory(extra_args=FLAG)
    parts = 32
    _create(b.bootstrap, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 50, "acks": "all"})
    sent: dict[int, list[bytes]] = {i: [] for i in range(parts)}
    t0 = int(time.time() * 1000)
    for rnd in range(3):
        before = set(_wal_objects(b.data_dir))
        for i in range(parts):
            v = b"r%d-p%d" % (rnd, i)
            p.produce(topic_name, value=v, partition=i, timestamp=t0 + rnd * 1000)
            sent[i].append(v)
        assert p.flush(15) == 0
        new = sorted(set(_wal_objects(b.data_dir)) - before)
        pieces = [pc for f in new for pc in write_ahead.decode(f.read_bytes())[1]]
        assert sorted(pc.partition for pc in pieces) == list(range(parts)), [f.name for f in new]
        if rnd > 0:  # once every log is loaded, the one produce request makes one object
            assert len(new) <= 2, [f.name for f in new]
    # no partition wrote a segment object of its own
    assert not list((Path(b.data_dir) / "objects" / "default" / topic_name).rglob("*.kfs"))
    got = _consume_all(b.bootstrap, topic_name, parts, 3 * parts)
    assert got == {i: list(enumerate(sent[i])) for i in range(parts)}
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wal-offsets"})
    assert c.get_watermark_offsets(TopicPartition(topic_name, 5, 0), timeout=10) == (0, 3)
    found = c.offsets_for_times([TopicPartition(topic_name, i, t0 + 1000) for i in range(parts)], timeout=10)
    assert [tp.offset for tp in found] == [1] * parts
    c.close()
    # and after a restart (cold cache) from the objects
    b.restart()
    assert _consume_all(b.bootstrap, topic_name, parts, 3 * parts) == got


def test_kill9_between_upload_and_commit_keeps_every_acknowledged_record(broker_factory, topic_name):
    b = broker_factory(extra_args=FLAG)
    parts = 8
    _create(b.bootstrap, topic_name, parts)
    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(err, m):
        if err is None:
            acked.append((m.partition(), m.offset(), m.value()))

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(parts * 10):
        p.produce(topic_name, value=b"before-%03d" % i, partition=i % parts, on_delivery=on_delivery)
    assert p.flush(15) == 0
    # Hold the metadata store's write lock: the next flush uploads its object, then its
    # commit waits on the lock; the broker is killed right then.
    db_path = Path(b.data_dir) / "metadata.sqlite"
    assert db_path.exists()
    db = sqlite3.connect(str(db_path), isolation_level=None, timeout=30)
    try:
        before = set(_wal_objects(b.data_dir))
        db.execute("BEGIN IMMEDIATE")
        for i in range(parts * 5):
            p.produce(topic_name, value=b"during-%03d" % i, partition=i % parts, on_delivery=on_delivery)
        p.poll(0)
        wait_until(lambda: set(_wal_objects(b.data_dir)) - before, 20, "the write-ahead object of the held flush", interval=0.01)
        acked_at_kill = len(acked)
        b.kill9()
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert acked_at_kill == parts * 10  # nothing of the held flush was acknowledged
    b.start()
    for i in range(parts * 5):
        p.produce(topic_name, value=b"after-%03d" % i, partition=i % parts, on_delivery=on_delivery)
    assert p.flush(30) == 0
    total = sum(1 for _ in acked)
    got = _consume_all(b.bootstrap, topic_name, parts, total)
    for part in range(parts):
        offsets = [o for o, _v in got[part]]
        assert offsets == list(range(len(offsets)))  # nothing served twice, no hole
        values = [v for _o, v in got[part]]
        assert len(values) == len(set(values))
    served = {(part, o, v) for part, recs in got.items() for o, v in recs}
    assert set(acked) <= served  # every acknowledged record, at its offset
    assert len(served) == len(set(acked))


REWRITE = ["--write-ahead-objects", "true", "--merge-interval-ms", "100", "--merge-grace-ms", "300",
           "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "4000"]


def _spec_segments(data_dir: str, topic: str) -> list[Path]:
    return sorted((Path(data_dir) / "objects" / "default" / topic).rglob("segment-*.kfs"))


def test_consumer_reading_while_data_moves_into_segments_sees_every_record_once(broker_factory, topic_name):
    b = broker_factory(extra_args=REWRITE)
    parts = 4
    _create(b.bootstrap, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    total = 1200
    reads: list = []
    import threading

    t = None
    for i in range(total):
        p.produce(topic_name, value=b"v-%05d" % i, partition=i % parts)
        if i % 8 == 0:
            p.flush(10)  # many small flushes: many pieces to move
        if i == total // 3:
            t = threading.Thread(target=lambda: reads.append(_consume_all(b.bootstrap, topic_name, parts, total, timeout=60)))
            t.start()
    assert p.flush(10) == 0
    t.join(90)
    expected = {q: [(o, b"v-%05d" % (o * parts + q)) for o in range(total // parts)] for q in range(parts)}
    assert reads[0] == expected  # read while pieces moved into segments
    wait_until(lambda: _spec_segments(b.data_dir, topic_name) and not _wal_objects(b.data_dir), 30, "every piece rewritten and its objects deleted", interval=0.2)
    for f in _spec_segments(b.data_dir, topic_name):  # the spec's layout, keyed by base offset
        assert f.name == f"segment-{segment.decode(f.read_bytes()).info.base_offset:020d}.kfs"
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected


def test_kill9_during_rewrite_and_cleanup_loses_and_duplicates_nothing(broker_factory, topic_name):
    b = broker_factory(extra_args=REWRITE)
    parts = 4
    _create(b.bootstrap, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    acked = []
    total = 800
    for i in range(total):
        p.produce(topic_name, value=b"k-%04d" % i, partition=i % parts,
                  on_delivery=lambda e, m: acked.append((m.partition(), m.offset(), m.value())) if e is None else None)
        if i % 4 == 0:
            p.flush(10)
    assert p.flush(10) == 0
    # kill once the rewrite is under way (a spec segment exists), then again while the
    # cleanup deletes (fewer objects than at the first kill)
    wait_until(lambda: _spec_segments(b.data_dir, topic_name), 30, "a first rewritten segment", interval=0.01)
    b.kill9()
    left = len(_wal_objects(b.data_dir))
    b.start()
    _consume_all(b.bootstrap, topic_name, parts, total)  # loads the partitions: the rewrite goes on
    wait_until(lambda: len(_wal_objects(b.data_dir)) < left, 60, "the cleanup deleting", interval=0.01)
    b.kill9()
    b.start()
    expected = {q: [(o, b"k-%04d" % (o * parts + q)) for o in range(total // parts)] for q in range(parts)}
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected
    assert sorted(acked) == sorted((q, o, v) for q, recs in expected.items() for o, v in recs)
    # and the job ends: every piece in spec segments, no write-ahead object left
    wait_until(lambda: not _wal_objects(b.data_dir), 60, "no write-ahead object left", interval=0.2)
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected
