"""The `kafscale` Spark data source: batch and streaming reads straight from segment objects.

    from kafscale.pipeline import register
    register(spark)
    df = (spark.read.format("kafscale")
          .option("storage", "s3://bucket/prefix").option("subscribe", "orders")
          .load())

Rows have the schema of Spark's Kafka source (with headers). Only flushed segments are read:
records a broker still buffers are invisible until their segment is written, so "latest" is
the end of the last flushed segment. See docs/pipeline.md for all options.

This module holds the Spark side only (readers, the data source class); the options are
parsed in `options.py`, start and end offsets resolved in `offsets.py`, and segments
listed, planned and decoded by the Spark-free `segments` package.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Iterator

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
from kafscale.pipeline.offsets import listing_and_bounds, offsets_from_json, offsets_json, resolve
from kafscale.pipeline.options import SourceConfig, bool_option, parse_options
from kafscale.pipeline.segments import PartitionRange, TopicPartition

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


def kafka_schema(include_headers: bool = True) -> StructType:
    """The schema of Spark's Kafka source; the `headers` column only with includeHeaders=true."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


# ---------------------------------------------------------------------------------------
# Readers


class KafScaleInputPartition(InputPartition):
    """One slice of one segment, or (packSegments) a tuple of consecutive slices; Spark runs
    one task per input partition."""

    def __init__(self, slices: seg.SegmentSlice | tuple[seg.SegmentSlice, ...]):
        super().__init__(slices)


def plan_groups(cfg: SourceConfig, ranges: dict[TopicPartition, PartitionRange], slices: list[seg.SegmentSlice]) -> list[tuple[seg.SegmentSlice, ...]]:
    """The slices of each Spark task: packed by bytes (maxPartitionBytes, default 64 MiB), so
    the task count follows the data size, not the number of segments; minPartitions and
    maxRecordsPerPartition divide the offset ranges first, as Spark's Kafka source does."""
    offset_ranges = None
    if cfg.min_partitions or cfg.max_records_per_partition:
        offset_ranges = seg.split_offset_ranges(ranges, min_partitions=cfg.min_partitions, max_records=cfg.max_records_per_partition)
    return seg.group_slices(slices, cfg.max_partition_bytes, offset_ranges, pack=cfg.pack_segments)


def _input_partitions(cfg: SourceConfig, ranges: dict[TopicPartition, PartitionRange], slices: list[seg.SegmentSlice]) -> list[InputPartition]:
    return [KafScaleInputPartition(g if len(g) > 1 else g[0]) for g in plan_groups(cfg, ranges, slices)]


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
    chunks = seg.read_slices(opts, slices)
    if cfg.arrow:
        schema = cfg.arrow_schema()
        return _coalesced((seg.columns_to_arrow(c, s.topic, s.partition, schema) for s, c in chunks), cfg.batch_rows)
    # chain() hands rows on in C: no Python frame per row on the baseline path
    return itertools.chain.from_iterable(seg.columns_to_tuples(c, s.topic, s.partition, cfg.include_headers) for s, c in chunks)


def _coalesced(batches: Iterator, rows: int) -> Iterator:
    """Arrow record batches of about `rows` rows (arrowBatchRows) out of smaller ones: Spark
    handles each batch a Python source yields (schema checks, IPC framing, a JVM batch) at a
    fixed cost, as much as decoding a few hundred records, and a task over many small
    segments or partitions would otherwise yield one small batch each."""
    import pyarrow as pa

    held: list = []
    count = 0
    for b in batches:
        if b.num_rows >= rows and not held:
            yield b
            continue
        held.append(b)
        count += b.num_rows
        if count >= rows:
            yield _concat(pa, held)
            held, count = [], 0
    if held:
        yield _concat(pa, held)


def _concat(pa, batches: list):
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class KafScaleBatchReader(DataSourceReader):
    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg

    def plan(self) -> tuple[dict[TopicPartition, PartitionRange], list[seg.SegmentSlice]]:
        cfg = self.cfg

        async def attempt(store, _fresh: bool):
            skipped = seg.SkipReport()
            listing, bounds, _ = await listing_and_bounds(store, cfg, skipped)
            start = await resolve(store, cfg, listing, bounds, is_start=True)
            end = await resolve(store, cfg, listing, bounds, is_start=False)
            for tp in sorted(start):
                if start[tp] > end[tp]:
                    raise ValueError(
                        f"{tp[0]}/{tp[1]}: the starting offset {start[tp]} is after the ending offset {end[tp]} "
                        "(as resolved from the starting and ending options)"
                    )
            ranges = {tp: PartitionRange(start[tp], end[tp]) for tp in start}
            aborted: dict[TopicPartition, tuple] = {}
            if cfg.read_committed:
                # Up to the first undecided transaction, without the aborted ones' records.
                for tp, r in ranges.items():
                    stable, aborted[tp] = await seg.transaction_outcomes(
                        store, listing.segments[tp], r.start, bounds[tp].end, fail_on_corruption=cfg.fail_on_corruption
                    )
                    r.end = max(r.start, min(r.end, stable))
            return ranges, await _plan_slices(store, cfg, listing, ranges, aborted, skipped)

        return seg.run_with_store(cfg.storage, _relisting(attempt))

    def partitions(self) -> list[InputPartition]:
        return _input_partitions(self.cfg, *self.plan())

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.cfg, partition)


class KafScaleStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over flushed segments. Offsets are {topic: {partition: next offset}}.

    A restart from a checkpoint resumes at the checkpointed offsets exactly. Partitions (and
    subscribed topics) that appear later start at their earliest offset; a subscribed topic
    that has no segment yet is waited for. With Trigger.AvailableNow the end is fixed when
    the query starts; maxOffsetsPerTrigger splits the work into several micro-batches;
    minOffsetsPerTrigger holds a micro-batch back until that many offsets are there or
    maxTriggerDelay has passed since the last one.
    """

    def __init__(self, cfg: SourceConfig):
        self.cfg = cfg
        self._available_now_target: dict[TopicPartition, int] | None = None
        self._warned_no_limit = False
        self._last_trigger_ms = 0.0
        self._latest_seen: dict = {}
        self._initial: dict | None = None
        self._metas = seg.MetaCache()  # segment metadata across triggers: only new segments are read
        self._snapshot = None  # (listing, bounds, gone) of the last _bounds()
        self._planned = None  # (start, end, snapshot) of the last latestOffset()

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts, resolved once per query (as Spark's
        Kafka source fixes its initial offsets when the query starts): Spark asks again on
        every trigger until the first micro-batch, and "latest" must not move meanwhile."""
        if self._initial is not None:
            return self._initial
        cfg = self.cfg

        async def attempt(store, _fresh: bool):
            listing, bounds, _ = await listing_and_bounds(store, cfg, require_all=False)
            return await resolve(store, cfg, listing, bounds, is_start=True, streaming=True)

        start = offsets_json(seg.run_with_store(cfg.storage, _relisting(attempt)))
        if start or cfg.starting == "earliest":
            self._initial = start  # (no partition yet: asked again until the topics appear)
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cfg.max_offsets_per_trigger:
            return ReadMaxRows(self.cfg.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._bounds()[0]

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        end = self._latest_offset(start, limit)
        # partitions(start, end) for the micro-batch this plans reuses this listing
        self._planned = (start, end, self._snapshot)
        return end

    def _latest_offset(self, start: dict | None, limit: ReadLimit | None) -> dict:
        start_pos = offsets_from_json(start) if start is not None else {}
        latest, earliest, gone = self._bounds(start_pos)
        self._latest_seen = offsets_json(latest)
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
        # partitions that are gone (topic deleted) leave the offsets: planning reports the loss
        end = {tp: off for tp, off in start_pos.items() if tp not in gone}
        for tp, off in target.items():
            end[tp] = max(start_pos.get(tp, earliest[tp]), off)
        if self._hold_back(start_pos, end, earliest):
            return start
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(start_pos, end, earliest, limit.max_rows)
        return offsets_json(end)

    def reportLatestOffset(self) -> dict | None:
        """The newest flushed offsets seen by the last latestOffset() (StreamingQueryProgress
        `latestOffset`, as Spark's Kafka source reports it)."""
        return self._latest_seen or None

    def _hold_back(self, start: dict[TopicPartition, int], end: dict[TopicPartition, int], earliest: dict[TopicPartition, int]) -> bool:
        """minOffsetsPerTrigger: True to skip this trigger (fewer new offsets than the minimum,
        and maxTriggerDelay not yet passed since the last micro-batch). Not applied with
        Trigger.AvailableNow, which must end."""
        want = self.cfg.min_offsets_per_trigger
        if not want or self._available_now_target is not None:
            return False
        import time

        now = time.time() * 1000
        if now - self._last_trigger_ms >= self.cfg.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new = sum(max(0, off - start.get(tp, earliest.get(tp, off))) for tp, off in end.items())
        if new < want:
            return True
        self._last_trigger_ms = now
        return False

    def _bounds(self, start: dict[TopicPartition, int] | None = None) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int], set[TopicPartition]]:
        """(latest, earliest, gone) per partition: gone are partitions of `start` whose topic
        was deleted; read_committed: latest is the first offset of a transaction without a
        marker yet (found from `start`, else from the earliest)."""
        cfg = self.cfg

        async def attempt(store, _fresh: bool):
            listing, bounds, gone = await listing_and_bounds(store, cfg, require_all=False, known=list(start or {}), cache=self._metas)
            self._snapshot = (listing, bounds, gone)
            latest = {tp: b.end for tp, b in bounds.items()}
            if cfg.read_committed:
                for tp, b in bounds.items():
                    begin = max(b.start, (start or {}).get(tp, b.start))
                    latest[tp], _ = await seg.transaction_outcomes(store, listing.segments[tp], begin, b.end, fail_on_corruption=cfg.fail_on_corruption)
                    latest[tp] = max(latest[tp], begin)
            return latest, {tp: b.start for tp, b in bounds.items()}, gone

        return seg.run_with_store(cfg.storage, _relisting(attempt))

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        cfg = self.cfg
        start_pos, end_pos = offsets_from_json(start), offsets_from_json(end)
        vanished = sorted(set(start_pos) - set(end_pos))
        if vanished:
            _data_loss(cfg, f"partitions {', '.join(f'{t}/{p}' for t, p in vanished)} are gone (topic deleted?) and their unread records with them")

        planned, self._planned = self._planned, None

        async def attempt(store, fresh: bool):
            skipped = seg.SkipReport()
            if not fresh and planned is not None and planned[0] == start and planned[1] == end and planned[2] is not None:
                # the micro-batch latestOffset() just planned: its listing holds every
                # segment up to `end` (one listing per trigger, not two; a segment merged
                # away since is re-planned when read, and one gone before planning, from a
                # new listing)
                listing, bounds, gone = planned[2]
            else:  # a micro-batch replayed from the checkpoint after a restart
                listing, bounds, gone = await listing_and_bounds(store, cfg, require_all=False, known=list(end_pos), cache=self._metas)
            ranges = {}
            for tp, stop in end_pos.items():
                if tp in gone or tp not in bounds:
                    if start_pos.get(tp, stop) < stop:
                        _data_loss(cfg, f"{tp[0]}/{tp[1]} is gone (topic deleted?) with offsets {start_pos[tp]}..{stop - 1} unread")
                    continue
                first = bounds[tp].start
                begin = start_pos.get(tp, first)  # a partition new in this batch starts at its earliest
                if begin < first:
                    _data_loss(cfg, f"{tp[0]}/{tp[1]}: offsets {begin}..{min(first, stop) - 1} were deleted (retention or DeleteRecords) before they were read")
                    begin = min(first, stop)
                ranges[tp] = PartitionRange(begin, stop)
            aborted: dict[TopicPartition, tuple] = {}
            if cfg.read_committed:
                # latestOffset ended the range at or before the first undecided transaction:
                # every transaction with records in it has its marker among the segments now.
                for tp, r in ranges.items():
                    _, aborted[tp] = await seg.transaction_outcomes(
                        store, listing.segments[tp], r.start, seg.END_OF_LOG, fail_on_corruption=cfg.fail_on_corruption
                    )
                    aborted[tp] = tuple(a for a in aborted[tp] if a[1] < r.end)
            return ranges, await _plan_slices(store, cfg, listing, ranges, aborted, skipped, cache=self._metas)

        return _input_partitions(cfg, *seg.run_with_store(cfg.storage, _relisting(attempt)))

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.cfg, partition)

    def commit(self, end: dict) -> None:
        pass  # segments are immutable and owned by the broker: nothing to release


# Plans made from a new listing because an object listed for the previous one was gone.
LISTING_ATTEMPTS = 3


def _relisting(plan):
    """What run_with_store runs for `plan(store, fresh)`: it, and again from a new listing
    (fresh True) while an object it listed is gone by the time planning reads it
    (seg.ListingChanged: moved by a merge, a rewrite of write-ahead objects or retention
    since the listing, which only a listing older than the broker's --merge-grace-ms sees)."""

    async def go(store):
        for attempt in range(LISTING_ATTEMPTS):
            try:
                return await plan(store, attempt > 0)
            except seg.ListingChanged as e:
                if attempt == LISTING_ATTEMPTS - 1:
                    raise
                log.info("planning again from a new listing: %s", e)

    return go


async def _plan_slices(store, cfg: SourceConfig, listing, ranges: dict[TopicPartition, PartitionRange], aborted: dict[TopicPartition, tuple], skipped: seg.SkipReport, cache=None) -> list[seg.SegmentSlice]:
    """The slices of `ranges` (batch and streaming reads alike), each with its partition's
    aborted transactions; what was skipped goes to the corruption log."""
    slices = await seg.plan_slices(
        store,
        listing,
        ranges,
        max_partition_bytes=cfg.max_partition_bytes,
        cache=cache,
        fail_on_corruption=cfg.fail_on_corruption,
        fail_on_data_loss=cfg.fail_on_data_loss,
        skipped=skipped,
    )
    skipped.write(cfg.corruption_log)
    if aborted:
        slices = [dataclasses.replace(sl, aborted=aborted.get((sl.topic, sl.partition), ())) for sl in slices]
    return slices


def _data_loss(cfg: SourceConfig, what: str) -> None:
    """failOnDataLoss=true: fail the query; false: log and go on without the lost records."""
    if cfg.fail_on_data_loss:
        raise seg.DataLossError(f"{what}; set failOnDataLoss=false to go on without them")
    log.warning("%s; going on (failOnDataLoss=false)", what)


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

    def __init__(self, options):
        super().__init__(options)
        if _created_by_pyspark() and any(self.options.get(k) is not None for k in _READ_OPTIONS):
            # at load(), as Spark's Kafka source: wrong options fail here, before any query
            # runs (batch- or stream-only rules are checked at planning). pyspark creates the
            # source the same way for a streaming write: those have none of the read options.
            parse_options(self.options, streaming=None)
            if _user_schema_given():
                raise ValueError("the kafscale source has a fixed schema (that of Spark's Kafka source) and cannot be given one with .schema()")

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return kafka_schema(bool_option(self.options, "includeHeaders", False))

    def _check_schema(self, schema: StructType) -> None:
        if schema != self.schema():
            raise ValueError("the kafscale source has a fixed schema (that of Spark's Kafka source) and cannot be given one with .schema()")

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return KafScaleBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return KafScaleStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool):
        from kafscale.pipeline.sink import KafScaleWriter, parse_sink_options

        if overwrite:
            raise ValueError("a topic cannot be overwritten: write with .mode(\"append\") (or the default mode)")
        return KafScaleWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool):
        from kafscale.pipeline.sink import KafScaleStreamWriter, parse_sink_options

        return KafScaleStreamWriter(parse_sink_options(self.options, schema))


def _creator_frame():
    """The frame of pyspark's worker that instantiates the data source, if this is one.

    pyspark builds a data source in create_data_source.py when a DataFrame is loaded (and in
    other workers for writes); only the former sees the user's schema, as a local variable.
    pyspark offers no hook for either, so this looks at the calling frames; with another
    pyspark layout it finds nothing and the checks fall back to planning time.
    """
    import inspect

    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    for _ in range(6):
        if frame is None:
            return None
        if frame.f_code.co_filename.endswith("create_data_source.py"):
            return frame
        frame = frame.f_back
    return None


_READ_OPTIONS = ("storage", "subscribe", "subscribePattern", "assign")


def _created_by_pyspark() -> bool:
    return _creator_frame() is not None


def _user_schema_given() -> bool:
    frame = _creator_frame()
    return frame is not None and frame.f_locals.get("user_specified_schema") is not None


__all__ = [
    "KafScaleDataSource",
    "KafScaleBatchReader",
    "KafScaleStreamReader",
    "kafka_schema",
    "parse_options",
]
