"""The Spark source reads records held in write-ahead objects (issue #32): a topic written
by a real broker with --write-ahead-objects, read in batch and as a stream before the
broker rewrote its data into segment objects and after, every record once at its offset;
an object whose commit never happened yields nothing; where a segment object and a piece
hold the same offsets, the segment object is read."""

from __future__ import annotations

import dataclasses
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
