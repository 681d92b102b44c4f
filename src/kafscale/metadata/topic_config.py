"""Topic configs the broker understands: defaults, validation and typed access."""

from __future__ import annotations

from dataclasses import dataclass


class InvalidConfigError(ValueError):
    pass


def _non_negative_or_minus_one(v: str) -> None:
    if int(v) < -1:
        raise InvalidConfigError("must be >= -1")


def _positive(v: str) -> None:
    if int(v) <= 0:
        raise InvalidConfigError("must be > 0")


def _timestamp_type(v: str) -> None:
    if v not in ("CreateTime", "LogAppendTime"):
        raise InvalidConfigError("must be CreateTime or LogAppendTime")


def _cleanup_policy(v: str) -> None:
    policies = {p.strip() for p in v.split(",") if p.strip()}
    if "compact" in policies:
        raise InvalidConfigError("cleanup.policy=compact is not supported: KafScale segments are immutable; use delete")
    if policies != {"delete"}:
        raise InvalidConfigError("must be delete")


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    default: str
    validate: object
    kind: int  # DescribeConfigs config_type: 2 boolean, 3 int, 5 long, 2? see CONFIG_TYPES
    doc: str


# DescribeConfigs v3+ config_type values.
STRING, INT, LONG, LIST = 2, 3, 5, 7

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    c.name: c
    for c in [
        ConfigDef("retention.ms", str(7 * 24 * 3600 * 1000), _non_negative_or_minus_one, LONG, "Delete segments older than this; -1 keeps forever"),
        ConfigDef("retention.bytes", "-1", _non_negative_or_minus_one, LONG, "Delete oldest segments beyond this size per partition; -1 unlimited"),
        ConfigDef("segment.bytes", str(4 * 1024 * 1024), _positive, INT, "Seal a segment at this size"),
        ConfigDef("max.message.bytes", str(1024 * 1024 + 12), _positive, INT, "Largest record batch accepted"),
        ConfigDef("message.timestamp.type", "CreateTime", _timestamp_type, STRING, "CreateTime or LogAppendTime"),
        ConfigDef("cleanup.policy", "delete", _cleanup_policy, LIST, "Only delete is supported"),
    ]
}


def validate(configs: dict[str, str | None]) -> None:
    """Raise InvalidConfigError naming the first unknown or invalid entry."""
    for name, value in configs.items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise InvalidConfigError(f"unknown or unsupported topic config {name}")
        if value is None:
            continue
        try:
            d.validate(value)
        except InvalidConfigError as e:
            raise InvalidConfigError(f"invalid value {value!r} for {name}: {e}") from None
        except ValueError:
            raise InvalidConfigError(f"invalid value {value!r} for {name}: not a number") from None


def effective(configs: dict[str, str], broker_defaults: dict[str, str] | None = None) -> dict[str, str]:
    out = {name: d.default for name, d in TOPIC_CONFIGS.items()}
    out.update(broker_defaults or {})
    out.update(configs)
    return out


@dataclass(frozen=True, slots=True)
class LogSettings:
    """The configs the log itself acts on, parsed once."""

    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    max_message_bytes: int
    log_append_time: bool

    @classmethod
    def from_configs(cls, configs: dict[str, str], broker_defaults: dict[str, str] | None = None) -> "LogSettings":
        c = effective(configs, broker_defaults)
        return cls(
            int(c["retention.ms"]),
            int(c["retention.bytes"]),
            int(c["segment.bytes"]),
            int(c["max.message.bytes"]),
            c["message.timestamp.type"] == "LogAppendTime",
        )
