"""The Spark source over offset gaps, as compaction leaves them (issue #16): planning by
offsets, reading segments whose batches skip offsets (inside, between, before and after
them, a segment with none), emptied batches and KIP-534 delete horizons, batch and
streaming, read_committed; and a read planned on byte ranges of an object the compactor
rewrote under the same key afterwards. The segments are the ones tests/support/gaps.py
writes for the broker tests (file object store, namespace "default")."""

from __future__ import annotations

import datetime as dt
import json

import pytest

pyspark = pytest.importorskip("pyspark")

from kafscale.pipeline import segments as seg  # noqa: E402
from kafscale.protocol import records as R  # noqa: E402
from kafscale.storage import segment as S  # noqa: E402
from tests.support.gaps import Rec, Seg, gap_batch, gappy_layout, t0, ts, write_partition_sync  # noqa: E402

NS = "default"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _rows(df) -> list[tuple]:
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"], (r["timestamp"] - EPOCH) // dt.timedelta(milliseconds=1))
        for r in df.select("partition", "offset", "key", "value", "timestamp").toArrow().to_pylist()
    )


def _want(recs: list[Rec], partition: int = 0, lo: int = 0, hi: int = 1 << 62) -> list[tuple]:
    return sorted((partition, r.offset, r.key, r.value, r.timestamp) for r in recs if lo <= r.offset < hi)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """topic gappy (partition 0: the gap layout; 1: ends in a gap) and topic txgaps (a
    committed transaction thinned by compaction, an aborted one emptied, its ABORT marker
    kept, a committed one emptied with its marker gone, then a last record)."""
    root = tmp_path_factory.mktemp("pgaps")
    t = t0()
    segs, survivors = gappy_layout(t)
    write_partition_sync(root, "gappy", 0, segs, partitions=2)
    tail = [Rec(0, ts(t, 0), b"a", b"first"), Rec(3, ts(t, 3), b"b", b"last")]
    write_partition_sync(root, "gappy", 1, [Seg(0, 9, [gap_batch(0, 4, tail)])])
    committed = [Rec(0, ts(t, 0), b"c0", b"yes"), Rec(2, ts(t, 2), b"c2", b"yes")]
    txn = [
        gap_batch(0, 3, committed, producer_id=9, producer_epoch=0, base_sequence=0, attributes=R.TRANSACTIONAL_MASK),
        R.build_control_batch(True, 9, 0, 0, ts(t, 4), base_offset=4),
        gap_batch(5, 7, [], base_timestamp=ts(t, 5), producer_id=10, producer_epoch=0, base_sequence=0, attributes=R.TRANSACTIONAL_MASK),
        R.build_control_batch(False, 10, 0, 0, ts(t, 8), base_offset=8),
        # producer 11's committed transaction emptied, its marker (at 11) gone past its horizon
        gap_batch(9, 10, [], base_timestamp=ts(t, 9), producer_id=11, producer_epoch=0, base_sequence=0, attributes=R.TRANSACTIONAL_MASK),
    ]
    last = Rec(12, ts(t, 12), b"n", b"plain")
    write_partition_sync(root, "txgaps", 0, [Seg(0, 10, txn, aborted=((10, 5, 8),)), Seg(11, 12, [gap_batch(12, 12, [last])])])
    return f"file://{root}/objects", t, survivors, tail, committed + [last]


def _load(spark, url, topic="gappy", **options):
    reader = spark.read.format("kafscale").option("storage", url)
    if "assign" not in options:
        reader = reader.option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def test_batch_read_returns_the_surviving_records(spark, store):
    url, _t, survivors, tail, _ = store
    want = _want(survivors) + _want(tail, 1)
    assert _rows(_load(spark, url)) == want
    # byte ranges of one batch or two (every batch is indexed), offset ranges cut anywhere
    assert _rows(_load(spark, url, maxPartitionBytes="150", packSegments="false")) == want
    assert _rows(_load(spark, url, minPartitions="7")) == want
    assert _rows(_load(spark, url, maxRecordsPerPartition="3", maxPartitionBytes="150")) == want


@pytest.mark.parametrize("start,end", [(0, 35), (1, 3), (3, 9), (5, 14), (6, 16), (9, 10), (10, 13), (14, 31), (16, 30), (20, 35), (30, 35)])
def test_offset_ranges_starting_and_ending_in_gaps(spark, store, start, end):
    url, _t, survivors, _, _ = store
    df = _load(spark, url, assign={"gappy": [0]}, startingOffsets={"gappy": {"0": start}}, endingOffsets={"gappy": {"0": end}}, maxPartitionBytes="150")
    assert _rows(df) == _want(survivors, 0, start, end)


def test_timestamps_and_bounds_over_gaps(spark, store):
    url, t, survivors, _, _ = store
    df = _load(spark, url, assign={"gappy": [0]}, startingTimestamp=str(ts(t, 16)))
    assert _rows(df) == _want(survivors, 0, 30)  # the first record at or after it
    df = _load(spark, url, assign={"gappy": [0]}, startingTimestamp=str(ts(t, 3)))
    assert _rows(df) == _want(survivors, 0, 4)

    async def bounds(s):
        listing = await seg.list_topics(s, NS, topics=["gappy"])
        return await seg.partition_bounds(s, listing)

    b = seg.run_with_store(url, bounds)
    assert (b[("gappy", 0)].start, b[("gappy", 0)].end) == (0, 35)
    assert (b[("gappy", 1)].start, b[("gappy", 1)].end) == (0, 10)  # to the segment's last offset


def test_read_committed_over_compacted_transactions(spark, store, tmp_path):
    url, _t, _s, _tail, committed = store
    assert _rows(_load(spark, url, topic="txgaps", **{"kafka.isolation.level": "read_committed"})) == _want(committed)
    assert _rows(_load(spark, url, topic="txgaps")) == _want(committed)  # the emptied batches have no rows either
    # streaming read_committed: an emptied batch whose marker is gone holds nothing back
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    q = (
        spark.readStream.format("kafscale").option("storage", url).option("subscribe", "txgaps").option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed").load()
        .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    assert _rows(spark.read.parquet(out)) == _want(committed)


def test_stream_across_gaps_in_small_micro_batches(spark, store, tmp_path):
    url, _t, survivors, tail, _ = store
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    q = (
        spark.readStream.format("kafscale").option("storage", url).option("subscribe", "gappy").option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "4").option("maxPartitionBytes", "150").load()
        .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) > 3  # 45 offsets, 4 a micro-batch: many of them, some with no row at all
    assert _rows(spark.read.parquet(out)) == _want(survivors) + _want(tail, 1)


def test_planned_byte_ranges_of_a_rewritten_object_are_replanned(tmp_path):
    """Slices planned on byte ranges of a segment, then the compactor rewrites the segment
    under the same key (records removed, batches moved): each slice still yields exactly
    the survivors of its offsets, once, and none fails."""
    t = t0()
    recs = [Rec(o, ts(t, o), b"k%d" % (o % 4), b"v%d" % o) for o in range(40)]
    batches = [gap_batch(b, b + 3, recs[b : b + 4]) for b in range(0, 40, 4)]
    write_partition_sync(tmp_path, "rw", 0, [Seg(0, 39, batches)])
    url = f"file://{tmp_path}/objects"

    async def plan(s):
        listing = await seg.list_topics(s, NS, topics=["rw"])
        return await seg.plan_slices(s, listing, {("rw", 0): seg.PartitionRange(0, 40)}, max_partition_bytes=len(batches[0]) * 2)

    slices = seg.run_with_store(url, plan)
    assert len(slices) > 3 and all(sl.byte_range and sl.range_bounds for sl in slices)
    # compaction keeps the latest record of each key: offsets 36-39, in the last batch; the
    # other batches are dropped (no producer to keep an empty one for)
    kept = [r for r in recs if r.offset >= 36]
    enc = S.encode([gap_batch(36, 39, kept)], 0, last_offset=39, index_interval=1)

    async def rewrite(s):
        await s.put(S.segment_key(NS, "rw", 0, 0), enc.parts)
        await s.put(S.index_key(NS, "rw", 0, 0), [enc.index])

    seg.run_with_store(url, rewrite)
    opts = seg.ReadOptions(url, NS)
    got = [(sl.start_offset, int(o)) for sl in slices for chunk in seg.read_slice(opts, sl) for o in chunk.offsets]
    assert got == [(sl.start_offset, o) for sl in slices for o in range(36, 40) if sl.start_offset <= o < sl.end_offset]
    assert [o for _s, o in got] == [36, 37, 38, 39]


def test_a_truncated_object_under_planned_ranges_is_reported_when_skipped(tmp_path):
    """A ranged slice whose object was cut short (damage, not a rewrite) re-plans, finds the
    segment unreadable: with failOnCorruption=false its offsets are skipped and reported;
    with true the read fails naming the object."""
    t = t0()
    recs = [Rec(o, ts(t, o), b"k", b"v%d" % o) for o in range(20)]
    batches = [gap_batch(b, b + 3, recs[b : b + 4]) for b in range(0, 20, 4)]
    write_partition_sync(tmp_path, "cut", 0, [Seg(0, 19, batches)])
    url = f"file://{tmp_path}/objects"

    async def plan(s):
        listing = await seg.list_topics(s, NS, topics=["cut"])
        return await seg.plan_slices(s, listing, {("cut", 0): seg.PartitionRange(0, 20)}, max_partition_bytes=len(batches[0]) * 2)

    slices = seg.run_with_store(url, plan)
    assert len(slices) > 1 and slices[-1].byte_range
    path = tmp_path / "objects" / NS / "cut" / "0" / f"segment-{0:020d}.kfs"
    path.write_bytes(path.read_bytes()[: slices[-1].byte_range[0] + 30])  # cut inside the last range
    log_dir = str(tmp_path / "skipped")
    got = [int(o) for chunk in seg.read_slice(seg.ReadOptions(url, NS, fail_on_corruption=False, corruption_log=log_dir), slices[-1]) for o in chunk.offsets]
    assert got == []
    report = seg.read_skip_log(log_dir)
    assert report["offsets_skipped"] == slices[-1].end_offset - slices[-1].start_offset
    with pytest.raises(seg.CorruptSegmentError, match="segment-00000000000000000000.kfs"):
        list(seg.read_slice(seg.ReadOptions(url, NS), slices[-1]))
