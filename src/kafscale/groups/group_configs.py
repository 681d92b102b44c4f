"""The groups' config overrides (GROUP config resources) as this broker's coordinators use
them, and their changes through DescribeConfigs/AlterConfigs/IncrementalAlterConfigs.

The store (`/group-configs/{group}`, MetadataStore.alter_group_config) is the truth: a change
is validated as Kafka validates it (metadata/group_config.py) over the overrides it read and
written in one guarded transaction. A coordinator reads a group's overrides at most every
`refresh_s` (a change through another broker applies within that time; through this broker,
at once), so steady heartbeats cost no metadata reads.

Kafka keeps a group's configs when the group is deleted (they live apart from the group and
may exist before it), and so does KafScale.
"""

from __future__ import annotations

import time
from typing import Callable

from kafscale.metadata import group_config
from kafscale.metadata.group_config import GroupLimits

CACHE_SWEEP_AT = 10_000  # cached groups; past this, entries older than refresh_s are dropped


class GroupConfigs:
    def __init__(self, metadata, limits: GroupLimits, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.metadata = metadata
        self.limits = limits
        self.refresh_s = refresh_s
        self.clock = clock
        self._cache: dict[str, tuple[float, dict[str, str]]] = {}  # group -> (read at, overrides)

    async def overrides(self, group_id: str) -> dict[str, str]:
        """The group's overrides, at most `refresh_s` old."""
        now = self.clock()
        cached = self._cache.get(group_id)
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1]
        found = await self.metadata.get_group_config(group_id)
        self._remember(group_id, now, found)
        return found

    def _remember(self, group_id: str, now: float, found: dict[str, str]) -> None:
        if len(self._cache) >= CACHE_SWEEP_AT:  # stale entries would be re-read anyway
            self._cache = {g: e for g, e in self._cache.items() if now - e[0] < self.refresh_s}
        self._cache[group_id] = (now, found)

    async def effective_overrides(self, group_id: str) -> dict[str, str]:
        """The group's overrides as its coordinator and share partitions apply them: numbers
        clamped to the broker's current bounds (Kafka's GroupConfig.evaluate)."""
        found = await self.overrides(group_id)
        return {name: group_config.effective(name, found, self.limits) for name in found}

    async def describe(self, group_id: str) -> list[group_config.Resolved]:
        """Every group config of the group, as DescribeConfigs reports them (from the store)."""
        found = await self.metadata.get_group_config(group_id)
        return [group_config.resolve(name, found, self.limits) for name in sorted(group_config.GROUP_CONFIGS)]

    async def alter(self, group_id: str, change: Callable[[dict[str, str]], dict[str, str]], validate_only: bool) -> dict[str, str]:
        """`change(old overrides) -> new overrides`, validated (InvalidConfigError, or what
        `change` raises) before anything is stored; the new overrides."""

        def checked(old: dict[str, str]) -> dict[str, str]:
            return group_config.validate(change(dict(old)), self.limits)

        if validate_only:
            return checked(await self.metadata.get_group_config(group_id))
        new = await self.metadata.alter_group_config(group_id, checked)
        self._remember(group_id, self.clock(), new)
        return new
