"""Idempotent-producer state of one partition: Kafka's per-producer sequence checks.

For each producer id the table keeps its epoch and the last few appended batches
(first/last sequence, base offset). A retried batch that matches one of them is a
duplicate and is answered with its original offset; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER;
an older epoch is INVALID_PRODUCER_EPOCH; a producer the partition has never seen (or has
forgotten after expiry) starting mid-sequence is UNKNOWN_PRODUCER_ID, so the client resets.
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


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

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
            entry = ProducerEntry(h.producer_id, h.producer_epoch)
            self.producers[h.producer_id] = entry
        entry.batches.append(BatchRecord(h.base_sequence, _last_seq(h), base_offset, base_offset + h.last_offset_delta))
        entry.last_timestamp_ms = now_ms
        while len(entry.batches) > BATCHES_KEPT and entry.batches[0].base_offset < durable_below:
            entry.batches.pop(0)

    def roll_back(self, first_dropped_offset: int) -> None:
        """Forget batches at or beyond an offset whose flush failed."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            while entry.batches and entry.batches[-1].base_offset >= first_dropped_offset:
                entry.batches.pop()
            if not entry.batches:
                del self.producers[pid]

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        doomed = [pid for pid, e in self.producers.items() if e.last_timestamp_ms < now_ms - expiration_ms]
        for pid in doomed:
            del self.producers[pid]
        return len(doomed)
