"""The settings share groups run by, in one place (`ShareSettings.for_group`).

Broker defaults are Kafka's `group.share.*` broker configs (BrokerConfig fields
`group_share_*`); a group may override some of them with Kafka's GROUP config resource
keys (`share.auto.offset.reset`, `share.record.lock.duration.ms`, ...). Everything that
runs a share group (the group coordinator's heartbeat, the share-partition manager's
fetches and lock timers) asks `for_group(group_id)` and reads the resolved
`ShareGroupSettings`; per-group configs are plugged in with `set_group_configs`, a
function returning a group's stored overrides (empty: the broker defaults hold)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Awaitable, Callable, Mapping

# Kafka's GROUP config keys of share groups -> the ShareGroupSettings field they set
GROUP_KEYS = {
    "share.auto.offset.reset": "auto_offset_reset",
    "share.record.lock.duration.ms": "record_lock_duration_ms",
    "share.isolation.level": "isolation_level",
    "share.session.timeout.ms": "session_timeout_ms",
    "share.heartbeat.interval.ms": "heartbeat_interval_ms",
    "share.delivery.count.limit": "delivery_count_limit",
}

# BrokerConfig fields (Kafka's group.share.* names in broker/config.py KAFKA_NAMES)
BROKER_FIELDS = {
    "record_lock_duration_ms": "group_share_record_lock_duration_ms",
    "session_timeout_ms": "group_share_session_timeout_ms",
    "heartbeat_interval_ms": "group_share_heartbeat_interval_ms",
    "delivery_count_limit": "group_share_delivery_count_limit",
    "partition_max_record_locks": "group_share_partition_max_record_locks",
    "max_size": "group_share_max_size",
}


@dataclass(frozen=True, slots=True)
class ShareGroupSettings:
    """What one share group runs by (Kafka 4.1's defaults)."""

    auto_offset_reset: str = "latest"  # where a share partition starts: latest | earliest
    record_lock_duration_ms: int = 30_000  # how long an acquired record stays locked to its consumer
    isolation_level: str = "read_uncommitted"  # read_committed: aborted transactions' records are never delivered
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    delivery_count_limit: int = 5  # deliveries after which a released or timed-out record is archived
    partition_max_record_locks: int = 2_000  # records in flight (acquired or awaiting redelivery) per share partition
    max_size: int = 200  # members per share group

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    def with_group_configs(self, configs: Mapping[str, str]) -> "ShareGroupSettings":
        """These settings with a group's GROUP configs applied (unknown keys ignored)."""
        changes = {}
        types = {f.name: f.type for f in fields(self)}
        for key, value in configs.items():
            name = GROUP_KEYS.get(key)
            if name is None or value is None:
                continue
            changes[name] = int(value) if types[name] in (int, "int") else str(value)
        return replace(self, **changes) if changes else self


def broker_share_settings(config) -> ShareGroupSettings:
    """The broker's defaults (its group.share.* settings)."""
    base = ShareGroupSettings()
    values = {name: int(getattr(config, attr)) for name, attr in BROKER_FIELDS.items() if hasattr(config, attr)}
    return replace(base, **values)


GroupConfigs = Callable[[str], Awaitable[Mapping[str, str]]]


class ShareSettings:
    """Broker defaults plus per-group overrides: the one seam share-group code reads."""

    def __init__(self, defaults: ShareGroupSettings | None = None, group_configs: GroupConfigs | None = None):
        self.defaults = defaults or ShareGroupSettings()
        self._group_configs = group_configs

    def set_group_configs(self, group_configs: GroupConfigs | None) -> None:
        """Where a group's GROUP configs come from (e.g. the metadata store)."""
        self._group_configs = group_configs

    async def for_group(self, group_id: str) -> ShareGroupSettings:
        if self._group_configs is None:
            return self.defaults
        return self.defaults.with_group_configs(await self._group_configs(group_id))
