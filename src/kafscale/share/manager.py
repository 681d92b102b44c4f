"""The share partitions this broker serves, and its share sessions: the asyncio driver of
`partition.py` and `sessions.py` behind ShareFetch and ShareAcknowledge.

A share partition lives with its topic partition's owner (the broker that appends to it
and knows its high watermark and open transactions), as Kafka's SharePartitionManager
lives with the partition leader. Its durable state is one metadata-store document per
(group, topic, partition) (`MetadataStore.put_share_state`), written with a compare on the
version this broker read: an acknowledgement is answered only once the document holding
it is written, so it survives a kill -9 and a move of the partition to another broker
(which loads the document on its first share fetch); a broker holding a stale copy fails
its write (ConflictError), drops the copy and answers NOT_LEADER_OR_FOLLOWER. Acquisitions
are not written (as in Kafka): after a crash, records acquired but not acknowledged are
delivered again, with the delivery count of the last write.

A member that leaves its share group (or whose session there times out) gets its acquired
records released at once: the group coordinator tells this broker's manager directly
(`member_left`), and every `MEMBERSHIP_CHECK_S` while records are held, the holders are
compared with the group's stored members (`members_of`), for groups coordinated by
another broker.

Kafka keeps this state in the share coordinator's `__share_group_state` topic, reached by
the inter-broker APIs 83-87; here the metadata store already gives every broker a
durable, fenced key space, so those APIs are not needed (docs/share-groups.md).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata import group_config
from kafscale.metadata.store import ConflictError
from kafscale.protocol import records as batches
from kafscale.share.partition import Ack, Acquired, LogBatch, ShareCounters, SharePartition
from kafscale.share.sessions import ShareSession, ShareSessionCache
from kafscale.share.settings import ShareGroupSettings, ShareSettings
from kafscale.storage.failures import STORE_FAILURES

log = logging.getLogger("kafscale.share")

Key = tuple[str, str, int]  # (group id, topic, partition)
ABORT_MARKER = 0  # a control record's type: 0 abort, 1 commit
MEMBERSHIP_CHECK_S = 1.0  # how often holders of acquired records are checked against their group's members


@dataclass(slots=True)
class _Entry:
    sp: SharePartition
    version: int  # of its document in the metadata store
    leader_epoch: int  # of the log it was loaded under: another epoch means it moved away and back
    topic_id: str | None  # of the topic it belongs to (a same-named topic created later is another)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(slots=True)
class FetchResult:
    chunks: list = field(default_factory=list)  # stored batches holding the acquired records
    acquired: list[Acquired] = field(default_factory=list)
    error: ErrorCode = ErrorCode.none
    message: str | None = None


class SharePartitionManager:
    def __init__(self, metadata, logs, settings: ShareSettings, clock: Callable[[], float] | None = None,
                 max_sessions: int = 2_000):
        self.metadata = metadata
        self.logs = logs
        self.settings = settings
        self.clock = clock or (lambda: time.time() * 1000.0)
        self.sessions = ShareSessionCache(max_sessions, idle_ms=settings.defaults.session_timeout_ms)
        self.partitions: dict[Key, _Entry] = {}
        self._load_locks: dict[Key, asyncio.Lock] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._tasks: set[asyncio.Task] = set()
        self._released: set[asyncio.Future] = set()  # long polls waiting for redeliverable records
        self.writes = 0  # state documents written (bench/ and /metrics read it)
        self.counters = ShareCounters()  # of every share partition served here (/metrics)
        # A group's current member ids as stored by its coordinator (None: no such share
        # group); set by the broker. Holders of records that are not among them are released.
        self.members_of: Callable[[str], Awaitable[set[str] | None]] | None = None
        self._member_check: asyncio.Task | None = None

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.partitions.clear()

    # -- loading ----------------------------------------------------------------------------

    async def _entry(self, group_id: str, topic: str, partition: int, lg, settings: ShareGroupSettings,
                     revalidate: bool = False) -> _Entry:
        """The share partition of an owned log, loaded or initialized (SPSO from
        share.auto.offset.reset, written at once as Kafka's InitializeShareGroupState does).
        `revalidate`: compare the copy with the store first (a new share session: an admin
        may have altered or deleted the state of the then empty group meanwhile)."""
        key = (group_id, topic, partition)
        topic_id = getattr(lg, "topic_id", None)
        entry = self.partitions.get(key)
        if entry is not None and (entry.leader_epoch, entry.topic_id) == (lg.leader_epoch, topic_id) and not revalidate:
            return entry
        lock = self._load_locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self.partitions.get(key)
            doc, version = await self.metadata.get_share_state(group_id, topic, partition)
            if entry is not None and (entry.leader_epoch, entry.topic_id, entry.version) == (lg.leader_epoch, topic_id, version):
                return entry
            if doc is not None and doc.get("topic_id") not in (None, topic_id):
                doc = None  # the state of a deleted topic of the same name: start over (over its version)
            if doc is None:
                start = await self._start_offset(lg, settings.auto_offset_reset)
                sp = SharePartition(start, settings.delivery_count_limit, settings.partition_max_record_locks, self.counters)
                try:
                    version = await self.metadata.put_share_state(group_id, topic, partition,
                                                                  dict(sp.to_doc(), topic_id=topic_id), version)
                    self.writes += 1
                except ConflictError:
                    # Another broker initialized it first (it owned the partition a moment ago): read that.
                    doc, version = await self.metadata.get_share_state(group_id, topic, partition)
                    if doc is None:
                        raise
                    sp = SharePartition.from_doc(doc, settings.delivery_count_limit, settings.partition_max_record_locks,
                                                 self.counters)
                else:
                    log.info("share group %s: %s-%d starts at offset %d (%s)", group_id, topic, partition, start,
                             settings.auto_offset_reset)
            else:
                sp = SharePartition.from_doc(doc, settings.delivery_count_limit, settings.partition_max_record_locks,
                                             self.counters)
            entry = _Entry(sp, version, lg.leader_epoch, topic_id)
            self.partitions[key] = entry
            return entry

    async def _start_offset(self, lg, reset: str) -> int:
        """Where a new share partition starts (Kafka's share.auto.offset.reset): the log
        start, the log end, or the first record at or after now minus a duration (the log
        end when there is none)."""
        if reset == "earliest":
            return lg.log_start_offset
        back = group_config.auto_offset_reset_by_duration_ms(reset)
        if back is None:
            return lg.high_watermark
        offset, _ = await lg.offset_for_timestamp(int(self.clock() - back))
        return offset if offset >= 0 else lg.high_watermark

    def forget(self, key: Key) -> None:
        self.partitions.pop(key, None)

    # -- fetching -----------------------------------------------------------------------------

    async def acquire(self, group_id: str, member_id: str, topic: str, partition: int, max_records: int,
                      max_bytes: int, new_session: bool = False, record_limit: bool = False,
                      batch_size: int = 0) -> FetchResult:
        """Records of one partition acquired for `member_id` (raises StorageError when this
        broker does not own the partition). `record_limit`: at most `max_records` (KIP-1206's
        record-limit acquire mode), else whole stored batches until `max_records` are reached."""
        settings = await self.settings.for_group(group_id)
        lg = await self.logs.get_log(topic, partition)
        entry = await self._entry(group_id, topic, partition, lg, settings, revalidate=new_session)
        sp = entry.sp
        sp.delivery_count_limit = settings.delivery_count_limit
        sp.max_in_flight = settings.partition_max_record_locks
        upto = lg.last_stable_offset if settings.read_committed else None
        limit = lg.high_watermark if upto is None else min(upto, lg.high_watermark)
        # The log is read outside the lock; a concurrent fetch of another member may take
        # what was read meanwhile: then read on from where it left off (a few times).
        for _attempt in range(3):
            async with entry.lock:
                sp.move_start(lg.log_start_offset)
                if not sp.has_available(limit):
                    return FetchResult()
                offset = sp.next_fetch_offset()
            if offset >= limit:
                return FetchResult()
            chunks = await lg.read(offset, max(max_bytes, 1), at_least_one=True, upto=upto)
            found = _batches_of(chunks)
            if settings.read_committed and found and lg.may_have_aborted_from(offset):
                aborted = lg.aborted_transactions(offset, found[-1][1].last_offset + 1)
                logged = _deliverable(chunks, found, aborted)
            else:
                logged = [LogBatch(h.base_offset, h.last_offset, not h.is_control) for _, h, _ in found]
            now = self.clock()
            async with entry.lock:
                acquired = sp.acquire(member_id, now, settings.record_lock_duration_ms, logged, max_records,
                                      lg.log_start_offset, record_limit, batch_size)
            if acquired:
                # (earlier deadlines are armed already; the timer finds the next one when it fires)
                self._arm(now + settings.record_lock_duration_ms)
                self._check_members_soon()
                return FetchResult(_covering(chunks, found, acquired), acquired)
        return FetchResult()

    def add_release_waiter(self, fut: asyncio.Future) -> None:
        self._released.add(fut)

    def discard_release_waiter(self, fut: asyncio.Future) -> None:
        self._released.discard(fut)

    def _wake(self) -> None:
        for fut in self._released:
            if not fut.done():
                fut.set_result(None)
        self._released.clear()

    # -- acknowledging --------------------------------------------------------------------------

    async def acknowledge(self, group_id: str, member_id: str, topic: str, partition: int, acks: list[Ack]) -> None:
        """Apply and persist one partition's acknowledgements; raises KafkaError (nothing
        changed, or the change is not durable and the copy was dropped). Lock renewals
        (RENEW) alone write nothing: a lock is not durable state."""
        settings = await self.settings.for_group(group_id)
        lg = await self.logs.get_log(topic, partition)
        entry = await self._entry(group_id, topic, partition, lg, settings)
        async with entry.lock:
            if not entry.sp.acknowledge(member_id, acks, self.clock(), settings.record_lock_duration_ms):
                return
            await self._persist((group_id, topic, partition), entry)
        # Released records can be delivered again, and done ones moved the start offset,
        # making room under the in-flight limit: waiting fetches look again.
        self._wake()

    async def _persist(self, key: Key, entry: _Entry) -> None:
        try:
            entry.version = await self.metadata.put_share_state(*key, dict(entry.sp.to_doc(), topic_id=entry.topic_id),
                                                                entry.version)
            self.writes += 1
        except Exception as e:
            # Not durable: forget this copy, so what is served next is what the store has
            # (acknowledged only what was written; acquired records become deliverable again).
            self.forget(key)
            log.warning("share group %s: state of %s-%d not written (%s); reloading it", key[0], key[1], key[2], e)
            if isinstance(e, ConflictError):
                raise KafkaError(ErrorCode.not_leader_or_follower,
                                 f"share state of {key[1]}-{key[2]} was changed by another broker") from None
            raise KafkaError(ErrorCode.kafka_storage_error, f"share state of {key[1]}-{key[2]} not written: {e}") from None

    # -- sessions ---------------------------------------------------------------------------------

    async def close_session(self, session: ShareSession) -> None:
        """A share session closed: the member's acquired records in its partitions go back."""
        await self.member_left(*session.key, why="closed its session", cause="session_closed")

    async def member_left(self, group_id: str, member_id: str, why: str = "left the group", cause: str = "member_left") -> int:
        """The member's acquired records in every share partition of the group served here
        go back at once, delivery counts kept (one that reached the limit is archived), as
        Kafka releases them when a member's share session ends; how many."""
        released = 0
        for (g, _topic, _partition), entry in list(self.partitions.items()):
            if g == group_id:
                async with entry.lock:
                    released += entry.sp.release_member(member_id)
        self.counters.released[cause] += released
        if released:
            log.info("share group %s: member %s %s, %d records released", group_id, member_id, why, released)
            self._wake()
        return released

    def _check_members_soon(self) -> None:
        if self.members_of is not None and self._member_check is None:
            self._member_check = asyncio.ensure_future(self._check_members())
            self._tasks.add(self._member_check)
            self._member_check.add_done_callback(self._tasks.discard)

    async def _check_members(self) -> None:
        """While records are held here: release those of holders no longer in their group
        (left or timed out at a coordinator on another broker)."""
        try:
            while True:
                await asyncio.sleep(MEMBERSHIP_CHECK_S)
                holders: dict[str, set[str]] = {}
                for (group_id, _t, _p), entry in list(self.partitions.items()):
                    holders.setdefault(group_id, set()).update(entry.sp.holders())
                holders = {g: held for g, held in holders.items() if held}
                if not holders:
                    return
                # (holders read before the members: a member acquires only after its join is stored)
                for group_id, held in holders.items():
                    try:
                        members = await self.members_of(group_id) or set()
                    except STORE_FAILURES as e:
                        log.debug("share group %s: members not read (%s)", group_id, e)
                        continue
                    for member_id in sorted(held - members):
                        await self.member_left(group_id, member_id, why="is not a member of the group")
        finally:
            self._member_check = None

    def connection_closed(self, connection: str) -> None:
        """A client connection closed: the share sessions opened on it end, and their
        members' records go back at once instead of when their locks time out."""
        for session in self.sessions.on_connection(connection):
            task = asyncio.ensure_future(self.close_session(session))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- acquisition locks ------------------------------------------------------------------------

    def _arm(self, deadline: float | None) -> None:
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        delay = max(0.0, (deadline - self.clock()) / 1000.0) + 0.001
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, None
        now = self.clock()
        expired = 0
        for (group_id, topic, partition), entry in list(self.partitions.items()):
            if (topic, partition) not in self.logs.logs:
                self.forget((group_id, topic, partition))  # the partition moved away: its new owner serves it
                continue
            if entry.lock.locked():
                continue  # an acquisition or acknowledgement is running: look again soon
            n = entry.sp.expire(now)
            if n:
                expired += n
                log.debug("share group %s: %d record locks of %s-%d timed out", group_id, n, topic, partition)
        deadlines = [e.sp.next_deadline() for e in self.partitions.values()]
        deadlines = [d for d in deadlines if d is not None]
        if any(e.lock.locked() for e in self.partitions.values()):
            deadlines.append(now + 50)
        if deadlines:
            self._arm(min(deadlines))
        if expired:
            self._wake()


def _batches_of(chunks) -> list[tuple[int, object, int]]:
    """(chunk index, header, position) of every batch in `chunks`."""
    out = []
    for i, chunk in enumerate(chunks):
        for pos, h in batches.iter_batches(chunk):
            out.append((i, h, pos))
    return out


def _deliverable(chunks, found, aborted: list[tuple[int, int]]) -> list[LogBatch]:
    """read_committed: a transactional batch of a producer whose transaction was aborted
    (from its first offset up to its abort marker) is not delivered, as Kafka's consumers
    skip it; control batches never are."""
    pending = sorted(aborted, key=lambda a: a[1])
    open_aborted: set[int] = set()
    out = []
    for i, h, pos in found:
        while pending and pending[0][1] <= h.last_offset:
            open_aborted.add(pending.pop(0)[0])
        if h.is_control:
            if h.producer_id in open_aborted and _control_type(chunks[i], pos, h) == ABORT_MARKER:
                open_aborted.discard(h.producer_id)
            out.append(LogBatch(h.base_offset, h.last_offset, False))
        else:
            out.append(LogBatch(h.base_offset, h.last_offset, not (h.is_transactional and h.producer_id in open_aborted)))
    return out


def _control_type(chunk, pos: int, header) -> int:
    recs = batches.decode_records(chunk, pos, header, verify_crc=False)
    key = recs[0].key if recs else None
    return struct.unpack(">hh", bytes(key[:4]))[1] if key and len(key) >= 4 else -1


def _covering(chunks, found, acquired: list[Acquired]) -> list:
    """The stored batches holding acquired records, as they are: slices of the chunks,
    adjacent batches of one chunk in one slice."""
    if not acquired:
        return []
    spans: list[list[int]] = []  # [chunk index, start, end]
    ranges = [(a.first_offset, a.last_offset) for a in acquired]
    for i, h, pos in found:
        if any(first <= h.last_offset and h.base_offset <= last for first, last in ranges):
            if spans and spans[-1][0] == i and spans[-1][2] == pos:
                spans[-1][2] = pos + h.size
            else:
                spans.append([i, pos, pos + h.size])
    return [chunks[i][start:end] for i, start, end in spans]
