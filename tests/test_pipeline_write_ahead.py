"""The Spark source reads records held in write-ahead objects (issue #32): a topic written
by a real broker with --write-ahead-objects, read in batch and as a stream before the
broker rewrote its data into segment objects and after, every record once at its offset;
an object whose commit never happened yields nothing; where a segment object and a piece
hold the same offsets, the segment object is read."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.pipeline import segments as seg
from kafscale.protocol import records
from kafscale.storage import segment, write_ahead
from tests.support.wait import wait_until

NO_REWRITE = ["--write-ahead-objects", "true", "--merge-interval-ms", "0"]
REWRITE = ["--write-ahead-objects", "true", "--merge-interval-ms", "100", "--merge-grace-ms", "300",
           "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "4000"]  # fmt: skip
PARTS = 3


def _wal_objects(data_dir: str) -> list[Path]:
    d = Path(data_dir) / "objects" / "default" / "~wal"
    return sorted(d.glob("*.wal")) if d.exists() else []


def _spec_segments(data_dir: str, topic: str) -> list[Path]:
    return sorted((Path(data_dir) / "objects" / "default" / topic).rglob("segment-*.kfs"))


def _create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(15)


def _produce(bootstrap: str, topic: str, rounds: range, per_round: int) -> list[tuple[int, int, bytes]]:
    """Records to every partition, one flush (one write-ahead object) per round; the
    acknowledged (partition, offset, value)s."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    acked: list[tuple[int, int, bytes]] = []
    for r in rounds:
        for i in range(per_round):
            part = i % PARTS
            p.produce(topic, value=b"r%d-%d" % (r, i), partition=part,
                      on_delivery=lambda e, m: acked.append((m.partition(), m.offset(), m.value())) if e is None else None)  # fmt: skip
        assert p.flush(15) == 0
    return acked


def _orphan_object(data_dir: str, topic: str, base: int) -> Path:
    """A write-ahead object uploaded whose commit never happened (a kill -9 in between): a
    piece of partition 0 at the offsets its next records will get."""
    created = int(time.time() * 1000)
    batch = bytearray(records.build_batch([(None, b"never committed")], timestamp=created))
    records.patch_batch(memoryview(batch), 0, base, 0)
    enc = segment.encode([bytes(batch)], base, created_ms=created)
    obj = write_ahead.encode([(topic, "00000000-0000-0000-0000-000000000001", 0, enc)], created)
    path = Path(data_dir) / "objects" / write_ahead.object_key("default", created, 0, "orphan", 1)
    path.write_bytes(b"".join(bytes(x) for x in obj.parts))
    return path


def _batch_rows(spark, data_dir: str, topic: str) -> list[tuple[int, int, bytes]]:
    df = spark.read.format("kafscale").option("storage", f"file://{data_dir}/objects").option("subscribe", topic).load()
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in df.select("partition", "offset", "value").collect())


def _stream_available_now(spark, data_dir: str, topic: str, out: str, checkpoint: str) -> int:
    reader = spark.readStream.format("kafscale").option("storage", f"file://{data_dir}/objects").option("subscribe", topic)
    q = reader.option("startingOffsets", "earliest").load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert not q.isActive and q.exception() is None
    return sum(p["numInputRows"] for p in q.recentProgress)


def _parquet_rows(spark, out: str) -> list[tuple[int, int, bytes]]:
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in spark.read.parquet(out).select("partition", "offset", "value").collect())


def test_spark_reads_write_ahead_objects_before_and_after_the_rewrite(spark, broker_factory, topic_name, tmp_path):
    b = broker_factory(extra_args=NO_REWRITE)
    _create(b.bootstrap, topic_name)
    acked = _produce(b.bootstrap, topic_name, range(3), 30)
    assert len(acked) == 90
    assert _wal_objects(b.data_dir) and not _spec_segments(b.data_dir, topic_name)  # all in write-ahead objects
    orphan = _orphan_object(b.data_dir, topic_name, base=max(o for p, o, _ in acked if p == 0) + 1)

    # before the rewrite: batch and stream read every committed record once, nothing of the orphan
    assert _batch_rows(spark, b.data_dir, topic_name) == sorted(acked)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    assert _stream_available_now(spark, b.data_dir, topic_name, out, checkpoint) == 90
    assert _parquet_rows(spark, out) == sorted(acked)

    # the same broker with its rewrite on: more records, then everything moves into segment
    # objects and the write-ahead objects (the orphan too) are deleted
    b.stop()
    b.extra_args = REWRITE
    b.start()
    acked += _produce(b.bootstrap, topic_name, range(3, 5), 30)
    assert len(acked) == 150
    wait_until(lambda: not _wal_objects(b.data_dir), 60, "every piece rewritten and every write-ahead object deleted", interval=0.2)
    assert not orphan.exists()
    assert {f.parent.name for f in _spec_segments(b.data_dir, topic_name)} == {str(p) for p in range(PARTS)}
    assert _batch_rows(spark, b.data_dir, topic_name) == sorted(acked)
    assert _stream_available_now(spark, b.data_dir, topic_name, out, checkpoint) == 60  # only the new ones
    assert _parquet_rows(spark, out) == sorted(acked)


def test_stream_picks_up_records_still_in_write_ahead_objects_after_segments(spark, broker_factory, topic_name, tmp_path):
    """A stream over a partition whose older data is in segment objects and newer data in
    write-ahead objects (the rewrite runs behind the flushes)."""
    b = broker_factory(extra_args=REWRITE)
    _create(b.bootstrap, topic_name)
    acked = _produce(b.bootstrap, topic_name, range(2), 30)
    wait_until(lambda: not _wal_objects(b.data_dir), 60, "the first records rewritten", interval=0.2)
    b.stop()
    b.extra_args = NO_REWRITE
    b.start()
    acked += _produce(b.bootstrap, topic_name, range(2, 4), 30)
    assert _wal_objects(b.data_dir)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    assert _stream_available_now(spark, b.data_dir, topic_name, out, checkpoint) == 120
    assert _parquet_rows(spark, out) == sorted(acked)
    assert _batch_rows(spark, b.data_dir, topic_name) == sorted(acked)


def test_a_segment_object_wins_over_a_piece_with_the_same_offsets(tmp_path):
    """The rewrite committed between the reader's metadata read and its listing: the
    partition's offsets are both in a segment object and in a piece; the plan reads the
    segment object, and a piece read on its own gives the same records."""
    url = f"file://{tmp_path}"
    batch = bytearray(records.build_batch([(None, b"v%d" % i) for i in range(5)], timestamp=1_700_000_000_000))
    records.patch_batch(memoryview(batch), 0, 0, 0)
    enc = segment.encode([bytes(batch)], 0, created_ms=1_700_000_000_000)
    obj = write_ahead.encode([("t", "00000000-0000-0000-0000-000000000002", 0, enc)], 1_700_000_000_000)
    wao = write_ahead.object_key("default", 1_700_000_000_000, 0, "w", 1)
    info = dataclasses.replace(enc.info, wao_key=wao, wao_position=obj.pieces[0].position)
    piece = seg.piece_key(info)

    async def setup_and_plan(store):
        await store.put(wao, obj.parts)
        await store.put(segment.segment_key("default", "t", 0, 0), enc.parts)
        listing = await seg.list_topics(store, "default", topics=["t"], pieces={("t", 0): [(0, piece)]})
        assert listing.segments[("t", 0)] == [(0, segment.segment_key("default", "t", 0, 0))]
        return await seg.plan_slices(store, listing, {("t", 0): seg.PartitionRange(0, 5)})

    slices = seg.run_with_store(url, setup_and_plan)
    assert [(s.key, s.start_offset, s.end_offset) for s in slices] == [(segment.segment_key("default", "t", 0, 0), 0, 5)]
    opts = seg.ReadOptions(url)
    from_segment = [c for _, c in seg.read_slices(opts, slices)]
    from_piece = list(seg.read_slice(opts, seg.SegmentSlice("t", 0, piece, 0, 5)))

    def rows(chunks):
        return [(int(o), bytes(v)) for c in chunks for o, v in zip(c.offsets, c.values.to_pylist())]

    assert rows(from_piece) == rows(from_segment) == [(i, b"v%d" % i) for i in range(5)]


def _stream_end(q, topic: str) -> dict[int, int]:
    """The end offsets per partition of a stream's last micro-batch ({} before the first)."""
    p = q.lastProgress
    if not p or not p["sources"]:
        return {}
    end = p["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    return {int(k): int(v) for k, v in (end or {}).get(topic, {}).items()}


def test_stream_reading_while_the_data_moves_into_segments_sees_every_record_once(spark, broker_factory, topic_name):
    """A running stream (a few offsets a micro-batch, so it reads behind the producer)
    over partitions whose data the broker moves from write-ahead objects into segment
    objects under it (pieces rewritten 1.5 s after their flush, their objects deleted
    from 2 s on after a 200 ms grace), and merges those segments further: a micro-batch
    may plan on pieces and read after they moved. Every acknowledged record comes out
    once, at its offset, and the stream's reads crossed the move."""
    b = broker_factory(extra_args=["--write-ahead-objects", "true", "--merge-interval-ms", "100", "--merge-grace-ms", "200",
                                   "--segment-max-age-ms", "1500", "--write-ahead-orphan-age-ms", "2000"])  # fmt: skip
    _create(b.bootstrap, topic_name)
    acked: list[tuple[int, int, bytes]] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all"})
    now = int(time.time() * 1000)

    def produce(rounds: range) -> None:
        for r in rounds:
            for i in range(PARTS * 4):
                p.produce(topic_name, value=b"r%03d-%d" % (r, i), partition=i % PARTS, timestamp=now,
                          on_delivery=lambda e, m: acked.append((m.partition(), m.offset(), m.value())) if e is None else None)  # fmt: skip
            assert p.flush(15) == 0  # one write-ahead object per round

    produce(range(10))
    name = "wal_race_" + "".join(c if c.isalnum() else "_" for c in topic_name)
    q = (
        spark.readStream.format("kafscale").option("storage", f"file://{b.data_dir}/objects").option("subscribe", topic_name)
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "36").load()
        .writeStream.format("memory").queryName(name).trigger(processingTime="100 milliseconds").start()
    )
    try:
        wait_until(lambda: q.exception() is not None or _stream_end(q, topic_name), 120, "the stream's first micro-batch", interval=0.05)
        assert q.exception() is None, q.exception()
        rounds, seen, read_when_moved = 10, set(), None
        # keep producing while the stream reads and the broker rewrites and deletes under it
        while read_when_moved is None or rounds < 40:
            produce(range(rounds, rounds + 2))
            rounds += 2
            now_there = set(_wal_objects(b.data_dir))
            if read_when_moved is None and seen - now_there:
                read_when_moved = sum(_stream_end(q, topic_name).values())
            seen |= now_there
            assert q.exception() is None, q.exception()
            assert rounds < 400, "no write-ahead object was ever deleted"
        ends = {part: 1 + max(o for pp, o, _v in acked if pp == part) for part in range(PARTS)}
        assert read_when_moved < sum(ends.values()), "the stream read everything before the data moved: nothing crossed"
        wait_until(lambda: q.exception() is not None or _stream_end(q, topic_name) == ends, 180, "the stream to reach the end of the log", interval=0.2)
        assert q.exception() is None, q.exception()
        got = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in spark.sql(f"select partition, offset, value from {name}").collect())
    finally:
        q.stop()
    assert got == sorted(acked)  # every record once, at its offset
    assert _spec_segments(b.data_dir, topic_name)


def _rows_of(reader, parts) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of what the stream reader's read() gives for its input
    partitions, in the order it gives them (arrow batches or row tuples)."""
    out = []
    for part in parts:
        for item in reader.read(part):
            for r in item.to_pylist() if hasattr(item, "to_pylist") else [dict(zip(("key", "value", "topic", "partition", "offset"), item))]:
                out.append((r["partition"], r["offset"], bytes(r["value"])))
    return out


def test_a_micro_batch_planned_on_pieces_reads_them_after_they_moved_and_their_objects_are_gone(broker_factory, topic_name):
    """The streaming source's steps as Spark calls them, with the broker's rewrite and the
    write-ahead cleanup run to the end in between: one micro-batch planned (input
    partitions on pieces of write-ahead objects), another with only its end offsets
    chosen (latestOffset); then every piece moves into segment objects and every object
    is deleted; then the planned batch is read and the other planned and read. Both give
    every record once, in order, at its offset (the reads re-plan from the segment
    objects), and the next micro-batch goes on from there."""
    from kafscale.pipeline.options import parse_options
    from kafscale.pipeline.source import KafScaleStreamReader

    b = broker_factory(extra_args=NO_REWRITE)
    _create(b.bootstrap, topic_name)
    acked = _produce(b.bootstrap, topic_name, range(4), 30)
    assert _wal_objects(b.data_dir) and not _spec_segments(b.data_dir, topic_name)
    cfg = parse_options({"storage": f"file://{b.data_dir}/objects", "subscribe": topic_name, "startingOffsets": "earliest"}, streaming=True)
    planned, chosen = KafScaleStreamReader(cfg), KafScaleStreamReader(cfg)
    start = planned.initialOffset()
    end = planned.latestOffset(start, planned.getDefaultReadLimit())
    parts = planned.partitions(start, end)
    keys = [s.key for p in parts for s in (p.value if isinstance(p.value, tuple) else (p.value,))]
    assert keys and all(seg.parse_piece_key(k) for k in keys), keys  # planned on pieces of write-ahead objects
    assert chosen.latestOffset(chosen.initialOffset(), chosen.getDefaultReadLimit()) == end

    b.stop()
    b.extra_args = REWRITE
    b.start()
    more = _produce(b.bootstrap, topic_name, range(4, 5), 30)  # (loads the partitions: their rewrite starts)
    wait_until(lambda: not _wal_objects(b.data_dir), 60, "every piece rewritten and every write-ahead object deleted", interval=0.1)

    for reader, input_parts in ((planned, parts), (chosen, chosen.partitions(start, end))):
        rows = _rows_of(reader, input_parts)
        assert sorted(rows) == sorted(acked)  # each once, at its offset
        for q in range(PARTS):
            assert [o for pp, o, _v in rows if pp == q] == list(range(40))  # in order
    nxt = planned.latestOffset(end, planned.getDefaultReadLimit())
    assert sorted(_rows_of(planned, planned.partitions(end, nxt))) == sorted(more)
