"""Group configs (GROUP config resources, DescribeConfigs/AlterConfigs resource type 32): the
one table of the per-group settings Apache Kafka 4.1 has, their defaults from the broker's
settings, Kafka's validation, and the effective values the coordinators use.

Kafka's semantics, kept here (GroupConfig, GroupConfigManager, ConfigHelper):
- a group's overrides are validated as a whole set, merged over the broker-level values
  (`group.consumer.session.timeout.ms` stands behind `consumer.session.timeout.ms`, ...):
  unknown names first ("Unknown group config name: x"), then each value's type and range in
  the table's order, then the broker's bounds (`group.consumer.min.session.timeout.ms` and
  friends), then that each session timeout exceeds its heartbeat interval; every failure is
  INVALID_CONFIG with Kafka's message;
- a config may be set on a group that does not exist (a share group's
  `share.auto.offset.reset` is set before its consumers start), and describing any group
  answers the full list: the override where one is set (source GROUP_CONFIG), else the
  broker-level value (DEFAULT_CONFIG), each with itself as its only synonym;
- the effective value is the override clamped to the broker's current bounds (they may
  have changed since it was set), else the broker's value.

The `streams.*` keys are Kafka's (KIP-1071 streams groups, which KafScale does not have):
validated against Kafka's default `group.streams.*` bounds, stored and reported, no effect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from kafscale.metadata.topic_config import DEFAULT_CONFIG, INT, STRING, InvalidConfigError, Resolved, Synonym

GROUP_CONFIG = 8  # DescribeConfigs config_source of a group override (Kafka's ConfigSource.GROUP_CONFIG)
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The broker-level settings behind group configs: defaults and bounds (Kafka's
    group.consumer.*, group.share.*, group.streams.*). Field names are BrokerConfig's."""

    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_min_session_timeout_ms: int = 45_000
    group_consumer_max_session_timeout_ms: int = 60_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_min_heartbeat_interval_ms: int = 5_000
    group_consumer_max_heartbeat_interval_ms: int = 15_000
    group_share_session_timeout_ms: int = 45_000
    group_share_min_session_timeout_ms: int = 45_000
    group_share_max_session_timeout_ms: int = 60_000
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_min_heartbeat_interval_ms: int = 5_000
    group_share_max_heartbeat_interval_ms: int = 15_000
    group_share_record_lock_duration_ms: int = 30_000
    group_share_min_record_lock_duration_ms: int = 15_000
    group_share_max_record_lock_duration_ms: int = 60_000
    # No flags: KafScale has no streams groups; Kafka's defaults.
    group_streams_session_timeout_ms: int = 45_000
    group_streams_min_session_timeout_ms: int = 45_000
    group_streams_max_session_timeout_ms: int = 60_000
    group_streams_heartbeat_interval_ms: int = 5_000
    group_streams_min_heartbeat_interval_ms: int = 5_000
    group_streams_max_heartbeat_interval_ms: int = 15_000
    group_streams_num_standby_replicas: int = 0
    group_streams_max_standby_replicas: int = 2

    @classmethod
    def from_config(cls, config) -> "GroupLimits":
        """From a BrokerConfig (any object with these attributes; missing ones keep Kafka's defaults)."""
        return cls(**{f.name: int(getattr(config, f.name)) for f in fields(cls) if hasattr(config, f.name)})

    def check(self) -> None:
        """Refuse broker settings Kafka refuses at start (ValueError, Kafka's wording)."""
        for kind in ("consumer", "share", "streams"):
            for what in ("session.timeout.ms", "heartbeat.interval.ms"):
                attr = what.replace(".", "_")
                value = getattr(self, f"group_{kind}_{attr}")
                lo = getattr(self, f"group_{kind}_min_{attr}")
                hi = getattr(self, f"group_{kind}_max_{attr}")
                if value < lo:
                    raise ValueError(f"group.{kind}.{what} must be greater than or equal to group.{kind}.min.{what}")
                if value > hi:
                    raise ValueError(f"group.{kind}.{what} must be less than or equal to group.{kind}.max.{what}")
            if getattr(self, f"group_{kind}_heartbeat_interval_ms") >= getattr(self, f"group_{kind}_session_timeout_ms"):
                raise ValueError(f"group.{kind}.heartbeat.interval.ms must be less than group.{kind}.session.timeout.ms")
        lock, lo, hi = (self.group_share_record_lock_duration_ms, self.group_share_min_record_lock_duration_ms,
                        self.group_share_max_record_lock_duration_ms)
        if not 1000 <= lock <= 3_600_000 or not 1000 <= lo <= 30_000 or not 30_000 <= hi <= 3_600_000:
            raise ValueError("group.share.record.lock.duration.ms must be in [1000, 3600000], its min in [1000, 30000] and its max in [30000, 3600000]")
        if lock < lo:
            raise ValueError("group.share.record.lock.duration.ms must be greater than or equal to group.share.min.record.lock.duration.ms")
        if lock > hi:
            raise ValueError("group.share.max.record.lock.duration.ms must be greater than or equal to group.share.record.lock.duration.ms")


# -- share.auto.offset.reset -------------------------------------------------------------------

# java.time.Duration.parse's ISO-8601 form PnDTnHnMn.nS (case-insensitive, signs allowed)
_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.IGNORECASE,
)
BY_DURATION = "by_duration:"


def parse_duration_ms(text: str) -> float | None:
    """Milliseconds of an ISO-8601 duration as Java's Duration.parse reads it; None if it is not one."""
    m = _DURATION.fullmatch(text)
    if m is None or m.group(3) == "T" or not any(m.group(i) for i in (2, 4, 5, 6)):
        return None
    days, hours, minutes, secs = (int(m.group(i) or 0) for i in (2, 4, 5, 6))
    frac = m.group(7) or ""
    seconds = days * 86_400 + hours * 3600 + minutes * 60 + secs
    nanos = int(frac.ljust(9, "0")) if frac else 0
    if m.group(6) and m.group(6).startswith("-"):
        nanos = -nanos
    total_ms = seconds * 1000 + nanos / 1e6
    return -total_ms if m.group(1) == "-" else total_ms


def auto_offset_reset_by_duration_ms(value: str) -> float | None:
    """For `by_duration:<ISO duration>`: how far back from now a new share-partition starts (ms);
    None for earliest and latest."""
    return parse_duration_ms(value[len(BY_DURATION):]) if value.startswith(BY_DURATION) else None


def _auto_offset_reset(v: str) -> None:
    # Kafka's ShareGroupAutoOffsetResetStrategy: earliest, latest (case-sensitive) or
    # by_duration:<duration> with a duration that is not negative
    if v in ("earliest", "latest"):
        return
    if v.startswith(BY_DURATION):
        ms = parse_duration_ms(v[len(BY_DURATION):])
        if ms is not None and ms >= 0:
            return
    raise InvalidConfigError(f"Invalid value `{v}` for configuration share.auto.offset.reset. "
                             "The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.")


def _one_of(*choices: str):
    def check(v: str) -> None:
        if v not in choices:
            raise InvalidConfigError(f"String must be one of: {', '.join(choices)}")

    return check


def _at_least(lo: int):
    def check(v: str) -> None:
        if int(v) < lo:
            raise InvalidConfigError(f"Value must be at least {lo}")

    return check


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bounds:
    """The broker settings (GroupLimits fields) bounding a group config, by Kafka's name."""

    min_field: str | None
    max_field: str


@dataclass(frozen=True, slots=True)
class GroupConfigDef:
    name: str
    kind: int
    broker_field: str | None  # the GroupLimits field giving its default, if a broker setting does
    default: str | None  # else Kafka's fixed default
    validate: object
    doc: str
    bounds: Bounds | None = None

    def default_value(self, limits: GroupLimits) -> str:
        return str(getattr(limits, self.broker_field)) if self.broker_field else str(self.default)


def _kafka_name(limits_field: str) -> str:
    return limits_field.replace("_", ".")


def _bounded(group_type: str, setting: str, least: int, doc: str) -> GroupConfigDef:
    """An INT group config `<group_type>.<setting>` whose default is the broker's
    group.<group_type>.<setting> and whose bounds are the broker's group.<group_type>.min.<setting>
    and max.<setting> (Kafka's naming; `setting` as a GroupLimits field part)."""
    return GroupConfigDef(f"{group_type}.{_kafka_name(setting)}", INT, f"group_{group_type}_{setting}", None, _at_least(least), doc,
                          Bounds(f"group_{group_type}_min_{setting}", f"group_{group_type}_max_{setting}"))


_NO_STREAMS = " KafScale has no streams groups (KIP-1071): stored and reported, no effect."

# In Kafka's definition order: values are parsed, and the first bad one reported, in this order.
GROUP_CONFIGS: dict[str, GroupConfigDef] = {
    d.name: d
    for d in [
        _bounded("consumer", "session_timeout_ms", 1,
                 "A consumer-protocol (KIP-848) member of this group that sends no heartbeat for this long is removed from it."),
        _bounded("consumer", "heartbeat_interval_ms", 1,
                 "How often consumer-protocol (KIP-848) members of this group heartbeat; given to them in every heartbeat response."),
        _bounded("share", "session_timeout_ms", 1,
                 "A member of this share group that sends no heartbeat for this long is removed from it."),
        _bounded("share", "heartbeat_interval_ms", 1,
                 "How often members of this share group heartbeat."),
        _bounded("share", "record_lock_duration_ms", 1000,
                 "How long a record delivered to a member of this share group stays locked to it; unacknowledged when the lock expires, it is delivered again."),
        GroupConfigDef("share.auto.offset.reset", STRING, None, "latest", _auto_offset_reset,
                       "Where a share-partition of this group starts when it has no state yet: earliest (the log start), latest (the log end) or "
                       "by_duration:<ISO-8601 duration, PnDTnHnMn.nS> (the first record at or after now minus the duration; not negative)."),
        GroupConfigDef("share.isolation.level", STRING, None, "read_uncommitted", _one_of("read_committed", "read_uncommitted"),
                       "read_committed: this share group delivers transactional records only once their transaction commits, and never aborted ones; "
                       "read_uncommitted: every record. Records outside transactions are delivered in both."),
        _bounded("streams", "session_timeout_ms", 1,
                 "Session timeout of streams-group members." + _NO_STREAMS),
        _bounded("streams", "heartbeat_interval_ms", 1,
                 "Heartbeat interval of streams-group members." + _NO_STREAMS),
        GroupConfigDef("streams.num.standby.replicas", INT, "group_streams_num_standby_replicas", None, _at_least(0),
                       "Standby replicas of each streams task." + _NO_STREAMS,
                       Bounds(None, "group_streams_max_standby_replicas")),
    ]
}

# (session timeout, heartbeat interval) pairs: the session must be the longer
_SESSION_OVER_HEARTBEAT = (
    ("consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"),
    ("share.session.timeout.ms", "share.heartbeat.interval.ms"),
    ("streams.session.timeout.ms", "streams.heartbeat.interval.ms"),
)
# Kafka's order of the bound checks (heartbeat before session, group kind by kind)
_BOUND_CHECK_ORDER = (
    "consumer.heartbeat.interval.ms", "consumer.session.timeout.ms",
    "share.heartbeat.interval.ms", "share.session.timeout.ms", "share.record.lock.duration.ms",
    "streams.heartbeat.interval.ms", "streams.session.timeout.ms", "streams.num.standby.replicas",
)


def _normalized(d: GroupConfigDef, raw: str) -> str:
    """The value as Kafka parses it (ConfigDef: trimmed; an INT is a Java int)."""
    v = raw.strip()
    if d.kind == INT:
        if not re.fullmatch(r"[+-]?[0-9]+", v) or not INT_MIN <= int(v) <= INT_MAX:
            raise InvalidConfigError(f"Invalid value {raw} for configuration {d.name}: Not a number of type INT")
        v = str(int(v))
    try:
        d.validate(v)
    except InvalidConfigError as e:  # Kafka's ConfigException(name, value, message) wording
        raise InvalidConfigError(f"Invalid value {v} for configuration {d.name}: {e}") from None
    return v


def validate(overrides: dict[str, str], limits: GroupLimits) -> dict[str, str]:
    """A group's whole set of overrides, normalized as Kafka prints them; InvalidConfigError
    (INVALID_CONFIG) with Kafka's message for the first problem."""
    for name in overrides:
        if name not in GROUP_CONFIGS:
            raise InvalidConfigError(f"Unknown group config name: {name}")
    out = {name: _normalized(GROUP_CONFIGS[name], value) for name, value in sorted(overrides.items(), key=lambda kv: _ORDER[kv[0]])}
    values = {name: int(resolve(name, out, limits).value) for name in _BOUND_CHECK_ORDER}
    for name in _BOUND_CHECK_ORDER:
        b = GROUP_CONFIGS[name].bounds
        if b.min_field is not None and values[name] < getattr(limits, b.min_field):
            raise InvalidConfigError(f"{name} must be greater than or equal to {_kafka_name(b.min_field)}")
        if values[name] > getattr(limits, b.max_field):
            raise InvalidConfigError(f"{name} must be less than or equal to {_kafka_name(b.max_field)}")
    for session, heartbeat in _SESSION_OVER_HEARTBEAT:
        if values[session] <= values[heartbeat]:
            raise InvalidConfigError(f"{session} must be greater than {heartbeat}")
    return {name: out[name] for name in overrides}


_ORDER = {name: i for i, name in enumerate(GROUP_CONFIGS)}


def resolve(name: str, overrides: dict[str, str], limits: GroupLimits) -> Resolved:
    """Value, source and synonyms of group config `name`, as Kafka's DescribeConfigs: the
    override (GROUP_CONFIG) or the broker-level value (DEFAULT_CONFIG), itself its only synonym."""
    d = GROUP_CONFIGS[name]
    if name in overrides:
        value, source = overrides[name], GROUP_CONFIG
    else:
        value, source = d.default_value(limits), DEFAULT_CONFIG
    return Resolved(name, value, source, (Synonym(name, value, source),))


def effective_int(name: str, overrides: dict[str, str], limits: GroupLimits) -> int:
    """The value a coordinator uses: the override clamped to the broker's current bounds
    (they may have been changed since it was set), else the broker's value."""
    d = GROUP_CONFIGS[name]
    if name not in overrides:
        return int(d.default_value(limits))
    value = int(overrides[name])
    if d.bounds is not None:
        if d.bounds.min_field is not None:
            value = max(value, getattr(limits, d.bounds.min_field))
        value = min(value, getattr(limits, d.bounds.max_field))
    return value


def effective(name: str, overrides: dict[str, str], limits: GroupLimits) -> str:
    """As `effective_int`, for any config (strings as they are)."""
    return str(effective_int(name, overrides, limits)) if GROUP_CONFIGS[name].kind == INT else overrides.get(name, GROUP_CONFIGS[name].default_value(limits))
