"""The registry of the partition logs this broker owns (LogManager): loading a log on first
use, with recovery on load; releasing, forgetting and stopping logs; topic deletion. Also,
for now, the owned log itself (PartitionLog: the write buffer and group-commit flushes) and
the read-only view of a partition owned elsewhere (FlushedPartition).

Offsets are assigned when a batch enters the write buffer; the high watermark (what
consumers see and what is acknowledged) only moves once the segment holding the batch is in
the object store and committed to the metadata store. If an upload fails, every batch not
yet durable is dropped and its producers get a retriable error, so offsets are never
handed out twice and nothing acknowledged is ever renumbered.

Split out of here:
  failures.py     StorageError, and how store failures become retriable Kafka errors
  reader.py       SegmentReader: the shared read path (cache, whole and ranged segment loads)
  recovery.py     adopting uncommitted segments and rebuilding producer state on load
  retention.py    which segments are past retention, and the task that deletes them
  topic_cache.py  TopicCache: topic metadata and the topic-id table
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from kafscale.errors import ErrorCode
from kafscale.metadata.store import ConflictError, MetadataStore, PartitionState, TopicMeta
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.failures import STORE_FAILURES, StorageError, store_failure
from kafscale.storage.merger import SegmentMerger
from kafscale.storage.objectstore import ObjectExistsError, ObjectStore
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.reader import SegmentReader
from kafscale.storage.recovery import rebuild_producer_state, recover
from kafscale.storage.retention import Retention, segments_past_retention
from kafscale.storage.topic_cache import TopicCache

log = logging.getLogger("kafscale.storage")


@dataclass(slots=True)
class _Pending:
    data: memoryview
    nbytes: int
    base_offset: int
    waiters: list[asyncio.Future]


class PartitionLog:
    def __init__(self, manager: "LogManager", meta: TopicMeta, state: PartitionState):
        self.manager = manager
        self.topic = meta.name
        self.partition = state.partition
        self.state = state
        self.settings = LogSettings.from_configs(meta.configs)
        self.next_offset = state.high_watermark
        self.producers = ProducerStateTable()
        self._buffer: list[_Pending] = []
        self._buffer_bytes = 0
        self._buffer_since = 0.0
        self._waiting_acks = 0
        self._last_flush = float("-inf")  # not 0.0: the monotonic clock may start near 0 (a fresh VM)
        self._wake = asyncio.Event()
        self._data_waiters: set[asyncio.Future] = set()
        self._flusher: asyncio.Task | None = None
        self._flush_lock = asyncio.Lock()
        self._in_flight: list[_Pending] = []
        self.closed = False  # no more appends: the log is stopping or stopped
        self.stopped_by: StorageError | None = None  # why: what every waiter left is answered with

    # -- state ----------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.state.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.state.log_start_offset

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def apply_configs(self, meta: TopicMeta) -> None:
        self.settings = LogSettings.from_configs(meta.configs)

    # -- write path -----------------------------------------------------------------------

    def append(self, data: memoryview, headers: list[records.BatchHeader], want_ack: bool) -> tuple[int, int, asyncio.Future | None]:
        """Assign offsets to already-validated batches (patched in place) and buffer them.

        Returns (base offset, log append time or -1, future resolved when durable).
        Runs without awaiting, so offsets are assigned in arrival order.
        """
        if self.closed:
            raise self.refusal()
        duplicate = self.producers.check_record_set(headers)  # raises InvalidRecordError
        if duplicate is not None:
            return self._answer_duplicate(duplicate.base_offset, want_ack)
        base = self.next_offset
        append_time = -1
        if self.settings.log_append_time:
            append_time = int(time.time() * 1000)
        pos = 0
        offset = base
        now_ms = int(time.time() * 1000)
        for h in headers:
            if h.producer_id >= 0:
                self.producers.record(h, offset, now_ms, self.state.high_watermark)
            records.patch_batch(data, pos, offset, self.state.leader_epoch)
            if append_time >= 0:
                records.set_max_timestamp(data, pos, h.size, append_time)
            offset += h.last_offset_delta + 1
            pos += h.size
        self.next_offset = offset
        waiter = asyncio.get_running_loop().create_future() if want_ack else None
        if not self._buffer:
            self._buffer_since = time.monotonic()
        self._buffer.append(_Pending(data, len(data), base, [waiter] if waiter is not None else []))
        self._buffer_bytes += len(data)
        if waiter is not None:
            self._waiting_acks += 1
        self.manager.metrics_produced(len(data), sum(h.record_count for h in headers))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._run_flusher(), name=f"flush-{self.topic}-{self.partition}")
        self._wake.set()
        return base, append_time, waiter

    def _answer_duplicate(self, base_offset: int, want_ack: bool) -> tuple[int, int, asyncio.Future | None]:
        """A retried batch already appended: answer its original offset once it is durable."""
        if not want_ack:
            return base_offset, -1, None
        waiter = asyncio.get_running_loop().create_future()
        if base_offset < self.state.high_watermark:
            waiter.set_result(None)
        else:
            pending = next((p for p in self._buffer if p.base_offset == base_offset), None) or next(
                (p for p in self._in_flight if p.base_offset == base_offset), None
            )
            if pending is None:
                waiter.set_exception(StorageError("retried batch is neither durable nor pending"))
            else:
                pending.waiters.append(waiter)
        return base_offset, -1, waiter

    def _flush_due_in(self) -> float:
        """Seconds until the buffer must be flushed (<= 0: now)."""
        now = time.monotonic()
        cfg = self.manager.config
        if self._buffer_bytes >= self.settings.segment_bytes:
            return 0.0
        due = self._buffer_since + cfg.flush_interval_ms / 1000
        if self._waiting_acks:
            # Group commit: someone waits for an ack and no upload is in flight.
            due = min(due, self._last_flush + cfg.min_flush_interval_ms / 1000)
        return due - now

    async def _run_flusher(self) -> None:
        while not self.closed:
            if not self._buffer:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = self._flush_due_in()
            if delay > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass
                continue
            try:
                await self.flush_once()
            except Exception:  # noqa: BLE001 - a bug must not stop this partition's flushes for good
                log.exception("partition %s-%s: flush failed unexpectedly", self.topic, self.partition)
                await asyncio.sleep(0.1)

    async def flush(self) -> None:
        """Flush everything buffered now, and wait for an upload already in flight
        (shutdown, ownership hand-over)."""
        while True:
            await self.flush_once()  # takes the flush lock: waits for the upload in flight
            if not self._buffer:
                return

    def _take_segment(self) -> list[_Pending]:
        # Seal when the segment reaches segment.bytes: it may end up to one record set
        # past it, which keeps segments full (fewer PUTs) rather than often one set short.
        taken, size = [], 0
        while self._buffer and size < self.settings.segment_bytes:
            p = self._buffer.pop(0)
            taken.append(p)
            size += p.nbytes
        self._buffer_bytes -= size
        self._buffer_since = time.monotonic()
        return taken

    async def flush_once(self) -> None:
        async with self._flush_lock:
            if not self._buffer:
                return
            self._last_flush = time.monotonic()
            if not self.manager.cluster.owns(self.topic, self.partition):
                # Lease lost or ownership moved: another broker may write this partition now.
                self.fail_pending(StorageError(f"{self.topic}-{self.partition} is no longer owned here", ErrorCode.not_leader_or_follower))
                self.manager.forget(self.topic, self.partition)
                return
            taken = self._take_segment()
            self._in_flight = taken
            self._waiting_acks -= sum(1 for p in taken if p.waiters)
            base = self.state.high_watermark
            body = b"".join(p.data for p in taken)
            enc = segment.encode([body], base)
            mgr = self.manager
            started = time.monotonic()
            try:
                objects = mgr.segment_objects(self.topic, self.partition, enc)
                await mgr.store.create_many(objects)  # never replaces another writer's segment
                self.state = await mgr.metadata.commit_segment(self.state, enc.info)
            except asyncio.CancelledError:
                self._in_flight = []
                self._fail_unflushed(taken, StorageError("flush cancelled (broker stopping)"))
                raise
            except Exception as e:  # noqa: BLE001 - any failure means "not durable"
                if not await self._committed_despite(e, enc.info):
                    self._in_flight = []
                    self._fail_unflushed(taken, e)
                    return
            self._in_flight = []
            try:
                mgr.metrics_flushed(enc.info, time.monotonic() - started, len(objects))
                mgr.reader.cache_segment(self.topic, self.partition, base, body)
            except Exception:  # noqa: BLE001 - the data is durable: acknowledge it regardless
                log.exception("partition %s-%s: bookkeeping after a flush failed", self.topic, self.partition)
            self._answer(taken, None)
            self._notify_data()

    async def _committed_despite(self, error: Exception, info: segment.SegmentInfo) -> bool:
        """After an ambiguous failure, re-read the metadata: did the commit land anyway?"""
        try:
            st = await self.manager.metadata.get_partition(self.topic, self.partition)
        except Exception:  # noqa: BLE001
            return False
        if st is not None and st.leader_epoch == self.state.leader_epoch and st.high_watermark == info.last_offset + 1 and any(
            s == info for s in st.segments  # this very segment, not another writer's at its offset
        ):
            self.state = st
            return True
        if isinstance(error, ConflictError) and st is not None:
            self.state = st
        return False

    def fail_pending(self, error: StorageError) -> None:
        """Ownership lost: stop now (see halt)."""
        self.halt(error)

    def _fail_unflushed(self, taken: list[_Pending], error: Exception) -> None:
        """Drop everything not durable: its offsets will be handed out again."""
        if isinstance(error, ConflictError):
            code, what = ErrorCode.not_leader_or_follower, "partition state changed under us (fenced)"
        elif isinstance(error, ObjectExistsError):
            # Another writer's segment holds this base offset. Forgetting the log makes the
            # next produce re-read ownership and the partition state (recovery adopts that
            # segment if nobody committed it): clients retry on the owner's new offsets.
            code, what = ErrorCode.not_leader_or_follower, f"lost the race for segment {self.state.high_watermark} to another writer"
        else:
            code, what = ErrorCode.kafka_storage_error, f"flush failed: {error}"
        dropped = taken + self._buffer
        self._buffer = []
        self._buffer_bytes = 0
        self._waiting_acks = 0
        self.next_offset = self.state.high_watermark
        self.producers.roll_back(self.next_offset)
        log.error(
            "partition %s-%s: %s; %d unacknowledged batches rejected with error %d",
            self.topic, self.partition, what, len(dropped), code,
            extra={"topic": self.topic, "partition": self.partition},
        )
        self.manager.metrics_flush_failed()
        self._answer(dropped, StorageError(what, code))
        if code == ErrorCode.not_leader_or_follower:
            self.manager.forget(self.topic, self.partition)

    # -- stopping -------------------------------------------------------------------------
    # Every way a log stops (topic deleted, ownership lost or moved, fenced, shutdown) goes
    # through halt(), which stop() wraps with the final flush, and every waiter is answered:
    #   buffered batches         -> the stop reason (this log never uploads them);
    #   the upload in flight     -> its outcome: acknowledged if it committed, else the reason;
    #   retried duplicates       -> with the batch they wait on (they share its waiters);
    #   long-poll fetches        -> woken; their next look finds the log gone.
    # Reasons: UNKNOWN_TOPIC_OR_PARTITION for a deleted topic, NOT_LEADER_OR_FOLLOWER for lost
    # ownership and for whatever a shutdown or hand-over could not flush (both retriable).

    def _answer(self, batches: list[_Pending], error: Exception | None) -> None:
        """The one place producers waiting on batches get their answer: None acknowledges
        (durable); an error rejects, and once the log is stopping its stop reason wins,
        since that tells the client where to go next."""
        if error is not None and self.stopped_by is not None:
            error = self.stopped_by
        for p in batches:
            for w in p.waiters:
                if w.done():
                    continue
                if error is None:
                    w.set_result(None)
                else:
                    w.set_exception(error)

    def refusal(self) -> StorageError:
        """The error for a request reaching this log after it stopped."""
        reason = self.stopped_by
        code = reason.error_code if reason is not None else ErrorCode.not_leader_or_follower
        return StorageError(f"{self.topic}-{self.partition} is not served here: {reason or 'stopped'}", code)

    def halt(self, reason: StorageError) -> None:
        """Stop at once, without I/O: no more appends, every buffered batch rejected with
        `reason`; an upload in flight is answered by its own outcome when it ends."""
        if self.stopped_by is None:
            self.stopped_by = reason
        self.closed = True
        dropped, self._buffer = self._buffer, []
        if not self._flush_lock.locked():
            # No upload runs: batches still marked in flight were left by a flush that
            # failed unexpectedly (a bug), and nothing else would ever answer them.
            dropped, self._in_flight = self._in_flight + dropped, []
        self._buffer_bytes = 0
        self._waiting_acks = 0
        self._answer(dropped, reason)
        self._wake.set()  # the flusher sees `closed` and ends after any upload in flight
        self._notify_data()

    async def stop(self, reason: StorageError, flush: bool) -> None:
        """The one way to stop a log. With flush (shutdown, graceful hand-over) everything
        buffered is made durable and acknowledged first; what cannot be is rejected with
        `reason`. Without (deleted, fenced) this is halt()."""
        if self.stopped_by is None:
            self.stopped_by = reason
        if flush and not self.closed:
            self.closed = True  # new appends go elsewhere while the last flush runs
            try:
                await self.flush()
            except Exception as e:  # noqa: BLE001 - whatever is left is rejected below
                log.error("partition %s-%s: final flush failed: %s", self.topic, self.partition, e, extra={"topic": self.topic, "partition": self.partition})
        self.halt(reason)
        if flush and self._flusher is not None:
            await asyncio.wait([self._flusher], timeout=30)

    async def upload_finished(self) -> None:
        """Wait for an upload in flight to end (before deleting a topic's objects, so no
        late segment lands under a name a re-created topic would adopt)."""
        async with self._flush_lock:
            pass

    # -- read path ------------------------------------------------------------------------

    def _notify_data(self) -> None:
        waiters, self._data_waiters = self._data_waiters, set()
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def add_data_waiter(self, fut: asyncio.Future) -> None:
        if self.closed:  # nothing will be appended here any more: look again now
            if not fut.done():
                fut.set_result(None)
            return
        self._data_waiters.add(fut)

    def discard_data_waiter(self, fut: asyncio.Future) -> None:
        self._data_waiters.discard(fut)

    async def read(self, offset: int, max_bytes: int, at_least_one: bool = True) -> list[memoryview]:
        """Stored batches from `offset` up to the high watermark, at most max_bytes
        (the first batch whole if at_least_one). Raises StorageError(OFFSET_OUT_OF_RANGE)."""
        st = self.state
        if offset < st.log_start_offset or offset > st.high_watermark:
            raise StorageError(f"offset {offset} outside [{st.log_start_offset}, {st.high_watermark}]", ErrorCode.offset_out_of_range)
        return await self.manager.reader.read(self.topic, self.partition, st.segments, offset, st.high_watermark, max_bytes, at_least_one)

    def start_load(self, offset: int) -> asyncio.Future | None:
        """Begin loading the stored segment holding `offset` if it is not cached (None: nothing to wait for)."""
        return self.manager.reader.start_load(self.topic, self.partition, self.state.segments, offset)

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`, or (-1, -1)."""
        return await self.manager.reader.offset_for_timestamp(self.topic, self.partition, self.state.segments, self.state.log_start_offset, timestamp)

    async def max_timestamp_offset(self) -> tuple[int, int]:
        """(offset, timestamp) of the record with the largest timestamp, or (-1, -1)."""
        return await self.manager.reader.max_timestamp_offset(self.topic, self.partition, self.state.segments)

    # -- retention and deletion -----------------------------------------------------------

    async def advance_log_start(self, new_start: int) -> None:
        """DeleteRecords: move the log start offset and drop segments wholly below it."""
        async with self._flush_lock:
            if new_start <= self.state.log_start_offset:
                return
            doomed = [s for s in self.state.segments if s.last_offset < new_start]
            await self._drop_segments(doomed, new_start)

    async def enforce_retention(self, now_ms: int) -> int:
        """Delete whole segments past retention.ms / retention.bytes. Returns how many."""
        doomed = segments_past_retention(self.state.segments, self.settings, now_ms)
        if not doomed:
            return 0
        async with self._flush_lock:
            nxt = doomed[-1].last_offset + 1
            await self._drop_segments(doomed, max(nxt, self.state.log_start_offset))
        return len(doomed)

    async def _drop_segments(self, doomed: list[segment.SegmentInfo], new_start: int) -> None:
        mgr = self.manager
        self.state = await mgr.metadata.update_partition(
            self.state, log_start_offset=new_start, remove_segments=[s.base_offset for s in doomed]
        )
        keys = []
        for seg in doomed:
            keys.append(segment.segment_key(mgr.namespace, self.topic, self.partition, seg.base_offset))
            keys.append(segment.index_key(mgr.namespace, self.topic, self.partition, seg.base_offset))
        if keys:
            await mgr.store.delete(keys)
            log.info("partition %s-%s: deleted %d segments, log start offset now %d", self.topic, self.partition, len(doomed), new_start)


class FlushedPartition:
    """Read-only view of a partition this broker does not own, from the metadata's segment
    list; refreshed after a short time so followers see new segments."""

    MAX_AGE_S = 0.5

    def __init__(self, manager: "LogManager", state: PartitionState):
        self.manager = manager
        self.state = state
        self.topic, self.partition = state.topic, state.partition
        self.loaded = time.monotonic()

    def stale(self) -> bool:
        return time.monotonic() - self.loaded > self.MAX_AGE_S

    high_watermark = PartitionLog.high_watermark
    log_start_offset = PartitionLog.log_start_offset
    leader_epoch = PartitionLog.leader_epoch
    start_load = PartitionLog.start_load

    async def read(self, offset: int, max_bytes: int, at_least_one: bool = True) -> list[memoryview]:
        if self.stale():
            try:
                st = await self.manager.metadata.get_partition(self.topic, self.partition)
            except STORE_FAILURES as e:
                raise store_failure(e, f"reading {self.topic}-{self.partition}") from e
            if st is not None:
                self.state, self.loaded = st, time.monotonic()
        return await PartitionLog.read(self, offset, max_bytes, at_least_one)

    def add_data_waiter(self, fut: asyncio.Future) -> None:
        # No local appends to wait for: wake the long poll when the view goes stale.
        asyncio.get_running_loop().call_later(self.MAX_AGE_S, lambda: fut.done() or fut.set_result(None))

    def discard_data_waiter(self, fut: asyncio.Future) -> None:
        pass


class LogManager:
    """The partition logs this broker owns; the read path (self.reader), the topic cache
    (self.topics), retention (self.retention) and the merger (self.merger) hang off it."""

    def __init__(self, metadata: MetadataStore, store: ObjectStore, config, cluster):
        self.metadata = metadata
        self.store = store
        self.config = config
        self.cluster = cluster
        self.namespace = config.namespace
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._loading: dict[tuple[str, int], asyncio.Future] = {}
        self.topics = TopicCache(metadata)
        self._readers: dict[tuple[str, int], "FlushedPartition"] = {}
        self._retention_task: asyncio.Task | None = None
        self._merge_task: asyncio.Task | None = None
        self.stopping = False
        self.merger = SegmentMerger(
            self, config.merge_interval_ms / 1000, config.merge_grace_ms / 1000, config.merge_max_pending_objects, config.merge_min_grace_ms / 1000
        )
        self.stats = {"produce_bytes": 0, "produce_records": 0, "flushes": 0, "flush_failures": 0, "segment_bytes": 0, "puts": 0, "gets": 0}
        self.reader = SegmentReader(store, self.namespace, config.cache_bytes, self.stats)
        self.cache = self.reader.cache
        self.retention = Retention(self, config.retention_check_interval_ms / 1000)
        # hook(info, seconds, puts) after each durable flush: ops/metrics times and sizes them.
        self.flush_hooks: list = []

    # -- metrics hooks (ops/metrics reads these) -----------------------------------------

    def metrics_produced(self, nbytes: int, nrecords: int) -> None:
        self.stats["produce_bytes"] += nbytes
        self.stats["produce_records"] += nrecords

    def metrics_flushed(self, info: segment.SegmentInfo, seconds: float, puts: int) -> None:
        self.stats["flushes"] += 1
        self.stats["puts"] += puts
        self.stats["segment_bytes"] += info.size
        for hook in self.flush_hooks:
            hook(info, seconds, puts)

    def segment_objects(self, topic: str, partition: int, enc: segment.EncodedSegment) -> list[tuple[str, list]]:
        """The objects to upload for one sealed segment: the .kfs, plus its .index when it
        is big enough to be read by ranges (smaller segments are always read whole, so an
        index would be one more PUT per flush that no reader needs)."""
        objects = [(segment.segment_key(self.namespace, topic, partition, enc.info.base_offset), enc.parts)]
        if enc.info.size >= self.config.index_min_bytes:
            objects.append((segment.index_key(self.namespace, topic, partition, enc.info.base_offset), [enc.index]))
        return objects

    def metrics_flush_failed(self) -> None:
        self.stats["flush_failures"] += 1

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._retention_task = loop.create_task(self.retention.run_forever(), name="retention")
        if self.config.merge_interval_ms > 0:
            self._merge_task = loop.create_task(self.merger.run_forever(), name="merger")

    async def stop(self) -> None:
        self.stopping = True  # no new logs from here on: clients go to the next owner
        for task in (self._retention_task, self._merge_task):
            if task:
                task.cancel()
        reason = StorageError("the broker is shutting down", ErrorCode.not_leader_or_follower)
        await asyncio.gather(*(self._stop_log(lg, reason, flush=True) for lg in list(self.logs.values())), return_exceptions=True)
        self.logs.clear()

    async def _stop_log(self, lg: PartitionLog, reason: StorageError, flush: bool) -> None:
        """Stop a log and then forget it; until then get_log refuses with its reason (no
        second log of the partition while the first one flushes)."""
        try:
            await lg.stop(reason, flush)
        finally:
            if self.logs.get((lg.topic, lg.partition)) is lg:
                del self.logs[(lg.topic, lg.partition)]

    # -- topics -------------------------------------------------------------------------

    def topic_changed(self, meta: TopicMeta) -> None:
        self.topics.put(meta)
        for (t, _p), lg in self.logs.items():
            if t == meta.name:
                lg.apply_configs(meta)

    async def drop_topic(self, name: str) -> None:
        """Forget a deleted topic's logs and cache, and delete its objects."""
        await self.stop_topic(name)
        keys = await self.store.list(f"{self.namespace}/{name}/")
        await self.store.delete(keys)

    async def stop_topic(self, name: str) -> None:
        """A topic was deleted (here, or by another broker): stop its logs, answering their
        waiting produces UNKNOWN_TOPIC_OR_PARTITION, and forget its cached state."""
        self.topics.forget(name)
        reason = StorageError(f"topic {name!r} was deleted", ErrorCode.unknown_topic_or_partition)
        doomed = [lg for (t, _p), lg in self.logs.items() if t == name]
        for lg in doomed:  # without flush: every waiting produce is answered before any I/O
            await self._stop_log(lg, reason, flush=False)
        for lg in doomed:
            try:
                await asyncio.wait_for(lg.upload_finished(), 30)
            except TimeoutError:
                log.warning("topic %s deleted while an upload of partition %d hangs: its object may be left behind", name, lg.partition)
        for key in [k for k in self._readers if k[0] == name]:
            del self._readers[key]
        self.reader.drop(name)

    # -- partition logs ------------------------------------------------------------------

    async def release(self, topic: str, partition: int, flush: bool) -> None:
        """Ownership is moving away: flush (graceful hand-over) or drop (fenced), then forget."""
        lg = self.logs.get((topic, partition))
        if lg is not None:
            await self._stop_log(lg, StorageError(f"{topic}-{partition} moved to another broker", ErrorCode.not_leader_or_follower), flush)
        self.reader.drop(topic, partition)

    def forget(self, topic: str, partition: int) -> None:
        """Ownership lost or fenced, seen by the log itself: stop it now (no flush)."""
        lg = self.logs.pop((topic, partition), None)
        if lg is not None:
            lg.halt(StorageError(f"{topic}-{partition} is no longer owned here", ErrorCode.not_leader_or_follower))

    async def _partition_state(self, topic: str, partition: int) -> PartitionState:
        try:
            st = await self.metadata.get_partition(topic, partition)
        except STORE_FAILURES as e:
            raise store_failure(e, f"reading {topic}-{partition}") from e
        if st is None:
            raise StorageError(f"unknown topic or partition {topic}-{partition}", ErrorCode.unknown_topic_or_partition)
        return st

    async def get_reader(self, topic: str, partition: int):
        """Something to fetch from: the owned log, or else a read-only view of the
        partition's flushed segments (any broker can serve those from the object store)."""
        try:
            return await self.get_log(topic, partition)
        except StorageError as e:
            if e.error_code != ErrorCode.not_leader_or_follower:
                raise
        key = (topic, partition)
        view = self._readers.get(key)
        if view is None or view.stale():
            view = self._readers[key] = FlushedPartition(self, await self._partition_state(topic, partition))
        return view

    async def get_log(self, topic: str, partition: int) -> PartitionLog:
        """The owned log of a partition, loading and recovering it on first use.

        Raises StorageError(UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER)."""
        key = (topic, partition)
        lg = self.logs.get(key)
        if lg is not None:
            if lg.closed:  # stopping: its reason says whether to retry elsewhere or give up
                raise lg.refusal()
            return lg
        if self.stopping or not self.cluster.owns(topic, partition):
            raise StorageError(f"{topic}-{partition} is not served by this broker", ErrorCode.not_leader_or_follower)
        fut = self._loading.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[key] = fut
            try:
                lg = await self._load(topic, partition)
                self.logs[key] = lg
                fut.set_result(lg)
            except BaseException as e:
                fut.set_exception(e)
                fut.exception()  # mark retrieved
                raise
            finally:
                del self._loading[key]
            return lg
        return await asyncio.shield(fut)

    async def _load(self, topic: str, partition: int) -> PartitionLog:
        try:
            meta = await self.topics.get(topic)
            if meta is None or not 0 <= partition < meta.partitions:
                meta = await self.topics.get(topic, refresh=True)
            if meta is None or not 0 <= partition < meta.partitions:
                raise StorageError(f"unknown topic or partition {topic}-{partition}", ErrorCode.unknown_topic_or_partition)
            # Recovery commits adopted segments: another owner's commit in between is a
            # ConflictError, answered as NOT_LEADER_OR_FOLLOWER like any store failure here.
            st = await recover(self.store, self.metadata, self.namespace, await self._partition_state(topic, partition), self.merger.schedule_delete)
            lg = PartitionLog(self, meta, st)
            await rebuild_producer_state(self.reader, topic, partition, lg.state.segments, lg.producers)
        except STORE_FAILURES as e:
            raise store_failure(e, f"loading {topic}-{partition}") from e
        return lg

    def epoch_end_offset(self, lg: PartitionLog, epoch: int) -> tuple[int, int]:
        """(end offset, epoch) for OffsetForLeaderEpoch: the current epoch ends at the high
        watermark; an older one ends where the current one began (its start offset)."""
        if epoch >= lg.leader_epoch:
            return lg.high_watermark, lg.leader_epoch
        return lg.state.epoch_start_offset, epoch
