"""One share partition (a share group's view of one topic partition): the pure state
machine behind ShareFetch and ShareAcknowledge. No I/O and no clock of its own: the driver
(`manager.py`) passes `now` (ms) and the batches it read from the log, persists `to_doc()`
before it answers an acknowledgement, and calls `expire()` at `next_deadline()`.

Apache Kafka's SharePartition is the reference:

- The share-partition start offset (SPSO) is the first offset not yet done with; `end`
  (Kafka's SPEO + 1) the first offset never acquired. Every offset in [SPSO, end) is in
  flight: AVAILABLE (to be delivered again), ACQUIRED (by one member, until a lock
  deadline), ACKNOWLEDGED or ARCHIVED. Offsets in that window that are not in `records`
  are gaps (no record there: compacted away, or control and aborted batches) and count as
  ARCHIVED. Once the records at the SPSO are done it moves past them.
- Acquiring a record counts one delivery. A release (or a lock that times out) makes it
  AVAILABLE again, unless it has reached the delivery count limit: then it is ARCHIVED.
  REJECT archives at once, ACCEPT acknowledges, GAP archives an offset with no record.
- An acknowledgement names records the member holds: anything else (another member's, not
  acquired, already done) is INVALID_RECORD_STATE for the whole partition's acknowledgement,
  which then changes nothing. RENEW (Kafka 4.2, KIP-1222) restarts a held record's
  acquisition lock and changes nothing else: no state, no delivery count, nothing to persist.
- Acquisition takes whole stored batches until `max_records` are reached (Kafka's
  batch-optimized mode), or exactly `max_records` at most (record-limit mode, KIP-1206:
  the rest of a batch stays AVAILABLE in flight). In batch-optimized mode the acquired
  ranges are cut at stored batch boundaries every `batch_size` records, as Kafka answers.
- The number of records in flight is bounded (`max_in_flight`, Kafka's
  group.share.partition.max.record.locks): new records are acquired only below it.
- The log start moving past the SPSO (retention, DeleteRecords) moves the SPSO with it.
- What is persisted (`to_doc`): the SPSO, `end` and every in-flight record's state and
  delivery count, with ACQUIRED written as AVAILABLE: after a crash or a move to another
  broker, records acquired but not acknowledged are delivered again (at least once), and
  acknowledged or archived ones never.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from kafscale.errors import ErrorCode, KafkaError


class RecordState(IntEnum):
    # Kafka's values (RecordState in SharePartition, the persisted state of the share coordinator)
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # Kafka 4.2 (KIP-1222): ShareFetch and ShareAcknowledge v2 only


DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
_ACK_NAMES = {int(t): t.name.lower() for t in AckType}


@dataclass(slots=True)
class ShareCounters:
    """What share partitions did, summed over the ones that share this object (a broker's:
    /metrics reads them). Records, not requests."""

    acquired: int = 0  # acquisitions (each one delivery)
    redelivered: int = 0  # ... of records delivered before
    acknowledged: dict[str, int] = field(default_factory=lambda: {t.name.lower(): 0 for t in AckType})  # by type
    lock_timeouts: int = 0  # acquisition locks that ran out
    archived: dict[str, int] = field(default_factory=lambda: dict(rejected=0, delivery_limit=0, gap=0))  # by why
    released: dict[str, int] = field(default_factory=lambda: dict(session_closed=0, member_left=0))  # by why (the driver's)


@dataclass(slots=True)
class InFlight:
    state: RecordState
    delivery_count: int = 0
    member_id: str | None = None
    deadline: float = 0.0


@dataclass(frozen=True, slots=True)
class LogBatch:
    """What acquisition needs of a stored batch: its offsets and whether its records go to
    consumers (a control batch, or an aborted transaction's under read_committed, do not)."""

    base_offset: int
    last_offset: int
    deliverable: bool = True


@dataclass(frozen=True, slots=True)
class Acquired:
    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Ack:
    first_offset: int
    last_offset: int
    types: tuple[int, ...]  # one for the whole range, or one per offset


class SharePartition:
    def __init__(self, start_offset: int, delivery_count_limit: int = 5, max_in_flight: int = 2_000,
                 counters: ShareCounters | None = None):
        self.spso = start_offset
        self.end = start_offset
        self.records: dict[int, InFlight] = {}
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight
        self.counters = counters if counters is not None else ShareCounters()

    # -- views ------------------------------------------------------------------------------

    def next_fetch_offset(self) -> int:
        """Where the log should be read from: the first AVAILABLE record, else `end`."""
        available = [o for o, r in self.records.items() if r.state is RecordState.AVAILABLE]
        return min(available) if available else self.end

    def has_available(self, high_watermark: int) -> bool:
        """Would an acquisition now find something (records to redeliver, or new ones below
        `high_watermark` with room in flight)?"""
        if any(r.state is RecordState.AVAILABLE for r in self.records.values()):
            return True
        return self.end < high_watermark and self.end - self.spso < self.max_in_flight

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.records.values() if r.state is RecordState.ACQUIRED), default=None)

    def in_flight(self) -> int:
        return self.end - self.spso

    def acquired(self) -> int:
        """Records held by a consumer now."""
        return sum(1 for r in self.records.values() if r.state is RecordState.ACQUIRED)

    def counts(self) -> dict[str, int]:
        """Records in flight by state (gaps counted as archived)."""
        out = {s.name.lower(): 0 for s in RecordState}
        for r in self.records.values():
            out[r.state.name.lower()] += 1
        out["archived"] += self.end - self.spso - len(self.records)
        return out

    # -- acquisition --------------------------------------------------------------------------

    def acquire(self, member_id: str, now: float, lock_ms: int, batches: list[LogBatch], max_records: int,
                log_start: int | None = None, record_limit: bool = False, batch_size: int = 0) -> list[Acquired]:
        """Acquire for `member_id` what `batches` (read from `next_fetch_offset()`, in
        offset order) offer: AVAILABLE records again, new records past `end`. Whole batches
        at a time, stopping once `max_records` are acquired (Kafka's batch-optimized mode),
        or `record_limit`: never more than `max_records` (the rest of a batch stays in flight,
        AVAILABLE). `batch_size` (> 0, batch-optimized only): the acquired ranges are cut at
        stored batch boundaries every that many records."""
        if log_start is not None:
            self.move_start(log_start)
        got: list[int] = []
        deadline = now + lock_ms
        for batch in batches:
            if len(got) >= max_records:
                break
            if batch.last_offset < self.spso:
                continue
            for offset in range(max(batch.base_offset, self.spso), min(batch.last_offset + 1, self.end)):
                r = self.records.get(offset)
                if r is not None and r.state is RecordState.AVAILABLE:
                    if record_limit and len(got) >= max_records:
                        break
                    self._acquire_one(r, member_id, deadline)
                    got.append(offset)
            if batch.last_offset < self.end:
                continue
            self._advance()  # (gaps and undeliverable batches just passed are not in flight)
            if self.end - self.spso >= self.max_in_flight:
                break  # no new records beyond the in-flight limit
            start = max(batch.base_offset, self.end)
            if batch.deliverable:
                # (per record only what must be: this loop sees every record a share group reads)
                stop = batch.last_offset + 1
                if record_limit:
                    stop = min(stop, start + max(max_records - len(got), 0))
                records = self.records
                for offset in range(start, stop):
                    records[offset] = InFlight(RecordState.ACQUIRED, 1, member_id, deadline)
                got.extend(range(start, stop))
                self.counters.acquired += max(stop - start, 0)
                for offset in range(max(start, stop), batch.last_offset + 1):
                    records[offset] = InFlight(RecordState.AVAILABLE)
            # (gaps before the batch and an undeliverable batch stay out of `records`: archived)
            self.end = batch.last_offset + 1
        self._advance()
        cuts = {b.base_offset for b in batches} if batch_size > 0 and not record_limit else set()
        return self._ranges(got, cuts, batch_size)

    def _acquire_one(self, r: InFlight, member_id: str, deadline: float) -> None:
        r.state, r.member_id, r.deadline = RecordState.ACQUIRED, member_id, deadline
        r.delivery_count += 1
        self.counters.acquired += 1
        if r.delivery_count > 1:
            self.counters.redelivered += 1

    def _ranges(self, offsets: list[int], cuts: set[int] = frozenset(), batch_size: int = 0) -> list[Acquired]:
        """Contiguous offsets of one delivery count as ranges; a range of `batch_size` or more
        ends before the next offset in `cuts` (a stored batch's first offset)."""
        if not offsets:
            return []
        offsets.sort()  # (acquired in order: linear)
        records, out = self.records, []
        first = prev = offsets[0]
        count = records[first].delivery_count if first in records else 1
        for o in offsets[1:]:
            c = records[o].delivery_count if o in records else 1
            if o == prev + 1 and c == count and not (o in cuts and o - first >= batch_size):
                prev = o
                continue
            out.append(Acquired(first, prev, count))
            first = prev = o
            count = c
        out.append(Acquired(first, prev, count))
        return out

    # -- acknowledgement ------------------------------------------------------------------------

    def acknowledge(self, member_id: str, acks: list[Ack], now: float = 0.0, lock_ms: int = 0) -> bool:
        """Apply one partition's acknowledgements, all or nothing; INVALID_RECORD_STATE (or
        INVALID_REQUEST for a malformed batch) changes nothing. RENEW moves a held record's
        lock deadline to `now + lock_ms`. Whether anything to persist changed (RENEW alone: no)."""
        planned: list[tuple[InFlight, int]] = []
        records = self.records
        for ack in acks:
            first, types = ack.first_offset, ack.types
            n = ack.last_offset - first + 1
            if n <= 0 or not types or (len(types) != 1 and len(types) != n):
                raise KafkaError(ErrorCode.invalid_request,
                                 f"acknowledgement batch {first}-{ack.last_offset} is malformed")
            for kind in set(types):
                if kind not in _ACK_NAMES:
                    raise KafkaError(ErrorCode.invalid_request, f"unknown acknowledge type {kind}")
            for i in range(n):
                r = records.get(first + i)
                if r is None or r.state is not RecordState.ACQUIRED or r.member_id != member_id:
                    raise KafkaError(ErrorCode.invalid_record_state,
                                     f"offset {first + i} is not acquired by member {member_id}")
                planned.append((r, types[0] if len(types) == 1 else types[i]))
        changed = False
        by_type = dict.fromkeys(_ACK_NAMES, 0)
        for r, kind in planned:
            by_type[kind] += 1
            if kind == AckType.RENEW:
                r.deadline = now + lock_ms
                continue
            changed = True
            if kind == AckType.ACCEPT:
                r.state, r.member_id, r.deadline = RecordState.ACKNOWLEDGED, None, 0.0
            elif kind == AckType.RELEASE:
                self._release(r)
            else:  # REJECT, GAP
                self._finish(r, RecordState.ARCHIVED)
                self.counters.archived["rejected" if kind == AckType.REJECT else "gap"] += 1
        for kind, k in by_type.items():
            self.counters.acknowledged[_ACK_NAMES[kind]] += k
        self._advance()
        return changed

    def _finish(self, r: InFlight, state: RecordState) -> None:
        r.state, r.member_id, r.deadline = state, None, 0.0

    def _release(self, r: InFlight) -> None:
        if r.delivery_count >= self.delivery_count_limit:
            self._finish(r, RecordState.ARCHIVED)
            self.counters.archived["delivery_limit"] += 1
        else:
            self._finish(r, RecordState.AVAILABLE)

    def holders(self) -> set[str]:
        """The members holding acquired records."""
        return {r.member_id for r in self.records.values() if r.state is RecordState.ACQUIRED}

    def release_member(self, member_id: str) -> int:
        """Give back every record `member_id` holds (its share session closed, or it left the
        group), delivery counts kept; how many."""
        held = [r for r in self.records.values() if r.state is RecordState.ACQUIRED and r.member_id == member_id]
        for r in held:
            self._release(r)
        self._advance()
        return len(held)

    def expire(self, now: float) -> int:
        """Release the records whose acquisition lock has timed out; how many."""
        due = [r for r in self.records.values() if r.state is RecordState.ACQUIRED and r.deadline <= now]
        for r in due:
            self._release(r)
        self.counters.lock_timeouts += len(due)
        self._advance()
        return len(due)

    # -- the window -------------------------------------------------------------------------------

    def move_start(self, log_start: int) -> bool:
        """The log no longer has what is below `log_start`: neither does the share partition."""
        if log_start <= self.spso:
            return False
        for offset in [o for o in self.records if o < log_start]:
            del self.records[offset]
        self.spso = log_start
        self.end = max(self.end, log_start)
        self._advance()
        return True

    def reset(self, start_offset: int) -> None:
        """Start over at `start_offset` (an admin's AlterShareGroupOffsets; the group is empty)."""
        self.records.clear()
        self.spso = self.end = start_offset

    def _advance(self) -> None:
        while self.spso < self.end:
            r = self.records.get(self.spso)
            if r is None:  # a gap: jump to the next record in flight
                self.spso = min(self.records, default=self.end)
                continue
            if r.state not in DONE:
                break
            del self.records[self.spso]
            self.spso += 1

    # -- persistence ----------------------------------------------------------------------------

    def to_doc(self) -> dict:
        """SPSO, end and runs of [first, last, state, delivery count]; acquired records as
        AVAILABLE (what a new owner may deliver again), gaps left out (archived)."""
        runs: list[list[int]] = []
        for offset in sorted(self.records):
            r = self.records[offset]
            state = RecordState.AVAILABLE if r.state is RecordState.ACQUIRED else r.state
            if runs and runs[-1][1] == offset - 1 and runs[-1][2] == state and runs[-1][3] == r.delivery_count:
                runs[-1][1] = offset
            else:
                runs.append([offset, offset, int(state), r.delivery_count])
        return dict(start_offset=self.spso, end_offset=self.end, records=runs)

    @classmethod
    def from_doc(cls, doc: dict, delivery_count_limit: int = 5, max_in_flight: int = 2_000,
                 counters: ShareCounters | None = None) -> "SharePartition":
        sp = cls(doc["start_offset"], delivery_count_limit, max_in_flight, counters)
        sp.end = doc.get("end_offset", sp.spso)
        for first, last, state, count in doc.get("records", []):
            if state == RecordState.AVAILABLE and count >= delivery_count_limit:
                state = RecordState.ARCHIVED  # delivered as often as allowed before the crash
            for offset in range(first, last + 1):
                sp.records[offset] = InFlight(RecordState(state), count)
        sp._advance()
        return sp
