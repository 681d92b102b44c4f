"""Topic configs: the one table of every topic config Apache Kafka has (name, Kafka's default,
type, validator, documentation, broker synonyms), how a value is resolved from a topic
override, an operator-given broker setting or a default, and the typed settings the log
acts on.

Kafka's semantics, kept here:
- a topic config's value is its override, else the first of its broker synonyms (in the
  order Kafka lists them, e.g. log.retention.ms, log.retention.minutes, log.retention.hours)
  that has a value, converted to the topic's unit, else the topic default;
- DescribeConfigs reports the synonyms as Kafka does: the topic override
  (DYNAMIC_TOPIC_CONFIG), then operator-given broker settings (STATIC_BROKER_CONFIG), then
  broker defaults (DEFAULT_CONFIG), leading entries not named after the first synonym
  dropped (so retention.ms shows no synonym unless log.retention.ms is set, as in Kafka);
- values are normalised as Kafka prints them (booleans lower case, lists joined by ",",
  numbers without leading zeros).

Every config is accepted and stored; `meaning` says what KafScale does with it (most
replication and local-disk configs have nothing to act on with stateless brokers
and an object store; they are kept so tools that set them work, and reported back).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

# DescribeConfigs config_type (v3+)
UNKNOWN, BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = range(10)
# DescribeConfigs config_source
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 3, 4, 5

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
_BOUNDS = {INT: (-(1 << 31), INT_MAX), SHORT: (-(1 << 15), (1 << 15) - 1), LONG: (-(1 << 63), LONG_MAX)}

COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


class InvalidConfigError(ValueError):
    pass


# -- value parsing: one function per type, returning the value as Kafka prints it ---------


def normalize_value(kind: int, value: str) -> str:
    v = value.strip()
    if kind in _BOUNDS:
        try:
            n = int(v)
        except ValueError:
            raise InvalidConfigError("not a number") from None
        lo, hi = _BOUNDS[kind]
        if not lo <= n <= hi:
            raise InvalidConfigError(f"out of range for {'an int' if kind == INT else 'a long'}")
        return str(n)
    if kind == BOOLEAN:
        if v.lower() not in ("true", "false"):
            raise InvalidConfigError("must be true or false")
        return v.lower()
    if kind == DOUBLE:
        try:
            return repr(float(v))
        except ValueError:
            raise InvalidConfigError("not a number") from None
    if kind == LIST:
        # Kafka's list parsing: an empty value is the empty list; otherwise split at commas
        # (whitespace around them dropped), keeping empty items for the validator to judge
        return ",".join(x.strip() for x in v.split(",")) if v else ""
    return v


# -- validators (on the normalised value) ---------------------------------------------------


def at_least(lo: int | float) -> Callable[[str], None]:
    def check(v: str) -> None:
        if float(v) < lo:
            raise InvalidConfigError(f"Value must be at least {lo}")

    return check


def between(lo: int | float, hi: int | float) -> Callable[[str], None]:
    def check(v: str) -> None:  # Kafka's Range.between messages
        if float(v) < lo:
            raise InvalidConfigError(f"Value must be at least {lo}")
        if float(v) > hi:
            raise InvalidConfigError(f"Value must be no more than {hi}")

    return check


def one_of(*choices: str) -> Callable[[str], None]:
    def check(v: str) -> None:
        if v not in choices:
            raise InvalidConfigError(f"must be one of {', '.join(choices)}")

    return check


def _gzip_level(v: str) -> None:
    if int(v) != -1 and not 1 <= int(v) <= 9:
        raise InvalidConfigError("must be between 1 and 9 or equal to -1")


CLEANUP_POLICIES = ("compact", "delete")


def _cleanup_policy(v: str) -> None:
    # Kafka's ValidList.in("compact", "delete"): each item, case-sensitive; the empty list is
    # valid (neither policy: the log keeps everything), duplicates are accepted
    for item in v.split(",") if v else ():
        if item not in CLEANUP_POLICIES:
            raise InvalidConfigError(f"String must be one of: {', '.join(CLEANUP_POLICIES)}")


def cleanup_policies(value: str | None) -> frozenset[str]:
    """The policies a (valid) cleanup.policy value names."""
    return frozenset(x.strip() for x in (value or "").split(",")) - {""}


def _throttled_replicas(v: str) -> None:
    items = [x for x in v.split(",") if x]  # Kafka lets empty items through here
    if items == ["*"] or all(re.fullmatch(r"[0-9]+:[0-9]+", x) for x in items):
        return
    raise InvalidConfigError("must be * or a list of partition:broker_id")


def _message_format_version(v: str) -> None:
    if not re.fullmatch(r"(0\.(8\.[0-2]|9\.0|10\.[0-2]|11\.0)|[1-3]\.[0-9])(\.[0-9]+)?(-IV[0-9]+)?", v):
        raise InvalidConfigError("not a Kafka version (e.g. 2.8 or 3.0-IV1)")


# -- the table ------------------------------------------------------------------------------

ENFORCED, ACCEPTED = "enforced", "accepted"


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    default: str | None  # Apache Kafka's default for the topic config (LogConfig)
    kind: int
    validate: Callable[[str], None] | None
    doc: str
    synonyms: tuple[str, ...] = ()  # broker configs standing for it, highest priority first
    meaning: str = ACCEPTED  # ENFORCED: KafScale acts on it; ACCEPTED: stored and reported only
    # Not an Apache Kafka topic config (Confluent Server's names): a topic's full config
    # listing names it only where it is set, so clients comparing the listing with
    # Kafka's (DescribeConfigs, CreateTopics' answer) see Kafka's set of names.
    extension: bool = False


_HOURS, _MINUTES = 3_600_000, 60_000
# broker synonym -> factor to the topic config's unit (ms)
SYNONYM_FACTOR = {
    "log.retention.minutes": _MINUTES,
    "log.retention.hours": _HOURS,
    "log.roll.hours": _HOURS,
    "log.roll.jitter.hours": _HOURS,
}

_STORED = " KafScale stores this setting and reports it back; it has no effect here"
_NO_REPLICAS = _STORED + " (durability comes from the object store, not from replicas)."
_NO_DISK = _STORED + " (brokers keep no local log files)."

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    c.name: c
    for c in [
        ConfigDef("cleanup.policy", "delete", LIST, _cleanup_policy,
                  "A list of compact and/or delete: what happens to old segments. delete removes whole segments by retention.ms and retention.bytes; "
                  "compact keeps, per key, the latest record (the partition owner's compactor rewrites sealed segment objects in the object store, "
                  "records keep their offsets) and refuses records without a key (INVALID_RECORD); compact,delete does both. "
                  "An empty list does neither: the log keeps everything.",
                  ("log.cleanup.policy",), ENFORCED),
        ConfigDef("compression.type", "producer", STRING, one_of(*COMPRESSION_TYPES),
                  "Codec of stored batches: producer keeps each batch as the producer compressed it; uncompressed, gzip, snappy, lz4 or zstd ask for that codec. "
                  "KafScale accepts every value and always stores batches as the producer sent them (it never re-compresses).",
                  ("compression.type",)),
        ConfigDef("compression.gzip.level", "-1", INT, _gzip_level, "gzip level used when the broker compresses with gzip." + _STORED + " (batches are never re-compressed).", ("compression.gzip.level",)),
        ConfigDef("compression.lz4.level", "9", INT, between(1, 17), "lz4 level used when the broker compresses with lz4." + _STORED + " (batches are never re-compressed).", ("compression.lz4.level",)),
        ConfigDef("compression.zstd.level", "3", INT, between(-131072, 22), "zstd level used when the broker compresses with zstd." + _STORED + " (batches are never re-compressed).", ("compression.zstd.level",)),
        ConfigDef("confluent.key.schema.validation", "false", BOOLEAN, None,
                  "Confluent Server's and Redpanda's name: every non-null record key must start with the magic byte 0 and the id of a schema registered "
                  "(live) under the subject <topic>-key in the built-in schema registry, else the record set is refused with INVALID_RECORD.", (), ENFORCED,
                  extension=True),
        ConfigDef("confluent.value.schema.validation", "false", BOOLEAN, None,
                  "Confluent Server's and Redpanda's name: every non-null record value must start with the magic byte 0 and the id of a schema registered "
                  "(live) under the subject <topic>-value in the built-in schema registry, else the record set is refused with INVALID_RECORD.", (), ENFORCED,
                  extension=True),
        ConfigDef("delete.retention.ms", "86400000", LONG, at_least(0), "How long a tombstone (a record with a null value) of a compacted topic is kept after the compactor first rewrote the segment holding it; "
                  "then it is removed. A consumer reading from the beginning sees a deleted key's tombstone if it reaches it within this time.",
                  ("log.cleaner.delete.retention.ms",), ENFORCED),
        ConfigDef("file.delete.delay.ms", "60000", LONG, at_least(0), "Wait before a deleted segment file is removed from disk." + _NO_DISK, ("log.segment.delete.delay.ms",)),
        ConfigDef("flush.messages", str(LONG_MAX), LONG, at_least(1), "Force an fsync after this many messages." + _STORED + " (a batch is acknowledged only once its segment is in the object store).", ("log.flush.interval.messages",)),
        ConfigDef("flush.ms", str(LONG_MAX), LONG, at_least(0), "Force an fsync after this long." + _STORED + " (a batch is acknowledged only once its segment is in the object store; see --flush-interval-ms).",
                  ("log.flush.interval.ms", "log.flush.scheduler.interval.ms")),
        ConfigDef("follower.replication.throttled.replicas", "", LIST, _throttled_replicas, "Replicas whose follower fetches are throttled (partition:broker list or *)." + _NO_REPLICAS),
        ConfigDef("index.interval.bytes", "4096", INT, at_least(0), "Bytes between offset index entries." + _STORED + " (segment indexes are built with --index-min-bytes).", ("log.index.interval.bytes",)),
        ConfigDef("leader.replication.throttled.replicas", "", LIST, _throttled_replicas, "Replicas whose leader side of replication is throttled (partition:broker list or *)." + _NO_REPLICAS),
        ConfigDef("local.retention.bytes", "-2", LONG, at_least(-2), "Local-disk retention by size for tiered topics (-2: retention.bytes)." + _NO_DISK, ("log.local.retention.bytes",)),
        ConfigDef("local.retention.ms", "-2", LONG, at_least(-2), "Local-disk retention by time for tiered topics (-2: retention.ms)." + _NO_DISK, ("log.local.retention.ms",)),
        ConfigDef("max.compaction.lag.ms", str(LONG_MAX), LONG, at_least(1), "Longest time a record of a compacted topic stays uncompacted: a partition whose oldest uncompacted segment is older than this is compacted "
                  "even below min.cleanable.dirty.ratio.", ("log.cleaner.max.compaction.lag.ms",), ENFORCED),
        ConfigDef("max.message.bytes", "1048588", INT, at_least(0), "Largest record batch (after compression) a producer may send to this topic; larger ones get MESSAGE_TOO_LARGE.",
                  ("message.max.bytes",), ENFORCED),
        ConfigDef("message.downconversion.enable", "true", BOOLEAN, None, "Whether Fetch v0-v3 (consumers reading message formats v0/v1) is served by converting the stored batches; "
                  "false answers them UNSUPPORTED_VERSION.", ("log.message.downconversion.enable",), ENFORCED),
        ConfigDef("message.format.version", "3.0-IV1", STRING, _message_format_version, "Deprecated message format version of the topic; ignored from inter-broker protocol 3.0 on, as in Kafka." + _STORED + ".",
                  ("log.message.format.version",)),
        ConfigDef("message.timestamp.after.max.ms", str(LONG_MAX), LONG, at_least(0),
                  "With CreateTime, a record whose timestamp is more than this many ms ahead of the broker's clock is refused with INVALID_TIMESTAMP.",
                  ("log.message.timestamp.after.max.ms",), ENFORCED),
        ConfigDef("message.timestamp.before.max.ms", str(LONG_MAX), LONG, at_least(0),
                  "With CreateTime, a record whose timestamp is more than this many ms behind the broker's clock is refused with INVALID_TIMESTAMP.",
                  ("log.message.timestamp.before.max.ms",), ENFORCED),
        ConfigDef("message.timestamp.difference.max.ms", str(LONG_MAX), LONG, at_least(0),
                  "Deprecated: the largest difference either way between a CreateTime record timestamp and the broker's clock; applies to whichever of "
                  "message.timestamp.before.max.ms and message.timestamp.after.max.ms is left at its default. Out-of-range records get INVALID_TIMESTAMP.",
                  ("log.message.timestamp.difference.max.ms",), ENFORCED),
        ConfigDef("message.timestamp.type", "CreateTime", STRING, one_of("CreateTime", "LogAppendTime"),
                  "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the broker's clock when it is appended.",
                  ("log.message.timestamp.type",), ENFORCED),
        ConfigDef("min.cleanable.dirty.ratio", "0.5", DOUBLE, between(0, 1), "A compacted partition is compacted when the bytes of its segments not yet compacted exceed this share of its compactable bytes "
                  "(higher: fewer, larger rewrites of segment objects; lower: less superseded data kept).", ("log.cleaner.min.cleanable.ratio",), ENFORCED),
        ConfigDef("min.compaction.lag.ms", "0", LONG, at_least(0), "Shortest time a record of a compacted topic stays uncompacted: a segment holding records younger than this is not compacted yet "
                  "(nor anything after it). Must not exceed max.compaction.lag.ms.", ("log.cleaner.min.compaction.lag.ms",), ENFORCED),
        ConfigDef("min.insync.replicas", "1", INT, at_least(1), "Replicas that must have a write for acks=all to succeed." + _NO_REPLICAS, ("min.insync.replicas",)),
        ConfigDef("preallocate", "false", BOOLEAN, None, "Preallocate segment files on disk." + _NO_DISK, ("log.preallocate",)),
        ConfigDef("remote.log.copy.disable", "false", BOOLEAN, None, "Stop copying segments to tiered storage." + _STORED + " (every segment lives in the object store)."),
        ConfigDef("remote.log.delete.on.disable", "false", BOOLEAN, None, "Delete tiered segments when tiered storage is turned off." + _STORED + " (every segment lives in the object store)."),
        ConfigDef("remote.storage.enable", "false", BOOLEAN, None, "Tiered storage for the topic." + _STORED + " (every segment lives in the object store)."),
        ConfigDef("retention.bytes", "-1", LONG, None, "Oldest segments of a partition are deleted while it holds more than this many bytes; -1: no size limit.",
                  ("log.retention.bytes",), ENFORCED),
        ConfigDef("retention.ms", "604800000", LONG, at_least(-1), "Segments whose newest record is older than this are deleted; -1: no time limit.",
                  ("log.retention.ms", "log.retention.minutes", "log.retention.hours"), ENFORCED),
        ConfigDef("segment.bytes", "1073741824", INT, at_least(14), "A partition's write buffer is sealed into a segment object at this size at the latest (KafScale's broker default is 4 MiB, --segment-bytes).",
                  ("log.segment.bytes",), ENFORCED),
        ConfigDef("segment.index.bytes", "10485760", INT, at_least(4), "Largest offset index file of a segment." + _STORED + ".", ("log.index.size.max.bytes",)),
        ConfigDef("segment.jitter.ms", "0", LONG, at_least(0), "Random jitter subtracted from segment.ms." + _STORED + ".", ("log.roll.jitter.ms", "log.roll.jitter.hours")),
        ConfigDef("segment.ms", "604800000", LONG, at_least(1), "Roll a new segment after this long." + _STORED + " (segments are sealed at each flush, at most --flush-interval-ms apart).",
                  ("log.roll.ms", "log.roll.hours")),
        ConfigDef("unclean.leader.election.enable", "false", BOOLEAN, None, "Whether an out-of-sync replica may become leader." + _NO_REPLICAS, ("unclean.leader.election.enable",)),
    ]
}

# Broker configs standing for topic configs, with the broker's defaults (Kafka's, except
# log.segment.bytes: KafScale seals segments at 4 MiB by default, see --segment-bytes).
# None: no default (Kafka reports the config with a null value).
BROKER_TOPIC_DEFAULTS: dict[str, tuple[str | None, int]] = {
    "log.cleanup.policy": ("delete", LIST),
    "compression.type": ("producer", STRING),
    "compression.gzip.level": ("-1", INT),
    "compression.lz4.level": ("9", INT),
    "compression.zstd.level": ("3", INT),
    "log.cleaner.delete.retention.ms": ("86400000", LONG),
    "log.segment.delete.delay.ms": ("60000", LONG),
    "log.flush.interval.messages": (str(LONG_MAX), LONG),
    "log.flush.interval.ms": (None, LONG),
    "log.flush.scheduler.interval.ms": (str(LONG_MAX), LONG),
    "log.index.interval.bytes": ("4096", INT),
    "log.local.retention.bytes": ("-2", LONG),
    "log.local.retention.ms": ("-2", LONG),
    "log.cleaner.max.compaction.lag.ms": (str(LONG_MAX), LONG),
    "message.max.bytes": ("1048588", INT),
    "log.message.downconversion.enable": ("true", BOOLEAN),
    "log.message.format.version": ("3.0-IV1", STRING),
    "log.message.timestamp.after.max.ms": (str(LONG_MAX), LONG),
    "log.message.timestamp.before.max.ms": (str(LONG_MAX), LONG),
    "log.message.timestamp.difference.max.ms": (str(LONG_MAX), LONG),
    "log.message.timestamp.type": ("CreateTime", STRING),
    "log.cleaner.min.cleanable.ratio": ("0.5", DOUBLE),
    "log.cleaner.min.compaction.lag.ms": ("0", LONG),
    "min.insync.replicas": ("1", INT),
    "log.preallocate": ("false", BOOLEAN),
    "log.retention.bytes": ("-1", LONG),
    "log.retention.ms": (None, LONG),
    "log.retention.minutes": (None, INT),
    "log.retention.hours": ("168", INT),
    "log.segment.bytes": (str(4 * 1024 * 1024), INT),
    "log.index.size.max.bytes": ("10485760", INT),
    "log.roll.jitter.ms": (None, LONG),
    "log.roll.jitter.hours": ("0", INT),
    "log.roll.ms": (None, LONG),
    "log.roll.hours": ("168", INT),
    "unclean.leader.election.enable": ("false", BOOLEAN),
}


_BROKER_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)


def broker_synonyms(name: str) -> tuple[str, ...]:
    """Kafka's DynamicBrokerConfig.brokerConfigSynonyms for a broker config name."""
    if name == "log.flush.interval.ms":
        return (name, "log.flush.scheduler.interval.ms")
    for group in _BROKER_SYNONYM_GROUPS:
        if name in group:
            return group
    return (name,)


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class Resolved:
    name: str
    value: str | None
    source: int
    synonyms: tuple[Synonym, ...] = field(default=())


def _broker_synonym_entries(first: str, names: tuple[str, ...], broker_static: dict[str, str]) -> list[Synonym]:
    out = [Synonym(n, broker_static[n], STATIC_BROKER_CONFIG) for n in names if n in broker_static]
    out += [Synonym(n, BROKER_TOPIC_DEFAULTS[n][0], DEFAULT_CONFIG) for n in names if n in BROKER_TOPIC_DEFAULTS and BROKER_TOPIC_DEFAULTS[n][0] is not None]
    while out and out[0].name != first:  # Kafka drops leading synonyms not named `first`
        out.pop(0)
    return out


def resolve(name: str, overrides: dict[str, str], broker_static: dict[str, str] | None = None) -> Resolved:
    """Value, source and synonyms of topic config `name`, as Kafka's DescribeConfigs."""
    d = TOPIC_CONFIGS[name]
    static = broker_static or {}
    syns = _broker_synonym_entries(d.synonyms[0], d.synonyms, static) if d.synonyms else []
    if name in overrides:
        syns.insert(0, Synonym(name, overrides[name], DYNAMIC_TOPIC_CONFIG))
        value = overrides[name]
    else:
        value = d.default
        for n in d.synonyms:
            v = static.get(n, BROKER_TOPIC_DEFAULTS.get(n, (None,))[0])
            if v is not None:
                value = str(int(v) * SYNONYM_FACTOR[n]) if n in SYNONYM_FACTOR else v
                break
    return Resolved(name, value, syns[0].source if syns else DEFAULT_CONFIG, tuple(syns))


def resolve_broker(name: str, broker_static: dict[str, str]) -> Resolved:
    """A broker config standing for topic configs (log.retention.ms, ...), as Kafka reports
    it on a broker resource."""
    syns = _broker_synonym_entries(name, broker_synonyms(name), broker_static)
    value = broker_static.get(name, BROKER_TOPIC_DEFAULTS[name][0])
    return Resolved(name, value, syns[0].source if syns else DEFAULT_CONFIG, tuple(syns))


def normalize(configs: dict[str, str | None], broker_static: dict[str, str] | None = None) -> dict[str, str | None]:
    """The configs with values as Kafka prints them; InvalidConfigError names the first
    unknown or invalid entry, with Kafka's message. A None value (deletion) is kept as None.
    `configs` is a topic's whole set of overrides: the checks across configs (Kafka's
    LogConfig.validateValues) see them over the broker's defaults."""
    out: dict[str, str | None] = {}
    for name, value in configs.items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise InvalidConfigError(f"unknown topic config {name}")
        if value is None:
            out[name] = None
            continue
        try:
            v = normalize_value(d.kind, value)
            if d.validate is not None:
                d.validate(v)
        except InvalidConfigError as e:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: {e}") from None
        out[name] = v
    given = {k: v for k, v in out.items() if v is not None}
    lo = int(resolve("min.compaction.lag.ms", given, broker_static).value or 0)
    hi = int(resolve("max.compaction.lag.ms", given, broker_static).value or LONG_MAX)
    if lo > hi:
        raise InvalidConfigError(f"conflict topic config setting min.compaction.lag.ms ({lo}) > max.compaction.lag.ms ({hi})")
    return out


def validate(configs: dict[str, str | None], broker_static: dict[str, str] | None = None) -> None:
    normalize(configs, broker_static)


def listed(configs: dict[str, str], keys=None) -> list[str]:
    """The names a topic's config listing gives, sorted: every Kafka config, an extension
    only where the topic sets it; `keys` (a non-empty list) asks for those names only."""
    if keys:
        return sorted(name for name in TOPIC_CONFIGS if name in keys)
    return sorted(name for name, d in TOPIC_CONFIGS.items() if not d.extension or name in configs)


def effective(configs: dict[str, str], broker_static: dict[str, str] | None = None) -> dict[str, str | None]:
    return {name: resolve(name, configs, broker_static).value for name in TOPIC_CONFIGS}


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The configs the log itself acts on, parsed once."""

    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    max_message_bytes: int
    log_append_time: bool
    # CreateTime records must lie in [now - before, now + after] (Kafka's LogValidator)
    timestamp_before_max_ms: int = LONG_MAX
    timestamp_after_max_ms: int = LONG_MAX
    # cleanup.policy: delete applies retention.ms/bytes; compact runs the compactor.
    cleanup_delete: bool = True
    cleanup_compact: bool = False
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86_400_000
    # message.downconversion.enable: Fetch v0-v3 served by down-converting (protocol/legacy.py)
    downconversion: bool = True
    # confluent.{key,value}.schema.validation: records carry a registered schema id (registry/validation.py)
    key_schema_validation: bool = False
    value_schema_validation: bool = False

    @property
    def schema_validation(self) -> bool:
        return self.key_schema_validation or self.value_schema_validation

    @classmethod
    def from_configs(cls, configs: dict[str, str], broker_static: dict[str, str] | None = None) -> "LogSettings":
        c = effective(configs, broker_static)
        difference = int(c["message.timestamp.difference.max.ms"])
        before, after = int(c["message.timestamp.before.max.ms"]), int(c["message.timestamp.after.max.ms"])
        policies = cleanup_policies(c["cleanup.policy"])
        return cls(
            int(c["retention.ms"]),
            int(c["retention.bytes"]),
            int(c["segment.bytes"]),
            int(c["max.message.bytes"]),
            c["message.timestamp.type"] == "LogAppendTime",
            # the deprecated difference applies where before/after keep their default, as in Kafka
            before if before != LONG_MAX else difference,
            after if after != LONG_MAX else difference,
            "delete" in policies,
            "compact" in policies,
            float(c["min.cleanable.dirty.ratio"]),
            int(c["min.compaction.lag.ms"]),
            int(c["max.compaction.lag.ms"]),
            int(c["delete.retention.ms"]),
            c["message.downconversion.enable"] == "true",
            c["confluent.key.schema.validation"] == "true",
            c["confluent.value.schema.validation"] == "true",
        )
