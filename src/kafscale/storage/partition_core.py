"""The decisions of one partition log, without I/O and without asyncio.

`PartitionCore` owns what a log decides: which offsets an append gets, when the write buffer
is due for a flush and what that flush takes, what becomes durable and who is answered with
what, what an upload failure drops, and how the log stops. The driver
(`storage/partition_log.py`) does the I/O around it: it uploads the segment a flush takes,
commits it to the metadata store, and delivers the `Answer`s each step returns to the
producers waiting on them. Waiters are opaque to the core (the driver's futures); time is
passed in (`now`, monotonic seconds; `now_ms`, wall-clock milliseconds), so tests drive it
with a fake clock.

The rules:
- Offsets are assigned on append, in arrival order; the high watermark moves only when the
  segment holding a batch is committed (`flush_committed`).
- An upload takes the oldest buffered batches, up to `segment.bytes` (it may end one record
  set past it, which keeps segments full). Uploads are pipelined: the next may begin (its
  segment starts where the last one in flight ends) while the one before it commits, and
  their outcomes come in offset order (the driver commits them one by one). An upload that
  fails to commit drops the one after it too; that one's object, maybe already stored,
  starts where the failed one's ends, so recovery adopts it only right after that one
  (storage/recovery.py: a contiguous chain from the high watermark).
- A failed upload drops every batch not yet durable (in flight and buffered): their offsets
  are handed out again, so nothing acknowledged is ever renumbered, and every waiter gets a
  retriable error.
- Transactions (docs/transactions.md): a producer's first transactional batch opens its
  transaction here; `append_marker` appends the COMMIT/ABORT control batch that closes it,
  like any batch. The last stable offset is the smallest first offset of the open
  transactions, else the high watermark (never above it). An ABORT marker that closes an
  open transaction adds (producer id, first offset, marker offset) to the aborted entries of
  the segment that holds it, committed with that segment. A failed upload rolls the
  transaction state back with the producer state.
- Every way a log stops (topic deleted, ownership lost or moved, fenced, shutdown) is
  `halt`: no more appends, buffered batches rejected with the stop reason, an upload in
  flight answered by its own outcome. Once stopping, the stop reason wins over any other
  error, since it tells the client where to go next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kafscale.errors import ErrorCode
from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.store import ConflictError, PartitionState
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import records
from kafscale.storage.failures import StorageError
from kafscale.storage.objectstore import ObjectExistsError
from kafscale.storage.producers import ProducerStateTable


@dataclass(slots=True)
class BufferedBatch:
    """A record set with its offsets assigned, not yet durable."""

    data: memoryview
    nbytes: int
    base_offset: int
    waiters: list[Any]  # the driver's waiters (futures): answered together
    aborted: tuple[tuple[int, int, int], ...] = ()  # an ABORT marker's aborted transaction
    marker: bool = False  # an end-transaction marker: flushed without waiting for min_flush_interval


class Answer(NamedTuple):  # a NamedTuple, as Appended: one or more a flush (#33)
    """Waiters to resolve: acknowledged when `error` is None (durable), else rejected."""

    waiters: list[Any]
    error: StorageError | None


class Upload(NamedTuple):  # a NamedTuple, as Appended: one a flush (#33)
    """What a flush takes: these batches, as one segment starting at `base_offset`."""

    batches: list[BufferedBatch]
    base_offset: int
    open_txns: tuple[tuple[int, int, int], ...] = ()  # open at the segment's end (SegmentInfo.open_txns)
    end_offset: int = 0  # the offset after its last record

    @property
    def aborted(self) -> tuple[tuple[int, int, int], ...]:
        """The aborted-transaction entries of the segment (SegmentInfo.aborted)."""
        out = ()
        for b in self.batches:  # (no generator: asked once a flush, nearly always empty)
            if b.aborted:
                out += b.aborted
        return out


@dataclass(slots=True)
class Outcome:
    """What the driver does after a step, in this order: start `upload`; deliver `answers`;
    wake long-poll readers when `notify_readers`; drop the log from the registry when
    `forget` (ownership lost or fenced: the next request re-reads ownership and state)."""

    answers: list[Answer] = field(default_factory=list)
    upload: Upload | None = None
    notify_readers: bool = False
    forget: bool = False
    rejected_batches: int = 0  # batches a failed upload dropped (for the driver's log line)


class Appended(NamedTuple):  # a NamedTuple: one per append, 3x cheaper to build than a frozen dataclass (#33)
    """An append's result: the base offset, the log append time (-1 unless the topic uses
    LogAppendTime), whether the record set was buffered (False: a retried duplicate), and
    for a duplicate an answer already decided (None: the waiter is answered with the batch
    it repeats, or nobody waits)."""

    base_offset: int
    append_time: int
    buffered: bool
    answer: Answer | None = None


class PartitionCore:
    def __init__(
        self,
        name: str,
        state: PartitionState,
        settings: LogSettings,
        flush_interval_s: float,
        min_flush_interval_s: float,
        producers: ProducerStateTable | None = None,
    ):
        self.name = name  # "topic-partition", for messages
        self.state = state  # the committed state: segments, high watermark, epoch
        self.settings = settings
        self.flush_interval_s = flush_interval_s
        self.min_flush_interval_s = min_flush_interval_s
        self.next_offset = state.high_watermark
        self.producers = producers if producers is not None else ProducerStateTable()
        self.buffer: list[BufferedBatch] = []
        self.buffered_bytes = 0
        self.buffer_since = 0.0
        self.waiting_acks = 0  # buffered batches someone waits on
        self.buffered_markers = 0  # end-transaction markers among them
        self.last_flush = float("-inf")  # not 0.0: the monotonic clock may start near 0 (a fresh VM)
        self.in_flight: list[BufferedBatch] = []  # the batches of `uploads`, in order
        self.uploads: list[Upload] = []  # taken and not answered yet, oldest first
        # Transactions whose marker is appended but not durable yet, as (producer id, first
        # offset, marker offset): still undecided for readers, so they hold the LSO back.
        self.closing_txns: list[tuple[int, int, int]] = []
        self.uploading = False
        self.closed = False  # no more appends: the log is stopping or stopped
        self.stopped_by: StorageError | None = None  # why: what every waiter left is answered with

    # -- append ---------------------------------------------------------------------------

    def append(self, data: memoryview, headers: list[records.BatchHeader], waiter: Any, now: float, now_ms: int) -> Appended:
        """Assign offsets to already-validated batches (patched in place) and buffer them.
        `waiter` (None: acks=0) is answered when they are durable. Raises StorageError once
        the log is stopping, InvalidRecordError for a bad producer sequence."""
        if self.closed:
            raise self.refusal()
        if records.any_attribute(headers, records.CONTROL_MASK):
            raise records.InvalidRecordError("control batches are written by the transaction coordinator, not produced", ErrorCode.invalid_record)
        duplicate = self.producers.check_record_set(headers)
        if duplicate is not None:
            return self._duplicate(duplicate.base_offset, waiter)
        base = offset = self.next_offset
        append_time = now_ms if self.settings.log_append_time else -1
        pos = 0
        for h in headers:
            if h.producer_id >= 0:
                self.producers.record(h, offset, now_ms, self.state.high_watermark)
            records.patch_batch(data, pos, offset, self.state.leader_epoch)
            if append_time >= 0:
                records.set_max_timestamp(data, pos, h.size, append_time)
            offset += h.last_offset_delta + 1
            pos += h.size
        self.next_offset = offset
        self._buffer(BufferedBatch(data, len(data), base, [waiter] if waiter is not None else []), now)
        return Appended(base, append_time, True)

    def _buffer(self, batch: BufferedBatch, now: float) -> None:
        if not self.buffer:
            self.buffer_since = now
        self.buffer.append(batch)
        self.buffered_bytes += batch.nbytes
        if batch.waiters:
            self.waiting_acks += 1
        if batch.marker:
            self.buffered_markers += 1

    def append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool, waiter: Any, now: float, now_ms: int) -> Appended:
        """Append the end-transaction control batch (COMMIT or ABORT) of a producer's
        transaction; `waiter` is answered once it is durable. A marker for a producer with no
        open transaction here is appended too (the coordinator may send one twice) but ends
        nothing. Raises StorageError once the log is stopping, InvalidRecordError for an old
        producer epoch (INVALID_PRODUCER_EPOCH) or coordinator epoch (TRANSACTION_COORDINATOR_FENCED)."""
        if self.closed:
            raise self.refusal()
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        offset = self.next_offset
        data = memoryview(bytearray(records.build_control_batch(commit, producer_id, producer_epoch, coordinator_epoch, now_ms)))
        records.patch_batch(data, 0, offset, self.state.leader_epoch)
        first = self.producers.end_txn(producer_id, producer_epoch, coordinator_epoch, offset, now_ms, self.state.high_watermark)
        aborted = ((producer_id, first, offset),) if first is not None and not commit else ()
        if first is not None:
            self.closing_txns.append((producer_id, first, offset))
        self.next_offset = offset + 1
        self._buffer(BufferedBatch(data, len(data), offset, [waiter] if waiter is not None else [], aborted, marker=True), now)
        return Appended(offset, -1, True)

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction is decided: the smallest first offset of the open
        transactions, else the high watermark (never above it)."""
        hw = self.state.high_watermark
        first = self.producers.first_unstable_offset()
        for _pid, txn_first, _marker in self.closing_txns:
            if first is None or txn_first < first:
                first = txn_first
        return hw if first is None or first > hw else first

    def _duplicate(self, base_offset: int, waiter: Any) -> Appended:
        """A retried batch already appended: answered at its original offset once durable."""
        if waiter is None:
            return Appended(base_offset, -1, False)
        if base_offset < self.state.high_watermark:
            return Appended(base_offset, -1, False, Answer([waiter], None))
        pending = next((b for b in self.buffer if b.base_offset == base_offset), None)
        if pending is not None and not pending.waiters:
            self.waiting_acks += 1  # first to wait on a buffered acks=0 batch: group commit applies
        elif pending is None:
            pending = next((b for b in self.in_flight if b.base_offset == base_offset), None)
        if pending is None:
            return Appended(base_offset, -1, False, Answer([waiter], StorageError("retried batch is neither durable nor pending")))
        pending.waiters.append(waiter)  # answered with the batch it repeats
        return Appended(base_offset, -1, False)

    # -- flush ----------------------------------------------------------------------------

    def flush_due_in(self, now: float) -> float | None:
        """Seconds until the buffer must be flushed (<= 0: now; None: nothing buffered)."""
        if not self.buffer:
            return None
        if self.buffered_bytes >= self.settings.segment_bytes:
            return 0.0
        if self.buffered_markers:
            # A transaction is decided but not complete until its markers are durable: the
            # coordinator answers the producer's next transaction CONCURRENT_TRANSACTIONS
            # until then, and the LSO waits. One more upload per transaction end is worth a
            # flush interval less per transaction (on S3, where min_flush_interval is long).
            return 0.0
        due = self.buffer_since + self.flush_interval_s
        if self.waiting_acks:
            # Group commit: someone waits for an ack; flush as soon as the last upload is
            # min_flush_interval old.
            due = min(due, self.last_flush + self.min_flush_interval_s)
        return due - now

    def flush_urgent(self) -> bool:
        """Whether the buffer must go now whenever the last upload was: it holds a whole
        segment, or a transaction marker (see flush_due_in). A flusher shared by many logs
        (storage/write_ahead_flusher.py) spaces its uploads by the min flush interval
        otherwise."""
        return bool(self.buffer) and (self.buffered_bytes >= self.settings.segment_bytes or self.buffered_markers > 0)

    def begin_flush(self, now: float, owned: bool) -> Outcome | None:
        """Take the next segment to upload (None: nothing buffered). Without ownership (lease
        lost or moved: another broker may write this partition now) the log halts instead."""
        if not self.buffer:
            return None
        self.last_flush = now
        if not owned:
            out = self.halt(StorageError(f"{self.name} is no longer owned here", ErrorCode.not_leader_or_follower))
            out.forget = True
            return out
        if self.buffered_bytes < self.settings.segment_bytes:
            # All of it (nearly every flush): one list handed over, no pops from the front.
            taken, self.buffer = self.buffer, []
            self.buffered_bytes = 0
            self.waiting_acks = 0
            self.buffered_markers = 0
        else:
            taken, size, limit = [], 0, self.settings.segment_bytes
            n = acks = markers = 0
            for b in self.buffer:
                if size >= limit:
                    break
                n += 1
                size += b.nbytes
                acks += 1 if b.waiters else 0
                markers += b.marker
            taken, self.buffer = self.buffer[:n], self.buffer[n:]
            self.buffered_bytes -= size
            self.waiting_acks -= acks
            self.buffered_markers -= markers
        self.buffer_since = now
        base = self.uploads[-1].end_offset if self.uploads else self.state.high_watermark
        end = self.buffer[0].base_offset if self.buffer else self.next_offset
        upload = Upload(taken, base, self.producers.open_at(end, self.closing_txns), end)
        self.in_flight = self.in_flight + taken
        self.uploads.append(upload)
        self.uploading = True
        return Outcome(upload=upload)

    def in_flight_upload(self, upload: Upload) -> bool:
        """Whether `upload` still waits for its outcome (False: a failure of an upload
        before it answered it already)."""
        for u in self.uploads:  # (by identity: an Upload compares equal by its fields)
            if u is upload:
                return True
        return False

    def commit_landed(self, latest: PartitionState | None, info: SegmentInfo) -> bool:
        """After an ambiguous failure: does `latest` (the metadata re-read) hold this very
        segment, committed by this log's epoch?"""
        return (
            latest is not None
            and latest.leader_epoch == self.state.leader_epoch
            and latest.high_watermark == info.last_offset + 1
            and any(s == info for s in latest.segments)  # this segment, not another writer's at its offset
        )

    def flush_committed(self, state: PartitionState) -> Outcome:
        """The oldest upload in flight is durable and committed as `state`: acknowledge
        its batches."""
        self.state = state
        self.producers.durable(state.high_watermark)
        if self.closing_txns:
            self.closing_txns = [t for t in self.closing_txns if t[2] >= state.high_watermark]
        n = len(self.uploads.pop(0).batches) if self.uploads else len(self.in_flight)
        if n == len(self.in_flight):  # the only upload in flight (nearly always): no slicing
            done, self.in_flight = self.in_flight, []
        else:
            done, self.in_flight = self.in_flight[:n], self.in_flight[n:]
        self.uploading = bool(self.uploads)
        if len(done) == 1:  # one batch a flush (a producer waiting on each): no comprehension
            return Outcome([Answer(done[0].waiters, None)], notify_readers=True)
        return Outcome([self._answer(done, None)], notify_readers=True)

    def flush_failed(self, error: BaseException, latest: PartitionState | None = None) -> Outcome:
        """The upload did not become durable: drop everything not durable (its offsets are
        handed out again) and reject it. `latest` is the metadata re-read after the failure,
        adopted when the failure was a concurrent change of the partition."""
        if isinstance(error, ConflictError) and latest is not None:
            self.state = latest
        code, what = self._flush_failure(error)
        dropped = self.in_flight + self.buffer  # the uploads after the failed one too
        self.in_flight, self.buffer, self.uploads = [], [], []
        self.uploading = False
        self.buffered_bytes = 0
        self.waiting_acks = 0
        self.buffered_markers = 0
        self.next_offset = self.state.high_watermark
        self.producers.roll_back(self.next_offset)  # a dropped marker's transaction is open again
        self.closing_txns = [t for t in self.closing_txns if t[2] < self.next_offset]
        return Outcome([self._answer(dropped, StorageError(what, code))], forget=code == ErrorCode.not_leader_or_follower, rejected_batches=len(dropped))

    def _flush_failure(self, error: BaseException) -> tuple[ErrorCode, str]:
        if isinstance(error, ConflictError):
            return ErrorCode.not_leader_or_follower, "partition state changed under us (fenced)"
        if isinstance(error, ObjectExistsError):
            # Another writer's segment holds this base offset. Forgetting the log makes the
            # next produce re-read ownership and the partition state (recovery adopts that
            # segment if nobody committed it): clients retry on the owner's new offsets.
            return ErrorCode.not_leader_or_follower, f"lost the race for segment {self.state.high_watermark} to another writer"
        return ErrorCode.kafka_storage_error, f"flush failed: {error}"

    # -- stopping -------------------------------------------------------------------------
    # Who gets what when a log stops:
    #   buffered batches         -> the stop reason (this log never uploads them);
    #   the upload in flight     -> its outcome: acknowledged if it committed, else the reason;
    #   retried duplicates       -> with the batch they wait on (they share its waiters);
    #   long-poll fetches        -> woken; their next look finds the log gone.
    # Reasons: UNKNOWN_TOPIC_OR_PARTITION for a deleted topic, NOT_LEADER_OR_FOLLOWER for lost
    # ownership and for whatever a shutdown or hand-over could not flush (both retriable).

    def begin_stop(self, reason: StorageError, flush: bool) -> bool:
        """Start stopping for `reason`. True: the driver flushes what is buffered first
        (shutdown, graceful hand-over); appends are refused from now on either way once
        halt() runs, and from now on already when flushing."""
        if self.stopped_by is None:
            self.stopped_by = reason
        if flush and not self.closed:
            self.closed = True  # new appends go elsewhere while the last flush runs
            return True
        return False

    def halt(self, reason: StorageError) -> Outcome:
        """Stop now: no more appends, every buffered batch rejected with the stop reason; an
        upload in flight is answered by its own outcome when it ends."""
        if self.stopped_by is None:
            self.stopped_by = reason
        self.closed = True
        dropped, self.buffer = self.buffer, []
        if not self.uploading:
            # No upload runs: batches still marked in flight were left by a flush that
            # failed unexpectedly (a bug), and nothing else would ever answer them.
            dropped, self.in_flight, self.uploads = self.in_flight + dropped, [], []
        self.buffered_bytes = 0
        self.waiting_acks = 0
        self.buffered_markers = 0
        return Outcome([self._answer(dropped, reason)], notify_readers=True)

    def refusal(self) -> StorageError:
        """The error for a request reaching this log after it stopped."""
        reason = self.stopped_by
        code = reason.error_code if reason is not None else ErrorCode.not_leader_or_follower
        return StorageError(f"{self.name} is not served here: {reason or 'stopped'}", code)

    def _answer(self, batches: list[BufferedBatch], error: StorageError | None) -> Answer:
        """The one place that decides what waiting producers get: None acknowledges; an error
        rejects, and once the log is stopping its stop reason wins."""
        if error is not None and self.stopped_by is not None:
            error = self.stopped_by
        return Answer([w for b in batches for w in b.waiters], error)
