"""GroupCoordinator: the asyncio driver around the pure group state machine (`state.py`).

It owns what the state machine must not: the clock, one timer per group (initial
rebalance delay, rebalance timeout, session timeouts, pending-sync timeout), the futures
on which JoinGroup/SyncGroup responses are parked, and persistence through the
MetadataStore. Group snapshots are written when Kafka writes its GroupMetadata record
(after the leader's SyncGroup, when the group becomes Empty, when a static member is
replaced), so after a restart members come back as after a Kafka coordinator failover;
committed offsets are written on every commit.

Offset commits and consumer groups' documents go to the store through the group's
`GroupWriter` (`group_writer.py`): validated and applied under the group's lock, written
after it is released, batched, and answered once stored, as Kafka's coordinator answers
once its records are committed; so heartbeats and commits of a group no longer queue
behind each other's store writes. What removes a group's keys (DeleteGroups, OffsetDelete,
retention, a conversion between the protocols) waits for its queued writes first.

After each store write the coordinator also appends Kafka's records for it (offset
commits, group metadata, tombstones: `offsets_topic.py`) to the group's partition of the
internal topic `__consumer_offsets`, which this broker owns as the group's coordinator
(`append_records`, the log manager's internal append). The store stays the source of
truth: the answer does not wait for that append to be durable (a record reaches the topic
with the partition's next flush), and an append that fails is logged, never undoes or
fails the commit. Appends are made under the group's lock or by its one writer, so the
topic holds each group's changes in the order the store got them.

Every operation on a group runs under that group's lock, so the state machine sees one
request at a time and effects (persist, then replies) are applied in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from typing import Awaitable, Callable, Iterable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.consumer_coordinator import ConsumerGroupCoordinator
from kafscale.groups.consumer_group import CONSUMER_GROUP_TYPE, is_consumer_group_doc
from kafscale.groups.share_coordinator import ShareGroupCoordinator
from kafscale.groups.share_group import SHARE_GROUP_TYPE, is_share_group_doc
from kafscale.groups.state import (
    CONSUMER_PROTOCOL_TYPE,
    PERSIST,
    Group,
    GroupConfig,
    GroupState,
    JoinResult,
    Outcome,
    Reply,
    SyncResult,
)
from kafscale.groups import offsets_topic, snapshot
from kafscale.groups.describe import describe_group
from kafscale.groups.group_writer import GroupWriter
from kafscale.groups.group_configs import GroupConfigs
from kafscale.metadata.group_config import GroupLimits
from kafscale.metadata.internal_topics import DEFAULT_OFFSETS_PARTITIONS, OFFSETS_TOPIC, offsets_partition_for
from kafscale.metadata.store import CommittedOffset, MetadataStore

CLASSIC_GROUP_TYPE = "classic"  # ListGroups' group type of the classic protocol's groups

log = logging.getLogger("kafscale.groups")

DEFAULT_RETENTION_CHECK_INTERVAL_MS = 600_000  # Kafka's offsets.retention.check.interval.ms


def log_commit_refused(api: str, group_id: str, member_id: str, group_instance_id: str | None,
                       error: ErrorCode, reason: str) -> None:
    """One INFO line per refused OffsetCommit / TxnOffsetCommit: the client only sees the code."""
    member = repr(member_id) if group_instance_id is None else f"{member_id!r} (instance {group_instance_id!r})"
    log.info("%s to group %r by member %s refused with %s: %s", api, group_id, member, error.name.upper(), reason)


def _commit_refusal_reason(group: Group, error: ErrorCode, member_id: str, group_instance_id: str | None,
                           generation_id: int) -> str:
    if error is ErrorCode.coordinator_not_available:
        return "the group is being removed"
    if error is ErrorCode.illegal_generation:
        return f"generation {generation_id} is not the group's current generation {group.generation_id}"
    if error is ErrorCode.fenced_instance_id:
        return f"instance {group_instance_id!r} now belongs to member {group.static_members.get(group_instance_id)!r}"
    if error is ErrorCode.rebalance_in_progress:
        return "the group is completing a rebalance (rejoin, then commit)"
    if error is ErrorCode.unknown_member_id:
        if not member_id and group_instance_id is None and generation_id < 0:
            return f"no member given and the group has members (state {group.state.value})"
        if group_instance_id is not None:
            return f"instance {group_instance_id!r} is not a static member of the group"
        return f"not a member of the group (state {group.state.value}, generation {group.generation_id})"
    return error.name.upper()


def _is_modern(doc: dict | None) -> bool:
    """A consumer-protocol or share group's document (not a classic group's)."""
    return is_consumer_group_doc(doc) or is_share_group_doc(doc)


class GroupCoordinator:
    def __init__(
        self,
        metadata: MetadataStore,
        config,
        cluster=None,
        clock: Callable[[], float] | None = None,
        append_records: Callable[[str, int, list], Awaitable[asyncio.Future]] | None = None,
        share_settings=None,
    ):
        self.metadata = metadata
        self.config = config
        # append_records(topic, partition, [(key, value)]) -> future of durability: where
        # the __consumer_offsets records go (None: nowhere, as in unit tests)
        self.append_records = append_records
        self._append_failures = 0
        # producer id -> groups it has TxnOffsetCommit offsets pending in (this broker's view)
        self._txn_groups: defaultdict[int, set[str]] = defaultdict(set)
        # Who coordinates which group; None means this broker coordinates every group
        # (the single-node default). Handlers bind the broker's cluster when unset.
        self.cluster = None
        if cluster is not None:
            self.bind_cluster(cluster)
        self.group_config = GroupConfig(
            initial_rebalance_delay_ms=int(getattr(config, "group_initial_rebalance_delay_ms", 3000)),
            min_session_timeout_ms=int(getattr(config, "group_min_session_timeout_ms", 6000)),
            max_session_timeout_ms=int(getattr(config, "group_max_session_timeout_ms", 1_800_000)),
        )
        self.offsets_retention_ms = int(getattr(config, "offsets_retention_minutes", 7 * 24 * 60)) * 60_000
        self.retention_check_interval_ms = int(
            getattr(config, "offsets_retention_check_interval_ms", DEFAULT_RETENTION_CHECK_INTERVAL_MS)
        )
        self.clock = clock or (lambda: time.time() * 1000.0)
        self.groups: dict[str, Group] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._writers: dict[str, GroupWriter] = {}  # group id -> its queued store writes
        self._waiters: dict[int, asyncio.Future] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()
        self._cleanup_task: asyncio.Task | None = None
        self._stopping = False
        # What was last logged of each group (state, generation, members): rebalances and
        # evictions are logged once each, as Kafka's coordinator does.
        self._logged: dict[str, tuple[str, int, frozenset[str]]] = {}
        # Per-group overrides of the broker's group settings (GROUP config resources)
        self.limits = GroupLimits.from_config(config)
        self.limits.check()  # ValueError: settings Kafka refuses to start with
        self.configs = GroupConfigs(metadata, self.limits, int(getattr(config, "group_config_refresh_ms", 1000)) / 1000)
        # Consumer-protocol (KIP-848) groups: same locks, same store keys (consumer_coordinator.py)
        self.consumer = ConsumerGroupCoordinator(self)
        # Share groups (KIP-932): same locks, same store keys (share_coordinator.py); their
        # settings (share/settings.py ShareSettings) are the broker's, shared with the share partitions
        self.share = ShareGroupCoordinator(self, share_settings)
        # ... with each group's own share.* configs over them
        self.share.settings.set_group_configs(self.configs.effective_overrides)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        # Groups load lazily (on their first request, ListGroups or the cleanup pass), so a
        # broker never runs timers for groups another broker coordinates.
        self._stopping = False
        self._cleanup_task = asyncio.ensure_future(self._cleanup_loop())

    async def stop(self) -> None:
        # What requests are waiting for goes to the store first (SIGTERM loses nothing).
        await asyncio.gather(*(w.drain() for w in list(self._writers.values())), return_exceptions=True)
        self._stopping = True
        await self.consumer.stop()
        await self.share.stop()
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
            await asyncio.gather(self._cleanup_task, return_exceptions=True)
            self._cleanup_task = None
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for group in list(self.groups.values()):
            # Like a Kafka coordinator unloading its groups: parked requests get NOT_COORDINATOR.
            self._resolve(group.unload(ErrorCode.not_coordinator))
        self.groups.clear()
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def bind_cluster(self, cluster) -> None:
        """Learn who coordinates which group; when coordinators move (membership changes,
        or new owners of `__consumer_offsets` partitions), let go of the groups that moved
        to another broker so no stale copy acts on them."""
        if self.cluster is cluster:
            return
        self.cluster = cluster
        listeners = getattr(cluster, "group_listeners", None)
        if not isinstance(listeners, list):
            listeners = getattr(cluster, "listeners", None)
        if isinstance(listeners, list):
            listeners.append(self._on_membership_change)

    def _on_membership_change(self, cluster) -> None:
        for group_id in [g for g in {*self.groups, *self.consumer.groups, *self.share.groups} if not self.owns(g)]:
            task = asyncio.ensure_future(self.release(group_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def owns(self, group_id: str) -> bool:
        return self.cluster is None or self.cluster.is_group_coordinator(group_id)

    async def release(self, group_id: str) -> None:
        """This broker no longer coordinates the group: forget it (another broker loads it)."""
        async with self._locks[group_id]:
            writer = self._writers.pop(group_id, None)
            if writer is not None:
                writer.abandon()
            self.consumer.forget(group_id)
            self.share.forget(group_id)
            group = self.groups.pop(group_id, None)
            if group is not None:
                self.cancel_timer(group_id)
                self._resolve(group.unload(ErrorCode.not_coordinator))
            for pid in [p for p, gs in self._txn_groups.items() if group_id in gs]:
                self._txn_groups[pid].discard(group_id)
                if not self._txn_groups[pid]:
                    del self._txn_groups[pid]

    # -- membership -------------------------------------------------------------------------

    async def join(self, group_id: str, lookup=None, list_names=None, **request) -> JoinResult:
        """JoinGroup. `lookup(names)` / `list_names()`: the topics, for a group that is a
        consumer group (its classic members are assigned by the broker: `consumer.classic_join`)."""
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)
            replaced = consumer is not None
            if consumer is not None:
                if not consumer.is_empty:
                    return await self.consumer.classic_join(consumer, request, lookup, list_names)
                if not request["member_id"]:
                    # An empty consumer group is replaced by a classic group (as Kafka); offsets stay.
                    await self.consumer.drop_empty(consumer)
            group = None if replaced else await self._load(group_id)
            created = False
            if group is None:
                if request["member_id"]:
                    # A member id for a group we do not have: let the client reset and rejoin.
                    return JoinResult(ErrorCode.unknown_member_id, request["member_id"])
                group = self._create(group_id)
                created = True
            out = group.join(self.clock(), **request)
            fut = await self._finish(group, out)
            if replaced:
                await self._persist(group)  # (the store's document is the consumer group's until then)
            elif created and group.is_empty and not group.members and not group.pending_members:
                self._forget(group)  # the join was refused; nothing to keep
        return out.result if fut is None else await fut

    async def sync(self, group_id: str, **request) -> SyncResult:
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)
            if consumer is not None:
                return await self.consumer.classic_sync(consumer, request)
            group = await self._load(group_id)
            if group is None:
                return SyncResult(ErrorCode.unknown_member_id)
            out = group.sync(self.clock(), **request)
            fut = await self._finish(group, out)
        return out.result if fut is None else await fut

    async def heartbeat(self, group_id: str, **request) -> ErrorCode:
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)
            if consumer is not None:
                return await self.consumer.classic_heartbeat(consumer, request)
            group = await self._load(group_id)
            if group is None:
                return ErrorCode.unknown_member_id
            out = group.heartbeat(self.clock(), **request)
            await self._finish(group, out)
        return out.result

    async def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)
            if consumer is not None:
                return ErrorCode.none, await self.consumer.classic_leave(consumer, members)
            group = await self._load(group_id)
            if group is None:
                return ErrorCode.none, [ErrorCode.unknown_member_id] * len(members)
            error, member_errors, effects = group.leave(self.clock(), members)
            await self._finish(group, Outcome(effects=effects))
        return error, member_errors

    # -- offsets ----------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        *,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        offsets: dict[tuple[str, int], CommittedOffset],
        api_version: int,
        pending_producer_id: int | None = None,
    ) -> ErrorCode:
        """Validate the committer against the group, then store the offsets (all or none).
        With `pending_producer_id` (TxnOffsetCommit) they are held pending for that producer's
        transaction; its coordinator commits or drops them when the transaction ends."""
        async with self._locks[group_id]:
            error, written = await self._commit_offsets(group_id, member_id, group_instance_id, generation_id, offsets,
                                                        api_version, pending_producer_id)
        if written is not None:
            try:
                await written  # (store failures raise to the handler, as before)
            except KafkaError as e:  # the group moved to another broker before its write
                return e.code
        return error

    async def _commit_offsets(self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int,
                              offsets: dict[tuple[str, int], CommittedOffset], api_version: int,
                              pending_producer_id: int | None) -> tuple[ErrorCode, asyncio.Future | None]:
        """commit_offsets under the group's lock: (error, the future of the offsets' write)."""
        transactional = pending_producer_id is not None
        api = "TxnOffsetCommit" if transactional else "OffsetCommit"
        now = self.clock()
        consumer = await self.consumer.loaded(group_id)
        if consumer is not None:
            error = self.consumer.validate_offset_commit(consumer, member_id, generation_id, api_version, transactional)
            if error is not ErrorCode.none:
                log_commit_refused(api, group_id, member_id, group_instance_id, error,
                                   f"member epoch {generation_id} refused by the consumer group")
                return error, None
            return ErrorCode.none, await self._store_offsets(group_id, offsets, now, pending_producer_id)
        group = await self._load(group_id)
        created = False
        if group is None:
            if generation_id >= 0:
                # Kafka: OffsetCommit v9+ gets GROUP_ID_NOT_FOUND, older ones and
                # TxnOffsetCommit ILLEGAL_GENERATION.
                error = ErrorCode.group_id_not_found if api_version >= 9 and not transactional else ErrorCode.illegal_generation
                log_commit_refused(api, group_id, member_id, group_instance_id, error,
                                   f"generation {generation_id} given but the group does not exist")
                return error, None
            # A "simple" group that only stores offsets.
            group = self._create(group_id)
            created = True
        error = group.validate_offset_commit(
            now, member_id=member_id, group_instance_id=group_instance_id, generation_id=generation_id,
            transactional=transactional,
        )
        if error is not ErrorCode.none:
            log_commit_refused(api, group_id, member_id, group_instance_id, error,
                               _commit_refusal_reason(group, error, member_id, group_instance_id, generation_id))
            if created:
                self._forget(group)
            return error, None
        written = await self._store_offsets(group_id, offsets, now, pending_producer_id)
        if created:
            if written is not None:
                await written  # (the new group's record follows its first offsets, in the store and the topic)
                written = None
            await self._persist(group)
        self._reschedule(group)
        return ErrorCode.none, written

    async def _store_offsets(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset], now: float,
                             pending_producer_id: int | None) -> asyncio.Future | None:
        """Queue committed offsets on the group's writer (the future of their write), or
        store a transaction's pending offsets now (None)."""
        if not offsets:
            return None
        stamped = {tp: dataclasses.replace(o, commit_ms=int(now)) for tp, o in offsets.items()}
        if pending_producer_id is None:
            return self.writer(group_id).offsets(stamped)
        await self.metadata.put_pending_offsets(group_id, pending_producer_id, stamped)
        self._txn_groups[pending_producer_id].add(group_id)
        return None

    # -- the groups' store writes (group_writer.py) ------------------------------------------

    def writer(self, group_id: str) -> GroupWriter:
        """The group's writer (kept, like its lock, until the group moves to another broker:
        its tickets count on)."""
        writer = self._writers.get(group_id)
        if writer is None:
            writer = self._writers[group_id] = GroupWriter(
                lambda offsets, doc_due: self._flush_group(group_id, offsets, doc_due))
        return writer

    async def drain_writes(self, group_id: str) -> None:
        """Until the group's queued writes are stored (before removing any of its keys)."""
        writer = self._writers.get(group_id)
        if writer is not None:
            await writer.drain()

    async def _flush_group(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset], doc_due: bool) -> None:
        """One write of what a group queued: its offsets and, if due, its consumer group's
        document as it is now; then their __consumer_offsets records."""
        due = self.consumer.doc_to_store(group_id) if doc_due else None
        try:
            await self.metadata.write_group(group_id, None if due is None else due[1], offsets)
        except Exception as e:
            log.warning("group %s: could not store %d offsets%s: %s", group_id, len(offsets),
                        " and the group" if due is not None else "", e)
            raise
        if offsets:
            await self._write_records(group_id, offsets_topic.offset_commit_records(group_id, offsets))
        if due is not None:
            await self.consumer.stored(group_id, *due)

    async def txn_marker_written(self, partition: int, producer_id: int, commit: bool) -> None:
        """A transaction's marker reached this group's partition of __consumer_offsets
        (written before the transaction coordinator moves the pending offsets in the store).
        On commit, append the records of the producer's pending offsets of the groups in
        this partition, stamped now; the store commits them right after. Groups this broker
        did not see the TxnOffsetCommit of (it coordinates them since) are found in the store."""
        groups = {g for g in self._txn_groups.get(producer_id, ()) if self.offsets_partition(g) == partition}
        if not groups:
            groups = {g for g in await self.metadata.list_groups() if self.offsets_partition(g) == partition}
        for group_id in sorted(groups):
            async with self._locks[group_id]:
                pending = await self.metadata.pending_offsets(group_id, producer_id)
                if commit and pending:
                    now = int(self.clock())
                    stamped = {tp: dataclasses.replace(o, commit_ms=now) for tp, o in pending.items()}
                    await self._write_records(group_id, offsets_topic.offset_commit_records(group_id, stamped))
            left = self._txn_groups.get(producer_id)
            if left is not None:
                left.discard(group_id)
                if not left:
                    del self._txn_groups[producer_id]

    async def fetch_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return await self.metadata.fetch_offsets(group_id)

    async def pending_offset_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions with a transactional offset whose transaction has not ended yet."""
        return await self.metadata.pending_offset_partitions(group_id)

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[tuple[str, int]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)  # a KIP-848 group answers the same calls
            group = consumer if consumer is not None else await self._load(group_id)
            if group is None:
                return ErrorCode.group_id_not_found, {}
            await self.drain_writes(group_id)
            error = group.validate_offset_delete()
            if error is not ErrorCode.none:
                return error, {}
            results: dict[tuple[str, int], ErrorCode] = {}
            deletable = []
            for topic, partition in partitions:
                if group.is_subscribed_to(topic):
                    results[(topic, partition)] = ErrorCode.group_subscribed_to_topic
                else:
                    results[(topic, partition)] = ErrorCode.none
                    deletable.append((topic, partition))
            if deletable:
                await self.metadata.delete_offsets(group_id, deletable)
                await self._write_records(group_id, offsets_topic.offset_tombstones(group_id, deletable))
            if group.is_empty and not await self.metadata.fetch_offsets(group_id):
                # Kafka drops an Empty group once its last offset is gone.
                await (self.consumer.delete(consumer) if consumer is not None else self._remove_group(group))
            return ErrorCode.none, results

    # -- admin ------------------------------------------------------------------------------

    async def describe(self, group_id: str) -> dict | None:
        async with self._locks[group_id]:
            if await self.consumer.loaded(group_id) is not None or await self.share.loaded(group_id) is not None:
                # Kafka (KIP-1043): DescribeGroups answers only for classic groups.
                raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} is not a classic group.")
            group = await self._load(group_id)
            return None if group is None else describe_group(group)

    async def list_every_group(self, owned: Callable[[str], bool] | None = None) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type) of every group of every protocol this
        broker coordinates, sorted; the stored documents are read once for all three."""
        owned = owned or self.owns
        docs = await self.metadata.list_groups()
        listed = [(gid, ptype, state, CLASSIC_GROUP_TYPE) for gid, ptype, state in await self.list_groups(owned, docs)]
        listed += [(gid, CONSUMER_GROUP_TYPE, state, CONSUMER_GROUP_TYPE) for gid, state in await self.consumer.list_groups(owned, docs)]
        listed += [(gid, SHARE_GROUP_TYPE, state, SHARE_GROUP_TYPE) for gid, state in await self.share.list_groups(owned, docs)]
        return sorted(listed)

    async def list_groups(self, owned: Callable[[str], bool] | None = None, docs: dict[str, dict] | None = None) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every classic group this broker coordinates
        (`docs`: the stored group documents, when the caller has read them already)."""
        owned = owned or self.owns
        if docs is None:
            docs = await self.metadata.list_groups()
        for group_id, doc in docs.items():
            if group_id not in self.groups and owned(group_id) and not _is_modern(doc):
                async with self._locks[group_id]:
                    if group_id not in self.groups:
                        self._install(snapshot.from_doc(group_id, doc, self.group_config, self.clock()))
        return [
            (gid, g.protocol_type or "", g.state.value)
            for gid, g in sorted(self.groups.items())
            if owned(gid) and g.state is not GroupState.DEAD
        ]

    async def delete_group(self, group_id: str) -> ErrorCode:
        async with self._locks[group_id]:
            consumer = await self.consumer.loaded(group_id)
            if consumer is not None:
                return await self.consumer.delete(consumer)
            share = await self.share.loaded(group_id)
            if share is not None:
                return await self.share.delete(share)
            group = await self._load(group_id)
            if group is None:
                return ErrorCode.group_id_not_found
            error = group.validate_delete()
            if error is not ErrorCode.none:
                return error
            await self._remove_group(group)
            return ErrorCode.none

    # -- offset retention --------------------------------------------------------------------

    async def expire_offsets(self) -> int:
        """One retention pass (Kafka's rules); returns how many offsets were removed."""
        owned = self.owns
        for group_id, doc in (await self.metadata.list_groups()).items():
            if group_id not in self.groups and owned(group_id) and not _is_modern(doc):
                async with self._locks[group_id]:
                    if group_id not in self.groups:
                        self._install(snapshot.from_doc(group_id, doc, self.group_config, self.clock()))
        removed = 0
        for group_id in list(self.groups):
            if not owned(group_id):
                continue
            async with self._locks[group_id]:
                group = self.groups.get(group_id)
                if group is None:
                    continue
                await self.drain_writes(group_id)
                now = self.clock()
                offsets = await self.metadata.fetch_offsets(group_id)
                expired = [tp for tp, o in offsets.items() if self._offset_expired(group, tp[0], o, now)]
                if expired:
                    await self.metadata.delete_offsets(group_id, expired)
                    await self._write_records(group_id, offsets_topic.offset_tombstones(group_id, expired))
                    removed += len(expired)
                if group.is_empty and not group.pending_members and len(expired) == len(offsets):
                    log.info("group %s is empty and has no offsets left; removing it", group_id)
                    await self._remove_group(group)
        for group_id, expired in await self.consumer.expire_offsets(owned, self.offsets_retention_ms):
            await self._write_records(group_id, offsets_topic.offset_tombstones(group_id, expired))
            removed += len(expired)
        return removed

    def _offset_expired(self, group: Group, topic: str, offset: CommittedOffset, now: float) -> bool:
        retention = self.offsets_retention_ms
        if group.protocol_type is None:
            # Offsets-only group: each offset lives `retention` after its commit.
            return now - offset.commit_ms >= retention
        if group.is_empty:
            # Consumers are gone: everything expires `retention` after the group emptied.
            return now - group.state_timestamp >= retention
        if (
            group.protocol_type == CONSUMER_PROTOCOL_TYPE
            and group.state is GroupState.STABLE
            and group.subscribed_topics is not None
            and topic not in group.subscribed_topics
        ):
            # A live consumer group keeps only the topics it still subscribes to.
            return now - offset.commit_ms >= retention
        return False

    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retention_check_interval_ms / 1000)
            try:
                # Old-layout keys that not-yet-upgraded brokers wrote after our start
                # (rolling upgrade) would otherwise stay invisible until the next restart.
                await self.metadata.migrate_legacy_keys()
                n = await self.expire_offsets()
                if n:
                    log.info("expired %d committed offsets", n)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("offset retention pass failed")

    # -- internals ---------------------------------------------------------------------------

    async def _load(self, group_id: str) -> Group | None:
        """The group from memory, else from the store (call with the group's lock held)."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        if group_id in self.consumer.groups:
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"Group {group_id} is a consumer-protocol group.")
        if group_id in self.share.groups:
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"Group {group_id} is a share group.")
        doc = await self.metadata.get_group(group_id)
        if is_share_group_doc(doc):
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"Group {group_id} is a share group.")
        if is_consumer_group_doc(doc):
            # Classic requests to a KIP-848 group (migration of members is not supported yet).
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"Group {group_id} is a consumer-protocol group.")
        if doc is None:
            if not await self.metadata.fetch_offsets(group_id):
                return None
            doc = {}  # offsets without a group record: an offsets-only group
        return self._install(snapshot.from_doc(group_id, doc, self.group_config, self.clock()))

    def _create(self, group_id: str) -> Group:
        return self._install(Group(group_id, self.group_config, self.clock()))

    def _install(self, group: Group) -> Group:
        self.groups[group.group_id] = group
        self._reschedule(group)
        return group

    def _forget(self, group: Group) -> None:
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
            self._logged.pop(group.group_id, None)
        self.cancel_timer(group.group_id)

    async def _remove_group(self, group: Group) -> None:
        self._resolve(group.mark_dead())
        self._forget(group)
        await self.drain_writes(group.group_id)
        offsets = await self.metadata.fetch_offsets(group.group_id)
        await self.metadata.delete_group(group.group_id)
        # Kafka's tombstones for a removed group: each offset it had, then the group.
        tombstones = offsets_topic.offset_tombstones(group.group_id, offsets)
        await self._write_records(group.group_id, [*tombstones, offsets_topic.group_tombstone(group.group_id)])

    async def _finish(self, group: Group, out: Outcome) -> asyncio.Future | None:
        """Park the request if needed, carry out the effects, re-arm the group's timer."""
        fut = None
        if out.waiter is not None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[out.waiter] = fut
        await self._apply(group, out.effects)
        self._reschedule(group)
        self._log_transition(group)
        return fut

    def _log_transition(self, group: Group) -> None:
        now = (group.state.value, group.generation_id, frozenset(group.members))
        before = self._logged.get(group.group_id)
        if before == now:
            return
        self._logged[group.group_id] = now
        if before is None:
            if not now[2]:
                return  # a group seen for the first time, with nobody in it yet
            before = ("", -1, frozenset())
        joined, left = sorted(now[2] - before[2]), sorted(before[2] - now[2])
        log.info(
            "group %s: %s generation %d, %d members%s%s",
            group.group_id, now[0], now[1], len(now[2]),
            f"; joined {', '.join(joined)}" if joined else "",
            f"; left or expired {', '.join(left)}" if left else "",
        )

    async def _apply(self, group: Group, effects: list) -> None:
        persisted = False
        for effect in effects:
            if effect is PERSIST:
                if not persisted:
                    await self._persist(group)
                    persisted = True
            elif isinstance(effect, Reply):
                self._resolve([effect])

    def _resolve(self, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                fut = self._waiters.pop(effect.waiter, None)
                if fut is not None and not fut.done():
                    fut.set_result(effect.result)

    async def _persist(self, group: Group) -> None:
        doc = snapshot.to_doc(group)
        try:
            await self.metadata.put_group(group.group_id, doc)
        except Exception:
            # The group keeps working from memory; only restart recovery is affected.
            log.exception("could not persist group %s", group.group_id)
            return
        await self._write_records(group.group_id, [offsets_topic.group_metadata_record(group.group_id, doc)])

    def offsets_partition(self, group_id: str) -> int:
        if self.cluster is not None:
            return self.cluster.offsets_partition(group_id)
        return offsets_partition_for(group_id, DEFAULT_OFFSETS_PARTITIONS)

    async def _write_records(self, group_id: str, recs: list) -> None:
        """Append the records of a change the store already has to the group's partition of
        __consumer_offsets (see the module doc: not awaited to durability; failures logged)."""
        if self.append_records is None or not recs:
            return
        partition = self.offsets_partition(group_id)
        try:
            done = await self.append_records(OFFSETS_TOPIC, partition, recs)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the store has the change; the topic misses it
            self._append_failed(group_id, partition, e)
            return
        if done is not None:
            done.add_done_callback(lambda f: None if f.cancelled() or f.exception() is None else self._append_failed(group_id, partition, f.exception()))

    def _append_failed(self, group_id: str, partition: int, error: BaseException) -> None:
        self._append_failures += 1
        log.warning(
            "group %s: records for %s-%d not appended (%s); the metadata store has the change",
            group_id, OFFSETS_TOPIC, partition, error,
        )

    def cancel_timer(self, group_id: str) -> None:
        handle = self._timers.pop(group_id, None)
        if handle is not None:
            handle.cancel()

    def _reschedule(self, group: Group) -> None:
        self.cancel_timer(group.group_id)
        if self.groups.get(group.group_id) is group:
            self.arm_timer(group.group_id, group.next_deadline())

    def arm_timer(self, group_id: str, deadline: float | None) -> None:
        """The group's one timer, at `deadline` (ms; None: none). Classic and consumer groups
        share the table: a group id is one or the other."""
        self.cancel_timer(group_id)
        if self._stopping or deadline is None:
            return
        # +1 ms: the loop's monotonic clock and wall-clock milliseconds may disagree slightly.
        delay = max(0.0, (deadline - self.clock()) / 1000.0) + 0.001
        loop = asyncio.get_running_loop()
        self._timers[group_id] = loop.call_later(delay, self._fire, group_id)

    def _fire(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        task = asyncio.ensure_future(self._on_timer(group_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_timer(self, group_id: str) -> None:
        if group_id in self.consumer.groups:
            await self.consumer.on_timer(group_id)
            return
        if group_id in self.share.groups:
            await self.share.on_timer(group_id)
            return
        try:
            async with self._locks[group_id]:
                group = self.groups.get(group_id)
                if group is None:
                    return
                if not self.owns(group_id):
                    self._forget(group)
                    self._resolve(group.unload(ErrorCode.not_coordinator))
                    return
                effects = group.tick(self.clock())
                await self._finish(group, Outcome(effects=effects))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("group %s timer failed", group_id)
