"""The asyncio driver of share groups (KIP-932), beside the classic and consumer ones.

It lives inside `GroupCoordinator` (`groups.share`) and shares its per-group locks, its
view of which groups this broker coordinates, its timers and its store: a group id is one
group, classic, consumer or share. The group's document is kept under the same store key,
marked `"type": "share"` (`ShareGroup.to_doc`), and written after every heartbeat that
changed it, so a coordinator failover keeps members, epochs and assignments; session
timers restart on load. Settings come from `kafscale.share.settings.ShareSettings`.

The share partitions' state (which records are acquired, acknowledged, ...) is not the
group coordinator's: it lives with each partition's owner (`kafscale.share`). A member
leaving (epoch -1) or timing out is told to this broker's share partitions at once
(`on_member_left`); owners elsewhere find it in the stored members (`stored_members`).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.consumer_coordinator import TopicLookup
from kafscale.groups.group_driver import GroupDriver
from kafscale.groups.share_group import (
    LEAVE_EPOCH,
    ShareGroup,
    ShareHeartbeatRequest,
    ShareHeartbeatResult,
    is_share_group_doc,
    validate_request,
)
from kafscale.share.settings import ShareSettings, broker_share_settings

log = logging.getLogger("kafscale.groups")


class ShareGroupCoordinator(GroupDriver):
    kind = "share group"

    def __init__(self, parent, settings: ShareSettings | None = None):
        super().__init__(parent)
        self.settings = settings or ShareSettings(broker_share_settings(parent.config))
        self.groups: dict[str, ShareGroup] = {}
        # (group id, member id) of a member gone from its group: its records go back (set by the broker)
        self.on_member_left: Callable[[str, str], Awaitable[object]] | None = None

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
        if req.member_epoch == LEAVE_EPOCH:
            await self.members_removed(group_id, [req.member_id])
        return result

    async def members_removed(self, group_id: str, member_ids: list[str]) -> None:
        if self.on_member_left is not None:
            for member_id in member_ids:
                await self.on_member_left(group_id, member_id)

    async def stored_members(self, group_id: str) -> set[str] | None:
        """The member ids of a share group as last stored by its coordinator (any broker's);
        None if there is no such share group."""
        doc = await self.metadata.get_group(group_id)
        if not is_share_group_doc(doc):
            return None
        return {m["member_id"] for m in doc.get("members", [])}

    def is_doc(self, doc: dict | None) -> bool:
        return is_share_group_doc(doc)

    def state_of_doc(self, group_id: str, doc: dict) -> str:
        return ShareGroup.from_doc(group_id, doc, self.parent.clock(), 0).state.value

    async def delete(self, group: ShareGroup) -> ErrorCode:
        """DeleteGroups: only an empty group (NON_EMPTY_GROUP otherwise), with its share-partition state."""
        if group.members:
            return ErrorCode.non_empty_group
        self.forget(group.group_id)
        await self.metadata.delete_group(group.group_id)
        await self.metadata.delete_share_states(group.group_id)
        return ErrorCode.none

    async def while_empty(self, group_id: str, change) -> ErrorCode:
        """AlterShareGroupOffsets / DeleteShareGroupOffsets: run `change()` on the group's
        share-partition state with the group's lock held (a member joining meanwhile waits),
        only if it is an empty share group, as Kafka (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP)."""
        async with self.parent._locks[group_id]:
            group = await self.loaded(group_id)
            if group is None:
                return ErrorCode.group_id_not_found
            if group.members:
                return ErrorCode.non_empty_group
            await change()
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
