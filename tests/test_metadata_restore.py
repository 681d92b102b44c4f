"""Issue #25: losing the metadata store loses no acknowledged record.

Embedded brokers (real `kafscale broker` processes, confluent-kafka clients): the metadata
file is deleted, the broker refuses to start empty, `kafscale metadata restore` rebuilds
the store from the newest snapshot and the bucket, and everything is back: after a SIGTERM
exactly (topics, configs, records at their offsets, committed offsets), after a kill -9
under load every acknowledged record at its offset. Bad input: a restore into a non-empty
store is refused and changes nothing; a damaged snapshot is reported and the previous one
used; a segment with a bad CRC stops the chain (reported); no snapshot at all still gives
back topics, records and offsets from the bucket alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from kafscale.backup.snapshot import created_ms_of
from kafscale.storage import write_ahead
from tests.support.broker import REPO, wait_for_leader
from tests.support.clients import AckedLoad
from tests.support.wait import wait_until

TOPIC = "orders"
PARTITIONS = 3
PER_PARTITION = 1000
RETENTION = "604800001"


def kafscale(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kafscale", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def lose_metadata(data_dir: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(data_dir, "metadata.sqlite" + suffix).unlink(missing_ok=True)


def produce(bootstrap: str, n: int, start: int = 0) -> dict[tuple[int, int], bytes]:
    """n records per partition, acks=all; {(partition, offset): value} of the acknowledged."""
    acked: dict[tuple[int, int], bytes] = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    wait_for_leader(p, TOPIC, 0)

    def done(err, msg):
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for i in range(start, start + n):
        for part in range(PARTITIONS):
            p.produce(TOPIC, value=f"p{part}-{i}".encode(), key=str(i).encode(), partition=part, on_delivery=done)
        p.poll(0)
    assert p.flush(30) == 0
    return acked


def read_all(bootstrap: str, ends: dict[int, int]) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(TOPIC, p, 0) for p in ends])
    got: dict[tuple[int, int], bytes] = {}

    def caught_up() -> bool:
        for m in c.consume(500, 0.5):
            if m.error() is None:
                got[(m.partition(), m.offset())] = m.value()
        return all(sum(1 for (p, _o) in got if p == part) >= end for part, end in ends.items())

    wait_until(caught_up, 60, "reading every record back")
    c.close()
    return got


def committed(bootstrap: str, group: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    out = {tp.partition: tp.offset for tp in c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=15)}
    c.close()
    return out


def commit(bootstrap: str, group: str, offsets: dict[int, int]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in offsets.items()], asynchronous=False)
    c.close()


def topic_config(bootstrap: str, name: str) -> str | None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    return admin.describe_configs([res])[res].result(15)[name].value


def create_orders(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config={"retention.ms": RETENTION})])[TOPIC].result(15)


def start_refuses(broker) -> str:
    """Start the broker on its lost metadata: it must exit 1 with the line naming restore."""
    try:
        broker.start()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the broker started on an empty metadata store over a namespace with data")
    rc = broker.proc.wait(30)
    broker.stop()
    assert rc == 1
    refusals = [ln for ln in broker.log_text().splitlines() if "refusing to start" in ln]
    assert refusals and "kafscale metadata restore" in refusals[-1], broker.log_text()[-2000:]
    return refusals[-1]


def test_sigterm_metadata_lost_everything_back(broker_factory):
    b = broker_factory(extra_args=["--merge-interval-ms", "0"])
    create_orders(b.bootstrap)
    acked = produce(b.bootstrap, PER_PARTITION)
    assert len(acked) == PARTITIONS * PER_PARTITION
    commit(b.bootstrap, "billing", {0: 500, 1: 600})
    assert b.stop() == 0
    lose_metadata(b.data_dir)

    start_refuses(b)
    # The CLI refuses nothing here: the store is empty (the refused start wrote no key).
    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 0, out.stderr
    assert "restored from snapshot" in out.stdout, out.stdout
    assert "committed offsets" in out.stdout

    b.start()
    assert topic_config(b.bootstrap, "retention.ms") == RETENTION
    got = read_all(b.bootstrap, {p: PER_PARTITION for p in range(PARTITIONS)})
    assert got == acked
    assert committed(b.bootstrap, "billing") == {0: 500, 1: 600, 2: -1001}
    # And the cluster goes on: new records follow at the next offsets.
    more = produce(b.bootstrap, 10, start=PER_PARTITION)
    assert sorted(o for (p, o) in more if p == 0) == list(range(PER_PARTITION, PER_PARTITION + 10))


def test_restore_refuses_a_store_that_is_not_empty(broker_factory):
    b = broker_factory()
    create_orders(b.bootstrap)
    produce(b.bootstrap, 5)
    assert b.stop() == 0
    db = Path(b.data_dir, "metadata.sqlite")
    before = db.read_bytes()
    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 1
    assert "not empty" in out.stderr and "nothing was changed" in out.stderr
    assert db.read_bytes() == before


def test_kill9_under_load_every_acknowledged_record_back(broker_factory):
    # Snapshots every 300 ms while producing: the newest one is older than the last
    # acknowledged records, so the restore must adopt segments from the bucket.
    b = broker_factory(extra_args=["--metadata-snapshot-interval-ms", "300", "--merge-interval-ms", "1000", "--merge-min-grace-ms", "100", "--merge-grace-ms", "200"])
    create_orders(b.bootstrap)
    load = AckedLoad({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 5000, "retries": 0}, TOPIC, PARTITIONS, "v").start()
    wait_until(lambda: len(load.acked) >= 3000, 60, "3000 acknowledged records")
    commit(b.bootstrap, "billing", {0: 100})
    committed_ms = time.time() * 1000
    snapdir = Path(b.data_dir, "objects", "default", "~metadata")
    wait_until(lambda: any((created_ms_of(p.name[9:-4]) or 0) > committed_ms for p in snapdir.glob("*.kms")), 30, "a snapshot after the commit")
    wait_until(lambda: len(load.acked) >= 4000, 60, "more records after the commit")
    b.kill9()
    acked = load.stop()
    lose_metadata(b.data_dir)

    out = kafscale("metadata", "restore", "--data-dir", b.data_dir, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["snapshot"] is not None
    b.start()
    ends = {p: max(o for (q, o) in acked if q == p) + 1 for p in range(PARTITIONS)}
    got = read_all(b.bootstrap, ends)
    for key, value in acked.items():
        assert got.get(key) == value, f"acknowledged record {key} not back at its offset"
    assert committed(b.bootstrap, "billing")[0] == 100


def test_without_any_snapshot_the_bucket_alone(broker_factory):
    # A segment per flush: "plain" stands for a topic of a version before markers, which
    # wrote no write-ahead objects (pieces count only under a live marker: a deleted
    # topic's stay in the objects for a while).
    b = broker_factory(extra_args=["--metadata-snapshot-interval-ms", "0", "--write-ahead-objects", "false"])
    create_orders(b.bootstrap)
    admin = admin_for(b)
    admin.create_topics([NewTopic("plain", 2, 1, config={"retention.ms": RETENTION})])["plain"].result(15)
    acked = produce(b.bootstrap, 200)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    p.produce("plain", b"x", partition=1)
    assert p.flush(15) == 0
    commit(b.bootstrap, "billing", {0: 50, 2: 70})
    assert b.stop() == 0
    lose_metadata(b.data_dir)
    assert not list(Path(b.data_dir, "objects", "default", "~metadata").glob("*.kms"))
    Path(b.data_dir, "objects", "default", "plain", "topic.json").unlink()  # as if written before markers

    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 0, out.stderr
    assert "no snapshot: the bucket alone" in out.stdout
    assert "configs at defaults, new topic ids (no marker, not in the snapshot): plain" in out.stdout, out.stdout
    b.start()
    assert read_all(b.bootstrap, {p: 200 for p in range(PARTITIONS)}) == acked
    assert committed(b.bootstrap, "billing") == {0: 50, 1: -1001, 2: 70}
    # orders' marker gave back its configs; plain had none: its partition count comes from
    # the keys (partition 1 has a segment) and its configs are the defaults.
    assert topic_config(b.bootstrap, "retention.ms") == RETENTION
    md = admin_for(b).list_topics(timeout=10)
    assert len(md.topics["plain"].partitions) == 2


def test_changes_after_the_snapshot(broker_factory):
    """A snapshot taken, then: a topic created (its marker has its configs), a topic
    deleted, more records and offset commits. All of it comes back from the bucket."""
    b = broker_factory(extra_args=["--metadata-snapshot-interval-ms", "0", "--merge-interval-ms", "0"])
    create_orders(b.bootstrap)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("gone", 1, 1)])["gone"].result(15)
    acked = produce(b.bootstrap, 100)
    commit(b.bootstrap, "billing", {0: 10})
    out = kafscale("metadata", "snapshot", "--data-dir", b.data_dir)
    assert out.returncode == 0 and out.stdout.startswith("snapshot "), out.stderr
    admin.create_topics([NewTopic("late", 2, 1, config={"cleanup.policy": "compact"})])["late"].result(15)
    admin.delete_topics(["gone"])["gone"].result(15)
    acked.update(produce(b.bootstrap, 100, start=100))
    commit(b.bootstrap, "billing", {0: 150, 1: 20})
    commit(b.bootstrap, "other", {2: 5})
    assert b.stop() == 0  # snapshots off: no final snapshot
    lose_metadata(b.data_dir)

    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 0, out.stderr
    assert "from their markers (created after the snapshot): late" in out.stdout, out.stdout
    assert "deleted since, left deleted: gone" in out.stdout, out.stdout
    b.start()
    md = admin_for(b).list_topics(timeout=10)
    assert "gone" not in md.topics and len(md.topics["late"].partitions) == 2
    res = ConfigResource(ConfigResource.Type.TOPIC, "late")
    admin = admin_for(b)
    assert admin.describe_configs([res])[res].result(15)["cleanup.policy"].value == "compact"
    assert read_all(b.bootstrap, {p: 200 for p in range(PARTITIONS)}) == acked
    assert committed(b.bootstrap, "billing") == {0: 150, 1: 20, 2: -1001}
    assert committed(b.bootstrap, "other") == {0: -1001, 1: -1001, 2: 5}


def admin_for(b) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def segment_at(data_dir: str, partition: int, base: int) -> tuple[Path, int]:
    """(object, position) of the segment of TOPIC's `partition` starting at `base`: its own
    segment object, or its piece in a write-ahead object (the newest one holding it: a
    restore adopts that one)."""
    objects = Path(data_dir, "objects", "default")
    own = objects / TOPIC / str(partition) / f"segment-{base:020d}.kfs"
    if own.exists():
        return own, 0
    for path in sorted((objects / write_ahead.WAL_DIR).glob("*.wal"), reverse=True):
        for pc in write_ahead.decode(path.read_bytes())[1]:
            if (pc.topic, pc.partition, pc.base_offset) == (TOPIC, partition, base):
                return path, pc.position
    raise AssertionError(f"no segment of {TOPIC}-{partition} starts at {base}")


def test_damaged_snapshot_and_bad_crc_in_the_chain(broker_factory):
    b = broker_factory(extra_args=["--merge-interval-ms", "0"])
    create_orders(b.bootstrap)
    produce(b.bootstrap, 100)
    assert b.stop() == 0  # final snapshot: offsets 0-99 in every partition
    b.start()
    produce(b.bootstrap, 100, start=100)
    assert b.stop(signal.SIGKILL) is not None  # no final snapshot: 100-199 only in the bucket
    good = sorted(Path(b.data_dir, "objects", "default", "~metadata").glob("*.kms"))[-1]
    # A newer snapshot that is damaged: the restore must say so and use `good`.
    data = bytearray(good.read_bytes())
    data[-5] ^= 0xFF
    newer = good.parent / ("snapshot-29991231T000000000Z-0.kms")
    newer.write_bytes(bytes(data))
    # Partition 1's first segment after the good snapshot gets a bad batch CRC.
    path, position = segment_at(b.data_dir, 1, 100)
    raw = bytearray(path.read_bytes())
    raw[position + 32 + 61 + 5] ^= 0xFF  # a byte inside the first batch's records
    path.write_bytes(bytes(raw))
    lose_metadata(b.data_dir)

    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 0, out.stderr
    assert "29991231T000000000Z-0" in out.stdout and "checksum" in out.stdout, out.stdout
    assert f"restored from snapshot {good.name[9:-4]}" in out.stdout
    assert f"{TOPIC}-1: the chain stops at offset 100" in out.stdout, out.stdout
    b.start()
    got = read_all(b.bootstrap, {0: 200, 1: 100, 2: 200})
    assert sorted(o for (p, o) in got if p == 1) == list(range(100))
    assert sorted(o for (p, o) in got if p == 0) == list(range(200))


def test_auto_restore_flag_restores_before_starting(broker_factory):
    b = broker_factory(extra_args=["--merge-interval-ms", "0"])
    create_orders(b.bootstrap)
    acked = produce(b.bootstrap, 50)
    assert b.stop() == 0
    lose_metadata(b.data_dir)
    b.extra_args += ["--metadata-auto-restore", "true"]
    b.start()
    assert "restore: restored from snapshot" in b.log_text()
    assert read_all(b.bootstrap, {p: 50 for p in range(PARTITIONS)}) == acked


def test_bucket_alone_finds_records_only_in_write_ahead_objects(broker_factory):
    """#32: records flushed with --write-ahead-objects and not yet rewritten are in no
    segment object; a restore from the bucket alone finds them (and the committed offsets
    in __consumer_offsets, written the same way) through the write-ahead objects' indexes."""
    flags = ["--metadata-snapshot-interval-ms", "0", "--write-ahead-objects", "true", "--merge-interval-ms", "0"]
    b = broker_factory(extra_args=flags)
    create_orders(b.bootstrap)
    acked = produce(b.bootstrap, 100)
    commit(b.bootstrap, "billing", {0: 10, 1: 20, 2: 30})
    assert b.stop() == 0
    objects = Path(b.data_dir, "objects", "default")
    assert list((objects / "~wal").glob("*.wal")) and not list((objects / TOPIC).rglob("segment-*.kfs"))
    lose_metadata(b.data_dir)

    out = kafscale("metadata", "restore", "--data-dir", b.data_dir)
    assert out.returncode == 0, out.stderr
    assert "no snapshot: the bucket alone" in out.stdout
    b.start()
    assert read_all(b.bootstrap, {p: 100 for p in range(PARTITIONS)}) == acked
    assert committed(b.bootstrap, "billing") == {0: 10, 1: 20, 2: 30}
    more = produce(b.bootstrap, 5, start=100)  # the log goes on after the restored end
    assert set(more) == {(p, o) for p in range(PARTITIONS) for o in range(100, 105)}
    assert read_all(b.bootstrap, {p: 105 for p in range(PARTITIONS)}) == {**acked, **more}
