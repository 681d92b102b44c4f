"""Point-in-time topic restore (#25 item 4): `kafscale topics restore TOPIC --to-time ISO
--as NEW` and `--to-offset N`, run as the CLI while the broker runs, read back with
confluent-kafka consumers from the broker. On the file store with the embedded metadata
store, and on moto S3 with etcd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from kafscale.protocol import records
from kafscale.storage import segment, write_ahead
from tests.support.broker import REPO, BrokerProcess
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until

NS = "default"
T0 = (int(time.time()) - 3600) * 1000  # records stamped an hour ago, a second apart


@pytest.fixture(params=["file", "s3-etcd"])
def cluster(request, tmp_path):
    """(broker, store flags for the CLI, env for the CLI, a function reading a source object,
    one listing the keys under a prefix, whether flushes write write-ahead objects). Each
    store with one layout whatever the default, so that a restore both copies segment
    objects and rewrites pieces of write-ahead objects: a segment per flush on the file
    store, write-ahead objects on S3."""
    if request.param == "file":
        in_wal = False
        b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--merge-interval-ms", "0", "--write-ahead-objects", "false"]).start()
        flags, env = ["--data-dir", str(tmp_path)], {}

        def read_object(key: str) -> bytes:
            return (tmp_path / "objects" / key).read_bytes()

        def list_keys(prefix: str) -> list[str]:
            root = tmp_path / "objects"
            return sorted(str(f.relative_to(root)) for f in root.glob(prefix + "*") if f.is_file())
    else:
        if not os.path.exists(ETCD_BIN):
            pytest.skip("etcd binary not installed (make system-deps)")
        in_wal = True
        etcd = request.getfixturevalue("etcd_server")
        moto = request.getfixturevalue("moto_server")
        tag = uuid.uuid4().hex[:8]
        bucket, prefix = f"ks-restore-{tag}", f"/ks-restore-{tag}"
        flags = ["--metadata", etcd.url, "--metadata-prefix", prefix, "--storage", f"s3://{bucket}/data"]
        env = {**moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true"}
        b = BrokerProcess(data_dir=str(tmp_path), extra_args=[*flags, "--merge-interval-ms", "0", "--write-ahead-objects", "true"], env=env).start()
        import boto3

        s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")

        def read_object(key: str) -> bytes:
            return s3.get_object(Bucket=bucket, Key=f"data/{key}")["Body"].read()

        def list_keys(prefix: str) -> list[str]:
            return sorted(o["Key"][len("data/"):] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"data/{prefix}").get("Contents", []))

    def source_segment(topic: str, partition: int, base: int) -> tuple[bool, bytes]:
        """(whether it is an object of its own, its bytes) of a source segment: its own
        object, or its piece of a write-ahead object (a whole spec segment too)."""
        key = segment.segment_key(NS, topic, partition, base)
        if key in list_keys(key):
            return True, read_object(key)
        for wal in list_keys(write_ahead.wal_prefix(NS)):
            data = read_object(wal)
            for pc in write_ahead.decode(data)[1]:
                if (pc.topic, pc.partition, pc.base_offset) == (topic, partition, base):
                    return False, data[pc.position : pc.position + pc.length]
        raise AssertionError(f"segment {base} of {topic}-{partition} is nowhere in the store")

    yield b, flags, env, read_object, source_segment, in_wal
    b.stop()


def restore(flags: list[str], env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kafscale", "topics", "restore", *args, "--json", "--quiet", *flags],
        capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO, timeout=120,
    )


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def produce_round(bootstrap: str, topic: str, partition: int, items: list[tuple[int, int]], codec: str = "lz4", **conf) -> None:
    """(i, timestamp) records key k{i}, value(i), in one compressed batch (one flush). The
    linger is long (flush() sends at once): a test process stalled for longer than the
    linger between two produce() calls would split the batch in two (seen on a busy CI)."""
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5000, "batch.num.messages": 10000, **conf})
    for i, ts in items:
        p.produce(topic, key=b"k%d" % i, value=value(i), partition=partition, timestamp=ts)
    assert p.flush(30) == 0


def consume(bootstrap: str, topic: str, partition: int, expect: int, isolation: str = "read_uncommitted") -> list[tuple[int, int, bytes, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        got: list = []
        eof = []

        def done() -> bool:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.timestamp()[1], m.key(), m.value()))
                elif m.error().code() == -191:  # _PARTITION_EOF
                    eof.append(m.offset())
            return len(got) >= expect and eof and eof[-1] >= (got[-1][0] + 1 if got else 0)

        wait_until(done, 60, f"{expect} records of {topic}-{partition} and its end")
        return got
    finally:
        c.close()


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def source_topic(b, topic: str) -> None:
    """Partition 0: records 0-149 (timestamp T0 + i s) in three lz4 segments of 50, each one
    batch, then record 150 stamped T0 (after any cut below: it must not come back with
    one). Partition 1: records 0-19 stamped T0 + i s, in one segment."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "86400000", "max.message.bytes": "500000"})])[topic].result(15)
    for r in range(3):
        produce_round(b.bootstrap, topic, 0, [(i, T0 + i * 1000) for i in range(r * 50, r * 50 + 50)])
    produce_round(b.bootstrap, topic, 0, [(150, T0)])
    produce_round(b.bootstrap, topic, 1, [(i, T0 + i * 1000) for i in range(20)], codec="zstd")


def value(i: int) -> bytes:
    return b"value %d, compressible. " % i * 8  # (librdkafka sends a batch uncompressed unless it shrinks)


def expected(n: int) -> list[tuple[int, int, bytes, bytes]]:
    return [(i, T0 + i * 1000, b"k%d" % i, value(i)) for i in range(n)]


def test_restore_to_a_time_inside_a_compressed_batch(cluster):
    b, flags, env, read_object, source_segment, in_wal = cluster
    source_topic(b, "orders")
    (own0, seg0), (own50, seg50), (own1, _) = (source_segment("orders", p, base) for p, base in ((0, 0), (0, 50), (1, 0)))
    assert own0 == own50 == own1 == (not in_wal)
    # The cut (offset 76) falls inside segment 50-99's one lz4 batch.
    [(pos, h)] = list(records.iter_batches(segment.decode(seg50).batches))
    assert (h.base_offset, h.last_offset, h.compression) == (50, 99, records.COMPRESSION_LZ4)

    done = restore(flags, env, "orders", "--to-time", iso(T0 + 75_500), "--as", "orders-restored")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    parts = {p["partition"]: p for p in report["partitions"]}
    # A whole segment is copied inside the store, or rewritten out of its write-ahead
    # object; the cut one is rewritten.
    whole = (1, 1) if own0 else (0, 2)
    assert (parts[0]["end"], parts[0]["high_watermark"], parts[0]["segments_copied"], parts[0]["segments_rewritten"]) == (76, 76, *whole)
    assert (parts[1]["end"], parts[1]["segments_copied"], parts[1]["segments_rewritten"]) == (20, *((1, 0) if own1 else (0, 1)))

    assert consume(b.bootstrap, "orders-restored", 0, 76) == expected(76)
    assert consume(b.bootstrap, "orders-restored", 1, 20) == expected(20)
    assert watermarks(b.bootstrap, "orders-restored", 0) == (0, 76)
    # The whole segment is the source's, byte for byte (its object or its piece), in an
    # object of its own; the cut one holds records 50-75 in one lz4 batch, as produced.
    assert read_object(segment.segment_key(NS, "orders-restored", 0, 0)) == seg0
    cut = segment.decode(read_object(segment.segment_key(NS, "orders-restored", 0, 50)))
    [(pos, h)] = list(records.iter_batches(cut.batches))
    assert (h.base_offset, h.last_offset, h.record_count, h.compression) == (50, 75, 26, records.COMPRESSION_LZ4)
    assert [r.offset for r in records.decode_records(cut.batches, pos)] == list(range(50, 76))

    # Same configs; the source untouched; the new topic takes produces after its end.
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, "orders-restored")
    configs = admin.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "86400000" and configs["max.message.bytes"].value == "500000"
    assert watermarks(b.bootstrap, "orders", 0) == (0, 151)
    assert consume(b.bootstrap, "orders", 0, 151)[:150] == expected(150)
    produce_round(b.bootstrap, "orders-restored", 0, [(999, T0)])
    assert consume(b.bootstrap, "orders-restored", 0, 77)[-1][:1] == (76,)

    # --to-offset: offsets below 120 (a cut inside the third segment's batch); partition 1
    # ends before, so it is whole.
    done = restore(flags, env, "orders", "--to-offset", "120", "--as", "orders-120")
    assert done.returncode == 0, done.stderr
    assert consume(b.bootstrap, "orders-120", 0, 120) == expected(120)
    assert consume(b.bootstrap, "orders-120", 1, 20) == expected(20)
    assert watermarks(b.bootstrap, "orders-120", 0) == (0, 120)

    # Refused, nothing created: a time before the log start, an existing target, an
    # unknown source.
    for args, says in [
        (("orders", "--to-time", iso(T0 - 1000), "--as", "orders-early"), "before the log start"),
        (("orders", "--to-offset", "10", "--as", "orders-restored"), "already exists"),
        (("nope", "--to-offset", "10", "--as", "orders-nope"), "does not exist"),
    ]:
        done = restore(flags, env, *args)
        assert done.returncode == 1 and says in done.stderr and "nothing created" in done.stderr, done.stderr
    topics = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics
    assert "orders-early" not in topics and "orders-nope" not in topics


def test_restore_aborts_a_transaction_open_at_the_cut(tmp_path):
    """Records 0-9, then a transaction (records 10-12, stamped T0 + 20 s) whose COMMIT
    marker comes at offset 13 with the broker's time (now), then record 14 stamped T0 + 1 s.
    Cut at T0 + 25 s: the marker is the first record after it, so the transaction was
    open then: the new topic holds 0-12 and an ABORT marker at 13; read_committed reads
    0-9 and reaches the end."""
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--merge-interval-ms", "0"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("txn", 1, 1)])["txn"].result(15)
        produce_round(b.bootstrap, "txn", 0, [(i, T0 + i * 1000) for i in range(10)], codec="zstd")
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "restore-txn", "linger.ms": 100})
        p.init_transactions(15)
        p.begin_transaction()
        for i in range(10, 13):
            p.produce("txn", key=b"k%d" % i, value=value(i), partition=0, timestamp=T0 + 20_000)
        p.commit_transaction(30)
        produce_round(b.bootstrap, "txn", 0, [(14, T0 + 1000)])
        assert watermarks(b.bootstrap, "txn", 0) == (0, 15)

        done = restore(["--data-dir", str(tmp_path)], {}, "txn", "--to-time", iso(T0 + 25_000), "--as", "txn-restored")
        assert done.returncode == 0, done.stderr
        [part] = json.loads(done.stdout)["partitions"]
        assert (part["end"], part["high_watermark"], part["aborted_transactions"]) == (13, 14, 1)
        assert watermarks(b.bootstrap, "txn-restored", 0) == (0, 14)
        got = consume(b.bootstrap, "txn-restored", 0, 13)
        assert [(o, k) for o, _ts, k, _v in got] == [(i, b"k%d" % i) for i in range(13)]
        committed = consume(b.bootstrap, "txn-restored", 0, 10, isolation="read_committed")
        assert [o for o, *_ in committed] == list(range(10))
        # In the source the transaction stays committed.
        assert [o for o, *_ in consume(b.bootstrap, "txn", 0, 14, isolation="read_committed")] == [*range(13), 14]
    finally:
        b.stop()


def test_restore_before_a_moved_log_start_is_refused(tmp_path):
    """DeleteRecords moved partition 0's log start to 30: a time whose records are gone
    is refused, naming the partition; a time after it restores from offset 30."""
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--merge-interval-ms", "0"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("trimmed", 1, 1)])["trimmed"].result(15)
        for r in range(2):
            produce_round(b.bootstrap, "trimmed", 0, [(i, T0 + i * 1000) for i in range(r * 25, r * 25 + 25)])
        admin.delete_records([TopicPartition("trimmed", 0, 30)])[TopicPartition("trimmed", 0, 30)].result(15)
        flags = ["--data-dir", str(tmp_path)]
        done = restore(flags, {}, "trimmed", "--to-time", iso(T0 + 10_000), "--as", "trimmed-early")
        assert done.returncode == 1 and "before the log start of trimmed-0" in done.stderr and "nothing created" in done.stderr, done.stderr
        done = restore(flags, {}, "trimmed", "--to-offset", "20", "--as", "trimmed-early")
        assert done.returncode == 1 and "before the log start" in done.stderr, done.stderr
        assert "trimmed-early" not in admin.list_topics(timeout=10).topics
        assert not (tmp_path / "objects" / NS / "trimmed-early").exists()
        done = restore(flags, {}, "trimmed", "--to-time", iso(T0 + 40_000), "--as", "trimmed-40")
        assert done.returncode == 0, done.stderr
        assert watermarks(b.bootstrap, "trimmed-40", 0) == (30, 41)
        assert consume(b.bootstrap, "trimmed-40", 0, 11) == expected(41)[30:]
    finally:
        b.stop()


async def test_a_copy_that_is_not_the_committed_segment_is_made_again(tmp_path):
    """Segment 0-9's key holds a merged object of 0-19 (a merge replaced it and never
    committed, or committed after the restore read the segment list): the copy is
    rewritten through the committed last offset, so the new topic's segment is 0-9 and its
    size the one committed for it; segment 10-19 is copied as it is."""
    from kafscale.metadata.backends import open_kv
    from kafscale.metadata.store import MetadataStore, TopicMeta
    from kafscale.storage.local_store import LocalObjectStore
    from kafscale.storage.topic_restore import TopicRestore

    md = MetadataStore(open_kv("embedded", tmp_path))
    store = LocalObjectStore(tmp_path / "objects")
    try:
        await md.create_topic(TopicMeta("merged", 1))
        st = await md.get_partition("merged", 0)
        batches = [records.build_batch([(b"k%d" % i, value(i)) for i in range(b, b + 10)], base_offset=b, timestamp=T0 + b,
                                       codec=records.COMPRESSION_ZSTD) for b in (0, 10)]
        for b, buf in zip((0, 10), batches):
            enc = segment.encode([buf], b, created_ms=T0)
            await store.put(segment.segment_key(NS, "merged", 0, b), enc.parts)
            st = await md.commit_segment(st, enc.info)
        first = st.segments[0]
        merged = segment.encode(batches, 0, created_ms=T0)  # what a merge writes under the run's first key
        await store.put(segment.segment_key(NS, "merged", 0, 0), merged.parts)

        done = await TopicRestore(md, store, NS).run("merged", "merged-copy", to_offset=20)
        [part] = done.partitions
        assert (part.segments_copied, part.segments_rewritten, part.end, part.high_watermark) == (1, 1, 20, 20)
        new = await md.get_partition("merged-copy", 0)
        assert [(s.base_offset, s.last_offset) for s in new.segments] == [(0, 9), (10, 19)]
        assert new.segments[0].size == first.size
        again = segment.decode(await store.get(segment.segment_key(NS, "merged-copy", 0, 0)))
        assert [(h.base_offset, h.last_offset) for _pos, h in records.iter_batches(again.batches)] == [(0, 9)]
        assert bytes(again.batches) == batches[0]
    finally:
        await md.close()
