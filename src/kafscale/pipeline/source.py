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
import dataclasses
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
# Options

@dataclass(frozen=True)
class SourceConfig:
    storage: str
    namespace: str
    topics: tuple[str, ...] | None
    pattern: str | None
    starting: Any  # "earliest" | "latest" | {topic: {partition: offset}}
    ending: Any  # "earliest" | "latest" | {topic: {partition: offset}}
    starting_timestamp: int | None
    timestamp_strategy: str  # "error" | "latest"
    max_offsets_per_trigger: int | None
    arrow: bool
    fail_on_corruption: bool
    fail_on_data_loss: bool
    corruption_log: str | None
    max_partition_bytes: int
    batch_rows: int
    pack_segments: bool = True
    assign: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    starting_by_timestamp: dict | None = None  # {topic: {partition: ms}}
    ending_timestamp: int | None = None
    ending_by_timestamp: dict | None = None
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    read_committed: bool = False  # kafka.isolation.level / isolationLevel = read_committed
    metadata: str | None = None  # the broker's --metadata (sqlite://path or etcd://...), for log start offsets
    metadata_prefix: str = "/kafscale"

    def read_options(self) -> seg.ReadOptions:
        return seg.ReadOptions(self.storage, self.namespace, self.fail_on_corruption, self.corruption_log, self.batch_rows)

    @property
    def assigned(self) -> dict[str, list[int]] | None:
        return None if self.assign is None else {t: list(ps) for t, ps in self.assign}

    def arrow_schema(self):
        return seg.arrow_schema(self.include_headers)


# Spark Kafka source options that only tune its Kafka consumer: rejected (see docs/pipeline.md)
_CONSUMER_OPTIONS = ("groupidprefix", "kafkaconsumer.polltimeoutms", "fetchoffset.numretries", "fetchoffset.retryintervalms")


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


def _int(options, name: str, default: int | None, *, positive: bool = False) -> int | None:
    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"option {name} must be an integer, not {raw!r}") from None
    if positive and value <= 0:
        raise ValueError(f"option {name} must be a positive integer, not {raw!r}")
    return value


_TIME_UNITS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(options, name: str, default_ms: int) -> int:
    """A Spark time string ("15m", "30s", "250ms", "1h"; a bare number is milliseconds)."""
    import re

    raw = options.get(name)
    if raw is None or str(raw).strip() == "":
        return default_ms
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(raw).lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS):
        raise ValueError(f"option {name} must be a duration such as 15m, 30s or 500ms, not {raw!r}")
    return int(m.group(1)) * _TIME_UNITS.get(m.group(2), 1)


def _partition_json(name: str, text: str, what: str) -> dict:
    try:
        spec = json.loads(text)
    except ValueError:
        raise ValueError(f"option {name} must be JSON like {{\"topic\":{{\"0\":{what}}}}}, not {text!r}") from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ValueError(f"option {name}: JSON must map topic -> {{partition: {what}}}, got {text!r}")
    return spec


def _offsets_spec(options, name: str, default: str):
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    if not text.startswith("{"):
        raise ValueError(f"option {name} must be earliest, latest or JSON like {{\"topic\":{{\"0\":23}}}}, not {text!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in _partition_json(name, text, "23").items():
        out[topic] = {}
        for p, off in parts.items():
            if not str(p).lstrip("-").isdigit() or not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
                raise ValueError(f"option {name}: bad entry {topic}/{p}: {off!r} (offsets are >= 0, -2 earliest, -1 latest)")
            out[topic][int(p)] = off
    return out


def _timestamps_spec(options, name: str) -> dict | None:
    raw = options.get(name)
    if raw is None:
        return None
    out: dict[str, dict[int, int]] = {}
    for topic, parts in _partition_json(name, str(raw).strip(), "1700000000000").items():
        out[topic] = {}
        for p, ts in parts.items():
            if not str(p).isdigit() or not isinstance(ts, int) or isinstance(ts, bool):
                raise ValueError(f"option {name}: bad entry {topic}/{p}: {ts!r} (timestamps are milliseconds since the epoch)")
            out[topic][int(p)] = ts
    return out


def _assign_spec(raw: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    text = str(raw).strip()
    try:
        spec = json.loads(text) if text.startswith("{") else None
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or not spec or not all(isinstance(v, list) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in v) for v in spec.values()):
        raise ValueError(f"option assign must be JSON mapping topics to partition lists, like {{\"orders\":[0,1]}}, not {text!r}")
    return tuple(sorted((t, tuple(sorted(set(ps)))) for t, ps in spec.items()))


def _check_start_not_after_end(start: dict, end: dict, what: str) -> None:
    """Spark's check before resolving: both given per partition, the same partitions, and no
    concrete start after its concrete end (negative, i.e. earliest/latest, is not compared)."""
    start_tps = {(t, p) for t, ps in start.items() for p in ps}
    end_tps = {(t, p) for t, ps in end.items() for p in ps}
    if start_tps != end_tps:
        raise ValueError(f"starting{what} and ending{what} must name the same partitions: {sorted(start_tps)} vs {sorted(end_tps)}")
    for t, ps in start.items():
        for p, a in ps.items():
            b = end[t][p]
            if a >= 0 and b >= 0 and a > b:
                raise ValueError(f"{t}/{p}: the start ({a}) is after the end ({b}) in starting{what} / ending{what}")


def parse_options(options, *, streaming: bool | None) -> SourceConfig:
    """Check and decode the read options. streaming None: only what holds for both batch and
    stream (Spark's check at load, before it knows which); True/False adds that mode's rules."""
    lower = {str(k).lower() for k in options.keys()} if hasattr(options, "keys") else set()
    storage = options.get("storage")
    if not storage:
        raise ValueError("option storage is required (file:///path or s3://bucket/prefix, as the broker's --storage)")
    subscribe, pattern, assign_raw = options.get("subscribe"), options.get("subscribePattern"), options.get("assign")
    if sum(x is not None for x in (subscribe, pattern, assign_raw)) != 1:
        raise ValueError("give exactly one of the options subscribe (comma-separated topics), subscribePattern (regex) or assign (JSON topic -> partitions)")
    topics = tuple(t.strip() for t in subscribe.split(",") if t.strip()) if subscribe is not None else None
    if subscribe is not None and not topics:
        raise ValueError(f"option subscribe names no topic: {subscribe!r}")
    if pattern is not None and not pattern.strip():
        raise ValueError("option subscribePattern is empty")
    assign = _assign_spec(assign_raw) if assign_raw is not None else None
    if assign is not None:
        topics = tuple(t for t, _ in assign)
    for key in sorted(lower):
        if (key.startswith("kafka.") and key != "kafka.isolation.level") or key in _CONSUMER_OPTIONS:
            raise ValueError(
                f"option {key} is not supported: this source has no Kafka consumer, it reads the segment objects "
                "named by the option storage (remove it; where to start is startingOffsets, see docs/pipeline.md)"
            )
    starting = _offsets_spec(options, "startingOffsets", "latest" if streaming else "earliest")
    ending = _offsets_spec(options, "endingOffsets", "latest")
    starting_by_ts = _timestamps_spec(options, "startingOffsetsByTimestamp")
    ending_by_ts = _timestamps_spec(options, "endingOffsetsByTimestamp")
    strategy = str(options.get("startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise ValueError("option startingOffsetsByTimestampStrategy must be error or latest")
    max_per_trigger = _int(options, "maxOffsetsPerTrigger", None, positive=True)
    min_per_trigger = _int(options, "minOffsetsPerTrigger", None, positive=True)
    if min_per_trigger is not None and max_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise ValueError(f"minOffsetsPerTrigger ({min_per_trigger}) is higher than maxOffsetsPerTrigger ({max_per_trigger})")
    isolation = options.get("kafka.isolation.level") or options.get("isolationLevel") or "read_uncommitted"
    isolation = str(isolation).strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise ValueError(f"isolation level (kafka.isolation.level / isolationLevel) must be read_uncommitted or read_committed, not {isolation!r}")
    cfg = SourceConfig(
        storage=storage,
        namespace=options.get("namespace") or "default",
        topics=topics,
        pattern=pattern.strip() if pattern is not None else None,
        starting=starting,
        ending=ending,
        starting_timestamp=_int(options, "startingTimestamp", None),
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_per_trigger,
        arrow=_bool(options, "arrow", True),
        fail_on_corruption=_bool(options, "failOnCorruption", True),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        corruption_log=options.get("corruptionLog") or None,
        max_partition_bytes=_int(options, "maxPartitionBytes", seg.DEFAULT_MAX_PARTITION_BYTES, positive=True) or seg.DEFAULT_MAX_PARTITION_BYTES,
        batch_rows=_int(options, "arrowBatchRows", seg.DEFAULT_ARROW_BATCH_ROWS, positive=True) or seg.DEFAULT_ARROW_BATCH_ROWS,
        pack_segments=_bool(options, "packSegments", True),
        assign=assign,
        starting_by_timestamp=starting_by_ts,
        ending_timestamp=_int(options, "endingTimestamp", None),
        ending_by_timestamp=ending_by_ts,
        include_headers=_bool(options, "includeHeaders", False),
        min_partitions=_int(options, "minPartitions", None, positive=True),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", None, positive=True),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", 15 * 60_000),
        read_committed=isolation == "read_committed",
        metadata=_metadata_url(options.get("metadata"), storage),
        metadata_prefix=options.get("metadataPrefix") or "/kafscale",
    )
    for name, spec in (
        ("startingOffsets", cfg.starting),
        ("endingOffsets", cfg.ending),
        ("startingOffsetsByTimestamp", cfg.starting_by_timestamp),
        ("endingOffsetsByTimestamp", cfg.ending_by_timestamp),
    ):
        if isinstance(spec, dict):
            for topic in spec:
                if not _subscribed(cfg, topic):
                    raise ValueError(f"{name} names topic {topic!r}, which is not subscribed")
            if assign is not None:
                named = {(t, p) for t, ps in spec.items() for p in ps}
                wanted = {(t, p) for t, ps in assign for p in ps}
                if named != wanted:
                    raise ValueError(f"{name} must name exactly the assigned partitions {sorted(wanted)}, not {sorted(named)}")
    # what wins when several are given (as Spark): the global timestamp, then the
    # per-partition timestamps, then the offsets
    if cfg.starting_timestamp is None and cfg.starting_by_timestamp is None and isinstance(cfg.starting, dict) and isinstance(cfg.ending, dict) and cfg.ending_timestamp is None and cfg.ending_by_timestamp is None:
        _check_start_not_after_end(cfg.starting, cfg.ending, "Offsets")
    if cfg.starting_timestamp is None and cfg.starting_by_timestamp is not None and cfg.ending_timestamp is None and cfg.ending_by_timestamp is not None:
        _check_start_not_after_end(cfg.starting_by_timestamp, cfg.ending_by_timestamp, "OffsetsByTimestamp")
    if streaming is True:
        for key in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
            if options.get(key) is not None:
                raise ValueError(f"option {key} is for batch queries only; a stream has no end")
    if streaming is False:
        _check_batch(cfg)
    return cfg


def _metadata_url(raw, storage: str) -> str | None:
    """The metadata store to read log start offsets from: the option `metadata` (the broker's
    --metadata URL, or a path to its metadata.sqlite), `none` for the objects alone, or by
    default the embedded store of a broker whose --storage is the default <data-dir>/objects."""
    import os

    if raw is not None:
        text = str(raw).strip()
        if text.lower() in ("", "none"):
            return None
        if text.startswith(("etcd://", "sqlite://")):
            return text
        if "://" in text:
            raise ValueError(f"option metadata must be etcd://host:port, sqlite:///path/metadata.sqlite or none, not {text!r}")
        return "sqlite://" + text
    if storage.startswith("file://"):
        candidate = os.path.join(os.path.dirname(storage[len("file://") :].rstrip("/")), "metadata.sqlite")
        if os.path.isfile(candidate):
            return "sqlite://" + candidate
    return None


def _check_batch(cfg: SourceConfig) -> None:
    if cfg.starting_timestamp is None and cfg.starting_by_timestamp is None:
        if cfg.starting == "latest":
            raise ValueError("startingOffsets=latest is not allowed in a batch query (it would read nothing): use earliest, offsets or a timestamp")
        if isinstance(cfg.starting, dict):
            for t, ps in cfg.starting.items():
                for p, off in ps.items():
                    if off == LATEST:
                        raise ValueError(f"startingOffsets for {t}/{p} is -1 (latest), which is not allowed in a batch query")
    if cfg.ending_timestamp is None and cfg.ending_by_timestamp is None:
        if cfg.ending == "earliest":
            raise ValueError("endingOffsets=earliest is not allowed in a batch query (it would read nothing): use latest or offsets")
        if isinstance(cfg.ending, dict):
            for t, ps in cfg.ending.items():
                for p, off in ps.items():
                    if off == EARLIEST:
                        raise ValueError(f"endingOffsets for {t}/{p} is -2 (earliest), which is not allowed in a batch query")


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


def _check_names_every_partition(name: str, spec: dict, known: set[TopicPartition]) -> None:
    named = {(t, p) for t, ps in spec.items() for p in ps}
    if named != known:
        missing = ", ".join(f"{t}/{p}" for t, p in sorted(known - named))
        extra = ", ".join(f"{t}/{p}" for t, p in sorted(named - known))
        raise ValueError(
            f"{name} must give a value for every partition of the topics read (use -2 for earliest, -1 for latest)"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not found in the storage: {extra}" if extra else "")
        )


async def _resolve(store, cfg: SourceConfig, listing: seg.TopicListing, bounds: dict[TopicPartition, PartitionRange], *, is_start: bool, streaming: bool = False) -> dict[TopicPartition, int]:
    """Concrete offsets for the starting (or ending) options over the listed partitions.

    As Spark: a global timestamp wins over per-partition timestamps, which win over offsets.
    A timestamp resolves to the first offset whose record time is >= it; with no such record
    a start fails (startingOffsetsByTimestampStrategy=error) or is the latest offset, an end
    is the latest offset.

    With read_committed, a start at "latest" is the last stable offset (the first offset of
    the earliest transaction with no marker yet), where a Kafka consumer in read_committed
    lands when it seeks to the end: a transaction open when the query starts is read once it
    commits. An end at "latest" stays the flushed end here; the batch plan cuts the range at
    the first undecided transaction.
    """
    known = set(listing.partitions())
    stable: dict[TopicPartition, int] = {}

    async def latest(tp: TopicPartition) -> int:
        b = bounds[tp]
        if not (is_start and cfg.read_committed):
            return b.end
        if tp not in stable:
            # an open transaction may have begun anywhere in the log: scan from its start
            stable[tp], _ = await seg.transaction_outcomes(store, listing.segments[tp], b.start, b.end, fail_on_corruption=cfg.fail_on_corruption)
            stable[tp] = max(b.start, stable[tp])
        return stable[tp]

    if is_start:
        global_ts, by_ts, spec, kind = cfg.starting_timestamp, cfg.starting_by_timestamp, cfg.starting, "startingOffsets"
    else:
        global_ts, by_ts, spec, kind = cfg.ending_timestamp, cfg.ending_by_timestamp, cfg.ending, "endingOffsets"
    tps = sorted(known)
    if global_ts is not None or by_ts is not None:
        if by_ts is not None and global_ts is None:
            _check_names_every_partition(kind + "ByTimestamp", by_ts, known)
        wanted = {tp: (global_ts if global_ts is not None else by_ts[tp[0]][tp[1]]) for tp in tps}
        found_all = await asyncio.gather(*(seg.offset_for_timestamp(store, listing.segments[tp], wanted[tp]) for tp in tps))
        out = {}
        for tp, found in zip(tps, found_all):
            if found is None:
                if is_start and cfg.timestamp_strategy == "error":
                    option = "startingTimestamp" if global_ts is not None else "startingOffsetsByTimestamp"
                    raise ValueError(
                        f"{option} {wanted[tp]}: partition {tp[0]}/{tp[1]} has no record at or after it "
                        "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
                    )
                found = await latest(tp)
            out[tp] = max(found, bounds[tp].start)
        return out
    if isinstance(spec, dict):
        _check_names_every_partition(kind, spec, known)
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        b = bounds[tp]
        want = spec[tp[0]][tp[1]] if isinstance(spec, dict) else (EARLIEST if spec == "earliest" else LATEST)
        if want == EARLIEST:
            out[tp] = b.start
        elif want == LATEST:
            out[tp] = await latest(tp)
        else:
            if is_start and want < b.start:
                if cfg.fail_on_data_loss:
                    raise seg.DataLossError(
                        f"startingOffsets {tp[0]}/{tp[1]}: offset {want} is before the earliest offset {b.start} "
                        "(deleted by retention or DeleteRecords?); set failOnDataLoss=false to start at the earliest"
                    )
                log.warning("%s/%s: starting offset %d is gone, starting at %d", tp[0], tp[1], want, b.start)
                want = b.start
            if not is_start and want > b.end:
                raise ValueError(
                    f"endingOffsets {tp[0]}/{tp[1]}: offset {want} is beyond the end of the flushed segments ({b.end}); "
                    "only flushed records are readable"
                )
            out[tp] = want
    return out


async def _list(store, cfg: SourceConfig, *, require_all: bool = True) -> seg.TopicListing:
    return await seg.list_topics(
        store,
        cfg.namespace,
        topics=list(cfg.topics) if cfg.topics and cfg.assign is None else None,
        pattern=cfg.pattern,
        assigned=cfg.assigned,
        require_all=require_all,
    )


async def _metadata_view(cfg: SourceConfig, tps: list[TopicPartition]) -> tuple[dict[TopicPartition, int], set[str]] | None:
    """(log start offset per partition, topics that no longer exist) from the metadata store,
    or None without one. DeleteRecords moves a partition's log start offset in the metadata
    store at once, possibly to the middle of a segment that stays in the object store until
    it is wholly below the start: the objects alone would show the deleted records."""
    if cfg.metadata is None or not tps:
        return None
    from kafscale.metadata.backends import open_kv
    from kafscale.metadata.store import MetadataStore

    store = MetadataStore(open_kv(cfg.metadata, ".", cfg.metadata_prefix))
    try:
        starts: dict[TopicPartition, int] = {}
        gone: set[str] = set()
        for topic in sorted({t for t, _ in tps}):
            if await store.get_topic(topic) is None:
                gone.add(topic)
        for tp in tps:
            if tp[0] in gone:
                continue
            st = await store.get_partition(tp[0], tp[1], with_segments=False)
            if st is not None:
                starts[tp] = st.log_start_offset
        return starts, gone
    finally:
        await store.close()


async def _listing_and_bounds(store, cfg: SourceConfig, skipped=None, *, require_all: bool = True, known: list[TopicPartition] = (), cache: seg.MetaCache | None = None):
    """Segments and [earliest, latest) per partition, earliest raised to the metadata store's
    log start offset; also the partitions in `known` that are gone (their topic deleted, or,
    without a metadata store, no object left). `cache`: a stream's segment metadata."""
    listing = await _list(store, cfg, require_all=require_all)
    if cache is not None:
        cache.keep_only({k for segs in listing.segments.values() for _, k in segs})
    bounds = await seg.partition_bounds(store, listing, fail_on_corruption=cfg.fail_on_corruption, skipped=skipped, cache=cache)
    view = await _metadata_view(cfg, sorted(set(listing.partitions()) | set(known)))
    if view is None:
        gone = {tp for tp in known if tp not in listing.segments}
    else:
        starts, gone_topics = view
        gone = {tp for tp in set(known) | set(bounds) if tp[0] in gone_topics}
        for tp, b in bounds.items():
            if starts.get(tp, 0) > b.start:
                b.start = min(starts[tp], b.end)
        for tp in gone:  # objects a deleted topic left behind are not read
            bounds.pop(tp, None)
            listing.segments.pop(tp, None)
    return listing, bounds, gone


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

        async def go(store):
            skipped = seg.SkipReport()
            listing, bounds, _ = await _listing_and_bounds(store, cfg, skipped)
            start = await _resolve(store, cfg, listing, bounds, is_start=True)
            end = await _resolve(store, cfg, listing, bounds, is_start=False)
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
            if aborted:
                slices = [dataclasses.replace(sl, aborted=aborted.get((sl.topic, sl.partition), ())) for sl in slices]
            return ranges, slices

        return seg.run_with_store(cfg.storage, go)

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

        async def go(store):
            listing, bounds, _ = await _listing_and_bounds(store, cfg, require_all=False)
            return await _resolve(store, cfg, listing, bounds, is_start=True, streaming=True)

        start = offsets_json(seg.run_with_store(cfg.storage, go))
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

        async def go(store):
            listing, bounds, gone = await _listing_and_bounds(store, cfg, require_all=False, known=list(start or {}), cache=self._metas)
            self._snapshot = (listing, bounds, gone)
            latest = {tp: b.end for tp, b in bounds.items()}
            if cfg.read_committed:
                for tp, b in bounds.items():
                    begin = max(b.start, (start or {}).get(tp, b.start))
                    latest[tp], _ = await seg.transaction_outcomes(store, listing.segments[tp], begin, b.end, fail_on_corruption=cfg.fail_on_corruption)
                    latest[tp] = max(latest[tp], begin)
            return latest, {tp: b.start for tp, b in bounds.items()}, gone

        return seg.run_with_store(cfg.storage, go)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        cfg = self.cfg
        start_pos, end_pos = offsets_from_json(start), offsets_from_json(end)
        vanished = sorted(set(start_pos) - set(end_pos))
        if vanished:
            _data_loss(cfg, f"partitions {', '.join(f'{t}/{p}' for t, p in vanished)} are gone (topic deleted?) and their unread records with them")

        planned, self._planned = self._planned, None

        async def go(store):
            skipped = seg.SkipReport()
            if planned is not None and planned[0] == start and planned[1] == end and planned[2] is not None:
                # the micro-batch latestOffset() just planned: its listing holds every
                # segment up to `end` (one listing per trigger, not two; a segment merged
                # away since is re-planned when read)
                listing, bounds, gone = planned[2]
            else:  # a micro-batch replayed from the checkpoint after a restart
                listing, bounds, gone = await _listing_and_bounds(store, cfg, require_all=False, known=list(end_pos), cache=self._metas)
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
            slices = await seg.plan_slices(
                store,
                listing,
                ranges,
                max_partition_bytes=cfg.max_partition_bytes,
                cache=self._metas,
                fail_on_corruption=cfg.fail_on_corruption,
                fail_on_data_loss=cfg.fail_on_data_loss,
                skipped=skipped,
            )
            skipped.write(cfg.corruption_log)
            if aborted:
                slices = [dataclasses.replace(sl, aborted=aborted.get((sl.topic, sl.partition), ())) for sl in slices]
            return ranges, slices

        return _input_partitions(cfg, *seg.run_with_store(cfg.storage, go))

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.cfg, partition)

    def commit(self, end: dict) -> None:
        pass  # segments are immutable and owned by the broker: nothing to release


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
        return kafka_schema(_bool(self.options, "includeHeaders", False))

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
