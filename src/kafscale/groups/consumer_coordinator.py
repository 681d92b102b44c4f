"""The asyncio driver of consumer-protocol groups (KIP-848), beside the classic coordinator.

It lives inside `GroupCoordinator` (`groups.consumer`) and shares its per-group locks, its
view of which groups this broker coordinates and its store: a group id is one group,
classic or consumer, never both. The group's document is kept under the same store key as
a classic group's, marked `"type": "consumer"` (`ConsumerGroup.to_doc`), and written after
every heartbeat that changed it, so a coordinator failover (another broker loading the
group) keeps members, epochs and assignments; session timers restart on load. Committed
offsets are the classic ones (`MetadataStore.commit_offsets`).

Not yet: __consumer_offsets records for these groups (Kafka's ConsumerGroupMetadata,
TargetAssignment and CurrentAssignment records); the store is the source of truth.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Awaitable, Callable, Iterable, Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNORS
from kafscale.groups.group_driver import GroupDriver
from kafscale.groups.consumer_group import (
    ConsumerGroup,
    ConsumerGroupConfig,
    GroupState,
    HeartbeatRequest,
    HeartbeatResult,
    is_consumer_group_doc,
    validate_request,
)
from kafscale.metadata.group_config import effective_int

log = logging.getLogger("kafscale.groups")

# name -> (topic id as a string, partition count) of the existing topics among `names`
TopicLookup = Callable[[Iterable[str]], Awaitable[Mapping[str, tuple[str, int]]]]


def consumer_group_config(config) -> ConsumerGroupConfig:
    """The broker flags (Kafka's group.consumer.* settings)."""
    assignors = tuple(a.strip() for a in str(getattr(config, "group_consumer_assignors", ",".join(DEFAULT_ASSIGNORS))).split(",") if a.strip())
    unknown = [a for a in assignors if a not in ASSIGNORS]
    if unknown or not assignors:
        raise ValueError(f"group.consumer.assignors: unknown assignor(s) {unknown}; known: {', '.join(ASSIGNORS)}")
    return ConsumerGroupConfig(
        session_timeout_ms=int(getattr(config, "group_consumer_session_timeout_ms", 45_000)),
        heartbeat_interval_ms=int(getattr(config, "group_consumer_heartbeat_interval_ms", 5_000)),
        max_size=int(getattr(config, "group_consumer_max_size", 2**31 - 1)),
        assignors=assignors,
    )


class ConsumerGroupCoordinator(GroupDriver):
    kind = "consumer group"

    def __init__(self, parent):
        super().__init__(parent)
        self.config = consumer_group_config(parent.config)
        self.groups: dict[str, ConsumerGroup] = {}

    # -- requests ------------------------------------------------------------------------------

    async def heartbeat(self, group_id: str, req: HeartbeatRequest, lookup: TopicLookup,
                        list_names: Callable[[], Awaitable[Iterable[str]]] | None = None) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat; refusals raise KafkaError. `list_names`: every topic
        name (for regex subscriptions)."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_request, "GroupId can't be empty.")
        validate_request(req, self.config)
        async with self.parent._locks[group_id]:
            group = await self.loaded(group_id)
            if group is None:
                if req.member_epoch != 0:
                    raise KafkaError(ErrorCode.group_id_not_found, f"Consumer group {group_id} not found.")
                group = await self._create(group_id)
            # The group's session timeout and heartbeat interval as its configs say now.
            group.config = await self.group_config(group_id)
            if group.regexes() or req.subscribed_topic_regex:
                # Regexes are re-evaluated on every heartbeat: a topic created or deleted
                # since changes what they select (and so the group epoch).
                group.resolve_regexes(await list_names(), req.subscribed_topic_regex)
            names = group.subscribed_topic_names() | set(req.subscribed_topic_names or ())
            names |= group.resolved_regexes.get(req.subscribed_topic_regex or "", frozenset())
            topics = await lookup(names)
            before = (group.state, group.group_epoch)
            try:
                result = group.heartbeat(self.parent.clock(), req, topics, self.partition_racks(topics))
            finally:
                await self._settle(group)
            if (group.state, group.group_epoch) != before:
                log.info("consumer group %s: %s, group epoch %d, target epoch %d, %d members", group_id,
                         group.state.value, group.group_epoch, group.target_epoch, len(group.members))
            return result

    async def group_config(self, group_id: str) -> ConsumerGroupConfig:
        """The broker's settings with the group's overrides (GROUP config resources
        consumer.session.timeout.ms / consumer.heartbeat.interval.ms), clamped to the
        broker's min/max as Kafka's coordinator does."""
        overrides = await self.parent.configs.overrides(group_id)
        if not overrides:
            return self.config
        limits = self.parent.limits
        return dataclasses.replace(
            self.config,
            session_timeout_ms=effective_int("consumer.session.timeout.ms", overrides, limits),
            heartbeat_interval_ms=effective_int("consumer.heartbeat.interval.ms", overrides, limits),
        )

    def partition_racks(self, topics: Mapping[str, tuple[str, int]]) -> dict[str, tuple[str | None, ...]]:
        """Topic id -> the rack of each partition: its owner broker's (--broker-rack), what
        Kafka's rack-aware assignment takes from the replicas; {} when no broker has one."""
        cluster = self.parent.cluster
        rack_of = {b.node_id: b.rack for b in cluster.brokers()} if cluster is not None else {}
        if not any(rack_of.values()):
            return {}
        return {tid: tuple(rack_of.get(cluster.owner_of(name, p)) for p in range(n)) for name, (tid, n) in topics.items()}

    def is_doc(self, doc: dict | None) -> bool:
        return is_consumer_group_doc(doc)

    def state_of_doc(self, group_id: str, doc: dict) -> str:
        return ConsumerGroup.from_doc(group_id, doc, self.config, self.parent.clock()).state.value

    def validate_offset_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int, api_version: int,
                               transactional: bool) -> ErrorCode:
        try:
            group.validate_offset_commit(member_id, member_epoch, api_version, transactional)
        except KafkaError as e:
            if transactional and e.code is ErrorCode.stale_member_epoch:
                # Kafka: TxnOffsetCommit knows no STALE_MEMBER_EPOCH, a stale epoch is ILLEGAL_GENERATION.
                return ErrorCode.illegal_generation
            return e.code
        return ErrorCode.none

    async def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+ of a member: UNKNOWN_MEMBER_ID / STALE_MEMBER_EPOCH as Kafka."""
        async with self.parent._locks[group_id]:
            group = await self.loaded(group_id)
            if group is None:
                return ErrorCode.none
            try:
                group.validate_offset_fetch(member_id, member_epoch)
            except KafkaError as e:
                return e.code
            return ErrorCode.none

    async def delete(self, group: ConsumerGroup) -> ErrorCode:
        """DeleteGroups: only an empty group (NON_EMPTY_GROUP otherwise), with its offsets."""
        if group.members:
            return ErrorCode.non_empty_group
        self.forget(group.group_id)
        await self.metadata.delete_group(group.group_id)
        return ErrorCode.none

    async def expire_offsets(self, owned: Callable[[str], bool], retention_ms: int) -> list[tuple[str, list[tuple[str, int]]]]:
        """Kafka's retention for consumer groups: an offset of a topic the group does not
        subscribe to expires `retention_ms` after its commit (so every offset of an empty
        group), and an empty group without offsets is removed. [(group, expired)]."""
        out = []
        for group_id, doc in (await self.metadata.list_groups()).items():
            if not is_consumer_group_doc(doc) or not owned(group_id):
                continue
            async with self.parent._locks[group_id]:
                group = await self.loaded(group_id)
                if group is None:
                    continue
                now = self.parent.clock()
                offsets = await self.metadata.fetch_offsets(group_id)
                expired = [tp for tp, o in offsets.items()
                           if not group.is_subscribed_to(tp[0]) and now - o.commit_ms >= retention_ms]
                if expired:
                    await self.metadata.delete_offsets(group_id, expired)
                    out.append((group_id, expired))
                if group.is_empty and len(expired) == len(offsets):
                    log.info("consumer group %s is empty and has no offsets left; removing it", group_id)
                    await self.delete(group)
        return out

    # -- loading and persistence ---------------------------------------------------------------

    async def loaded(self, group_id: str) -> ConsumerGroup | None:
        """The consumer group from memory or the store; None if the id is free or classic
        (call with the group's lock held)."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        if group_id in self.parent.groups:
            return None  # a classic group this broker has loaded
        doc = await self.metadata.get_group(group_id)
        if not is_consumer_group_doc(doc):
            return None
        group = ConsumerGroup.from_doc(group_id, doc, await self.group_config(group_id), self.parent.clock())
        self.groups[group_id] = group
        self._reschedule(group)
        return group

    async def _create(self, group_id: str) -> ConsumerGroup:
        classic = await self.parent._load(group_id)
        if classic is not None:
            if not classic.is_empty or classic.pending_members:
                # Migration of a live classic group (KIP-848's upgrade path) is not there yet.
                raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group.")
            # An empty classic group (or offsets only) becomes a consumer group; offsets stay.
            self.parent._forget(classic)
        group = ConsumerGroup(group_id, await self.group_config(group_id))
        self.groups[group_id] = group
        return group


__all__ = ["ConsumerGroupCoordinator", "GroupState", "consumer_group_config"]
