"""The Spark source with kafka.isolation.level=read_committed: segments written by the real
partition log (transactional batches and markers through LogManager, in process) into a
file:// store, then read straight from the segments (without a metadata store, which sees
segment objects only: write-ahead pieces are rewritten into them first), or with the
metadata store, wherever the records live: read_committed returns exactly the committed
records (nothing of an aborted or still open transaction, no control batch),
read_uncommitted (Spark's default) every record."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pyspark")

from kafscale.metadata.store import TopicMeta  # noqa: E402
from kafscale.pipeline import segments as seg  # noqa: E402
from kafscale.storage.local_store import LocalObjectStore  # noqa: E402
from kafscale.storage.txn import TxnMarker  # noqa: E402
from tests.test_txn_partition import PID_A, PID_B, _manager, _produce, plain_batch, txn_batch  # noqa: E402

TOPIC = "txns"
COMMITTED = [b"p0", b"b1", b"p1"]  # a1, a2 aborted; a3 open (and p2 after it)
EVERYTHING = [b"p0", b"a1", b"a2", b"b1", b"p1", b"a3", b"p2"]


async def _into_segments(mgr) -> None:
    """The partition's pieces in write-ahead objects (with --write-ahead-objects) rewritten
    into its own segment objects now, as the merger does after --segment-max-age-ms."""
    mgr.merger.segment_max_age_ms = 0
    await mgr.merger.run_once(merge_small=False)
    st = await mgr.metadata.get_partition(TOPIC, 0)
    assert st.segments and not any(s.wao_key for s in st.segments), st.segments


async def _write(tmp_path, into_segments: bool = True) -> None:
    mgr = _manager(tmp_path)
    await mgr.metadata.create_topic(TopicMeta(TOPIC, 1))
    lg = await mgr.get_log(TOPIC, 0)
    await _produce(lg, plain_batch(b"p0"))  # 0
    await _produce(lg, txn_batch([b"a1", b"a2"], PID_A, 0))  # 1, 2
    await _produce(lg, txn_batch([b"b1"], PID_B, 0))  # 3
    await mgr.write_txn_markers(TxnMarker(PID_A, 0, 0, False, [(TOPIC, 0)]))  # 4
    await mgr.write_txn_markers(TxnMarker(PID_B, 0, 0, True, [(TOPIC, 0)]))  # 5
    await _produce(lg, plain_batch(b"p1"))  # 6
    await _produce(lg, txn_batch([b"a3"], PID_A, 2))  # 7: left open
    await _produce(lg, plain_batch(b"p2"))  # 8
    if into_segments:
        await _into_segments(mgr)
    await mgr.stop()


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("txnstore")
    asyncio.run(_write(root))
    return root


def test_transaction_outcomes_from_the_segments_alone(store_dir):
    async def go():
        store = LocalObjectStore(store_dir / "objects")
        listing = await seg.list_topics(store, "default", topics=[TOPIC])
        segs = listing.segments[(TOPIC, 0)]
        return [await seg.transaction_outcomes(store, segs, a, b) for a, b in ((0, 9), (0, 7), (3, 9), (5, 7), (8, 9))]

    assert asyncio.run(go()) == [(7, ((PID_A, 1, 4),)), (7, ((PID_A, 1, 4),)), (7, ()), (7, ()), (9, ())]


@pytest.fixture(scope="module")
def pieces_dir(tmp_path_factory):
    """The same records as flushed: with write-ahead objects, pieces of them still."""
    root = tmp_path_factory.mktemp("txnpieces")
    asyncio.run(_write(root, into_segments=False))
    return root


def _values(spark, store_dir, **options) -> list[bytes]:
    reader = spark.read.format("kafscale").option("storage", f"file://{store_dir / 'objects'}").option("subscribe", TOPIC)
    options.setdefault("metadata", "none")
    for k, v in options.items():
        reader = reader.option(k, v)
    rows = reader.load().orderBy("offset").collect()
    return [bytes(r["value"]) for r in rows]


@pytest.mark.parametrize("arrow", ["true", "false"])
def test_spark_read_committed_returns_exactly_the_committed_records(spark, store_dir, arrow):
    assert _values(spark, store_dir, arrow=arrow) == EVERYTHING  # Spark's default: read_uncommitted
    assert _values(spark, store_dir, arrow=arrow, **{"kafka.isolation.level": "read_committed"}) == COMMITTED
    assert _values(spark, store_dir, arrow=arrow, isolationLevel="read_committed") == COMMITTED
    assert _values(spark, store_dir, arrow=arrow, isolationLevel="read_uncommitted") == EVERYTHING


def test_spark_read_committed_with_the_metadata_store_wherever_the_records_live(spark, pieces_dir):
    """The reader given the metadata store reads the committed segment list, pieces of
    write-ahead objects included: every record from its acknowledgement on."""
    metadata = str(pieces_dir / "meta.sqlite")
    assert _values(spark, pieces_dir, metadata=metadata) == EVERYTHING
    assert _values(spark, pieces_dir, metadata=metadata, isolationLevel="read_committed") == COMMITTED


def test_isolation_level_options_are_validated():
    from kafscale.pipeline.source import parse_options

    base = {"storage": "file:///x", "subscribe": "t"}
    assert parse_options({**base, "kafka.isolation.level": "read_committed"}, streaming=False).read_committed
    assert not parse_options(base, streaming=False).read_committed
    with pytest.raises(ValueError, match="read_uncommitted or read_committed"):
        parse_options({**base, "isolationLevel": "serializable"}, streaming=False)
    assert parse_options({**base, "isolationLevel": "read_committed"}, streaming=True).read_committed


def test_read_committed_with_min_partitions_splitting_the_range(spark, store_dir):
    got = _values(spark, store_dir, isolationLevel="read_committed", minPartitions="4")
    assert got == COMMITTED


def test_stream_read_committed_holds_an_open_transaction_back_until_its_marker(spark, tmp_path):
    asyncio.run(_write(tmp_path))
    url, out, checkpoint = f"file://{tmp_path / 'objects'}", str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run() -> list[bytes]:
        reader = spark.readStream.format("kafscale").option("storage", url).option("subscribe", TOPIC)
        reader = reader.option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed").option("maxOffsetsPerTrigger", "2")
        q = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        q.awaitTermination(120)
        assert not q.isActive and q.exception() is None
        return [bytes(r["value"]) for r in spark.read.parquet(out).orderBy("offset").collect()]

    assert run() == COMMITTED  # a3 (open) and p2 after it wait

    async def commit_a3():
        mgr = _manager(tmp_path)
        lg = await mgr.get_log(TOPIC, 0)
        assert lg.last_stable_offset == 7  # the open transaction came back with the restart
        await mgr.write_txn_markers(TxnMarker(PID_A, 0, 0, True, [(TOPIC, 0)]))  # 9
        await _produce(lg, plain_batch(b"p3"))  # 10
        await _into_segments(mgr)
        await mgr.stop()

    asyncio.run(commit_a3())
    assert run() == COMMITTED + [b"a3", b"p2", b"p3"]


def test_stream_latest_read_committed_starts_at_the_last_stable_offset(spark, broker, topic_name, tmp_path):
    """A Kafka consumer in read_committed that seeks to the end lands at the last stable
    offset: a transaction open when the stream starts at "latest" is delivered once it
    commits (exactly once), an aborted one never, records before it never."""
    import os

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.support.broker import wait_for_leader
    from tests.support.wait import wait_until

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic_name, 1, 1)]).values():
        f.result(30)
    plain = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    wait_for_leader(plain, topic_name)
    plain.produce(topic_name, b"before")
    assert plain.flush(30) == 0

    def txn_producer(tid: str) -> Producer:
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{topic_name}-{tid}", "transaction.timeout.ms": 60000})
        p.init_transactions(30)
        p.begin_transaction()
        return p

    committed, aborted = txn_producer("c"), txn_producer("a")
    for v in (b"t1-a", b"t1-b"):
        committed.produce(topic_name, v)
    assert committed.flush(30) == 0  # acknowledged: in a flushed segment, still undecided
    aborted.produce(topic_name, b"t2-x")
    assert aborted.flush(30) == 0

    storage = "file://" + os.path.join(os.path.abspath(broker.data_dir), "objects")
    out = str(tmp_path / "out")
    q = (
        spark.readStream.format("kafscale").option("storage", storage).option("subscribe", topic_name)
        .option("startingOffsets", "latest").option("kafka.isolation.level", "read_committed").load()
        .writeStream.format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds").start()
    )
    try:
        wait_until(lambda: q.recentProgress, 60, "the stream's first trigger (its starting offsets resolved)")
        assert q.isActive, q.exception()
        committed.commit_transaction(30)
        aborted.abort_transaction(30)
        plain.produce(topic_name, b"after")
        assert plain.flush(30) == 0

        def output() -> list[bytes] | None:
            if q.exception() is not None:
                raise AssertionError(str(q.exception()))
            if not os.path.isdir(os.path.join(out, "_spark_metadata")):
                return None
            got = [bytes(r["value"]) for r in spark.read.parquet(out).orderBy("offset").collect()]
            return got if b"after" in got else None

        got = wait_until(output, 60, "the committed transaction and the record after it in the output")
        assert got == [b"t1-a", b"t1-b", b"after"]
    finally:
        q.stop()
