"""The asyncio driver of share groups (KIP-932), beside the classic and consumer ones.

It lives inside `GroupCoordinator` (`groups.share`) and shares its per-group locks, its
view of which groups this broker coordinates, its timers and its store: a group id is one
group, classic, consumer or share. The group's document is kept under the same store key,
marked `"type": "share"` (`ShareGroup.to_doc`), and written after every heartbeat that
changed it, so a coordinator failover keeps members, epochs and assignments; session
timers restart on load. Settings come from `kafscale.share.settings.ShareSettings`.

The share partitions' state (which records are acquired, acknowledged, ...) is not the
group coordinator's: it lives with each partition's owner (`kafscale.share`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable, Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.share_group import (
    ShareGroup,
    ShareHeartbeatRequest,
    ShareHeartbeatResult,
    is_share_group_doc,
    validate_request,
)
from kafscale.share.settings import ShareSettings, broker_share_settings

log = logging.getLogger("kafscale.groups")

TopicLookup = Callable[[Iterable[str]], Awaitable[Mapping[str, tuple[str, int]]]]


class ShareGroupCoordinator:
    def __init__(self, parent, settings: ShareSettings | None = None):
        # parent: the GroupCoordinator (its locks, clock, store, timers and other groups)
        self.parent = parent
        self.metadata = parent.metadata
        self.settings = settings or ShareSettings(broker_share_settings(parent.config))
        self.groups: dict[str, ShareGroup] = {}

    async def stop(self) -> None:
        self.groups.clear()

    def forget(self, group_id: str) -> None:
        """This broker no longer coordinates the group (call with its lock held)."""
        if self.groups.pop(group_id, None) is not None:
            self.parent.cancel_timer(group_id)

    async def heartbeat(self, group_id: str, req: ShareHeartbeatRequest, lookup: TopicLookup) -> ShareHeartbeatResult:
        validate_request(group_id, req)
        settings = await self.settings.for_group(group_id)
        async with self.parent._locks[group_id]:
            group = await self.loaded(group_id)
            if group is None:
                if req.member_epoch != 0:
                    raise KafkaError(ErrorCode.group_id_not_found, f"Share group {group_id} not found.")
                group = await self._create(group_id)
            topics = await lookup(group.subscribed_topic_names() | set(req.subscribed_topic_names or ()))
            before = (group.group_epoch, len(group.members))
            try:
                result = group.heartbeat(self.parent.clock(), req, topics, settings.session_timeout_ms,
                                         settings.heartbeat_interval_ms, settings.max_size)
            finally:
                await self._settle(group)
            if (group.group_epoch, len(group.members)) != before:
                log.info("share group %s: %s, group epoch %d, %d members", group_id, group.state.value,
                         group.group_epoch, len(group.members))
            return result

    async def describe(self, group_id: str) -> ShareGroup | None:
        async with self.parent._locks[group_id]:
            return await self.loaded(group_id)

    async def list_groups(self, owned: Callable[[str], bool]) -> list[tuple[str, str]]:
        """(group id, state) of the share groups this broker coordinates."""
        out = []
        for group_id, doc in (await self.metadata.list_groups()).items():
            if is_share_group_doc(doc) and owned(group_id):
                group = self.groups.get(group_id) or ShareGroup.from_doc(group_id, doc, self.parent.clock(), 0)
                out.append((group_id, group.state.value))
        return sorted(out)

    async def delete(self, group: ShareGroup) -> ErrorCode:
        """DeleteGroups: only an empty group (NON_EMPTY_GROUP otherwise), with its share-partition state."""
        if group.members:
            return ErrorCode.non_empty_group
        self.forget(group.group_id)
        await self.metadata.delete_group(group.group_id)
        await self.metadata.delete_share_states(group.group_id)
        return ErrorCode.none

    # -- loading and persistence ---------------------------------------------------------------

    async def loaded(self, group_id: str) -> ShareGroup | None:
        """The share group from memory or the store; None if the id is free or another
        kind of group (call with the group's lock held)."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        if group_id in self.parent.groups or group_id in self.parent.consumer.groups:
            return None
        doc = await self.metadata.get_group(group_id)
        if not is_share_group_doc(doc):
            return None
        settings = await self.settings.for_group(group_id)
        group = ShareGroup.from_doc(group_id, doc, self.parent.clock(), settings.session_timeout_ms)
        self.groups[group_id] = group
        self._reschedule(group)
        return group

    async def _create(self, group_id: str) -> ShareGroup:
        # Kafka: a group id taken by a classic or consumer group is not a share group.
        if group_id in self.parent.groups or group_id in self.parent.consumer.groups or \
                await self.metadata.get_group(group_id) is not None:
            raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        group = ShareGroup(group_id)
        self.groups[group_id] = group
        return group

    async def _settle(self, group: ShareGroup) -> None:
        if group.changed:
            group.changed = False
            try:
                await self.metadata.put_group(group.group_id, group.to_doc())
            except Exception:
                log.exception("could not persist share group %s", group.group_id)
        self._reschedule(group)

    def _reschedule(self, group: ShareGroup) -> None:
        if self.groups.get(group.group_id) is group:
            self.parent.arm_timer(group.group_id, group.next_deadline())
        else:
            self.parent.cancel_timer(group.group_id)

    async def on_timer(self, group_id: str) -> None:
        try:
            async with self.parent._locks[group_id]:
                group = self.groups.get(group_id)
                if group is None:
                    return
                if not self.parent.owns(group_id):
                    self.forget(group_id)
                    return
                for member_id in group.tick(self.parent.clock()):
                    log.info("share group %s: member %s removed (session timeout)", group_id, member_id)
                await self._settle(group)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("share group %s timer failed", group_id)
