"""The transaction coordinator's state machine: Kafka's rules, without any I/O.

One `TransactionMetadata` per transactional id: producer id and epoch (and the previous
ones, for KIP-360 retries), timeout, state, the partitions and consumer groups of the
ongoing transaction, start and last-update times. Each request is a method that takes the
current time in milliseconds and returns a `Step`: the error to answer, and, when the
transaction changes, the new metadata (`Step.new`, a copy: the driver persists it BEFORE it
installs it and answers) and the markers to write once it is persisted (`Step.markers`).
The driver (`coordinator.py`) carries out the steps in order under the transactional id's
lock; nothing here touches a store, a socket or a clock.

States and transitions follow Apache Kafka's TransactionMetadata / TransactionCoordinator:

    Empty ----AddPartitions/AddOffsets----> Ongoing ----EndTxn----> PrepareCommit / PrepareAbort
    Ongoing --InitProducerId or timeout---> (PrepareEpochFence) --> PrepareAbort, epoch + 1
    PrepareCommit / PrepareAbort --markers written--> CompleteCommit / CompleteAbort
    Empty / Complete* --InitProducerId--> Empty (epoch + 1, or a new producer id at exhaustion)
    Empty / Complete* --transactional.id.expiration.ms without use--> Dead (key removed)

PrepareEpochFence is never persisted here either: Kafka holds it only as a pending state
on the way to PrepareAbort with the bumped epoch, which is what `fence` returns directly.

Transactions v2 (KIP-890 part 2, Kafka 4.0): a partition or group joins the transaction
implicitly (a partition leader's AddPartitionsToTxn for Produce v12+, the group
coordinator's add for TxnOffsetCommit v5+: `add_partitions(tv2=True)`), and EndTxn v5+
bumps the epoch at every end and answers it; an EndTxn retried with the epoch before the
bump is recognised, an abort with nothing added still ends (and bumps), and an exhausted
epoch moves the producer to a new producer id when the transaction completes.
`produce_error` / `txn_offset_commit_error` say what those requests answer when the
coordinator refuses.

Producer ids are allocated by the driver: a request that needs a new one (a new
transactional id, an exhausted epoch) returns `Step.needs_producer_id` and is called again
with `new_producer_id`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum

from kafscale.errors import ErrorCode

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue

DEFAULT_MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms
DEFAULT_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms


class TxnState(str, Enum):
    # The values are the names Kafka reports in DescribeTransactions / ListTransactions.
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


# Where no transaction is in progress: InitProducerId may bump the epoch, the id may expire.
IDLE = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
PREPARED = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
COMPLETE = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


def epoch_exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


def valid_timeout(timeout_ms: int, max_timeout_ms: int) -> bool:
    return 0 < timeout_ms <= max_timeout_ms


# Transactions v2 from which request versions (Kafka's AddPartitionsToTxnManager): Produce
# v12+ and TxnOffsetCommit v5+ add their partition (group) to the transaction themselves;
# from Produce v11 / TxnOffsetCommit v4 clients know TRANSACTION_ABORTABLE.
PRODUCE_ADDS_PARTITION_SINCE = 12
PRODUCE_TRANSACTION_ABORTABLE_SINCE = 11
TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE = 5
TXN_OFFSET_COMMIT_TRANSACTION_ABORTABLE_SINCE = 4
# The coordinator cannot answer now (moving, loading, unreachable, markers being written).
COORDINATOR_BUSY = frozenset({
    ErrorCode.concurrent_transactions, ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
    ErrorCode.coordinator_load_in_progress, ErrorCode.network_exception,
})


def produce_error(error: ErrorCode, produce_version: int) -> ErrorCode | None:
    """What a transactional Produce answers when the coordinator refused to verify (or, v12+,
    to add) its partition: None to append. As Kafka (AddPartitionsToTxnManager, then
    ReplicaManager): a fenced producer gets INVALID_PRODUCER_EPOCH; a partition not in the
    transaction TRANSACTION_ABORTABLE from v11 on, INVALID_TXN_STATE before; a busy or
    unreachable coordinator the retriable NOT_ENOUGH_REPLICAS (no metadata refresh)."""
    if error is ErrorCode.none:
        return None
    if error is ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if error is ErrorCode.transaction_abortable and produce_version < PRODUCE_TRANSACTION_ABORTABLE_SINCE:
        return ErrorCode.invalid_txn_state
    if error in COORDINATOR_BUSY:
        return ErrorCode.not_enough_replicas
    return error


def txn_offset_commit_error(error: ErrorCode, version: int) -> ErrorCode:
    """What TxnOffsetCommit answers when the transaction refused its offsets (the group not
    in the producer's transaction: TRANSACTION_ABORTABLE from v4 on, INVALID_TXN_STATE
    before, as Kafka's verification) or, v5+, refused to add its group: a fenced producer
    INVALID_PRODUCER_EPOCH (Kafka's verification answer), a busy or unreachable coordinator
    COORDINATOR_NOT_AVAILABLE, which every client retries (after finding the group's
    coordinator again)."""
    if error is ErrorCode.transaction_abortable and version < TXN_OFFSET_COMMIT_TRANSACTION_ABORTABLE_SINCE:
        return ErrorCode.invalid_txn_state
    if error is ErrorCode.producer_fenced and version >= TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE:
        return ErrorCode.invalid_producer_epoch
    if error in COORDINATOR_BUSY:
        return ErrorCode.coordinator_not_available
    return error


@dataclass(frozen=True)
class Markers:
    """Effect: write COMMIT/ABORT markers for this producer to these partitions (and settle
    the pending offsets of these groups), then complete the transaction."""

    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[tuple[str, int]]
    groups: frozenset[str]
    tv2: bool = False  # ended by a transactions v2 client (WriteTxnMarkers v2 transaction_version 2)


@dataclass
class Step:
    error: ErrorCode = ErrorCode.none
    new: "TransactionMetadata | None" = None  # persist, then install
    markers: Markers | None = None  # after the persist
    needs_producer_id: bool = False  # call again with a freshly allocated producer id
    # What the response carries (InitProducerId, EndTxn v5+): the producer id and epoch.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    partition_errors: dict | None = None  # verify-only AddPartitionsToTxn


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID  # transactions v2: the id to move to once complete
    timeout_ms: int = 60_000
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)  # consumer groups of AddOffsetsToTxn
    start_ms: int = -1
    last_update_ms: int = 0
    tv2: bool = False  # transactions v2 (KIP-890): implicitly added to, or ended with EndTxn v5+ (epoch bump per end)
    version: int = 0  # the store's version of this record when read or written (not persisted)

    # -- persistence -------------------------------------------------------------------------

    def to_doc(self) -> dict:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "last_producer_epoch": self.last_producer_epoch,
            "previous_producer_id": self.previous_producer_id,
            "next_producer_id": self.next_producer_id,
            "timeout_ms": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
            "start_ms": self.start_ms,
            "last_update_ms": self.last_update_ms,
            "tv2": self.tv2,
        }

    @classmethod
    def from_doc(cls, transactional_id: str, doc: dict, version: int = 0) -> "TransactionMetadata":
        return cls(
            transactional_id=transactional_id,
            producer_id=int(doc["producer_id"]),
            producer_epoch=int(doc["producer_epoch"]),
            last_producer_epoch=int(doc.get("last_producer_epoch", NO_PRODUCER_EPOCH)),
            previous_producer_id=int(doc.get("previous_producer_id", NO_PRODUCER_ID)),
            next_producer_id=int(doc.get("next_producer_id", NO_PRODUCER_ID)),
            timeout_ms=int(doc["timeout_ms"]),
            state=TxnState(doc["state"]),
            partitions={(str(t), int(p)) for t, p in doc.get("partitions", ())},
            groups=set(doc.get("groups", ())),
            start_ms=int(doc.get("start_ms", -1)),
            last_update_ms=int(doc.get("last_update_ms", 0)),
            tv2=bool(doc.get("tv2", False)),
            version=version,
        )

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: float) -> "TransactionMetadata":
        """A transactional id seen for the first time (epoch -1 until InitProducerId bumps it to 0)."""
        return cls(transactional_id, producer_id, timeout_ms=timeout_ms, last_update_ms=int(now_ms))

    def _copy(self, now_ms: float, **changes) -> "TransactionMetadata":
        out = copy.deepcopy(self)
        for k, v in changes.items():
            setattr(out, k, v)
        out.last_update_ms = int(now_ms)
        return out

    # -- InitProducerId ----------------------------------------------------------------------

    def init_producer_id(
        self,
        now_ms: float,
        timeout_ms: int,
        expected: tuple[int, int] | None = None,
        new_producer_id: int | None = None,
    ) -> Step:
        """InitProducerId with this transactional id. `expected`: the (producer id, epoch)
        the request carries (KIP-360), None when it sends (-1, -1). The caller has checked
        the timeout against transaction.max.timeout.ms."""
        if expected is not None and not self._valid_expected_producer(expected):
            return Step(ErrorCode.producer_fenced)
        state = self.state
        if state in PREPARED:
            return Step(ErrorCode.concurrent_transactions)  # the client backs off and retries
        if state is TxnState.ONGOING:
            # Abort the running transaction under a bumped epoch (fencing its producer); the
            # client gets CONCURRENT_TRANSACTIONS and retries, and that retry bumps again.
            step = self.fence(now_ms)
            step.error = ErrorCode.concurrent_transactions
            return step
        if state not in IDLE:  # Dead, PrepareEpochFence: never held in memory here
            return Step(ErrorCode.concurrent_transactions)
        if epoch_exhausted(self.producer_epoch) and (expected is None or expected[1] == self.producer_epoch):
            if new_producer_id is None:
                return Step(needs_producer_id=True)
            new = self._fresh(
                now_ms,
                timeout_ms,
                previous_producer_id=self.producer_id,
                producer_id=new_producer_id,
                producer_epoch=0,
                last_producer_epoch=self.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
            )
            return Step(new=new, producer_id=new.producer_id, producer_epoch=0)
        bumped = self.producer_epoch + 1
        if expected is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected[1] == self.last_producer_epoch:
            # A retry of a bump whose answer the producer never got: same epoch again.
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            return Step(ErrorCode.producer_fenced)
        new = self._fresh(now_ms, timeout_ms, producer_epoch=epoch, last_producer_epoch=last)
        return Step(new=new, producer_id=new.producer_id, producer_epoch=epoch)

    def _fresh(self, now_ms: float, timeout_ms: int, **producer) -> "TransactionMetadata":
        """A copy for a (re)initialised producer: Empty, no transaction, the new timeout."""
        return self._copy(
            now_ms, next_producer_id=NO_PRODUCER_ID, timeout_ms=timeout_ms, state=TxnState.EMPTY,
            partitions=set(), groups=set(), start_ms=-1, tv2=False, **producer,
        )

    def _valid_expected_producer(self, expected: tuple[int, int]) -> bool:
        pid, epoch = expected
        return (
            self.producer_epoch == NO_PRODUCER_EPOCH
            or pid == self.producer_id
            or (pid == self.previous_producer_id and epoch_exhausted(epoch))
        )

    # -- fencing and timeouts ----------------------------------------------------------------

    def fence(self, now_ms: float) -> Step:
        """Abort the ongoing transaction under a bumped epoch (Kafka's PrepareEpochFence then
        PrepareAbort): the producer that ran it is fenced from then on."""
        assert self.state is TxnState.ONGOING, self.state
        epoch = self.producer_epoch if self.producer_epoch >= MAX_EPOCH else self.producer_epoch + 1
        new = self._copy(now_ms, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH,
                         state=TxnState.PREPARE_ABORT)
        return Step(new=new, markers=new._markers(commit=False))

    def timed_out(self, now_ms: float) -> bool:
        return self.state is TxnState.ONGOING and self.start_ms + self.timeout_ms < now_ms

    def abort_if_timed_out(self, now_ms: float) -> Step | None:
        """transaction.timeout.ms: an Ongoing transaction past its timeout is aborted and its
        producer fenced (as Kafka's coordinator does); None when nothing is due."""
        return self.fence(now_ms) if self.timed_out(now_ms) else None

    def expired(self, now_ms: float, expiration_ms: int) -> bool:
        """transactional.id.expiration.ms: an id with no transaction in progress and no use
        for that long is removed (Kafka writes a tombstone; the driver deletes the key)."""
        return self.state in IDLE and self.last_update_ms <= now_ms - expiration_ms

    # -- AddPartitionsToTxn / AddOffsetsToTxn -----------------------------------------------

    def _check_producer(self, producer_id: int, producer_epoch: int) -> ErrorCode:
        if self.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if self.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        return ErrorCode.none

    def add_partitions(
        self,
        now_ms: float,
        producer_id: int,
        producer_epoch: int,
        partitions: set[tuple[str, int]] = frozenset(),
        groups: set[str] = frozenset(),
        tv2: bool = False,
    ) -> Step:
        """AddPartitionsToTxn / AddOffsetsToTxn, and (`tv2`) the implicit adds of
        transactions v2: a partition leader's AddPartitionsToTxn v4+ that is not verify-only
        (Produce v12+) and a group coordinator's add of a TxnOffsetCommit v5+'s group. An
        idle id (Empty, Complete*) starts a new transaction."""
        error = self._check_producer(producer_id, producer_epoch)
        if error is not ErrorCode.none:
            return Step(error)
        if self.state in PREPARED or self.state not in IDLE | {TxnState.ONGOING}:
            return Step(ErrorCode.concurrent_transactions)
        if self.state is TxnState.ONGOING and set(partitions) <= self.partitions and set(groups) <= self.groups:
            return Step()  # nothing new: answer at once
        start = int(now_ms) if self.state in IDLE else self.start_ms
        new = self._copy(
            now_ms,
            state=TxnState.ONGOING,
            partitions=self.partitions | set(partitions),
            groups=self.groups | set(groups),
            start_ms=start,
            tv2=tv2 or (self.tv2 and self.state is TxnState.ONGOING),
        )
        return Step(new=new)

    def verify_partitions(self, producer_id: int, producer_epoch: int, partitions) -> Step:
        """AddPartitionsToTxn v4+ verify-only: are these partitions in the transaction?"""
        error = self._check_producer(producer_id, producer_epoch)
        if error is ErrorCode.none and self.state in PREPARED:
            error = ErrorCode.concurrent_transactions
        if error is not ErrorCode.none:
            return Step(error, partition_errors={tp: error for tp in partitions})
        return Step(partition_errors={
            tp: ErrorCode.none if tp in self.partitions else ErrorCode.transaction_abortable for tp in partitions
        })

    # -- EndTxn ------------------------------------------------------------------------------

    def end_txn(
        self,
        now_ms: float,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        tv2: bool = False,
        new_producer_id: int | None = None,
    ) -> Step:
        """EndTxn from the client. `tv2`: EndTxn v5+ (KIP-890), where every end bumps the epoch."""
        state = self.state
        # Which rules: the request's for a transaction in progress (or none yet); for a
        # prepared or completed one also how that one was ended (a retry of a v2 end).
        use_tv2 = tv2 if state in (TxnState.ONGOING, TxnState.EMPTY) else (tv2 or self.tv2)
        if not use_tv2:
            return self._end_txn_v1(now_ms, producer_id, producer_epoch, commit)
        # A retry of an end whose answer (the bumped epoch) the client did not get. Not after
        # a fence (InitProducerId, timeout): that bump leaves no last epoch, the old one is fenced.
        retry_on_bump = (
            state in PREPARED | COMPLETE
            and self.last_producer_epoch == producer_epoch
            and self.producer_epoch == producer_epoch + 1
        )
        # ... of an end that overflowed the epoch and moved the producer to a new id.
        retry_on_overflow = (
            state in COMPLETE
            and self.previous_producer_id == producer_id
            and producer_epoch == MAX_EPOCH - 1
            and self.producer_epoch == 0
        )
        retry = retry_on_bump or retry_on_overflow
        if self.producer_id != producer_id and not retry_on_overflow:
            return Step(ErrorCode.invalid_producer_id_mapping)
        same_epoch = producer_epoch == self.producer_epoch
        if state in PREPARED and same_epoch:
            # The bumped epoch's next end while the markers of the last are being written.
            return Step(ErrorCode.concurrent_transactions)
        if not (retry or same_epoch) or (state in PREPARED and not retry):
            return Step(ErrorCode.producer_fenced)
        prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if state is TxnState.ONGOING:
            return self._prepare_end(now_ms, commit, new_producer_id)
        if state in PREPARED:  # a retry
            return Step(ErrorCode.concurrent_transactions if state is prepare else ErrorCode.invalid_txn_state)
        if retry:  # Complete*: the end it retries is done; answer what it answered
            if state is wanted:
                return Step(producer_id=self.producer_id, producer_epoch=self.producer_epoch)
            return Step(ErrorCode.invalid_txn_state)
        if not commit and state in IDLE:
            # Kafka 4.0: an abort with no partition added (Empty, Complete*) still ends a
            # transaction: PrepareAbort without markers, the epoch bumped.
            return self._prepare_end(now_ms, False, new_producer_id, start=True)
        return Step(ErrorCode.invalid_txn_state)

    def _prepare_end(self, now_ms: float, commit: bool, new_producer_id: int | None, start: bool = False) -> Step:
        """Transactions v2: PrepareCommit / PrepareAbort under the bumped epoch (a new
        producer id to move to at completion when the epoch is exhausted)."""
        next_pid = NO_PRODUCER_ID
        if epoch_exhausted(self.producer_epoch):
            if new_producer_id is None:
                return Step(needs_producer_id=True)
            next_pid = new_producer_id
        new = self._copy(
            now_ms,
            state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            producer_epoch=self.producer_epoch + 1,
            last_producer_epoch=self.producer_epoch,
            next_producer_id=next_pid,
            tv2=True,
            **({"start_ms": int(now_ms), "partitions": set(), "groups": set()} if start else {}),
        )
        pid, ep = (next_pid, 0) if next_pid != NO_PRODUCER_ID else (new.producer_id, new.producer_epoch)
        return Step(new=new, markers=new._markers(commit), producer_id=pid, producer_epoch=ep)

    def _end_txn_v1(self, now_ms: float, producer_id: int, producer_epoch: int, commit: bool) -> Step:
        """EndTxn v0-v4 (transactions v0/v1): the epoch stays; a retry has the same epoch."""
        if self.producer_id != producer_id:
            return Step(ErrorCode.invalid_producer_id_mapping)
        if producer_epoch != self.producer_epoch:
            return Step(ErrorCode.producer_fenced)
        state = self.state
        wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if state is TxnState.ONGOING:
            new = self._copy(
                now_ms,
                state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
                next_producer_id=NO_PRODUCER_ID,
                tv2=False,
            )
            return Step(new=new, markers=new._markers(commit), producer_id=new.producer_id, producer_epoch=new.producer_epoch)
        if state is wanted:
            return Step(producer_id=self.producer_id, producer_epoch=self.producer_epoch)  # a retry: done
        if state is (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
            return Step(ErrorCode.concurrent_transactions)
        return Step(ErrorCode.invalid_txn_state)

    def _markers(self, commit: bool) -> Markers:
        return Markers(self.producer_id, self.producer_epoch, commit, frozenset(self.partitions), frozenset(self.groups), self.tv2)

    def markers_to_resend(self) -> Markers | None:
        """After a coordinator move or restart: the markers a prepared transaction still owes."""
        if self.state not in PREPARED:
            return None
        return self._markers(self.state is TxnState.PREPARE_COMMIT)

    def complete(self, now_ms: float) -> Step:
        """Every marker is written: PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort.
        (The driver moves a commit's pending offsets in the same store transaction.)"""
        assert self.state in PREPARED, self.state
        changes = {}
        if self.tv2 and self.next_producer_id != NO_PRODUCER_ID:
            # The epoch overflowed at this end: the producer continues under the new id.
            changes = dict(previous_producer_id=self.producer_id, producer_id=self.next_producer_id,
                           producer_epoch=0, last_producer_epoch=self.producer_epoch)
        new = self._copy(
            now_ms,
            state=TxnState.COMPLETE_COMMIT if self.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT,
            partitions=set(),
            groups=set(),
            next_producer_id=NO_PRODUCER_ID,
            **changes,
        )
        return Step(new=new)

    # -- admin -------------------------------------------------------------------------------

    def describe(self) -> dict:
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(self.partitions):
            by_topic.setdefault(t, []).append(p)
        return dict(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_state=self.state.value,
            transaction_timeout_ms=self.timeout_ms,
            transaction_start_time_ms=self.start_ms,
            topics=by_topic,
        )
