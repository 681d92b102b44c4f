"""Options of the `kafscale` source (those of Spark's Kafka source where they apply), parsed
and checked once (`parse_options`) into a `SourceConfig`; see docs/pipeline.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kafscale.metadata.url import MetadataURL
from kafscale.pipeline import segments as seg
from kafscale.pipeline.segments import EARLIEST, LATEST
from kafscale.storage.url import FILE, StorageURL


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


def bool_option(options, name: str, default: bool) -> bool:
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
        arrow=bool_option(options, "arrow", True),
        fail_on_corruption=bool_option(options, "failOnCorruption", True),
        fail_on_data_loss=bool_option(options, "failOnDataLoss", True),
        corruption_log=options.get("corruptionLog") or None,
        max_partition_bytes=_int(options, "maxPartitionBytes", seg.DEFAULT_MAX_PARTITION_BYTES, positive=True) or seg.DEFAULT_MAX_PARTITION_BYTES,
        batch_rows=_int(options, "arrowBatchRows", seg.DEFAULT_ARROW_BATCH_ROWS, positive=True) or seg.DEFAULT_ARROW_BATCH_ROWS,
        pack_segments=bool_option(options, "packSegments", True),
        assign=assign,
        starting_by_timestamp=starting_by_ts,
        ending_timestamp=_int(options, "endingTimestamp", None),
        ending_by_timestamp=ending_by_ts,
        include_headers=bool_option(options, "includeHeaders", False),
        min_partitions=_int(options, "minPartitions", None, positive=True),
        max_records_per_partition=_int(options, "maxRecordsPerPartition", None, positive=True),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", 15 * 60_000),
        read_committed=isolation == "read_committed",
        metadata=_metadata_url(options.get("metadata"), StorageURL.parse(storage)),
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


def _metadata_url(raw, storage: StorageURL) -> str | None:
    """The metadata store to read log start offsets from: the option `metadata` (the broker's
    --metadata URL, or a path to its metadata.sqlite), `none` for the objects alone, or by
    default the embedded store of a broker whose --storage is the default <data-dir>/objects."""
    import os

    if raw is not None:
        text = str(raw).strip()
        if text.lower() in ("", "none"):
            return None
        if "://" in text:
            try:
                return MetadataURL.parse(text).text  # etcd:// or sqlite://
            except ValueError:
                raise ValueError(f"option metadata must be etcd://host:port, sqlite:///path/metadata.sqlite or none, not {text!r}") from None
        return "sqlite://" + text
    if storage.scheme == FILE:
        candidate = os.path.join(os.path.dirname(storage.location.rstrip("/")), "metadata.sqlite")
        if os.path.isfile(candidate):
            return "sqlite://" + candidate
    return None


def _check_batch(cfg: SourceConfig) -> None:
    if cfg.starting_timestamp is None and cfg.starting_by_timestamp is None:
        _refuse_empty_bound("startingOffsets", cfg.starting, "latest", LATEST, "earliest, offsets or a timestamp")
    if cfg.ending_timestamp is None and cfg.ending_by_timestamp is None:
        _refuse_empty_bound("endingOffsets", cfg.ending, "earliest", EARLIEST, "latest or offsets")


def _refuse_empty_bound(option: str, spec, word: str, sentinel: int, instead: str) -> None:
    """A batch query's bound that would make it read nothing (`word`, or `sentinel` for a partition)."""
    if spec == word:
        raise ValueError(f"{option}={word} is not allowed in a batch query (it would read nothing): use {instead}")
    if isinstance(spec, dict):
        for t, ps in spec.items():
            for p, off in ps.items():
                if off == sentinel:
                    raise ValueError(f"{option} for {t}/{p} is {sentinel} ({word}), which is not allowed in a batch query")


def _subscribed(cfg: SourceConfig, topic: str) -> bool:
    import re

    return topic in cfg.topics if cfg.topics is not None else re.fullmatch(cfg.pattern, topic) is not None
