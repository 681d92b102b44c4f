"""The transaction state machine (kafscale.transactions.state) with a fake clock: Kafka's
transitions, fencing, KIP-360, timeouts, expiration, transactions v2 epoch bumps."""

from __future__ import annotations

from kafscale.errors import ErrorCode
from kafscale.transactions.state import (
    MAX_EPOCH,
    TransactionMetadata,
    TxnState,
    produce_error,
    txn_offset_commit_error,
    valid_timeout,
)

T0 = 1_000_000.0


def initialized(pid: int = 7, timeout_ms: int = 10_000, now: float = T0) -> TransactionMetadata:
    meta = TransactionMetadata.new("tx", pid, timeout_ms, now)
    step = meta.init_producer_id(now, timeout_ms)
    assert step.error is ErrorCode.none and step.new is not None
    assert (step.producer_id, step.producer_epoch) == (pid, 0)
    return step.new


def ongoing(meta: TransactionMetadata, now: float = T0, parts=(("t", 0), ("t", 1))) -> TransactionMetadata:
    step = meta.add_partitions(now, meta.producer_id, meta.producer_epoch, set(parts))
    assert step.error is ErrorCode.none and step.new.state is TxnState.ONGOING
    return step.new


def test_new_id_gets_epoch_0_then_bumps_per_init():
    meta = initialized()
    assert meta.state is TxnState.EMPTY and meta.producer_epoch == 0
    step = meta.init_producer_id(T0 + 1, 10_000)
    assert step.new.producer_epoch == 1 and step.new.producer_id == 7 and step.new.last_producer_epoch == -1


def test_timeout_bounds():
    assert valid_timeout(900_000, 900_000)
    assert not valid_timeout(900_001, 900_000)
    assert not valid_timeout(0, 900_000)


def test_add_partitions_starts_transaction_and_is_idempotent():
    meta = ongoing(initialized(), now=T0 + 5)
    assert meta.start_ms == T0 + 5 and meta.partitions == {("t", 0), ("t", 1)}
    again = meta.add_partitions(T0 + 6, 7, 0, {("t", 0)})
    assert again.error is ErrorCode.none and again.new is None
    more = meta.add_partitions(T0 + 7, 7, 0, {("u", 0)}, {"g"})
    assert more.new.partitions == {("t", 0), ("t", 1), ("u", 0)} and more.new.groups == {"g"}
    assert more.new.start_ms == T0 + 5  # the transaction's start does not move


def test_add_partitions_checks_producer():
    meta = initialized()
    assert meta.add_partitions(T0, 8, 0, {("t", 0)}).error is ErrorCode.invalid_producer_id_mapping
    assert meta.add_partitions(T0, 7, 1, {("t", 0)}).error is ErrorCode.producer_fenced


def test_commit_prepares_with_markers_then_completes():
    meta = ongoing(initialized())
    step = meta.end_txn(T0 + 10, 7, 0, commit=True)
    assert step.error is ErrorCode.none and step.new.state is TxnState.PREPARE_COMMIT
    m = step.markers
    assert m.commit and m.producer_id == 7 and m.producer_epoch == 0 and m.partitions == {("t", 0), ("t", 1)}
    prepared = step.new
    assert prepared.markers_to_resend() == m
    # While markers are being written: a retry waits, the opposite is refused, no new txn.
    assert prepared.end_txn(T0 + 11, 7, 0, commit=True).error is ErrorCode.concurrent_transactions
    assert prepared.end_txn(T0 + 11, 7, 0, commit=False).error is ErrorCode.invalid_txn_state
    assert prepared.add_partitions(T0 + 11, 7, 0, {("t", 2)}).error is ErrorCode.concurrent_transactions
    assert prepared.init_producer_id(T0 + 11, 10_000).error is ErrorCode.concurrent_transactions
    done = prepared.complete(T0 + 12).new
    assert done.state is TxnState.COMPLETE_COMMIT and not done.partitions and done.producer_epoch == 0
    # A retried commit after completion succeeds; an abort now is refused.
    assert done.end_txn(T0 + 13, 7, 0, commit=True).error is ErrorCode.none
    assert done.end_txn(T0 + 13, 7, 0, commit=False).error is ErrorCode.invalid_txn_state
    # The next transaction starts from CompleteCommit.
    nxt = ongoing(done, now=T0 + 20)
    assert nxt.start_ms == T0 + 20


def test_end_txn_without_transaction_is_invalid_txn_state():
    meta = initialized()
    assert meta.end_txn(T0, 7, 0, commit=True).error is ErrorCode.invalid_txn_state
    assert meta.end_txn(T0, 7, 0, commit=False).error is ErrorCode.invalid_txn_state


def test_end_txn_wrong_producer():
    meta = ongoing(initialized())
    assert meta.end_txn(T0, 99, 0, commit=True).error is ErrorCode.invalid_producer_id_mapping
    assert meta.end_txn(T0, 7, 3, commit=True).error is ErrorCode.producer_fenced


def test_init_during_ongoing_fences_and_aborts():
    meta = ongoing(initialized())
    step = meta.init_producer_id(T0 + 1, 10_000)
    assert step.error is ErrorCode.concurrent_transactions
    assert step.new.state is TxnState.PREPARE_ABORT and step.new.producer_epoch == 1
    assert step.markers is not None and not step.markers.commit and step.markers.producer_epoch == 1
    # The zombie (epoch 0) can no longer end or extend its transaction.
    fenced = step.new
    assert fenced.end_txn(T0 + 2, 7, 0, commit=True).error is ErrorCode.producer_fenced
    aborted = fenced.complete(T0 + 3).new
    assert aborted.state is TxnState.COMPLETE_ABORT
    assert aborted.add_partitions(T0 + 4, 7, 0, {("t", 0)}).error is ErrorCode.producer_fenced
    # The new producer's retry gets epoch 2.
    retry = aborted.init_producer_id(T0 + 4, 10_000)
    assert retry.error is ErrorCode.none and retry.new.producer_epoch == 2


def test_timeout_aborts_and_fences():
    meta = ongoing(initialized(timeout_ms=1000), now=T0)
    assert meta.abort_if_timed_out(T0 + 1000) is None
    step = meta.abort_if_timed_out(T0 + 1001)
    assert step.new.state is TxnState.PREPARE_ABORT and step.new.producer_epoch == 1
    assert not step.markers.commit and step.markers.partitions == {("t", 0), ("t", 1)}
    done = step.new.complete(T0 + 1002).new
    assert done.end_txn(T0 + 1003, 7, 0, commit=True).error is ErrorCode.producer_fenced
    assert done.abort_if_timed_out(T0 + 10**9) is None


def test_kip360_bump_with_current_producer_and_retry_and_stale():
    meta = initialized()
    bumped = meta.init_producer_id(T0 + 1, 10_000, expected=(7, 0)).new
    assert bumped.producer_epoch == 1 and bumped.last_producer_epoch == 0
    # The same request again (answer lost): the same epoch, no second bump.
    retry = bumped.init_producer_id(T0 + 2, 10_000, expected=(7, 0))
    assert retry.error is ErrorCode.none and retry.producer_epoch == 1
    # A stale epoch: fenced.
    assert bumped.init_producer_id(T0 + 2, 10_000, expected=(7, 5)).error is ErrorCode.producer_fenced
    # Another producer id: fenced.
    assert bumped.init_producer_id(T0 + 2, 10_000, expected=(3, 1)).error is ErrorCode.producer_fenced


def test_epoch_exhaustion_rotates_producer_id():
    meta = initialized()
    meta.producer_epoch = MAX_EPOCH - 1
    step = meta.init_producer_id(T0, 10_000)
    assert step.needs_producer_id and step.new is None
    step = meta.init_producer_id(T0, 10_000, new_producer_id=50)
    assert step.new.producer_id == 50 and step.new.producer_epoch == 0 and step.new.previous_producer_id == 7
    # KIP-360 from the old id at its exhausted epoch is accepted as a retry of the rotation.
    rotated = step.new
    assert rotated._valid_expected_producer((7, MAX_EPOCH - 1))


def test_verify_only_add_partitions():
    meta = ongoing(initialized())
    step = meta.verify_partitions(7, 0, [("t", 0), ("x", 0)])
    assert step.partition_errors == {("t", 0): ErrorCode.none, ("x", 0): ErrorCode.transaction_abortable}
    assert meta.verify_partitions(7, 1, [("t", 0)]).partition_errors == {("t", 0): ErrorCode.producer_fenced}


def test_expiration_only_when_idle():
    meta = initialized(now=T0)
    assert not meta.expired(T0 + 999, 1000)
    assert meta.expired(T0 + 1000, 1000)
    assert not ongoing(meta, now=T0).expired(T0 + 10**9, 1000)


def test_doc_round_trip():
    meta = ongoing(initialized(), parts=(("a/b", 3),))
    meta.groups = {"g1"}
    again = TransactionMetadata.from_doc("tx", meta.to_doc(), version=4)
    assert again.to_doc() == meta.to_doc() and again.version == 4


def test_transactions_v2_bumps_epoch_on_every_end():
    meta = ongoing(initialized())
    step = meta.end_txn(T0 + 1, 7, 0, commit=True, tv2=True)
    assert step.new.producer_epoch == 1 and (step.producer_id, step.producer_epoch) == (7, 1)
    assert step.markers.producer_epoch == 1
    prepared = step.new
    # A retry of that EndTxn (still with epoch 0) is recognised, not fenced.
    assert prepared.end_txn(T0 + 2, 7, 0, commit=True, tv2=True).error is ErrorCode.concurrent_transactions
    done = prepared.complete(T0 + 3).new
    assert done.end_txn(T0 + 4, 7, 0, commit=True, tv2=True).error is ErrorCode.none
    nxt = ongoing(done, now=T0 + 5)
    assert nxt.producer_epoch == 1
    assert nxt.end_txn(T0 + 6, 7, 0, commit=False, tv2=True).error is ErrorCode.producer_fenced


def test_transactions_v2_epoch_overflow_moves_to_next_producer_id():
    meta = initialized()
    meta.producer_epoch = MAX_EPOCH - 1
    meta = ongoing(meta)
    assert meta.end_txn(T0, 7, MAX_EPOCH - 1, commit=True, tv2=True).needs_producer_id
    step = meta.end_txn(T0, 7, MAX_EPOCH - 1, commit=True, tv2=True, new_producer_id=60)
    assert (step.producer_id, step.producer_epoch) == (60, 0)
    done = step.new.complete(T0 + 1).new
    assert done.producer_id == 60 and done.producer_epoch == 0 and done.previous_producer_id == 7


def test_transactions_v2_implicit_add_starts_a_transaction_after_the_last():
    done = ongoing(initialized()).end_txn(T0 + 1, 7, 0, commit=True, tv2=True).new.complete(T0 + 2).new
    assert done.state is TxnState.COMPLETE_COMMIT and done.producer_epoch == 1
    # Produce v12 from a partition leader, under the bumped epoch: a new transaction.
    step = done.add_partitions(T0 + 3, 7, 1, {("t", 2)}, tv2=True)
    assert step.error is ErrorCode.none and step.new.state is TxnState.ONGOING and step.new.tv2
    assert step.new.partitions == {("t", 2)} and step.new.start_ms == T0 + 3
    assert done.add_partitions(T0 + 3, 7, 0, {("t", 2)}, tv2=True).error is ErrorCode.producer_fenced
    # A group (TxnOffsetCommit v5) joins the same way; nothing new: no write.
    more = step.new.add_partitions(T0 + 4, 7, 1, groups={"g"}, tv2=True).new
    assert more.groups == {"g"} and more.start_ms == T0 + 3
    assert more.add_partitions(T0 + 5, 7, 1, {("t", 2)}, {"g"}, tv2=True).new is None
    step = more.end_txn(T0 + 6, 7, 1, commit=True, tv2=True)
    assert step.markers.tv2 and step.markers.partitions == {("t", 2)} and step.markers.groups == {"g"}


def test_transactions_v2_end_after_complete():
    """Kafka 4.0's EndTxn v5 rules once a transaction is complete: a retry (the epoch before
    the bump) of the same end is answered done, of the other end INVALID_TXN_STATE; with the
    current epoch a commit has nothing to commit and an abort still ends (and bumps)."""
    aborted = ongoing(initialized()).end_txn(T0, 7, 0, commit=False, tv2=True).new.complete(T0 + 1).new
    assert (aborted.state, aborted.producer_epoch) == (TxnState.COMPLETE_ABORT, 1)
    retry = aborted.end_txn(T0 + 2, 7, 0, commit=False, tv2=True)
    assert retry.error is ErrorCode.none and retry.new is None and (retry.producer_id, retry.producer_epoch) == (7, 1)
    assert aborted.end_txn(T0 + 2, 7, 0, commit=True, tv2=True).error is ErrorCode.invalid_txn_state
    assert aborted.end_txn(T0 + 2, 7, 1, commit=True, tv2=True).error is ErrorCode.invalid_txn_state
    assert aborted.end_txn(T0 + 2, 7, 2, commit=False, tv2=True).error is ErrorCode.producer_fenced
    step = aborted.end_txn(T0 + 2, 7, 1, commit=False, tv2=True)
    assert step.new.state is TxnState.PREPARE_ABORT and (step.producer_id, step.producer_epoch) == (7, 2)
    assert step.markers.partitions == frozenset() and step.markers.groups == frozenset()
    # While its (no) markers are written, that epoch's next end waits; the one before is a retry.
    assert step.new.end_txn(T0 + 3, 7, 2, commit=False, tv2=True).error is ErrorCode.concurrent_transactions
    assert step.new.end_txn(T0 + 3, 7, 1, commit=True, tv2=True).error is ErrorCode.invalid_txn_state
    committed = ongoing(initialized()).end_txn(T0, 7, 0, commit=True, tv2=True).new.complete(T0 + 1).new
    assert committed.end_txn(T0 + 2, 7, 0, commit=False, tv2=True).error is ErrorCode.invalid_txn_state


def test_transactions_v2_end_from_empty():
    meta = initialized()
    assert meta.end_txn(T0, 7, 0, commit=True, tv2=True).error is ErrorCode.invalid_txn_state
    step = meta.end_txn(T0, 7, 0, commit=False, tv2=True)
    assert step.new.state is TxnState.PREPARE_ABORT and step.producer_epoch == 1 and step.new.start_ms == T0
    # transactions v1 keeps its rule: nothing to end
    assert meta.end_txn(T0, 7, 0, commit=False).error is ErrorCode.invalid_txn_state


def test_transactions_v2_overflow_retry_with_the_old_producer_id():
    meta = initialized()
    meta.producer_epoch = MAX_EPOCH - 1
    done = ongoing(meta).end_txn(T0, 7, MAX_EPOCH - 1, commit=True, tv2=True, new_producer_id=60).new.complete(T0 + 1).new
    retry = done.end_txn(T0 + 2, 7, MAX_EPOCH - 1, commit=True, tv2=True)
    assert retry.error is ErrorCode.none and (retry.producer_id, retry.producer_epoch) == (60, 0)
    assert done.end_txn(T0 + 2, 7, 3, commit=True, tv2=True).error is ErrorCode.invalid_producer_id_mapping


def test_produce_and_txn_offset_commit_errors_by_version():
    assert produce_error(ErrorCode.none, 12) is None
    assert produce_error(ErrorCode.producer_fenced, 12) is ErrorCode.invalid_producer_epoch
    assert produce_error(ErrorCode.transaction_abortable, 11) is ErrorCode.transaction_abortable
    assert produce_error(ErrorCode.transaction_abortable, 10) is ErrorCode.invalid_txn_state
    for busy in (ErrorCode.concurrent_transactions, ErrorCode.not_coordinator, ErrorCode.network_exception):
        assert produce_error(busy, 12) is ErrorCode.not_enough_replicas
        assert txn_offset_commit_error(busy, 5) is ErrorCode.coordinator_not_available
    assert produce_error(ErrorCode.invalid_producer_id_mapping, 12) is ErrorCode.invalid_producer_id_mapping
    assert txn_offset_commit_error(ErrorCode.producer_fenced, 5) is ErrorCode.invalid_producer_epoch
    assert txn_offset_commit_error(ErrorCode.producer_fenced, 4) is ErrorCode.producer_fenced
    assert txn_offset_commit_error(ErrorCode.transaction_abortable, 4) is ErrorCode.transaction_abortable
    assert txn_offset_commit_error(ErrorCode.transaction_abortable, 3) is ErrorCode.invalid_txn_state
    assert txn_offset_commit_error(ErrorCode.none, 5) is ErrorCode.none


def test_transactions_v2_fenced_producer_is_no_retry():
    """A v2 transaction aborted by a fence (timeout, InitProducerId) also has the epoch one
    above the producer's, but that producer's EndTxn is fenced, not taken for a retry."""
    meta = ongoing(initialized(timeout_ms=1000))
    meta.tv2 = True
    fenced = meta.abort_if_timed_out(T0 + 2000).new
    assert (fenced.state, fenced.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    # its markers say transactions v2 (WriteTxnMarkers v2's transaction_version)
    assert fenced.markers_to_resend().tv2
    assert fenced.end_txn(T0 + 2001, 7, 0, commit=False, tv2=True).error is ErrorCode.producer_fenced
    done = fenced.complete(T0 + 2002).new
    assert done.end_txn(T0 + 2003, 7, 0, commit=False, tv2=True).error is ErrorCode.producer_fenced
    assert done.end_txn(T0 + 2003, 7, 0, commit=True, tv2=True).error is ErrorCode.producer_fenced
