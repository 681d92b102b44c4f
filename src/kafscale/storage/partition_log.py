"""The driver of one owned partition log, and the read-only view of one owned elsewhere.

`PartitionLog` does the I/O around its `PartitionCore` (partition_core.py), which makes
every decision: a flusher task per log uploads the segment each flush takes, commits it to
the metadata store, and delivers the answers to the producers' futures. A flush is two
stages: the upload (one at a time, under the store lock) and the commit (under the flush
lock, which also serialises commits with the other changes of the partition state:
retention, DeleteRecords, a merge's swap). The next flush uploads while the one before it
commits, and an upload takes the flush lock before it lets the next one start, so commits
follow offset order. Reads go to the shared `SegmentReader` (reader.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from kafscale.errors import ErrorCode
from kafscale.metadata.kv import BeforeCommitFailed
from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.store import MetadataStore, PartitionState, TopicMeta
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.config import StorageConfig
from kafscale.storage.failures import STORE_FAILURES, StorageError, store_failure
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.partition_core import Answer, Outcome, PartitionCore
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.reader import SegmentReader
from kafscale.storage.txn import AbortedIndex, aborted_in_range, cut_at

log = logging.getLogger("kafscale.storage")

# A flush of at most this many bytes writes its segment and commits it in one job on the
# metadata store's commit thread when the store allows (PartitionLog._store_and_commit):
# small flushes are bound by CPU (thread hops, wake-ups), large ones by the write and its
# fsync, which the two-stage path overlaps with the commit of the flush before. 1 MiB, not
# 128 KiB: a single producer's lz4 batches make flushes of 150-600 KB, whose extra hops and
# wake-ups cost more broker CPU than the overlap saves (docs/performance.md, #33).
ONE_JOB_MAX_BYTES = 1024 * 1024


class PartitionLog:
    """One owned partition log. What it works with is given to it: the storage settings, the
    store, the metadata, the shared reader, the metrics sink, `owns(topic, partition)` (is it
    still ours?) and `forget(topic, partition)` (its registry drops it when ownership is lost)."""

    def __init__(
        self, meta: TopicMeta, state: PartitionState, producers: ProducerStateTable | None = None, *, config: StorageConfig,
        store: ObjectStore, metadata: MetadataStore, reader: SegmentReader, metrics: StorageMetrics,
        owns: Callable[[str, int], bool], forget: Callable[[str, int], None], write_ahead=None,
    ):
        self.topic = meta.name
        self.topic_id = meta.topic_id
        self.partition = state.partition
        self.config = config
        self.store = store
        self.metadata = metadata
        self.reader = reader
        self.metrics = metrics
        self._owns = owns
        self._forget = forget
        cfg = config
        self.core = PartitionCore(
            f"{self.topic}-{self.partition}",
            state,
            LogSettings.from_configs(meta.configs, cfg.kafka_static_configs),
            cfg.flush_interval_ms / 1000,
            cfg.min_flush_interval_ms / 1000,
            producers,
        )
        self._wake = asyncio.Event()
        self._data_waiters: set[asyncio.Future] = set()
        self._flusher: asyncio.Task | None = None
        self._flush_lock = asyncio.Lock()  # commits and the other changes of the state
        self._store_lock = asyncio.Lock()  # one upload at a time, in offset order
        self._commits: set[asyncio.Task] = set()
        self._aborted = AbortedIndex()
        # The broker's write-ahead flusher (storage/write_ahead_flusher.py) when this log's
        # flushes go into write-ahead objects shared with the broker's other partitions;
        # None: this log uploads its own segments from its own flusher task.
        self._write_ahead = write_ahead

    # -- state (the core's) ---------------------------------------------------------------

    @property
    def state(self) -> PartitionState:
        return self.core.state

    @property
    def settings(self) -> LogSettings:
        return self.core.settings

    @property
    def producers(self):
        return self.core.producers

    @property
    def next_offset(self) -> int:
        return self.core.next_offset

    @property
    def closed(self) -> bool:
        return self.core.closed

    @property
    def stopped_by(self) -> StorageError | None:
        return self.core.stopped_by

    @property
    def high_watermark(self) -> int:
        return self.core.state.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.core.state.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        return self.core.last_stable_offset

    @property
    def leader_epoch(self) -> int:
        return self.core.state.leader_epoch

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with records in [start, end)."""
        return aborted_in_range(self._aborted.of(self.state.segments), start, end)

    def may_have_aborted_from(self, start: int) -> bool:
        """False when no aborted transaction has records at or after `start` (the fetch
        path then skips finding the end of what it read)."""
        return self._aborted.any_from(self.state.segments, start)

    def apply_configs(self, meta: TopicMeta) -> None:
        self.core.settings = LogSettings.from_configs(meta.configs, self.config.kafka_static_configs)

    def refusal(self) -> StorageError:
        return self.core.refusal()

    # -- carrying out the core's outcomes -------------------------------------------------

    @staticmethod
    def _deliver(answer: Answer) -> None:
        for w in answer.waiters:
            if w.done():
                continue
            if answer.error is None:
                w.set_result(None)
            else:
                w.set_exception(answer.error)

    def _apply(self, out: Outcome) -> None:
        for answer in out.answers:
            self._deliver(answer)
        if out.notify_readers:
            self._notify_data()
        if out.forget:
            self._forget(self.topic, self.partition)

    # -- write path -----------------------------------------------------------------------

    def append(self, data: memoryview, headers: list[records.BatchHeader], want_ack: bool) -> tuple[int, int, asyncio.Future | None]:
        """Assign offsets to already-validated batches (patched in place) and buffer them.

        Returns (base offset, log append time or -1, future resolved when durable).
        Runs without awaiting, so offsets are assigned in arrival order.
        """
        loop = asyncio.get_running_loop()
        waiter = loop.create_future() if want_ack else None
        done = self.core.append(data, headers, waiter, time.monotonic(), int(time.time() * 1000))
        if not done.buffered:  # a retried duplicate: answered now or with its batch
            if done.answer is not None:
                self._deliver(done.answer)
            return done.base_offset, done.append_time, waiter
        self.metrics.produced(len(data), records.record_count(headers))
        self._buffered()
        return done.base_offset, done.append_time, waiter

    def append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool) -> asyncio.Future:
        """Append an end-transaction marker (see PartitionCore.append_marker); the future is
        resolved once it is durable. Raises StorageError / InvalidRecordError now."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self.core.append_marker(producer_id, producer_epoch, coordinator_epoch, commit, waiter, time.monotonic(), int(time.time() * 1000))
        self._buffered()
        return waiter

    def _buffered(self) -> None:
        """Something was buffered: the flusher looks at when it is due."""
        if self._write_ahead is not None:
            self._write_ahead.buffered(self)
            return
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._run_flusher(), name=f"flush-{self.topic}-{self.partition}")
        self._wake.set()

    async def _run_flusher(self) -> None:
        while not self.core.closed:
            delay = self.core.flush_due_in(time.monotonic())
            if delay is None:
                self._wake.clear()
                await self._wake.wait()
                continue
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
        """Flush everything buffered now, and wait for the uploads already in flight
        (shutdown, ownership hand-over)."""
        while True:
            await self.flush_once()  # takes the store lock: waits for the upload in flight
            if not self.core.buffer:
                break
        await self.upload_finished()

    async def flush_once(self) -> None:
        """Take the next segment and upload it; its commit goes on in a task of its own
        (holding the flush lock), so the next flush may upload meanwhile."""
        if self._write_ahead is not None:
            await self._write_ahead.flush(self)  # in the broker's next write-ahead object
            return
        async with self._store_lock:
            out = self.core.begin_flush(time.monotonic(), self._owns(self.topic, self.partition))
            if out is None:
                return
            if out.upload is None:  # ownership lost: halted
                self._apply(out)
                return
            body, enc, objects = self._encode(out.upload)
            if not self._flush_lock.locked() and await self._store_and_commit(out.upload, body, enc, objects):
                return
            stored = await self._store(out.upload, body, enc, objects)
            if stored is None:
                return
            try:
                await self._flush_lock.acquire()  # after the commit of the upload before this one
            except asyncio.CancelledError:
                self._upload_failed(StorageError("flush cancelled (broker stopping)"), None)
                raise
        task = asyncio.get_running_loop().create_task(self._commit(out.upload, *stored))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    def _encode(self, upload):
        """(its batch buffers, the encoded segment, its objects): an upload encoded once,
        for whichever of the two ways below stores it. The objects are written from the
        buffers where they lie (the produce requests' memory, counted in the budget): a
        joined copy made here was outside it for as long as the upload and the commit took
        (docs/performance.md "Memory on S3")."""
        body = [b.data for b in upload.batches]
        enc = segment.encode(body, upload.base_offset, aborted=upload.aborted, open_txns=upload.open_txns)
        return body, enc, segment.segment_objects(self.config.namespace, self.topic, self.partition, enc, self.config.index_min_bytes)

    async def _store_and_commit(self, upload, body, enc, objects) -> bool:
        """With no commit of this log in flight and a store that writes from a worker thread
        (the local directory): write the segment and commit it in one job on the metadata
        store's commit thread (kv.KV.commit_after), then answer. One thread hop each way
        instead of two: on the embedded default a flush's hops and wake-ups were a large part
        of the broker's CPU per acknowledged request (docs/performance.md, #33). Durability is
        the same: the objects' fsyncs (file, directory) come before the commit's. False: not
        taken (a large flush, another kind of store); the caller uploads and commits in two
        stages."""
        if sum(b.nbytes for b in upload.batches) > ONE_JOB_MAX_BYTES:
            return False
        write = self.store.blocking_create_many(objects)
        if write is None:
            return False
        started = time.monotonic()
        async with self._flush_lock:  # free: nothing of this log is committing
            try:
                state = await self.metadata.commit_segment(self.core.state, enc.info, before=write)
            except asyncio.CancelledError:
                self._upload_failed(StorageError("flush cancelled (broker stopping)"), None)
                raise
            except Exception as e:  # noqa: BLE001 - not written (nothing committed), or the commit's outcome unknown
                if self.core.in_flight_upload(upload):
                    await self.flush_uncertain(e.error if isinstance(e, BeforeCommitFailed) else e, enc.info, body, started)
                return True
            if self.core.in_flight_upload(upload):  # else cancelled meanwhile (stopping): answered
                self.flush_landed(state, enc.info, body, started, len(objects))
        return True

    async def _store(self, upload, body, enc, objects):
        """Upload one segment (durable in the store, not committed): (encoded segment,
        its batch buffers, start time, objects written), or None when it failed (then answered)."""
        started = time.monotonic()
        try:
            await self.store.create_many(objects)  # never replaces another writer's segment
        except asyncio.CancelledError:
            self._upload_failed(StorageError("flush cancelled (broker stopping)"), None)
            raise
        except Exception as e:  # noqa: BLE001 - not durable, nothing committed
            async with self._flush_lock:  # outcomes in offset order: the upload before this one's first
                if self.core.in_flight_upload(upload):
                    await self.flush_uncertain(e, enc.info, body, started)
            return None
        return enc, body, started, len(objects)

    async def _commit(self, upload, enc, body, started: float, puts: int) -> None:
        """Commit an uploaded segment and answer its producers; holds the flush lock,
        taken by flush_once."""
        try:
            if not self.core.in_flight_upload(upload):
                return  # the upload before it failed, and that answered this one's producers
            try:
                state = await self.metadata.commit_segment(self.core.state, enc.info)
            except asyncio.CancelledError:
                self._upload_failed(StorageError("flush cancelled (broker stopping)"), None)
                raise
            except Exception as e:  # noqa: BLE001 - any failure means "not durable"
                await self.flush_uncertain(e, enc.info, body, started)
                return
            if self.core.in_flight_upload(upload):  # else cancelled meanwhile (stopping): answered
                self.flush_landed(state, enc.info, body, started, puts)
        finally:
            self._flush_lock.release()

    # -- the steps of a flush another driver runs (the write-ahead flusher) ---------------
    # As flush_once does: it takes an upload with take_flush under store_lock, held until the
    # upload is durable (or failed) and flush_lock is taken, which is held until one of
    # flush_landed, flush_uncertain or flush_failed has answered it (each only while the core
    # still has the upload in flight: an earlier upload's failure answers the later ones).

    @property
    def store_lock(self) -> asyncio.Lock:
        return self._store_lock

    @property
    def flush_lock(self) -> asyncio.Lock:
        return self._flush_lock

    def take_flush(self, now: float):
        """The core's next upload (PartitionCore.begin_flush), None when there is nothing
        to upload or ownership was lost (then the log halts here)."""
        out = self.core.begin_flush(now, self._owns(self.topic, self.partition))
        if out is None:
            return None
        if out.upload is None:  # ownership lost: halted
            self._apply(out)
            return None
        return out.upload

    def flush_landed(self, state: PartitionState, info: SegmentInfo, body, started: float, puts: int, observe: bool = True) -> None:
        """The upload is durable and committed as `state`: answer its producers. `body`: its
        batch buffers, which the cache joins into its view. `observe`: a flush of its own for
        the metrics (False: a piece of a write-ahead object)."""
        out = self.core.flush_committed(state)
        try:
            self.metrics.flushed(info, time.monotonic() - started, puts, observe)
            self.reader.cache_segment(self.topic, self.partition, info.base_offset, body)
        except Exception:  # noqa: BLE001 - the data is durable: acknowledge it regardless
            log.exception("partition %s-%s: bookkeeping after a flush failed", self.topic, self.partition)
        self._apply(out)

    async def flush_uncertain(self, error: BaseException, info: SegmentInfo, body, started: float, observe: bool = True) -> None:
        """The commit of `info` failed or its answer was lost: committed after all (the
        metadata re-read holds it) or not durable."""
        latest = await self._reread_state()
        if not self.core.commit_landed(latest, info):
            self._upload_failed(error, latest)
            return
        self.flush_landed(latest, info, body, started, 0, observe)

    def flush_failed(self, error: BaseException) -> None:
        """The upload did not become durable (nothing was committed)."""
        self._upload_failed(error, None)

    async def _reread_state(self) -> PartitionState | None:
        """After an ambiguous failure, the metadata as it is now (None: unreadable)."""
        try:
            return await self.metadata.get_partition(self.topic, self.partition)
        except Exception:  # noqa: BLE001
            return None

    def _upload_failed(self, error: BaseException, latest: PartitionState | None) -> None:
        out = self.core.flush_failed(error, latest)
        rejection = out.answers[0].error
        log.error(
            "partition %s-%s: %s; %d unacknowledged batches rejected with error %d",
            self.topic, self.partition, rejection, out.rejected_batches, rejection.error_code,
            extra={"topic": self.topic, "partition": self.partition},
        )
        self.metrics.flush_failed()
        self._apply(out)

    # -- stopping (the rules: PartitionCore.halt) ----------------------------------------

    def halt(self, reason: StorageError) -> None:
        """Stop at once, without I/O (see PartitionCore.halt)."""
        self._apply(self.core.halt(reason))
        self._wake.set()  # the flusher sees `closed` and ends after any upload in flight

    async def stop(self, reason: StorageError, flush: bool) -> None:
        """The one way to stop a log. With flush (shutdown, graceful hand-over) everything
        buffered is made durable and acknowledged first; what cannot be is rejected with
        `reason`. Without (deleted, fenced) this is halt()."""
        if self.core.begin_stop(reason, flush):
            try:
                await self.flush()
            except Exception as e:  # noqa: BLE001 - whatever is left is rejected below
                log.error("partition %s-%s: final flush failed: %s", self.topic, self.partition, e, extra={"topic": self.topic, "partition": self.partition})
        self.halt(reason)
        if flush and self._flusher is not None:
            await asyncio.wait([self._flusher, *self._commits], timeout=30)

    async def upload_finished(self) -> None:
        """Wait for the uploads in flight to end (before deleting a topic's objects, so no
        late segment lands under a name a re-created topic would adopt)."""
        async with self._store_lock:
            async with self._flush_lock:  # queued behind the commit of the last upload
                pass

    # -- read path ------------------------------------------------------------------------

    def _notify_data(self) -> None:
        waiters, self._data_waiters = self._data_waiters, set()
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def add_data_waiter(self, fut: asyncio.Future) -> None:
        if self.core.closed:  # nothing will be appended here any more: look again now
            if not fut.done():
                fut.set_result(None)
            return
        self._data_waiters.add(fut)

    def discard_data_waiter(self, fut: asyncio.Future) -> None:
        self._data_waiters.discard(fut)

    async def read(self, offset: int, max_bytes: int, at_least_one: bool = True, upto: int | None = None) -> list[memoryview]:
        """Stored batches from `offset` up to the high watermark (or the whole batches below
        `upto`, the last stable offset for read_committed), at most max_bytes (the first
        batch whole if at_least_one). Raises StorageError(OFFSET_OUT_OF_RANGE)."""
        st = self.state
        try:
            return await read_committed(self.reader, st, offset, max_bytes, at_least_one, upto)
        except StorageError as e:
            if e.error_code != ErrorCode.offset_out_of_range or self.state is st:
                raise
        # The segment list changed while this read was under way and an object it named is
        # gone (a merge or a rewrite of write-ahead objects past its grace, retention): the
        # current list says where those offsets are now.
        return await read_committed(self.reader, self.state, offset, max_bytes, at_least_one, upto)

    def start_load(self, offset: int) -> asyncio.Future | None:
        """Begin loading the stored segment holding `offset` if it is not cached (None: nothing to wait for)."""
        return self.reader.start_load(self.topic, self.partition, self.state.segments, offset)

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`, or (-1, -1)."""
        st = self.state
        return await self.reader.offset_for_timestamp(self.topic, self.partition, st.segments, st.log_start_offset, timestamp)

    async def max_timestamp_offset(self) -> tuple[int, int]:
        """(offset, timestamp) of the record with the largest timestamp, or (-1, -1)."""
        return await self.reader.max_timestamp_offset(self.topic, self.partition, self.state.segments)

    # -- changes of the segment list (retention, DeleteRecords, merges) -------------------
    # Each runs under the flush lock, so it never races an upload's commit of the state.

    async def advance_log_start(self, new_start: int) -> None:
        """DeleteRecords: move the log start offset and drop segments wholly below it."""
        async with self._flush_lock:
            if new_start <= self.state.log_start_offset:
                return
            doomed = [s for s in self.state.segments if s.last_offset < new_start]
            await self._drop_segments(doomed, new_start)
        await self._delete_dropped(doomed, new_start)

    async def drop_leading_segments(self, doomed: list[SegmentInfo]) -> None:
        """Retention: delete the leading segments `doomed` (those retention.py found past
        retention.ms / retention.bytes); the log then starts after them."""
        async with self._flush_lock:
            new_start = max(doomed[-1].last_offset + 1, self.state.log_start_offset)
            await self._drop_segments(doomed, new_start)
        await self._delete_dropped(doomed, new_start)

    async def _drop_segments(self, doomed: list[SegmentInfo], new_start: int) -> None:
        self.core.state = await self.metadata.update_partition(
            self.state, log_start_offset=new_start, remove_segments=[s.base_offset for s in doomed]
        )

    async def _delete_dropped(self, doomed: list[SegmentInfo], new_start: int) -> None:
        """Deletes the objects of segments the committed state no longer lists, after the
        flush lock is released: a slow or retried delete must not hold up this partition's
        commits (nor, with write-ahead objects, a whole flush cycle waiting for them). No
        upload can reuse their keys: new segments start at or above the log start offset."""
        ns = self.config.namespace
        keys = []
        for seg in doomed:
            keys.append(segment.segment_key(ns, self.topic, self.partition, seg.base_offset))
            keys.append(segment.index_key(ns, self.topic, self.partition, seg.base_offset))
        if keys:
            await self.store.delete(keys)
            log.info("partition %s-%s: deleted %d segments, log start offset now %d", self.topic, self.partition, len(doomed), new_start)

    async def swap_segments(self, run: list[SegmentInfo], merged: SegmentInfo) -> bool:
        """A merge: replace the segments of `run` by `merged` in the committed state, unless
        retention or DeleteRecords changed the run meanwhile (False)."""
        async with self._flush_lock:
            current = {s.base_offset: s for s in self.state.segments}
            if self.closed or any(current.get(s.base_offset) != s for s in run):
                return False
            self.core.state = await self.metadata.update_partition(
                self.state, remove_segments=[s.base_offset for s in run], add_segments=[merged]
            )
            return True


async def read_committed(
    reader: SegmentReader, st: PartitionState, offset: int, max_bytes: int, at_least_one: bool, upto: int | None = None
) -> list[memoryview]:
    """Batches of a partition's committed segments from `offset`, owned or not; with `upto`
    only the whole batches ending below it."""
    if offset < st.log_start_offset or offset > st.high_watermark:
        raise StorageError(f"offset {offset} outside [{st.log_start_offset}, {st.high_watermark}]", ErrorCode.offset_out_of_range)
    end = st.high_watermark if upto is None else min(upto, st.high_watermark)
    chunks = await reader.read(st.topic, st.partition, st.segments, offset, end, max_bytes, at_least_one)
    return chunks if end == st.high_watermark else cut_at(chunks, end)


class FlushedPartition:
    """Read-only view of a partition this broker does not own, from the metadata's segment
    list; refreshed after a short time so followers see new segments."""

    MAX_AGE_S = 0.5

    def __init__(self, state: PartitionState, reader: SegmentReader, metadata: MetadataStore):
        self.reader = reader
        self.metadata = metadata
        self.state = state
        self.topic, self.partition = state.topic, state.partition
        self.loaded = time.monotonic()
        self._aborted = AbortedIndex()

    def stale(self) -> bool:
        return time.monotonic() - self.loaded > self.MAX_AGE_S

    @property
    def high_watermark(self) -> int:
        return self.state.high_watermark

    @property
    def log_start_offset(self) -> int:
        return self.state.log_start_offset

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    # Which transactions are open is known to the owner only (from its producer state): a
    # read_committed fetch is sent there (NOT_LEADER_OR_FOLLOWER).
    last_stable_offset = None

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return aborted_in_range(self._aborted.of(self.state.segments), start, end)

    def may_have_aborted_from(self, start: int) -> bool:
        return self._aborted.any_from(self.state.segments, start)

    def start_load(self, offset: int) -> asyncio.Future | None:
        return self.reader.start_load(self.topic, self.partition, self.state.segments, offset)

    async def read(self, offset: int, max_bytes: int, at_least_one: bool = True, upto: int | None = None) -> list[memoryview]:
        if self.stale():
            await self._refresh()
        try:
            return await read_committed(self.reader, self.state, offset, max_bytes, at_least_one, upto)
        except StorageError as e:
            if e.error_code != ErrorCode.offset_out_of_range or time.monotonic() - self.loaded < 0.05:
                raise
        # An object the list named is gone (the owner merged or rewrote it since, past the
        # grace period): read the owner's current list once more.
        await self._refresh()
        return await read_committed(self.reader, self.state, offset, max_bytes, at_least_one, upto)

    async def _refresh(self) -> None:
        try:
            st = await self.metadata.get_partition(self.topic, self.partition)
        except STORE_FAILURES as e:
            raise store_failure(e, f"reading {self.topic}-{self.partition}") from e
        if st is not None:
            self.reader.segments_changed(self.topic, self.partition, self.state.segments, st.segments)
            self.state, self.loaded = st, time.monotonic()

    def add_data_waiter(self, fut: asyncio.Future) -> None:
        # No local appends to wait for: wake the long poll when the view goes stale.
        asyncio.get_running_loop().call_later(self.MAX_AGE_S, lambda: fut.done() or fut.set_result(None))

    def discard_data_waiter(self, fut: asyncio.Future) -> None:
        pass
