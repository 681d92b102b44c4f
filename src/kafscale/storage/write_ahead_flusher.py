"""The broker's write-ahead flusher: one object per flush for all the partitions it owns.

With `--write-ahead-objects true` the partition logs do not upload segments of their own.
When any log is due for a flush (PartitionCore.flush_due_in: the same min/max flush
interval and size rules as a log's own flusher), a flush cycle takes the next upload
(PartitionCore.begin_flush) of EVERY log with buffered data, so the data of all partitions
rides in one object; encodes each as the spec segment a log's own flush would upload;
writes them as ONE write-ahead object (storage/write_ahead.py; created, never replaced);
then commits every partition's new segment, located in that object, in one metadata
transaction per MetadataStore.COMMIT_CHUNK partitions (MetadataStore.commit_segments, at once),
each guarded by its own partition's compare; and answers each partition's producers from
its own outcome (PartitionLog.flush_landed / flush_uncertain / flush_failed, over the
core's rules):
- the upload failed: every partition of the cycle fails its waiters with a retriable
  error and hands its offsets out again (nothing was committed anywhere);
- a partition's compare failed (fenced, ownership moved mid-flush): only that partition's
  waiters fail (NOT_LEADER_OR_FOLLOWER); the others are committed without it;
- a commit whose answer was lost is settled per partition by re-reading its state.
An object whose commit never happened holds nothing anyone was answered for: the
write-ahead cleanup deletes it once it is old enough (storage/merger.py).

At most MAX_CYCLES cycles run at once, and a cycle takes at most `max_object_bytes` (what
is left rides on the next one at once). Cycles are pipelined per partition, as a log's own
flushes are (partition_log.py): a cycle holds each log's store lock from its take until the
object is durable and the log's flush lock is its own, then commits under the flush locks
and answers. So a partition whose last piece is still being committed goes into the next
cycle's object meanwhile, and its commits stay in offset order: a commit waits for the one
before it, and a piece whose earlier piece failed (which answered it) is not committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.store import MetadataStore, PartitionState
from kafscale.storage import segment, write_ahead
from kafscale.storage.failures import StorageError
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.partition_log import PartitionLog

log = logging.getLogger("kafscale.storage")

MAX_CYCLES = 4
MAX_OBJECT_BYTES = 64 * 1024 * 1024


class WriteAheadFlusher:
    def __init__(self, store: ObjectStore, metadata: MetadataStore, namespace: str,
                 broker_id: int, metrics: StorageMetrics, max_object_bytes: int = MAX_OBJECT_BYTES, commit_deadline_s: float = 75.0,
                 min_interval_s: float = 0.0):
        self.store = store
        self.metadata = metadata
        self.namespace = namespace
        self.broker_id = broker_id
        self.metrics = metrics
        self.max_object_bytes = max_object_bytes
        # No commit starts into an object older than this: the cleanup deletes unreferenced
        # objects from four times that age on (write_ahead_cleanup.py).
        self.commit_deadline_s = commit_deadline_s
        # Cycles start at most this often (--min-flush-interval-ms), but for a log holding a
        # whole segment or a transaction marker: each cycle takes every partition's data,
        # so each partition still uploads at most once per interval, and a broker whose
        # partitions get records at staggered times does not upload for each of them.
        self.min_interval_s = min_interval_s
        self._last_cycle = float("-inf")
        self.writer = uuid.uuid4().hex[:8]  # this process's objects, apart from an earlier run's of the broker id
        self.sequence = 0
        self.objects_written = 0
        self._wake = asyncio.Event()
        self._next_due = float("inf")  # monotonic time of the earliest due flush last seen
        self._requests: list[tuple[PartitionLog, asyncio.Future]] = []
        # Logs that buffered something and may still hold it (insertion order): the loop
        # and the cycles look at these, not at every log the broker holds (walking 1,024
        # logs on each wake-up was a fifth of a broker's CPU at 1,024 partitions, #32). A log
        # leaves when the loop finds it with nothing buffered and no upload in flight.
        self._pending: dict[PartitionLog, None] = {}
        self._cycles: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    # -- what the logs call ------------------------------------------------------------

    def buffered(self, lg: PartitionLog) -> None:
        """`lg` buffered something: wake the loop if that makes a flush due sooner."""
        self._ensure_running()
        self._pending[lg] = None
        now = time.monotonic()
        due = self._due_at(lg, now)
        if due is not None and due < self._next_due:
            self._next_due = due
            self._wake.set()

    def _due_at(self, lg: PartitionLog, now: float) -> float | None:
        """When `lg` wants a cycle (monotonic), None when it has nothing buffered."""
        delay = lg.core.flush_due_in(now)
        if delay is None:
            return None
        if lg.core.flush_urgent():
            return now + delay
        return max(now + delay, self._last_cycle + self.min_interval_s)

    async def flush(self, lg: PartitionLog) -> None:
        """Run a cycle that takes `lg`'s buffered data now (shutdown, hand-over), after any
        upload of it in flight, and return when that cycle has answered."""
        self._ensure_running()
        await lg.upload_finished()
        if not lg.core.buffer:
            return
        fut = asyncio.get_running_loop().create_future()
        self._requests.append((lg, fut))
        self._wake.set()
        await fut

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._cycles:
            await asyncio.gather(*self._cycles, return_exceptions=True)

    # -- the loop ----------------------------------------------------------------------

    def _ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="write-ahead-flusher")

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            next_due = float("inf")
            pending = self._pending
            for lg in list(pending):
                if lg.store_lock.locked():  # in a cycle's upload: its end wakes us
                    continue
                due = self._due_at(lg, now)
                if due is None:
                    del pending[lg]  # nothing buffered (buffered() adds it back)
                elif due < next_due:
                    next_due = due
            if (self._requests or next_due <= now) and len(self._cycles) < MAX_CYCLES:
                requests, self._requests = self._requests, []
                self._last_cycle = now
                task = asyncio.get_running_loop().create_task(self._cycle(requests))
                self._cycles.add(task)
                task.add_done_callback(self._cycle_done)
                await asyncio.sleep(0)  # let it take its logs before the next look
                continue
            self._next_due = now if next_due <= now else next_due  # (all cycles busy: a cycle's end wakes us)
            try:
                await asyncio.wait_for(self._wake.wait(), None if next_due <= now or next_due == float("inf") else next_due - now)
            except TimeoutError:
                pass

    def _cycle_done(self, task: asyncio.Task) -> None:
        self._cycles.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("write-ahead flush cycle failed unexpectedly", exc_info=task.exception())

    async def _cycle(self, requests: list[tuple[PartitionLog, asyncio.Future]]) -> None:
        held = _Held()
        try:
            now = time.monotonic()
            size = 0
            requested = [lg for lg, _f in requests]
            for lg in [*requested, *self._pending]:
                if size >= self.max_object_bytes:
                    break
                if lg.store_lock.locked() or not lg.core.buffer:
                    continue
                await lg.store_lock.acquire()  # free: taken at once
                held.stores.append(lg)
                upload = lg.take_flush(now)
                if upload is None:
                    held.release_store(lg)
                    continue
                held.taken.append((lg, upload))
                size += sum(b.nbytes for b in upload.batches)
            if held.taken:
                await self._write(held)
        finally:
            held.release_all()
            for _lg, fut in requests:
                if not fut.done():
                    fut.set_result(None)

    async def _write(self, held: "_Held") -> None:
        started = time.monotonic()
        created_ms = int(time.time() * 1000)
        pieces = []
        for lg, up in held.taken:
            body = [b.data for b in up.batches]  # uploaded where they lie: joined only into the cache's view
            enc = segment.encode(body, up.base_offset, created_ms=created_ms, aborted=up.aborted, open_txns=up.open_txns)
            pieces.append((lg, up, body, enc))
        obj = write_ahead.encode([(lg.topic, lg.topic_id, lg.partition, enc) for lg, _up, _body, enc in pieces], created_ms)
        self.sequence += 1
        key = write_ahead.object_key(self.namespace, created_ms, self.broker_id, self.writer, self.sequence)
        infos = [_located(enc.info, key, p.position) for (_lg, _up, _b, enc), p in zip(pieces, obj.pieces)]
        failure: BaseException | None = None
        try:
            try:
                await self.store.create(key, obj.parts)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - not durable: every partition of the cycle fails, once its earlier piece is settled
                failure = e
            else:
                self.objects_written += 1
                self.metrics.uploaded(1)
            # Outcomes in offset order: each log's earlier piece (an earlier cycle's) is
            # committed or failed before this one is; then the next cycle may take the log.
            for lg, _up, _b, _e in pieces:
                await held.take_flush_lock(lg)
            if failure is None and time.monotonic() - started > self.commit_deadline_s:
                failure = StorageError(f"write-ahead object {key} is older than {self.commit_deadline_s:.0f} s before its commit: not committed")
        except asyncio.CancelledError:
            _fail_cancelled(pieces)
            raise
        live = [(piece, info) for piece, info in zip(pieces, infos) if piece[0].core.in_flight_upload(piece[1])]  # else answered by an earlier piece's failure
        held.release_stores()
        self._wake.set()  # those logs may go into the next cycle now
        if failure is not None:
            for (lg, _up, _body, _enc), _info in live:
                lg.flush_failed(failure)
            return
        if not live:
            return
        try:
            results = await self.metadata.commit_segments([(lg.state, info) for (lg, _u, _b, _e), info in live])
        except asyncio.CancelledError:
            _fail_cancelled([piece for piece, _info in live])
            raise
        self.metrics.object_flushed(obj.size, time.monotonic() - started)
        for ((lg, up, body, _enc), info), result in zip(live, results):
            if not lg.core.in_flight_upload(up):
                continue  # cancelled meanwhile (stopping): answered
            if isinstance(result, PartitionState):
                lg.flush_landed(result, info, body, started, 0, observe=False)
            else:
                await lg.flush_uncertain(result, info, body, started, observe=False)


def _fail_cancelled(pieces: list) -> None:
    """The broker stops: fail each (log, upload, ...) piece not answered yet."""
    for lg, up, *_rest in pieces:
        if lg.core.in_flight_upload(up):
            lg.flush_failed(StorageError("flush cancelled (broker stopping)"))


class _Held:
    """The locks a cycle holds: the store lock of each log it looked at or took (until its
    object is durable and the flush locks are taken), the flush lock of each log it took
    (until its answers)."""

    def __init__(self) -> None:
        self.taken: list = []  # (log, upload)
        self.stores: list[PartitionLog] = []
        self.flushes: list[PartitionLog] = []

    def release_store(self, lg: PartitionLog) -> None:
        self.stores.remove(lg)
        lg.store_lock.release()

    def release_stores(self) -> None:
        stores, self.stores = self.stores, []
        for lg in stores:
            lg.store_lock.release()

    async def take_flush_lock(self, lg: PartitionLog) -> None:
        await lg.flush_lock.acquire()
        self.flushes.append(lg)

    def release_all(self) -> None:
        self.release_stores()
        flushes, self.flushes = self.flushes, []
        for lg in flushes:
            lg.flush_lock.release()


def _located(info: SegmentInfo, key: str, position: int) -> SegmentInfo:
    """`info` held at `position` of the write-ahead object `key` (dataclasses.replace, by
    hand: replace's field walk was a tenth of a flush cycle over 1,024 partitions)."""
    return SegmentInfo(
        info.base_offset, info.last_offset, info.size, info.record_count, info.max_timestamp, info.created_ms, aborted=info.aborted,
        open_txns=info.open_txns, cleaned=info.cleaned, delete_horizon_ms=info.delete_horizon_ms, wao_key=key, wao_position=position,
    )
