"""The `kafscale` Spark data source: batch and streaming reads straight from segment objects.

    from kafscale.pipeline import register
    register(spark)
    df = (spark.read.format("kafscale")
          .option("storage", "s3://bucket/prefix").option("subscribe", "orders")
          .load())

Rows have the schema of Spark's Kafka source (with headers). Only flushed segments are read:
records a broker still buffers are invisible until their segment is written, so "latest" is
the end of the last flushed segment. See docs/pipeline.md for all options.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafscale.pipeline import segments as seg
from kafscale.pipeline.segments import EARLIEST, LATEST, PartitionRange, TopicPartition

try:  # admission control and Trigger.AvailableNow for Python sources arrived in Spark 4.2
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

    HAS_ADMISSION_CONTROL = True
except ImportError:  # older pyspark: no read limits; latestOffset() is called without arguments
    HAS_ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        max_rows: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = logging.getLogger("kafscale.pipeline")

NAME = "kafscale"


def kafka_schema() -> StructType:
    """The schema of Spark's Kafka source with includeHeaders=true."""
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))),
        ]
    )


# ---------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class SourceConfig:
    storage: str
    namespace: str
    topics: tuple[str, ...] | None
    pattern: str | None
    starting: Any  # "earliest" | "latest" | {topic: {partition: offset}}
    ending: Any  # "latest" | {topic: {partition: offset}}
    starting_timestamp: int | None
    timestamp_strategy: str  # "error" | "latest"
    max_offsets_per_trigger: int | None
    arrow: bool
    fail_on_corruption: bool
    fail_on_data_loss: bool
    corruption_log: str | None
    max_partition_bytes: int
    batch_rows: int
    pack_segments: bool = False

    def read_options(self) -> seg.ReadOptions:
        return seg.ReadOptions(self.storage, self.namespace, self.fail_on_corruption, self.corruption_log, self.batch_rows)


def _bool(options, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, not {raw!r}")


def _int(options, name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {raw!r}") from None


def _offsets_spec(options, name: str, default: str, allowed: tuple[str, ...]):
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip()
    if text.lower() in allowed:
        return text.lower()
    try:
        spec = json.loads(text)
    except ValueError:
        raise ValueError(f"option {name} must be {' or '.join(allowed)} or JSON like {{\"topic\":{{\"0\":23}}}}, not {text!r}") from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ValueError(f"option {name}: JSON must map topic -> {{partition: offset}}, got {text!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in spec.items():
        out[topic] = {}
        for p, off in parts.items():
            if not str(p).lstrip("-").isdigit() or not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
                raise ValueError(f"option {name}: bad entry {topic}/{p}: {off!r} (offsets are >= 0, -2 earliest, -1 latest)")
            out[topic][int(p)] = off
    return out


def parse_options(options, *, streaming: bool) -> SourceConfig:
    storage = options.get("storage")
    if not storage:
        raise ValueError("option storage is required (file:///path or s3://bucket/prefix, as the broker's --storage)")
    subscribe, pattern = options.get("subscribe"), options.get("subscribePattern")
    if bool(subscribe) == bool(pattern):
        raise ValueError("give exactly one of the options subscribe (comma-separated topics) or subscribePattern (regex)")
    topics = tuple(t.strip() for t in subscribe.split(",") if t.strip()) if subscribe else None
    if subscribe and not topics:
        raise ValueError("option subscribe names no topic")
    starting = _offsets_spec(options, "startingOffsets", "latest" if streaming else "earliest", ("earliest", "latest"))
    if streaming and options.get("endingOffsets") is not None:
        raise ValueError("endingOffsets is for batch reads only")
    ending = _offsets_spec(options, "endingOffsets", "latest", ("latest",))
    if isinstance(ending, dict) and any(off == EARLIEST for parts in ending.values() for off in parts.values()):
        raise ValueError("endingOffsets: -2 (earliest) is not allowed as an ending offset")
    strategy = str(options.get("startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise ValueError("startingOffsetsByTimestampStrategy must be error or latest")
    max_per_trigger = _int(options, "maxOffsetsPerTrigger", None)
    if max_per_trigger is not None and max_per_trigger <= 0:
        raise ValueError("maxOffsetsPerTrigger must be positive")
    cfg = SourceConfig(
        storage=storage,
        namespace=options.get("namespace") or "default",
        topics=topics,
        pattern=pattern or None,
        starting=starting,
        ending=ending,
        starting_timestamp=_int(options, "startingTimestamp", None),
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_per_trigger,
        arrow=_bool(options, "arrow", True),
        fail_on_corruption=_bool(options, "failOnCorruption", True),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        corruption_log=options.get("corruptionLog") or None,
        max_partition_bytes=_int(options, "maxPartitionBytes", seg.DEFAULT_MAX_PARTITION_BYTES) or seg.DEFAULT_MAX_PARTITION_BYTES,
        batch_rows=_int(options, "arrowBatchRows", seg.DEFAULT_ARROW_BATCH_ROWS) or seg.DEFAULT_ARROW_BATCH_ROWS,
        pack_segments=_bool(options, "packSegments", False),
    )
    for name, spec in (("startingOffsets", cfg.starting), ("endingOffsets", cfg.ending)):
        if isinstance(spec, dict):
            for topic in spec:
                if not _subscribed(cfg, topic):
                    raise ValueError(f"{name} names topic {topic!r}, which is not subscribed")
    return cfg


def _subscribed(cfg: SourceConfig, topic: str) -> bool:
    import re

    return topic in cfg.topics if cfg.topics is not None else re.fullmatch(cfg.pattern, topic) is not None


# ---------------------------------------------------------------------------------------
# Offsets


def offsets_json(offsets: dict[TopicPartition, int]) -> dict:
    """Spark Kafka style {topic: {"partition": offset}} with a stable key order.

    Spark compares serialized offsets, so the same positions must always print the same.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = offsets[(topic, part)]
    return out


def offsets_from_json(data: dict | None) -> dict[TopicPartition, int]:
    if not data:
        return {}
    return {(topic, int(p)): int(off) for topic, parts in data.items() for p, off in parts.items()}


async def _resolve(store, cfg: SourceConfig, listing: seg.TopicListing, bounds: dict[TopicPartition, PartitionRange], spec, *, is_start: bool) -> dict[TopicPartition, int]:
    """Concrete offsets for a starting/ending spec over the listed partitions."""
    known = set(listing.partitions())
    if isinstance(spec, dict):
        for topic, parts in spec.items():
            for p in parts:
                if (topic, p) not in known:
                    kind = "startingOffsets" if is_start else "endingOffsets"
                    raise seg.TopicNotFoundError(f"{kind} names partition {topic}/{p}, which has no flushed segments")
    out: dict[TopicPartition, int] = {}
    for tp in sorted(known):
        b = bounds[tp]
        want = spec.get(tp[0], {}).get(tp[1], EARLIEST if is_start else LATEST) if isinstance(spec, dict) else (EARLIEST if spec == "earliest" else LATEST)
        if want == EARLIEST:
            out[tp] = b.start
        elif want == LATEST:
            out[tp] = b.end
        else:
            if is_start and want < b.start:
                if cfg.fail_on_data_loss:
                    raise seg.DataLossError(
                        f"startingOffsets {tp[0]}/{tp[1]}: offset {want} is before the earliest flushed offset {b.start} "
                        "(deleted by retention?); set failOnDataLoss=false to start at the earliest"
                    )
                log.warning("%s/%s: starting offset %d is gone, starting at %d", tp[0], tp[1], want, b.start)
                want = b.start
            if not is_start and want > b.end:
                raise ValueError(
                    f"endingOffsets {tp[0]}/{tp[1]}: offset {want} is beyond the end of the flushed segments ({b.end}); "
                    "only flushed records are readable"
                )
            out[tp] = want
    if is_start and cfg.starting_timestamp is not None:
        tps = sorted(known)
        found_all = await asyncio.gather(*(seg.offset_for_timestamp(store, listing.segments[tp], cfg.starting_timestamp) for tp in tps))
        for tp, found in zip(tps, found_all):
            if found is None:
                if cfg.timestamp_strategy == "error":
                    raise ValueError(
                        f"startingTimestamp {cfg.starting_timestamp}: partition {tp[0]}/{tp[1]} has no record at or after it "
                        "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
                    )
                found = bounds[tp].end
            out[tp] = found
    return out


async def _listing_and_bounds(store, cfg: SourceConfig, skipped=None):
    listing = await seg.list_topics(store, cfg.namespace, topics=list(cfg.topics) if cfg.topics else None, pattern=cfg.pattern)
    bounds = await seg.partition_bounds(store, listing, fail_on_corruption=cfg.fail_on_corruption, skipped=skipped)
    return listing, bounds


# ---------------------------------------------------------------------------------------
# Readers


class KafScaleInputPartition(InputPartition):
    """One slice of one segment, or (packSegments) a tuple of consecutive slices; Spark runs
    one task per input partition."""

    def __init__(self, slices: seg.SegmentSlice | tuple[seg.SegmentSlice, ...]):
        super().__init__(slices)


def _input_partitions(cfg: SourceConfig, slices: list[seg.SegmentSlice]) -> list[InputPartition]:
    if cfg.pack_segments:
        return [KafScaleInputPartition(p) for p in seg.pack_slices(slices, cfg.max_partition_bytes)]
    return [KafScaleInputPartition(s) for s in slices]


_gc_frozen = False


def _freeze_imported_objects() -> None:
    """Exempt what the worker has loaded so far from cyclic garbage collection, once per process.

    PySpark's worker daemon runs gc.collect() after every task; with pyspark, pyarrow and
    numpy loaded that traverses ~50k long-lived objects (modules, classes, functions) and
    costs 15-30 ms of CPU per task, as much as decoding a 4 MiB segment. gc.freeze() moves
    them out of the collector's view (it is meant for exactly this: long-lived objects in
    forked servers); everything created later is collected as before.
    """
    global _gc_frozen
    if not _gc_frozen:
        _gc_frozen = True
        import gc

        import numpy  # noqa: F401  (loaded before freezing: the decoder needs them anyway)
        import pyarrow  # noqa: F401

        gc.collect()  # nothing that is garbage now ends up frozen
        gc.freeze()


def _read(cfg: SourceConfig, partition: InputPartition) -> Iterator:
    value = getattr(partition, "value", None)
    slices = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(s, seg.SegmentSlice) for s in slices):
        return iter(())  # Spark's placeholder partition when nothing was planned
    _freeze_imported_objects()
    opts = cfg.read_options()
    chunks = ((s, c) for s in slices for c in seg.read_slice(opts, s))
    if cfg.arrow:
        schema = seg.arrow_schema()
        return (seg.columns_to_arrow(c, s.topic, s.partition, schema) for s, c in chunks)
    # chain() hands rows on in C: no Python frame per row on the baseline path
    return itertools.chain.from_iterable(seg.columns_to_tuples(c, s.topic, s.partition) for s, c in chunks)


class KafScaleBatchReader(DataSourceReader):
    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg

    def plan(self) -> list[seg.SegmentSlice]:
        cfg = self.cfg

        async def go(store):
            skipped = seg.SkipReport()
            listing, bounds = await _listing_and_bounds(store, cfg, skipped)
            start = await _resolve(store, cfg, listing, bounds, cfg.starting, is_start=True)
            end = await _resolve(store, cfg, listing, bounds, cfg.ending, is_start=False)
            ranges = {tp: PartitionRange(start[tp], end[tp]) for tp in start}
            slices = await seg.plan_slices(
                store,
                listing,
                ranges,
                max_partition_bytes=cfg.max_partition_bytes,
                fail_on_corruption=cfg.fail_on_corruption,
                fail_on_data_loss=cfg.fail_on_data_loss,
                skipped=skipped,
            )
            skipped.write(cfg.corruption_log)
            return slices

        return seg.run_with_store(cfg.storage, go)

    def partitions(self) -> list[InputPartition]:
        return _input_partitions(self.cfg, self.plan())

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.cfg, partition)


class KafScaleStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over flushed segments. Offsets are {topic: {partition: next offset}}.

    A restart from a checkpoint resumes at the checkpointed offsets exactly. Partitions that
    appear later start at their earliest offset. With Trigger.AvailableNow the end is fixed
    when the query starts; maxOffsetsPerTrigger splits the work into several micro-batches.
    """

    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg
        self._available_now_target: dict[TopicPartition, int] | None = None
        self._warned_no_limit = False

    def initialOffset(self) -> dict:
        cfg = self.cfg

        async def go(store):
            listing, bounds = await _listing_and_bounds(store, cfg)
            return await _resolve(store, cfg, listing, bounds, cfg.starting, is_start=True)

        start = seg.run_with_store(cfg.storage, go)
        return offsets_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cfg.max_offsets_per_trigger:
            return ReadMaxRows(self.cfg.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._bounds()[0]

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        latest, earliest = self._bounds()
        target = dict(latest)
        if self._available_now_target is not None:
            # behave as if nothing arrived after the query started, new partitions included
            target = {tp: min(off, self._available_now_target[tp]) for tp, off in target.items() if tp in self._available_now_target}
        if start is None:
            # pyspark without admission control calls latestOffset() with no start: the
            # contract is then simply "the newest offsets"; a read limit cannot be applied
            if self.cfg.max_offsets_per_trigger and not self._warned_no_limit:
                log.warning("this pyspark version cannot limit micro-batches: maxOffsetsPerTrigger is ignored")
                self._warned_no_limit = True
            return offsets_json(target)
        start_pos = offsets_from_json(start)
        end = dict(start_pos)
        for tp, off in target.items():
            end[tp] = max(start_pos.get(tp, earliest[tp]), off)
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(start_pos, end, earliest, limit.max_rows)
        return offsets_json(end)

    def _bounds(self) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        cfg = self.cfg

        async def go(store):
            _, bounds = await _listing_and_bounds(store, cfg)
            return bounds

        bounds = seg.run_with_store(cfg.storage, go)
        return {tp: b.end for tp, b in bounds.items()}, {tp: b.start for tp, b in bounds.items()}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        cfg = self.cfg
        start_pos, end_pos = offsets_from_json(start), offsets_from_json(end)

        async def go(store):
            skipped = seg.SkipReport()
            listing = await seg.list_topics(store, cfg.namespace, topics=list(cfg.topics) if cfg.topics else None, pattern=cfg.pattern)
            ranges = {}
            for tp, stop in end_pos.items():
                segs = listing.segments.get(tp)
                if not segs:
                    continue
                begin = start_pos.get(tp, segs[0][0])  # a partition new in this batch starts at its earliest
                if begin < segs[0][0]:
                    if cfg.fail_on_data_loss:
                        raise seg.DataLossError(f"{tp[0]}/{tp[1]}: offsets {begin}..{segs[0][0] - 1} were deleted before they were read; set failOnDataLoss=false to skip them")
                    begin = segs[0][0]
                ranges[tp] = PartitionRange(begin, stop)
            slices = await seg.plan_slices(
                store,
                listing,
                ranges,
                max_partition_bytes=cfg.max_partition_bytes,
                fail_on_corruption=cfg.fail_on_corruption,
                fail_on_data_loss=cfg.fail_on_data_loss,
                skipped=skipped,
            )
            skipped.write(cfg.corruption_log)
            return slices

        return _input_partitions(cfg, seg.run_with_store(cfg.storage, go))

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.cfg, partition)

    def commit(self, end: dict) -> None:
        pass  # segments are immutable and owned by the broker: nothing to release


def _rate_limit(start: dict[TopicPartition, int], end: dict[TopicPartition, int], earliest: dict[TopicPartition, int], max_rows: int) -> dict[TopicPartition, int]:
    """Cut the advance to at most max_rows offsets in total, shared in proportion to each
    partition's backlog (as Spark's Kafka source does), and deterministic."""
    lag = {tp: end[tp] - start.get(tp, earliest.get(tp, end[tp])) for tp in end}
    total = sum(v for v in lag.values() if v > 0)
    if total <= max_rows:
        return end
    out = dict(end)
    share = {tp: (v * max_rows) // total if v > 0 else 0 for tp, v in lag.items()}
    left = max_rows - sum(share.values())
    for tp in sorted(tp for tp, v in lag.items() if v > share[tp]):
        if left <= 0:
            break
        share[tp] += 1
        left -= 1
    for tp, v in lag.items():
        if v > 0:
            out[tp] = start.get(tp, earliest.get(tp, end[tp])) + share[tp]
    return out


# ---------------------------------------------------------------------------------------
# The data source


class KafScaleDataSource(DataSource):
    """Spark data source `kafscale`: read topics from segment objects, write through a broker."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return kafka_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafScaleBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafScaleStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool):
        from kafscale.pipeline.sink import KafScaleWriter, parse_sink_options

        if overwrite:
            raise ValueError("a topic cannot be overwritten: write with .mode(\"append\")")
        return KafScaleWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool):
        from kafscale.pipeline.sink import KafScaleStreamWriter, parse_sink_options

        return KafScaleStreamWriter(parse_sink_options(self.options, schema))


__all__ = [
    "KafScaleDataSource",
    "KafScaleBatchReader",
    "KafScaleStreamReader",
    "kafka_schema",
    "parse_options",
]
