"""The `kafscale` Spark source, the sink's row mapping and the ready-made jobs.

Segments are written with the real codec into a file:// store; no broker is involved.
One local SparkSession serves the whole module.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import struct
import sys

import pytest

pyspark = pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

import cramjam  # noqa: E402

from kafscale.pipeline import jobs, read_skip_log  # noqa: E402
from kafscale.pipeline import segments as seg  # noqa: E402
from kafscale.protocol import records as R  # noqa: E402
from kafscale.storage import segment as S  # noqa: E402

NS = "default"
BASE_TS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
DAY_MS = 86_400_000
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


# ---------------------------------------------------------------------------------------
# Writing test segments with the real codec


def _with_body(batch: bytes, codec: int, body: bytes) -> bytes:
    """The same batch re-encoded around another (compressed) records body."""
    h = R.read_header(batch)
    attrs = (h.attributes & ~R.COMPRESSION_MASK) | codec
    after_crc = struct.pack(">hiqqqhii", attrs, h.last_offset_delta, h.first_timestamp, h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) + body
    return struct.pack(">qiib", h.base_offset, 9 + len(after_crc), -1, 2) + struct.pack(">I", R.crc32c(after_crc)) + after_crc


def _xerial(raw: bytes, chunk: int = 64) -> bytes:
    """Snappy in the Java client's xerial framing, small chunks so several are used."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(raw), chunk):
        block = bytes(cramjam.snappy.compress_raw(raw[i : i + chunk]))
        out += struct.pack(">i", len(block)) + block
    return out


class Log:
    """Builds segments for topic partitions and remembers the rows a reader must return."""

    def __init__(self, url: str):
        self.url = url
        self.next_offset: dict[tuple[str, int], int] = {}
        self.expected: dict[str, list[tuple]] = {}

    def batch(self, topic, part, recs, *, codec=R.COMPRESSION_NONE, ts=None, kind="normal"):
        """One batch at the partition's next offset; returns its bytes."""
        base = self.next_offset.get((topic, part), 0)
        ts = BASE_TS + base * 1000 if ts is None else ts
        if kind == "control":
            # an end-transaction marker: occupies an offset, never becomes a row
            buf = R.build_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")], base_offset=base, timestamp=ts, producer_id=7, producer_epoch=0, attributes=R.CONTROL_MASK | R.TRANSACTIONAL_MASK)
        elif kind == "xerial":
            plain = R.build_batch(recs, base_offset=base, timestamp=ts)
            buf = _with_body(plain, R.COMPRESSION_SNAPPY, _xerial(plain[R.HEADER_SIZE :]))
        else:
            buf = R.build_batch(recs, base_offset=base, timestamp=ts, codec=codec)
        row_ts, ts_type = ts, 0
        if kind == "log_append":
            buf = bytearray(buf)
            row_ts, ts_type = ts + 5_000, 1
            R.set_max_timestamp(buf, 0, len(buf), row_ts)
            buf = bytes(buf)
        if kind != "control":
            rows = self.expected.setdefault(topic, [])
            for i, rec in enumerate(recs):
                headers = tuple((k, v) for k, v in rec[2]) if len(rec) > 2 and rec[2] else None
                rows.append((topic, part, base + i, rec[0], rec[1], row_ts, ts_type, headers))
        self.next_offset[(topic, part)] = base + R.read_header(buf).record_count
        return buf

    def put(self, topic, part, batches, *, index_interval=S.DEFAULT_INDEX_INTERVAL, base=None, index=True):
        """Store a segment, with its .index unless index=False (as brokers write segments under
        --index-min-bytes: the reader then measures them by their footer)."""
        base = R.read_header(batches[0]).base_offset if base is None else base
        enc = S.encode(batches, base, index_interval=index_interval)
        key = S.segment_key(NS, topic, part, base)

        async def go(store):
            await store.put(key, enc.parts)
            if index:
                await store.put(S.index_key(NS, topic, part, base), [enc.index])

        seg.run_with_store(self.url, go)
        return key

    def rows(self, topic, pred=lambda r: True):
        return sorted(r for r in self.expected.get(topic, []) if pred(r))


def simple_records(n, start=0, *, headers=False):
    return [(f"k{start + i}".encode(), f"value-{start + i}".encode(), [("n", str(start + i).encode())] if headers else []) for i in range(n)]


def corrupt_object(url: str, key: str, mutate) -> None:
    path = os.path.join(url[len("file://") :], key)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    with open(path, "wb") as f:
        f.write(mutate(data))


# ---------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A store with several topics; see each block for what it exercises."""
    root = tmp_path_factory.mktemp("store")
    log = Log(f"file://{root}")
    t = "events"
    # partition 0: every codec, headers, null key/value, a control batch, LogAppendTime, 2 segments
    b = [
        log.batch(t, 0, [(None, b"a0", [("h1", b"x"), ("h2", None)]), (b"", b"a1"), (b"k2", None), (b"k3", b"a3", [])]),
        log.batch(t, 0, [(b"k4", b"gzip-" * 20), (None, b"a5", [("trace", b"\x00\xff")])], codec=R.COMPRESSION_GZIP),
        log.batch(t, 0, [], kind="control"),
        log.batch(t, 0, [(b"k7", b"snappy-" * 30), (b"k8", b"a8")], codec=R.COMPRESSION_SNAPPY),
    ]
    log.put(t, 0, b, index_interval=2)
    b = [
        log.batch(t, 0, [(b"k9", b"lz4-" * 25, [("h", b"lz4")]), (b"k10", b"a10")], codec=R.COMPRESSION_LZ4),
        log.batch(t, 0, simple_records(3, 11, headers=True), codec=R.COMPRESSION_ZSTD),
        log.batch(t, 0, simple_records(4, 14), kind="xerial"),
        log.batch(t, 0, simple_records(2, 18), kind="log_append"),
    ]
    log.put(t, 0, b, index_interval=3)
    # partition 1: three segments of two batches each, timestamps a day apart per segment,
    # without .index objects (as a broker writes small segments)
    for s in range(3):
        day = BASE_TS + s * DAY_MS
        b = [log.batch(t, 1, simple_records(3, 100 * s), ts=day, codec=s + 1), log.batch(t, 1, simple_records(2, 100 * s + 3, headers=True), ts=day + 60_000)]
        log.put(t, 1, b, index=False)
    # partition 2: one batch, tombstones, no index
    log.put(t, 2, [log.batch(t, 2, [(b"gone", None), (b"kept", b"v"), (None, None)])], index=False)

    # big: one segment of 40 batches x 25 records, indexed every batch, split by bytes
    big = [log.batch("big", 0, simple_records(25, 25 * i), codec=R.COMPRESSION_NONE) for i in range(40)]
    log.put("big", 0, big, index_interval=25)

    # merged: small segments 0, 10, 20 and then a merged segment-0 covering 0..29, as a
    # background merge leaves them until it deletes the small ones
    small = [[log.batch("merged", 0, simple_records(10, 10 * i))] for i in range(3)]
    for batches in small:
        log.put("merged", 0, batches)
    log.put("merged", 0, [b for batches in small for b in batches], base=0)

    # damaged: second batch of a segment has a flipped payload byte
    damaged = [log.batch("damaged", 0, simple_records(5, 5 * i)) for i in range(3)]
    key = log.put("damaged", 0, damaged)
    flip_at = S.HEADER_SIZE + len(damaged[0]) + R.HEADER_SIZE + 3
    corrupt_object(log.url, key, lambda d: d[:flip_at] + bytes([d[flip_at] ^ 0xFF]) + d[flip_at + 1 :])

    # truncated: an intact first segment, then one cut in the middle of its second batch
    log.put("truncated", 0, [log.batch("truncated", 0, simple_records(4))])
    cut = [log.batch("truncated", 0, simple_records(4, 4 + 4 * i)) for i in range(2)]
    key = log.put("truncated", 0, cut, index=False)  # no footer to measure it by: read whole, fails
    cut_at = S.HEADER_SIZE + len(cut[0]) + 20
    corrupt_object(log.url, key, lambda d: d[:cut_at])
    return log


def load(spark, log, **options):
    options.setdefault("includeHeaders", "true")  # as_rows compares headers too
    reader = spark.read.format("kafscale").option("storage", log.url)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v))
    return reader.load()


def _ms(ts: dt.datetime) -> int:
    return (ts - EPOCH) // dt.timedelta(milliseconds=1)


def as_rows(table) -> list[tuple]:
    out = []
    for r in table.to_pylist():
        headers = tuple((h["key"], h["value"]) for h in r["headers"]) if r["headers"] is not None else None
        out.append((r["topic"], r["partition"], r["offset"], r["key"], r["value"], _ms(r["timestamp"]), r["timestampType"], headers))
    return sorted(out)


def error_text(excinfo) -> str:
    return str(excinfo.value)


# ---------------------------------------------------------------------------------------
# Pure planning (no Spark)


def _meta(key, base, last, corrupt=None):
    return seg.SegmentMeta(key, base, last, 1000, (base,), (S.HEADER_SIZE,), corrupt)


def test_segment_without_index_is_measured_by_its_footer(tmp_path):
    url = f"file://{tmp_path}"
    batches = [R.build_batch([(None, b"v%d" % i) for i in range(5)], timestamp=BASE_TS) for _ in range(3)]
    pos = 0
    for i, b in enumerate(batches):  # offsets 0-4, 5-9, 10-14 from base 20
        b = bytearray(b)
        R.patch_batch(b, 0, 20 + 5 * i, 0)
        batches[i] = bytes(b)
    enc = S.encode(batches, 20)
    key = S.segment_key(NS, "t", 0, 20)
    calls = []

    async def go(store):
        await store.put(key, enc.parts)
        real_get = store.get

        async def counting_get(k, start=0, end=None):
            calls.append((k, start, end))
            return await real_get(k, start, end)

        store.get = counting_get
        return await seg.read_segment_meta(store, key, 20)

    meta = seg.run_with_store(url, go)
    assert (meta.base_offset, meta.last_offset, meta.size) == (20, 34, enc.info.size)
    assert meta.index_offsets == () and meta.corrupt is None
    # one miss for the index, no read of the segment's body (the footer came from get_tail)
    assert calls == [(S.index_key(NS, "t", 0, 20), 0, None)]
    assert seg.split_piece(("t", 0), meta, 22, 30, 10) == [seg.SegmentSlice("t", 0, key, 22, 30, None, enc.info.size)]


def test_cover_drops_segments_a_merge_made_redundant():
    metas = [_meta("s0", 0, 29), _meta("s10", 10, 19), _meta("s20", 20, 29), _meta("s30", 30, 39)]
    assert [(m.key, a, b) for m, a, b in seg.cover(metas, 5, 35)] == [("s0", 5, 30), ("s30", 30, 35)]


def test_cover_reports_gaps_unless_told_to_skip():
    metas = [_meta("s0", 0, 9), _meta("s20", 20, 29)]
    with pytest.raises(seg.DataLossError, match="offsets 10..19"):
        seg.cover(metas, 0, 30, tp=("t", 0))
    assert [(m.key, a, b) for m, a, b in seg.cover(metas, 0, 30, fail_on_data_loss=False)] == [("s0", 0, 10), ("s20", 20, 30)]
    # a segment already reported corrupt is skipped without a data-loss error
    metas = [_meta("s0", 0, 9), _meta("s10", 10, 9, corrupt="bad"), _meta("s20", 20, 29)]
    assert [(m.key, a, b) for m, a, b in seg.cover(metas, 0, 30)] == [("s0", 0, 10), ("s20", 20, 30)]


def test_read_survives_a_merge_deleting_the_planned_segment(tmp_path):
    log = Log(f"file://{tmp_path}")
    small = [[log.batch("m", 0, simple_records(10, 10 * i), codec=R.COMPRESSION_LZ4)] for i in range(3)]
    for batches in small:
        log.put("m", 0, batches)

    async def plan(store):
        listing = await seg.list_topics(store, NS, topics=["m"])
        return await seg.plan_slices(store, listing, {("m", 0): seg.PartitionRange(3, 27)})

    slices = seg.run_with_store(log.url, plan)
    assert [s.key.rsplit("-", 1)[1] for s in slices] == ["00000000000000000000.kfs", "00000000000000000010.kfs", "00000000000000000020.kfs"]
    # the merger writes segment-0 covering 0..29, then deletes the small ones
    log.put("m", 0, [b for batches in small for b in batches], base=0)

    async def delete(store):
        await store.delete([S.segment_key(NS, "m", 0, 10), S.segment_key(NS, "m", 0, 20)])

    seg.run_with_store(log.url, delete)
    opts = seg.ReadOptions(log.url, NS)
    offsets = [o for s in slices for cols in seg.read_slice(opts, s) for o in cols.offsets]
    assert offsets == list(range(3, 27))


def test_tiny_segments_of_a_task_are_decoded_together_exactly(tmp_path):
    """A task packed from many tiny segments of several partitions: the slices of a
    partition are decoded in one pass (few chunks, not one per segment), each keeping only
    its offsets, also when slices start and end inside batches (minPartitions cuts)."""
    log = Log(f"file://{tmp_path}")
    codecs = [R.COMPRESSION_NONE, R.COMPRESSION_LZ4, R.COMPRESSION_ZSTD]
    for part in (0, 1):
        for i in range(40):
            log.put("tiny", part, [log.batch("tiny", part, simple_records(3, 100 * part + 3 * i, headers=i % 2 == 0), codec=codecs[i % 3])], index=False)

    async def plan(store):
        listing = await seg.list_topics(store, NS, topics=["tiny"])
        return await seg.plan_slices(store, listing, {("tiny", 0): seg.PartitionRange(2, 119), ("tiny", 1): seg.PartitionRange(0, 120)})

    slices = seg.run_with_store(log.url, plan)
    assert len(slices) == 80
    opts = seg.ReadOptions(log.url, NS)
    chunks = list(seg.read_slices(opts, slices))
    assert len(chunks) == 2  # one per partition
    got = [(s.partition, int(o)) for s, c in chunks for o in c.offsets]
    assert got == [(0, o) for o in range(2, 119)] + [(1, o) for o in range(120)]
    # the same rows as each slice read on its own (the exact path)
    alone = [(s.partition, int(o), v) for s in slices for c in seg.read_slice(opts, s) for o, v in zip(c.offsets, c.values.to_pylist())]
    assert [(s.partition, int(o), v) for s, c in chunks for o, v in zip(c.offsets, c.values.to_pylist())] == alone
    # slices cut inside batches, as minPartitions / maxRecordsPerPartition cut them
    ranges = seg.split_offset_ranges({("tiny", 0): seg.PartitionRange(2, 119)}, max_records=7)
    groups = seg.group_slices([s for s in slices if s.partition == 0], 1 << 30, ranges)
    cut = [int(o) for g in groups for _, c in seg.read_slices(opts, g) for o in c.offsets]
    assert cut == list(range(2, 119))
    # chunks stay about arrowBatchRows rows (here 10: at most one 3-record segment more)
    small = seg.ReadOptions(log.url, NS, batch_rows=10)
    sizes = [len(c) for _, c in seg.read_slices(small, slices)]
    assert sum(sizes) == 237 and max(sizes) <= 12 and len(sizes) >= 20


def test_stream_metadata_cache_follows_merges(tmp_path):
    """A stream's cached segment metadata is used only while the partition's next segment
    starts where the cached one ends: after a merge stored the run under its first key and
    its other segments are gone, the first key is measured again."""
    log = Log(f"file://{tmp_path}")
    small = [[log.batch("mc", 0, simple_records(10, 10 * i))] for i in range(3)]
    for batches in small:
        log.put("mc", 0, batches, index=False)
    cache = seg.MetaCache()

    async def metas(store):
        listing = await seg.list_topics(store, NS, topics=["mc"])
        segs = listing.segments[("mc", 0)]
        got = await seg.fetch_metas(store, segs, cache=cache)
        return [(m.base_offset, m.last_offset) for m in got]

    assert seg.run_with_store(log.url, metas) == [(0, 9), (10, 19), (20, 29)]
    assert set(cache.metas) == {S.segment_key(NS, "mc", 0, b) for b in (0, 10, 20)}
    log.put("mc", 0, [b for batches in small for b in batches], base=0)  # the merger's object under the first key
    # its followers are still listed: the cached extent of the first key is still a valid cover
    assert seg.run_with_store(log.url, metas) == [(0, 9), (10, 19), (20, 29)]

    async def delete(store):
        await store.delete([S.segment_key(NS, "mc", 0, 10), S.segment_key(NS, "mc", 0, 20)])

    seg.run_with_store(log.url, delete)
    assert seg.run_with_store(log.url, metas) == [(0, 29)]


def test_offsets_behind_latest_as_spark_kafka_source_metrics():
    end = {"t": {"0": 10, "1": 5}, "u": {"0": 7}}
    latest = {"t": {"0": 12, "1": 5}, "u": {"0": 13}}
    assert jobs.offsets_behind_latest(end, latest) == {"minOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 6, "avgOffsetsBehindLatest": 8 / 3}
    assert jobs.offsets_behind_latest(json.dumps(end), None) is None


def test_rate_limit_is_proportional_and_exact():
    from kafscale.pipeline.source import _rate_limit

    start = {("t", 0): 0, ("t", 1): 100}
    end = {("t", 0): 30, ("t", 1): 110, ("t", 2): 5}  # t/2 is new: starts at its earliest 0
    limited = _rate_limit(start, end, {("t", 2): 0}, 9)
    assert sum(limited[tp] - start.get(tp, 0) for tp in limited) == 9
    assert limited[("t", 0)] > limited[("t", 1)] - 100
    assert _rate_limit(start, end, {("t", 2): 0}, 1000) == end


def test_options_are_validated():
    from kafscale.pipeline.source import parse_options

    base = {"storage": "file:///x", "subscribe": "a,b"}
    cfg = parse_options({**base, "startingOffsets": '{"a":{"0":23,"1":-2}}'}, streaming=False)
    assert cfg.topics == ("a", "b") and cfg.starting == {"a": {0: 23, 1: -2}} and cfg.ending == "latest"
    assert parse_options(base, streaming=True).starting == "latest"
    for bad, msg in [
        ({"storage": "file:///x"}, "subscribe"),
        ({**base, "subscribePattern": "a.*"}, "exactly one"),
        ({**base, "startingOffsets": '{"c":{"0":1}}'}, "not subscribed"),
        ({**base, "endingOffsets": '{"a":{"0":-2}}'}, "earliest"),
        ({**base, "startingOffsets": "soon"}, "startingOffsets"),
        ({**base, "failOnCorruption": "maybe"}, "failOnCorruption"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_options(bad, streaming=False)


# ---------------------------------------------------------------------------------------
# Batch reads


def test_schema_is_the_kafka_source_schema(spark, data):
    base = "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,timestampType:int"
    assert load(spark, data, subscribe="events").schema.simpleString() == base + ",headers:array<struct<key:string,value:binary>>>"
    # as Spark: no headers column unless includeHeaders=true
    df = load(spark, data, subscribe="events", includeHeaders="false")
    assert df.schema.simpleString() == base + ">"
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"] and df.count() == len(data.rows("events"))


@pytest.mark.parametrize("arrow", ["true", "false"])
def test_batch_read_returns_every_record_exactly(spark, data, arrow):
    df = load(spark, data, subscribe="events", arrow=arrow, packSegments="false")
    assert df.rdd.getNumPartitions() == 6  # one input partition per segment
    assert load(spark, data, subscribe="events").rdd.getNumPartitions() == 1  # packed by bytes (the default)
    got = as_rows(df.toArrow())
    assert got == data.rows("events")
    # spot checks of what the model encodes
    by_offset = {(r[1], r[2]): r for r in got}
    assert by_offset[(0, 0)][3] is None and by_offset[(0, 0)][7] == (("h1", b"x"), ("h2", None))
    assert by_offset[(0, 1)][3] == b"" and by_offset[(0, 3)][7] is None  # empty key; no headers -> null
    assert (0, 6) not in by_offset  # the control batch
    assert by_offset[(0, 19)][6] == 1 and by_offset[(0, 19)][5] == BASE_TS + 18_000 + 5_000  # LogAppendTime
    assert by_offset[(2, 0)][4] is None and by_offset[(2, 2)][3:5] == (None, None)


def test_offset_ranges_from_json_are_exact(spark, data):
    start = {"events": {"0": 2, "1": -2, "2": 1}}
    end = {"events": {"0": 15, "1": -1, "2": 2}}
    got = as_rows(load(spark, data, subscribe="events", startingOffsets=start, endingOffsets=end).toArrow())
    want = data.rows("events", lambda r: (r[1] == 0 and 2 <= r[2] < 15) or r[1] == 1 or (r[1] == 2 and r[2] == 1))
    assert got == want
    # a range that starts inside a batch and ends inside another, on one partition only
    got = as_rows(load(spark, data, subscribe="events", startingOffsets={"events": {"0": 8, "1": 0, "2": 0}}, endingOffsets={"events": {"0": 12, "1": 0, "2": 0}}).toArrow())
    assert [r[2] for r in got] == [8, 9, 10, 11]


def test_large_segment_is_split_by_index_and_stays_exact(spark, data):
    df = load(spark, data, subscribe="big", maxPartitionBytes="4096", startingOffsets={"big": {"0": 13}}, endingOffsets={"big": {"0": 987}})
    assert df.rdd.getNumPartitions() > 5
    got = as_rows(df.toArrow())
    assert [r[2] for r in got] == list(range(13, 987))
    assert got == data.rows("big", lambda r: 13 <= r[2] < 987)


def test_merged_and_small_segments_never_repeat_an_offset(spark, data):
    got = as_rows(load(spark, data, subscribe="merged").toArrow())
    assert got == data.rows("merged") and len(got) == 30


def test_starting_timestamp(spark, data):
    # partition 1 has segments a day apart: start at the second day
    t = BASE_TS + DAY_MS
    got = as_rows(load(spark, data, subscribe="events", startingTimestamp=str(t), startingOffsetsByTimestampStrategy="latest").toArrow())
    assert got == data.rows("events", lambda r: r[1] == 1 and r[2] >= 5)
    # timestamps are per batch here: a time inside partition 0 starts at the next batch
    t0 = BASE_TS + 7_500
    got = as_rows(load(spark, data, subscribe="events", startingTimestamp=str(t0), startingOffsetsByTimestampStrategy="latest").toArrow())
    assert {r[2] for r in got if r[1] == 0} == set(range(9, 20))
    with pytest.raises(Exception) as e:
        load(spark, data, subscribe="events", startingTimestamp=str(BASE_TS + 10 * DAY_MS)).count()
    assert "startingTimestamp" in error_text(e)


def test_subscribe_pattern(spark, data):
    got = as_rows(load(spark, data, subscribePattern="ev.nt?s").toArrow())
    assert got == data.rows("events")


def test_missing_topic_is_an_error(spark, data):
    with pytest.raises(Exception) as e:
        load(spark, data, subscribe="events,nope").count()
    assert "nope" in error_text(e) and "not found" in error_text(e)
    with pytest.raises(Exception) as e:
        load(spark, data, subscribePattern="zz.*").count()
    assert "no topic matching" in error_text(e)


def test_storage_without_kafscale_objects_says_so(tmp_path):
    """Not "topic not found": the storage (or namespace) itself is wrong; and the cause comes
    first, not chained to asyncio's "no running event loop"."""
    from kafscale.pipeline.source import KafScaleBatchReader, parse_options

    for options in ({"subscribe": "orders"}, {"subscribePattern": "ord.*"}):
        with pytest.raises(seg.TopicNotFoundError, match="holds no KafScale objects") as e:
            KafScaleBatchReader(parse_options({"storage": f"file://{tmp_path}", "metadata": "none", **options}, streaming=False)).partitions()
        assert e.value.__context__ is None


def test_corrupt_batch_fails_with_object_and_offset(spark, data):
    with pytest.raises(Exception) as e:
        load(spark, data, subscribe="damaged").count()
    text = error_text(e)
    assert "default/damaged/0/segment-00000000000000000000.kfs" in text
    assert "offset 5" in text and "CRC32C" in text


def test_corrupt_batch_skipped_and_counted_when_allowed(spark, data, tmp_path):
    got = as_rows(load(spark, data, subscribe="damaged", failOnCorruption="false", corruptionLog=str(tmp_path)).toArrow())
    assert got == data.rows("damaged", lambda r: not 5 <= r[2] < 10)
    report = read_skip_log(str(tmp_path))
    assert report["offsets_skipped"] == 5 and report["entries"][0]["offset"] == 5


def test_truncated_segment_fails_or_is_skipped(spark, data, tmp_path):
    with pytest.raises(Exception) as e:
        load(spark, data, subscribe="truncated").count()
    text = error_text(e)
    assert "default/truncated/0/segment-00000000000000000004.kfs" in text and "truncated" in text and "offset 8" in text
    got = as_rows(load(spark, data, subscribe="truncated", failOnCorruption="false", corruptionLog=str(tmp_path)).toArrow())
    assert got == data.rows("truncated", lambda r: r[2] < 4)
    assert read_skip_log(str(tmp_path))["entries"][0]["object"].endswith("segment-00000000000000000004.kfs")


def test_s3_storage(spark, tmp_path):
    """The same reader over the S3 backend (moto): listing, index + tail metadata, ranged reads."""
    if not os.environ.get("KAFSCALE_S3_ENDPOINT"):
        pytest.skip("no moto S3 server")
    url = "s3://pipeline-test/some/prefix"
    seg.run_with_store(url, lambda store: store.create_bucket())
    log = Log(url)
    for part in (0, 1):
        for s in range(2):
            log.put("s3t", part, [log.batch("s3t", part, simple_records(30, 30 * (2 * s + i)), codec=R.COMPRESSION_ZSTD) for i in range(2)], index_interval=30)
    df = load(spark, log, subscribe="s3t", maxPartitionBytes="200", packSegments="false")
    assert df.rdd.getNumPartitions() == 8  # each segment split in two byte ranges
    assert as_rows(df.toArrow()) == log.rows("s3t")


# ---------------------------------------------------------------------------------------
# Streaming


def _run_available_now(spark, url, out, checkpoint, **options):
    reader = spark.readStream.format("kafscale").option("storage", url).option("subscribe", "stream").option("startingOffsets", "earliest").option("includeHeaders", "true")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert not q.isActive
    assert q.exception() is None
    return [p for p in q.recentProgress if p["numInputRows"] > 0]


def test_stream_available_now_resumes_from_checkpoint_without_duplicates(spark, tmp_path):
    log = Log(f"file://{tmp_path / 'store'}")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    for part in (0, 1):
        log.put("stream", part, [log.batch("stream", part, simple_records(6, 100 * part)), log.batch("stream", part, simple_records(5, 100 * part + 6), codec=R.COMPRESSION_ZSTD)])

    def written():
        return as_rows(spark.read.parquet(out).select("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers").toArrow())

    batches = _run_available_now(spark, log.url, out, checkpoint, maxOffsetsPerTrigger="8")
    assert len(batches) == 3 and sum(p["numInputRows"] for p in batches) == 22  # 8 + 8 + 6
    assert written() == log.rows("stream")

    # new segments (one on a new partition) after the first run: only they are read
    log.put("stream", 0, [log.batch("stream", 0, simple_records(4, 11))])
    log.put("stream", 2, [log.batch("stream", 2, simple_records(3, 200))])
    batches = _run_available_now(spark, log.url, out, checkpoint)
    assert sum(p["numInputRows"] for p in batches) == 7
    assert written() == log.rows("stream")
    end = json.loads(batches[-1]["sources"][0]["endOffset"]) if isinstance(batches[-1]["sources"][0]["endOffset"], str) else batches[-1]["sources"][0]["endOffset"]
    assert end == {"stream": {"0": 15, "1": 11, "2": 3}}
    latest = batches[-1]["sources"][0]["latestOffset"]
    assert (json.loads(latest) if isinstance(latest, str) else latest) == end  # reportLatestOffset

    # crash between the sink's write and the commit: the restarted query replays the same
    # offsets (planned deterministically) and the file sink does not add them twice
    commits = sorted(os.listdir(os.path.join(checkpoint, "commits")), key=lambda n: int(n) if n.isdigit() else -1)
    for name in (commits[-1], f".{commits[-1]}.crc"):
        if os.path.exists(os.path.join(checkpoint, "commits", name)):
            os.remove(os.path.join(checkpoint, "commits", name))
    _run_available_now(spark, log.url, out, checkpoint)
    assert written() == log.rows("stream")

    # nothing new: nothing read
    assert _run_available_now(spark, log.url, out, checkpoint) == []
    assert written() == log.rows("stream")


# ---------------------------------------------------------------------------------------
# Jobs


def test_parquet_job_writes_every_row_partitioned_by_topic_and_date(spark, data, tmp_path, capsys):
    out = str(tmp_path / "parquet")
    result = jobs.parquet(data.url, out, topics="events", spark=spark, max_offsets_per_trigger=20)
    assert result.rows == len(data.rows("events")) and result.batches >= 2
    printed = capsys.readouterr().out
    assert "rows" in printed and "events/0" in printed
    # Spark's offsets-behind-latest source metrics, which a Python source cannot report, per batch
    lines = [ln for ln in printed.splitlines() if "] batch " in ln]
    assert "offsets behind latest: max 0, avg 0.0, min 0" in lines[-1]
    assert any("offsets behind latest: max 0," not in ln for ln in lines[:-1])  # the rate-limited batches trail
    df = spark.read.parquet(out)
    got = sorted(df.toArrow().to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    want = data.rows("events")
    assert len(got) == len(want)
    for row, exp in zip(got, sorted(want, key=lambda r: (r[1], r[2]))):
        headers = tuple((h["key"], h["value"]) for h in row["headers"]) if row["headers"] is not None else None
        assert (row["topic"], row["partition"], row["offset"], row["key"], row["value"], _ms(row["timestamp"]), row["timestampType"], headers) == exp
        assert row["date"] == (EPOCH + dt.timedelta(milliseconds=exp[5])).date()
    dirs = sorted(os.path.relpath(root, out) for root, _, files in os.walk(out) if any(f.endswith(".parquet") for f in files))
    assert dirs == ["topic=events/date=2023-11-14", "topic=events/date=2023-11-15", "topic=events/date=2023-11-16"]
    # a second run finds nothing new
    assert jobs.parquet(data.url, out, topics="events", spark=spark).rows == 0
    assert spark.read.parquet(out).count() == len(want)
    # the checkpoint deleted: Spark's file sink would skip the new run's batches; refused, not silent
    shutil.rmtree(os.path.join(out, "_checkpoint"))
    with pytest.raises(ValueError, match="checkpoint .* is gone"):
        jobs.parquet(data.url, out, topics="events", spark=spark)


def test_iceberg_job_is_idempotent_per_batch(spark, data, tmp_path):
    pytest.importorskip("pyiceberg")
    warehouse = str(tmp_path / "warehouse")
    result = jobs.iceberg(data.url, "default.events", topics="events", warehouse=warehouse, spark=spark, max_offsets_per_trigger=25)
    want = data.rows("events")
    assert result.rows == len(want)
    appender = jobs.IcebergAppender("default.events", catalog_properties=jobs.sql_catalog_properties(warehouse))

    def table_rows():
        t = appender.table()
        t.refresh()
        # pyiceberg writes a null list<struct> as an empty list (apache/iceberg-python#3833)
        return [r[:7] + (r[7] or None,) for r in as_rows(t.scan().to_arrow())]

    assert table_rows() == want
    # the same micro-batch delivered again (a retried batch): nothing added
    same_batch = jobs.with_date(load(spark, data, subscribe="events"))
    appender(same_batch, 7)
    appender(same_batch, 7)
    assert table_rows() == want
    # a lost checkpoint replays everything: still no duplicates
    shutil.rmtree(os.path.join(warehouse, "_checkpoints"))
    replay = jobs.iceberg(data.url, "default.events", topics="events", warehouse=warehouse, spark=spark)
    assert replay.rows == len(want)
    assert table_rows() == want


# ---------------------------------------------------------------------------------------
# Sink row mapping (the end-to-end sink test needs a broker: test_pipeline_sink.py)


class FakeProducer:
    def __init__(self, conf, fail=False):
        self.conf, self.sent, self.fail, self.pending = conf, [], fail, []

    def produce(self, topic, value=None, key=None, on_delivery=None, headers=None, partition=None):
        self.sent.append((topic, key, value, headers, partition))
        self.pending.append((topic, partition, on_delivery))

    def poll(self, timeout=0):
        for topic, partition, cb in self.pending:
            err = "broker down" if self.fail else None
            cb(err, type("Msg", (), {"topic": lambda s: topic, "partition": lambda s: partition if partition is not None else -1})())
        self.pending = []
        return 0

    def flush(self, timeout=None):
        self.poll()
        return 0


def test_sink_maps_rows_and_arrow_batches_to_messages():
    from pyspark.sql import Row
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    from kafscale.pipeline import sink
    from kafscale.pipeline.source import kafka_schema

    cfg = sink.parse_sink_options({"bootstrap": "h:1", "topic": "out", "kafka.linger.ms": "1"}, kafka_schema())
    assert cfg.producer_config == (("linger.ms", "1"),)
    made = []

    def factory(conf):
        made.append(FakeProducer(conf))
        return made[-1]

    rows = [Row(key=b"k", value=b"v", topic="ignored", headers=[Row(key="h", value=b"x")]), Row(key=None, value=b"w", topic="ignored", headers=None)]
    assert sink.produce_all(cfg, rows, factory).rows == 2
    assert made[0].conf["bootstrap.servers"] == "h:1"
    assert made[0].sent == [("out", b"k", b"v", [("h", b"x")], None), ("out", None, b"w", None, None)]

    schema = StructType([StructField("value", StringType()), StructField("topic", StringType()), StructField("partition", IntegerType()), StructField("key", BinaryType())])
    cfg = sink.parse_sink_options({"bootstrap": "h:1"}, schema)
    batch = pa.RecordBatch.from_pylist([{"value": "text", "topic": "t1", "partition": 3, "key": b"k"}])
    sink.produce_all(cfg, [batch], factory)
    assert made[1].sent == [("t1", b"k", b"text", None, 3)]

    with pytest.raises(RuntimeError, match="broker down"):
        sink.produce_all(cfg, [batch], lambda conf: FakeProducer(conf, fail=True))
    with pytest.raises(ValueError, match="value column"):
        sink.parse_sink_options({"bootstrap": "h:1", "topic": "t"}, StructType([StructField("key", BinaryType())]))
