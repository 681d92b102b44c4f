"""Idempotent-producer state of one partition: Kafka's per-producer sequence checks.

For each producer id the table keeps its epoch and the last few appended batches
(first/last sequence, base offset). A retried batch that matches one of them is a
duplicate and is answered with its original offset; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER;
an older epoch is INVALID_PRODUCER_EPOCH; a producer the partition has never seen (or has
forgotten after expiry) starting mid-sequence is UNKNOWN_PRODUCER_ID, so the client resets.

Transactions: a producer's first transactional batch opens its transaction on the partition
(`open_txns`: producer id -> first offset); an end-transaction marker closes it. A
non-transactional batch while one is open is INVALID_TXN_STATE; a marker with an older
producer epoch INVALID_PRODUCER_EPOCH, with an older coordinator epoch
TRANSACTION_COORDINATOR_FENCED (as Kafka's ProducerAppendInfo). Changes at offsets not yet
durable are journaled, so `roll_back` after a failed flush restores exactly the state of
the durable log (an open transaction a dropped marker had closed is open again).
Pure logic, no I/O: the partition log feeds it batch headers and offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.errors import ErrorCode
from kafscale.protocol.records import BatchHeader, InvalidRecordError

BATCHES_KEPT = 5  # Kafka keeps the last five batches per producer (max.in.flight <= 5)
INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class BatchRecord:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    last_timestamp_ms: int = -1
    batches: list[BatchRecord] = field(default_factory=list)
    txn_first_offset: int = -1  # first offset of the open transaction here (-1: none)
    coordinator_epoch: int = -1  # of the last marker seen

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


def _last_seq(h: BatchHeader) -> int:
    return (h.base_sequence + h.last_offset_delta) % (INT32_MAX + 1)


def _check_follows(before: BatchHeader, h: BatchHeader) -> None:
    """`h` comes right after the new batch `before` of the same producer in one record set."""
    if h.producer_epoch < before.producer_epoch:
        raise InvalidRecordError(
            f"producer {h.producer_id} epoch {h.producer_epoch} follows its own epoch {before.producer_epoch}", ErrorCode.invalid_producer_epoch
        )
    expected = 0 if h.producer_epoch > before.producer_epoch else _next_seq(_last_seq(before))
    if h.base_sequence != expected:
        raise InvalidRecordError(
            f"producer {h.producer_id} sent sequence {h.base_sequence}, expected {expected}", ErrorCode.out_of_order_sequence_number
        )


@dataclass(frozen=True, slots=True)
class _Undo:
    """How to restore one producer's entry as it was before a change at `offset`."""

    offset: int
    producer_id: int
    entry: ProducerEntry | None  # the entry object before (None: there was none)
    txn_first_offset: int
    coordinator_epoch: int


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.open_txns: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._journal: list[_Undo] = []  # changes at offsets not yet durable, oldest first

    def _journal_change(self, pid: int, offset: int, durable_below: int) -> None:
        if offset >= durable_below:
            e = self.producers.get(pid)
            self._journal.append(_Undo(offset, pid, e, e.txn_first_offset if e else -1, e.coordinator_epoch if e else -1))

    def _set_txn(self, entry: ProducerEntry, first_offset: int) -> None:
        entry.txn_first_offset = first_offset
        if first_offset >= 0:
            self.open_txns[entry.producer_id] = first_offset
        else:
            self.open_txns.pop(entry.producer_id, None)

    def open_at(self, end: int, closing: list[tuple[int, int, int]] = ()) -> tuple[tuple[int, int, int], ...]:
        """(producer id, epoch, first offset) of the transactions open at offset `end`: those
        open now that began before it, and those `closing` (producer id, first, marker
        offset) by a marker at or after it."""
        if not self.open_txns and not closing:
            return ()
        out = [(pid, self.producers[pid].epoch, first) for pid, first in self.open_txns.items() if first < end]
        out += [(pid, self.producers[pid].epoch if pid in self.producers else -1, first) for pid, first, marker in closing if first < end <= marker]
        return tuple(sorted(out, key=lambda t: (t[2], t[0])))

    def seed_open(self, producer_id: int, epoch: int, first_offset: int) -> None:
        """A transaction known open from the metadata (SegmentInfo.open_txns) before the
        replayed tail of the log."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, epoch)
        self._set_txn(entry, first_offset)

    def last_batch_offsets(self) -> dict[int, int]:
        """Producer id -> last offset of its last batch here, for every producer known (the
        batches the compactor keeps, emptied if need be, as Kafka's cleaner does)."""
        return {pid: e.batches[-1].last_offset for pid, e in self.producers.items() if e.batches}

    def first_unstable_offset(self) -> int | None:
        """The smallest first offset of the open transactions (None: none open)."""
        return min(self.open_txns.values()) if self.open_txns else None

    def check(self, h: BatchHeader) -> BatchRecord | None:
        """Validate one idempotent batch. Returns the original batch if this one is a
        duplicate, None if it may be appended; raises InvalidRecordError otherwise."""
        entry = self.producers.get(h.producer_id)
        if entry is None:
            if h.base_sequence != 0:
                raise InvalidRecordError(
                    f"producer {h.producer_id} is unknown here and starts at sequence {h.base_sequence}", ErrorCode.unknown_producer_id
                )
            return None
        if h.producer_epoch < entry.epoch:
            raise InvalidRecordError(
                f"producer {h.producer_id} epoch {h.producer_epoch} is older than the current epoch {entry.epoch}", ErrorCode.invalid_producer_epoch
            )
        if entry.txn_first_offset >= 0 and not h.is_transactional:
            raise InvalidRecordError(
                f"producer {h.producer_id} sent a non-transactional batch while its transaction from offset {entry.txn_first_offset} is open",
                ErrorCode.invalid_txn_state,
            )
        if h.producer_epoch > entry.epoch:
            if h.base_sequence != 0:
                raise InvalidRecordError(
                    f"producer {h.producer_id} new epoch {h.producer_epoch} must start at sequence 0, not {h.base_sequence}",
                    ErrorCode.out_of_order_sequence_number,
                )
            return None
        last = _last_seq(h)
        for b in entry.batches:
            if b.first_seq == h.base_sequence and b.last_seq == last:
                return b
        if entry.batches and h.base_sequence != _next_seq(entry.last_seq):
            raise InvalidRecordError(
                f"producer {h.producer_id} sent sequence {h.base_sequence}, expected {_next_seq(entry.last_seq)}", ErrorCode.out_of_order_sequence_number
            )
        return None

    def check_record_set(self, headers: list[BatchHeader]) -> BatchRecord | None:
        """Validate the batches of one record set, each idempotent batch against the
        producer's batch before it (in this set or retained here). Returns the original of
        the first batch when every batch is a retry of a retained one (the set was appended
        before), None when the set may be appended; raises InvalidRecordError otherwise.
        A set that mixes retried and new batches is refused: answering it as a duplicate
        would drop the new ones without a word."""
        if len(headers) == 1 and headers[0].producer_id < 0:
            return None  # one batch of a producer without idempotence: nothing to check (#33)
        previous: dict[int, BatchHeader] = {}  # producer id -> its new batch just before, in this set
        duplicates: list[BatchRecord] = []
        new_batches = 0
        for h in headers:
            if h.producer_id < 0:
                new_batches += 1
                continue
            before = previous.get(h.producer_id)
            if before is None:
                original = self.check(h)
            else:
                _check_follows(before, h)
                original = None
            if original is None:
                new_batches += 1
                previous[h.producer_id] = h
            else:
                duplicates.append(original)
        if duplicates and new_batches:
            raise InvalidRecordError(
                f"record set mixes {len(duplicates)} retried batches with {new_batches} new ones", ErrorCode.out_of_order_sequence_number
            )
        return duplicates[0] if duplicates else None

    def record(self, h: BatchHeader, base_offset: int, now_ms: int, durable_below: int) -> None:
        """Remember an appended batch. Records of batches not yet durable (offset >=
        `durable_below`) are never trimmed, so a failed flush can be rolled back."""
        entry = self.producers.get(h.producer_id)
        if entry is None or h.producer_epoch != entry.epoch:
            self._journal_change(h.producer_id, base_offset, durable_below)
            new = ProducerEntry(h.producer_id, h.producer_epoch)
            if entry is not None:  # a new epoch keeps the open transaction and the coordinator epoch
                new.txn_first_offset, new.coordinator_epoch = entry.txn_first_offset, entry.coordinator_epoch
            entry = self.producers[h.producer_id] = new
        # An emptied batch (compaction keeps a producer's last one, records removed) is
        # below the last stable offset, so its transaction is decided (its marker may be
        # gone by now): it carries the sequences, and opens no transaction.
        if h.is_transactional and h.record_count > 0 and entry.txn_first_offset < 0:
            self._journal_change(h.producer_id, base_offset, durable_below)
            self._set_txn(entry, base_offset)
        entry.batches.append(BatchRecord(h.base_sequence, _last_seq(h), base_offset, base_offset + h.last_offset_delta))
        entry.last_timestamp_ms = now_ms
        while len(entry.batches) > BATCHES_KEPT and entry.batches[0].base_offset < durable_below:
            entry.batches.pop(0)

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """May an end-transaction marker of this producer be appended? Raises InvalidRecordError."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidRecordError(
                f"marker for producer {producer_id} has epoch {producer_epoch}, older than the current epoch {entry.epoch}", ErrorCode.invalid_producer_epoch
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise InvalidRecordError(
                f"marker for producer {producer_id} has coordinator epoch {coordinator_epoch}, older than {entry.coordinator_epoch} (zombie coordinator)",
                ErrorCode.transaction_coordinator_fenced,
            )

    def end_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, offset: int, now_ms: int, durable_below: int) -> int | None:
        """An end-transaction marker appended at `offset` (checked with check_marker first):
        closes the producer's open transaction here and returns its first offset (None: no
        transaction was open, the marker ends nothing). The marker's epoch becomes the
        producer's (a higher one starts a new sequence)."""
        entry = self.producers.get(producer_id)
        self._journal_change(producer_id, offset, durable_below)
        if entry is None or producer_epoch != entry.epoch:
            new = ProducerEntry(producer_id, producer_epoch)
            if entry is not None:
                new.txn_first_offset = entry.txn_first_offset
            entry = self.producers[producer_id] = new
        first = entry.txn_first_offset
        self._set_txn(entry, -1)
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp_ms = now_ms
        return first if first >= 0 else None

    def durable(self, high_watermark: int) -> None:
        """Everything below `high_watermark` is durable: its changes can no longer be rolled back."""
        j = self._journal
        n = 0
        while n < len(j) and j[n].offset < high_watermark:
            n += 1
        if n:
            del j[:n]

    def roll_back(self, first_dropped_offset: int) -> None:
        """Forget what happened at or beyond an offset whose flush failed."""
        while self._journal and self._journal[-1].offset >= first_dropped_offset:
            undo = self._journal.pop()
            entry = undo.entry
            if entry is None:
                self.producers.pop(undo.producer_id, None)
                self.open_txns.pop(undo.producer_id, None)
                continue
            self.producers[undo.producer_id] = entry
            entry.coordinator_epoch = undo.coordinator_epoch
            self._set_txn(entry, undo.txn_first_offset)
        for pid in list(self.producers):
            entry = self.producers[pid]
            while entry.batches and entry.batches[-1].base_offset >= first_dropped_offset:
                entry.batches.pop()
            if not entry.batches and entry.txn_first_offset < 0 and entry.coordinator_epoch < 0:
                del self.producers[pid]

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle past `expiration_ms`, except those with an open transaction
        (the coordinator's timeout ends it with a marker)."""
        doomed = [pid for pid, e in self.producers.items() if e.last_timestamp_ms < now_ms - expiration_ms and e.txn_first_offset < 0]
        for pid in doomed:
            del self.producers[pid]
        return len(doomed)
