"""The asyncio driver of consumer-protocol groups (KIP-848), beside the classic coordinator.

It lives inside `GroupCoordinator` (`groups.consumer`) and shares its per-group locks, its
view of which groups this broker coordinates and its store: a group id is one group,
classic or consumer, never both. The group's document is kept under the same store key as
a classic group's, marked `"type": "consumer"` (`ConsumerGroup.to_doc`), and stored after
every request that changed it, so a coordinator failover (another broker loading the
group) keeps members, epochs and assignments; session timers restart on load. Committed
offsets are the classic ones (`MetadataStore.commit_offsets`).

As in Kafka's coordinator, a heartbeat changes the group in memory under the group's lock
and its answer waits, after the lock, until the change is stored: through the group's
`GroupWriter` (`group_writer.py`), which writes the document with the offsets committed
meanwhile, one write for many changes. A heartbeat that changes nothing writes nothing
and is answered at once, unless what it answers (its member's epoch and assignment) is
not stored yet. Classic members of the group wait for their changes under the lock (a
mixed group is a migration's passing state).

Classic members (JoinGroup/SyncGroup/Heartbeat/LeaveGroup of a group that is a consumer
group) are answered from the consumer group's state (`classic_*`, called by the classic
coordinator with the group's lock held), and the group converts between the two kinds as
`group.consumer.migration.policy` allows (`migration.py`): up when a consumer-protocol
member joins a classic group, down when its last consumer-protocol member leaves.

Each stored change is mirrored to the group's partition of `__consumer_offsets` as Kafka's
records (ConsumerGroupMetadata, PartitionMetadata, MemberMetadata, TargetAssignment and
CurrentMemberAssignment: `consumer_records.py`), computed from the previous and the new
document, like the classic coordinator's records; the store stays the source of truth.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Awaitable, Callable, Iterable, Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups import consumer_records, migration, offsets_topic
from kafscale.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNORS
from kafscale.groups.group_driver import GroupDriver
from kafscale.groups.consumer_group import (
    LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerGroupConfig,
    GroupState,
    HeartbeatRequest,
    HeartbeatResult,
    is_consumer_group_doc,
    validate_request,
)
from kafscale.groups.consumer_protocol import MalformedProtocol, parse_subscription
from kafscale.groups.state import JoinResult, SyncResult
from kafscale.metadata.group_config import effective_int

log = logging.getLogger("kafscale.groups")

# name -> (topic id as a string, partition count) of the existing topics among `names`
TopicLookup = Callable[[Iterable[str]], Awaitable[Mapping[str, tuple[str, int]]]]
# every topic name (for regex subscriptions)
NameLister = Callable[[], Awaitable[Iterable[str]]]


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
        self.policy = migration.MigrationPolicy.parse(
            getattr(parent.config, "group_consumer_migration_policy", migration.DEFAULT_POLICY.value))
        self.groups: dict[str, ConsumerGroup] = {}
        # group id -> the document last stored (None: none yet), what its records are diffed from
        self._docs: dict[str, dict | None] = {}
        # (group id, member id) -> the writer's ticket of the member's last change (until answered)
        self._member_changes: dict[tuple[str, str], int] = {}

    def forget(self, group_id: str) -> None:
        super().forget(group_id)
        self._docs.pop(group_id, None)
        for key in [k for k in self._member_changes if k[0] == group_id]:
            del self._member_changes[key]

    async def _settle(self, group: ConsumerGroup) -> int | None:
        """Queue the group's document if the request changed it (the writer's ticket, else
        None) and re-arm its timer (call with the group's lock held)."""
        ticket = None
        if group.changed:
            group.changed = False
            ticket = self.parent.writer(group.group_id).doc()
        self._reschedule(group)
        return ticket

    async def _stored_for_classic(self, group: ConsumerGroup, ticket: int | None) -> None:
        if ticket is not None:
            await self.parent.writer(group.group_id).wait(ticket)

    def doc_to_store(self, group_id: str) -> tuple[ConsumerGroup, dict] | None:
        """(the group, its document now) for the writer's flush; None if not coordinated here."""
        group = self.groups.get(group_id)
        return None if group is None else (group, group.to_doc())

    async def stored(self, group_id: str, group: ConsumerGroup, doc: dict) -> None:
        """The store has `doc`: its records go to __consumer_offsets (diffed from the last)."""
        if self.groups.get(group_id) is not group:
            return  # forgotten meanwhile: whoever removed it wrote its tombstones
        before = self._docs.get(group_id)
        self._docs[group_id] = doc
        await self.parent._write_records(group_id, consumer_records.changes(group_id, before, doc))

    # -- requests ------------------------------------------------------------------------------

    async def heartbeat(self, group_id: str, req: HeartbeatRequest, lookup: TopicLookup,
                        list_names: NameLister | None = None) -> HeartbeatResult:
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
                group = await self._create(group_id, lookup)
            if req.member_epoch == LEAVE_EPOCH:
                leaving = group.leaving(req)
                if migration.downgrade_allowed(self.policy, group, leaving.member_id):
                    await self._downgrade(group, leaving.member_id, f"member {leaving.member_id} left")
                    return HeartbeatResult(member_id=leaving.member_id, member_epoch=LEAVE_EPOCH)
            topics = await self._topics(group, lookup, list_names, req.subscribed_topic_names, req.subscribed_topic_regex)
            before = (group.state, group.group_epoch)
            try:
                result = group.heartbeat(self.parent.clock(), req, topics, self.partition_racks(topics))
            finally:
                ticket = await self._settle(group)
            self._log_epoch(group, before)
            key = (group_id, result.member_id)
            if ticket is not None:
                self._member_changes[key] = ticket
            else:
                ticket = self._member_changes.get(key)  # (a retry, while its first answer waits)
            writer = self.parent.writer(group_id) if ticket is not None else None
        if writer is not None:
            # Answered once stored, as Kafka answers once its records are committed.
            await writer.wait(ticket)
            if self._member_changes.get(key) == ticket:
                del self._member_changes[key]
        return result

    async def _topics(self, group: ConsumerGroup, lookup: TopicLookup, list_names: NameLister | None,
                      names=(), regex: str | None = None) -> Mapping[str, tuple[str, int]]:
        """The group's configs applied, and name -> (topic id, partitions) of the topics the
        group and a request (`names`, `regex`) subscribe to."""
        # The group's session timeout and heartbeat interval as its configs say now.
        group.config = await self.group_config(group.group_id)
        if group.regexes() or regex:
            # Regexes are re-evaluated on every heartbeat: a topic created or deleted
            # since changes what they select (and so the group epoch).
            group.resolve_regexes(await list_names(), regex)
        wanted = group.subscribed_topic_names() | set(names or ())
        wanted |= group.resolved_regexes.get(regex or "", frozenset())
        return await lookup(wanted)

    @staticmethod
    def _log_epoch(group: ConsumerGroup, before: tuple) -> None:
        if (group.state, group.group_epoch) != before:
            log.info("consumer group %s: %s, group epoch %d, target epoch %d, %d members", group.group_id,
                     group.state.value, group.group_epoch, group.target_epoch, len(group.members))

    # -- classic members in a consumer group (called with the group's lock held) ----------------

    async def classic_join(self, group: ConsumerGroup, request: dict, lookup: TopicLookup,
                           list_names: NameLister | None) -> JoinResult:
        member_id = request["member_id"]
        limits = self.parent.group_config
        if not limits.min_session_timeout_ms <= request["session_timeout_ms"] <= limits.max_session_timeout_ms:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id)
        try:
            names = parse_subscription(request["protocols"][0][1]).topics if request["protocols"] else ()
        except MalformedProtocol:
            names = ()  # (refused by the group's join)
        topics = await self._topics(group, lookup, list_names, names)
        before = (group.state, group.group_epoch)
        replaced = migration.replaced_by_classic(self.policy, group, request["group_instance_id"], member_id)
        try:
            result = group.classic_join(self.parent.clock(), topics=topics, racks=self.partition_racks(topics), **request)
        except KafkaError as e:
            log.info("JoinGroup of consumer group %r member %r refused with %s: %s", group.group_id, member_id,
                     e.code.name.upper(), e.message)
            result = JoinResult(e.code, member_id)
        finally:
            ticket = await self._settle(group)
        self._log_epoch(group, before)
        await self._stored_for_classic(group, ticket)
        if replaced is not None and result.error is ErrorCode.none:
            await self._downgrade(group, None, f"static member {replaced} replaced by the classic member {result.member_id}")
        return result

    async def classic_sync(self, group: ConsumerGroup, request: dict) -> SyncResult:
        if group.is_empty:
            return SyncResult(ErrorCode.unknown_member_id)
        try:
            result = group.classic_sync(self.parent.clock(), **request)
        except KafkaError as e:
            result = SyncResult(e.code)
        await self._stored_for_classic(group, await self._settle(group))
        return result

    async def classic_heartbeat(self, group: ConsumerGroup, request: dict) -> ErrorCode:
        try:
            result = group.classic_heartbeat(self.parent.clock(), **request)
        except KafkaError as e:
            result = e.code
        await self._stored_for_classic(group, await self._settle(group))
        return result

    async def classic_leave(self, group: ConsumerGroup, members: list[tuple[str, str | None]]) -> list[ErrorCode]:
        before = (group.state, group.group_epoch)
        try:
            result = group.classic_leave(members)
        finally:
            ticket = await self._settle(group)
            self._log_epoch(group, before)
        await self._stored_for_classic(group, ticket)
        return result

    # -- migration --------------------------------------------------------------------------------

    async def _downgrade(self, group: ConsumerGroup, leaving_member_id: str | None, why: str) -> None:
        """The last consumer-protocol member leaves (None: was replaced by a classic static
        member): the group becomes a classic group of the remaining (classic) members,
        rebalancing if one left (call with the group's lock held)."""
        await self.parent.drain_writes(group.group_id)
        classic = migration.to_classic_group(group, leaving_member_id, self.parent.group_config, self.parent.clock())
        log.info("consumer group %s: its last member using the consumer protocol is gone (%s); the group is a "
                 "classic group again, generation %d, %d members (group.consumer.migration.policy=%s)",
                 group.group_id, why, classic.generation_id, len(classic.members), self.policy.value)
        # Kafka's tombstones of the consumer group's records, then the classic group's record.
        await self.parent._write_records(group.group_id, consumer_records.changes(
            group.group_id, self._docs.get(group.group_id), None))
        self.forget(group.group_id)
        self.parent._install(classic)
        await self.parent._persist(classic)

    async def drop_empty(self, group: ConsumerGroup) -> None:
        """An empty consumer group gives way to a classic group of the same id (its offsets
        stay): Kafka's tombstones of its records; the classic group's document replaces its
        own (call with the group's lock held)."""
        await self.parent.drain_writes(group.group_id)
        await self.parent._write_records(group.group_id, consumer_records.changes(
            group.group_id, self._docs.get(group.group_id), None))
        self.forget(group.group_id)

    async def _expire(self, group: ConsumerGroup, now: float) -> list[str]:
        removed = []
        for member_id, why in group.expired(now):
            removed.append(member_id)
            if migration.downgrade_allowed(self.policy, group, member_id):
                await self._downgrade(group, member_id, f"member {member_id} removed: {why}")
                return removed
            group.remove_member(member_id)
            log.info("%s %s: member %s removed (%s)", self.kind, group.group_id, member_id, why)
        await self._settle(group)
        return removed

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
        await self.parent.drain_writes(group.group_id)
        before = self._docs.get(group.group_id)
        self.forget(group.group_id)
        offsets = await self.metadata.fetch_offsets(group.group_id)
        await self.metadata.delete_group(group.group_id)
        # Kafka's tombstones for a removed group: each offset it had, then the group's records.
        await self.parent._write_records(group.group_id, [*offsets_topic.offset_tombstones(group.group_id, offsets),
                                                          *consumer_records.changes(group.group_id, before, None)])
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
                await self.parent.drain_writes(group_id)
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
        self._docs[group_id] = doc
        self._reschedule(group)
        return group

    async def _create(self, group_id: str, lookup: TopicLookup) -> ConsumerGroup:
        """A consumer group for the first consumer-protocol member: new, in place of an
        empty classic group (its offsets stay), or converted from a classic group with
        members (KIP-848's online upgrade) if the migration policy allows it."""
        classic = await self.parent._load(group_id)
        config = await self.group_config(group_id)
        if classic is None or classic.is_empty:
            if classic is not None:
                self.parent._forget(classic)
            group = ConsumerGroup(group_id, config)
        else:
            refusal = migration.upgrade_refusal(self.policy, classic, self.config.max_size)
            if refusal is not None:
                log.info("classic group %s not converted to a consumer group: %s", group_id, refusal)
                raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group.")
            names = set()
            for m in classic.members.values():
                try:
                    names |= set(parse_subscription(m.metadata(classic.protocol_name) or m.protocols[0][1]).topics)
                except (MalformedProtocol, IndexError):
                    pass  # (to_consumer_group refuses it)
            group = migration.to_consumer_group(classic, config, dict(await lookup(names)), self.parent.clock())
            # Members parked in JoinGroup/SyncGroup rejoin the consumer group.
            self.parent._resolve(classic.unload(ErrorCode.rebalance_in_progress))
            self.parent._forget(classic)
            # Kafka's tombstone for the classic group's GroupMetadata record.
            await self.parent._write_records(group_id, [offsets_topic.group_tombstone(group_id)])
            log.info("classic group %s converted to a consumer group by a member using the consumer protocol: "
                     "group epoch %d, %d classic members", group_id, group.group_epoch, len(group.members))
        self.groups[group_id] = group
        self._docs[group_id] = None  # (its first write records it whole)
        return group


__all__ = ["ConsumerGroupCoordinator", "GroupState", "consumer_group_config"]
