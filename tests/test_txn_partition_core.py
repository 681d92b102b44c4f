"""The partition side of transactions in the pure core (`PartitionCore`, `ProducerStateTable`):
open transactions, the last stable offset, end-transaction markers (control batches), the
aborted-transaction entries of each segment, and the rollback of all of it when an upload
fails. Driven as tests/test_partition_core.py: fake clock, no I/O, the store side played
by the test."""

from __future__ import annotations

import dataclasses

import pytest

from kafscale.errors import ErrorCode
from kafscale.metadata.segments import SegmentInfo
from kafscale.protocol import records
from kafscale.protocol.records import InvalidRecordError
from kafscale.storage.objectstore import ObjectStoreError
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.recovery import replay
from kafscale.storage.txn import aborted_in_range, cut_at
from tests.test_partition_core import CREATE_TS, EPOCH, HW, NOW_MS, T0, answered, append, committed, headers_of, idem, make_core, plain, segment_of

E = ErrorCode
PID, OTHER = 4242, 77


def txn(seq: int, n: int = 1, pid: int = PID, epoch: int = 0) -> bytes:
    """A transactional batch of producer `pid`."""
    return records.build_batch(
        [(None, b"t")] * n, producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=CREATE_TS, attributes=records.TRANSACTIONAL_MASK
    )


def flush(core, aborted_expected=None):
    out = core.begin_flush(T0, owned=True)
    info = dataclasses.replace(segment_of(out.upload), aborted=out.upload.aborted)
    if aborted_expected is not None:
        assert info.aborted == aborted_expected
    return core.flush_committed(committed(core.state, info)), info


def marker(core, commit: bool, pid: int = PID, epoch: int = 0, coordinator_epoch: int = 0, waiter="m"):
    return core.append_marker(pid, epoch, coordinator_epoch, commit, waiter, T0, NOW_MS)


# -- the control batch ------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_control_batch_is_kafkas_end_transaction_marker(commit):
    data = records.build_control_batch(commit, PID, 3, 9, NOW_MS, base_offset=40)
    (h,) = records.validate_record_set(memoryview(bytearray(data)))  # CRC32C right
    assert (h.is_control, h.is_transactional, h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (True, True, PID, 3, -1, 1)
    (rec,) = records.decode_records(data)
    assert rec.key == (b"\x00\x00\x00\x01" if commit else b"\x00\x00\x00\x00")  # version 0, type
    assert rec.value == b"\x00\x00\x00\x00\x00\x09"  # version 0, coordinator epoch
    assert records.read_control(data, 0, h) == (1 if commit else 0, 9)


# -- open transactions and the last stable offset ---------------------------------------


def test_first_transactional_batch_opens_the_transaction_and_holds_the_lso():
    core = make_core(segment_bytes=10_000)
    append(core, plain(2), waiter="a")  # 10, 11
    append(core, txn(0, 2), waiter="b")  # 12, 13: opens at 12
    append(core, txn(2), waiter="c")  # 14: same transaction
    assert core.producers.open_txns == {PID: 12}
    assert core.last_stable_offset == HW  # never above the high watermark
    flush(core)
    assert core.state.high_watermark == 15
    assert core.last_stable_offset == 12


def test_commit_marker_is_appended_like_a_batch_and_frees_the_lso_once_durable():
    core = make_core(segment_bytes=10_000)
    append(core, txn(0, 3), waiter="a")  # 10..12
    append(core, plain(), waiter="b")  # 13
    flush(core)
    assert core.last_stable_offset == 10
    got = marker(core, commit=True, coordinator_epoch=5)
    assert (got.base_offset, core.next_offset) == (14, 15)
    assert core.producers.open_txns == {}
    assert core.last_stable_offset == 10  # the marker is not durable yet: still undecided
    out, info = flush(core, aborted_expected=())
    assert answered(out) == [(["m"], None)]
    assert core.state.high_watermark == 15 and core.last_stable_offset == 15
    assert info.last_offset == 14


def test_abort_marker_records_the_aborted_transaction_with_its_segment():
    core = make_core(segment_bytes=10_000)
    append(core, txn(0, 2), waiter="a")  # 10, 11
    append(core, txn(0, pid=OTHER), waiter="b")  # 12: another producer's transaction
    flush(core)
    marker(core, commit=False)  # 13
    assert core.last_stable_offset == 10
    _, info = flush(core, aborted_expected=((PID, 10, 13),))
    assert core.last_stable_offset == 12  # OTHER's transaction is still open
    marker(core, commit=True, pid=OTHER)  # 14
    _, info2 = flush(core, aborted_expected=())
    assert core.last_stable_offset == core.state.high_watermark == 15
    assert aborted_in_range(core.state.segments, 10, 15) == [(PID, 10)]


def test_marker_without_an_open_transaction_is_appended_but_ends_nothing():
    core = make_core()
    marker(core, commit=False)
    marker(core, commit=False)  # the coordinator re-sent it
    _, info = flush(core, aborted_expected=())
    assert info.record_count == 2 and core.last_stable_offset == 12


def test_markers_from_zombies_are_refused_and_the_epoch_moves_with_the_marker():
    core = make_core()
    append(core, txn(0, epoch=3), waiter="a")
    with pytest.raises(InvalidRecordError) as e:
        marker(core, commit=True, epoch=2)
    assert e.value.code == E.invalid_producer_epoch
    marker(core, commit=False, epoch=4, coordinator_epoch=6)  # fencing abort with a bumped epoch
    with pytest.raises(InvalidRecordError) as e:
        marker(core, commit=True, epoch=4, coordinator_epoch=5)
    assert e.value.code == E.transaction_coordinator_fenced
    with pytest.raises(InvalidRecordError) as e:  # the fenced producer's next batch
        append(core, txn(1, epoch=3), waiter="z")
    assert e.value.code == E.invalid_producer_epoch
    append(core, txn(0, epoch=4), waiter="n")  # the new epoch starts at sequence 0
    assert core.producers.open_txns == {PID: 12}


def test_non_transactional_batch_inside_an_open_transaction_is_invalid_txn_state():
    core = make_core()
    append(core, txn(0))
    with pytest.raises(InvalidRecordError) as e:
        append(core, idem(1))
    assert e.value.code == E.invalid_txn_state


def test_control_batches_cannot_be_produced():
    core = make_core()
    with pytest.raises(InvalidRecordError) as e:
        append(core, records.build_control_batch(True, PID, 0, 0, NOW_MS))
    assert e.value.code == E.invalid_record
    assert core.next_offset == HW


def test_failed_upload_rolls_back_open_transactions_markers_and_aborted_entries():
    core = make_core(segment_bytes=10_000)
    append(core, txn(0, 2), waiter="a")  # 10, 11
    flush(core)
    assert core.last_stable_offset == 10
    marker(core, commit=False)  # 12: closes PID's transaction (not durable)
    append(core, txn(0, pid=OTHER), waiter="b")  # 13: opens OTHER's
    assert core.producers.open_txns == {OTHER: 13}
    out = core.begin_flush(T0, owned=True)
    assert out.upload.aborted == ((PID, 10, 12),)
    out = core.flush_failed(ObjectStoreError("s3 down"))
    assert {c for _, c in answered(out)} == {E.kafka_storage_error}
    assert core.next_offset == 12
    assert core.producers.open_txns == {PID: 10}  # open again: its marker was dropped
    assert core.last_stable_offset == 10
    marker(core, commit=False)  # the coordinator retries: 12 again
    _, info = flush(core, aborted_expected=((PID, 10, 12),))
    assert core.last_stable_offset == 13


def test_failed_upload_restores_the_producer_epoch_a_dropped_marker_bumped():
    core = make_core()
    append(core, txn(0, epoch=1), waiter="a")
    flush(core)
    marker(core, commit=False, epoch=2, coordinator_epoch=3)
    core.begin_flush(T0, owned=True)
    core.flush_failed(ObjectStoreError("s3 down"))
    entry = core.producers.producers[PID]
    assert (entry.epoch, entry.coordinator_epoch, entry.txn_first_offset) == (1, -1, 10)
    append(core, txn(1, epoch=1), waiter="b")  # the old epoch is not fenced: nothing durable fenced it


def test_producers_with_an_open_transaction_do_not_expire():
    table = ProducerStateTable()
    h = records.read_header(txn(0))
    table.record(h, 5, now_ms=0, durable_below=0)
    table.record(records.read_header(idem(0, pid=OTHER)), 6, now_ms=0, durable_below=0)
    assert table.expire(now_ms=10_000, expiration_ms=1000) == 1
    assert set(table.producers) == {PID}


def test_replay_rebuilds_open_transactions_and_yields_aborted_entries():
    log = b"".join(
        [
            records.build_batch([(None, b"x")], base_offset=0, producer_id=PID, producer_epoch=0, base_sequence=0, attributes=records.TRANSACTIONAL_MASK),
            records.build_batch([(None, b"y")], base_offset=1, producer_id=OTHER, producer_epoch=0, base_sequence=0, attributes=records.TRANSACTIONAL_MASK),
            records.build_control_batch(False, PID, 0, 2, NOW_MS, base_offset=2),
            records.build_batch([(None, b"z")], base_offset=3, producer_id=PID, producer_epoch=0, base_sequence=1, attributes=records.TRANSACTIONAL_MASK),
        ]
    )
    table = ProducerStateTable()
    aborted = replay(table, log, [p for p, _ in records.iter_batches(log)], NOW_MS)
    assert aborted == ((PID, 0, 2),)
    assert table.open_txns == {OTHER: 1, PID: 3}
    assert table.producers[PID].coordinator_epoch == 2


# -- the read side ----------------------------------------------------------------------


def _seg(base, last, aborted=()):
    return SegmentInfo(base, last, 100, last - base + 1, -1, 0, aborted)


def test_aborted_in_range_takes_entries_overlapping_the_range_from_every_later_segment():
    segs = [_seg(0, 9, ((1, 2, 5),)), _seg(10, 19, ((2, 8, 12), (3, 15, 16))), _seg(20, 29, ((4, 3, 25), (5, 22, 28)))]
    assert aborted_in_range(segs, 10, 20) == [(4, 3), (2, 8), (3, 15)]  # 4 began before, ended after
    assert aborted_in_range(segs, 0, 5) == [(1, 2), (4, 3)]
    assert aborted_in_range(segs, 26, 30) == [(5, 22)]


def test_cut_at_keeps_whole_batches_below_the_offset():
    a = records.build_batch([(None, b"a")] * 3, base_offset=10)  # 10..12
    b = records.build_batch([(None, b"b")], base_offset=13)
    c = records.build_batch([(None, b"c")], base_offset=14)
    chunks = [memoryview(a + b), memoryview(c)]
    assert [bytes(x) for x in cut_at(chunks, 14)] == [a + b]
    assert [bytes(x) for x in cut_at(chunks, 13)] == [a]
    assert cut_at(chunks, 12) == []
    assert [bytes(x) for x in cut_at(chunks, 15)] == [a + b, c]


def test_segment_info_keeps_aborted_entries_through_json():
    import json

    info = _seg(0, 9, ((1, 2, 5),))
    again = SegmentInfo(**json.loads(json.dumps(dataclasses.asdict(info))))
    assert again == info and again.aborted == ((1, 2, 5),)
    assert SegmentInfo(0, 9, 100, 10, -1, 0).aborted == ()  # metadata written before transactions


def test_each_upload_records_the_transactions_open_at_its_end():
    core = make_core(segment_bytes=2 * len(txn(0)))  # two one-record batches per upload
    append(core, txn(0), waiter="a")  # 10: PID opens
    append(core, txn(0, pid=OTHER), waiter="b")  # 11: OTHER opens
    marker(core, commit=True)  # 12: PID closes (after the first upload's end)
    append(core, txn(0, pid=99), waiter="c")  # 13: opens after it
    out = core.begin_flush(T0, owned=True)
    assert [b.base_offset for b in out.upload.batches] == [10, 11]
    assert out.upload.open_txns == ((PID, 0, 10), (OTHER, 0, 11))  # PID's marker is not in this segment
    core.flush_committed(committed(core.state, dataclasses.replace(segment_of(out.upload), open_txns=out.upload.open_txns)))
    out = core.begin_flush(T0, owned=True)
    assert out.upload.open_txns == ((OTHER, 0, 11), (99, 0, 13))


def test_seeded_open_transactions_end_with_their_marker():
    table = ProducerStateTable()
    table.seed_open(PID, 3, 40)
    assert table.first_unstable_offset() == 40
    with pytest.raises(InvalidRecordError):
        table.check_marker(PID, 2, 0)  # the seeded epoch fences older markers
    table.check(records.read_header(txn(7, epoch=3)))  # mid-sequence: no UNKNOWN_PRODUCER_ID after a seed
    assert table.end_txn(PID, 3, 0, 50, NOW_MS, 0) == 40
    assert table.open_txns == {}


# -- when a marker is flushed -------------------------------------------------------------


def test_a_marker_is_flushed_at_once_not_after_min_flush_interval():
    """Group commit holds acknowledged batches until min_flush_interval after the last upload
    (the flush interval on S3); a transaction's marker does not wait for it: until the marker
    is durable the transaction is not complete and the producer's next one is refused."""
    core = make_core(segment_bytes=10_000)
    append(core, txn(0, 2), waiter="a", now=T0)
    flush(core)  # last_flush = T0
    append(core, plain(), waiter="b", now=T0)
    assert core.flush_due_in(T0) > 0  # an ordinary ack waits for min_flush_interval
    marker(core, commit=True)
    assert core.flush_due_in(T0) == 0.0
    out = core.begin_flush(T0, owned=True)
    assert [b.marker for b in out.upload.batches] == [False, True]
    assert core.buffered_markers == 0
    core.flush_committed(committed(core.state, segment_of(out.upload)))
    append(core, plain(), waiter="c", now=T0)
    assert core.flush_due_in(T0) > 0  # back to group commit once the marker is out


def test_a_failed_upload_forgets_the_markers_it_dropped():
    core = make_core(segment_bytes=10_000)
    append(core, txn(0), waiter="a")
    flush(core)
    marker(core, commit=False)
    assert core.buffered_markers == 1
    core.begin_flush(T0, owned=True)
    core.flush_failed(ObjectStoreError("s3 down"))
    assert (core.buffered_markers, core.flush_due_in(T0)) == (0, None)


# -- the aborted index a read_committed fetch asks --------------------------------------------


def test_aborted_index_follows_the_segment_list_and_answers_as_a_full_scan():
    from kafscale.storage.txn import AbortedIndex

    plain_seg = SegmentInfo(base_offset=0, last_offset=9, size=1, record_count=10, max_timestamp=0, created_ms=0)
    with_abort = dataclasses.replace(plain_seg, base_offset=10, last_offset=19, aborted=((PID, 12, 19),))
    index = AbortedIndex()
    segments = [plain_seg]
    assert (index.of(segments), index.any_from(segments, 0)) == ([], False)
    segments = segments + [with_abort]  # a commit makes a new list
    assert index.of(segments) == [with_abort]
    assert index.any_from(segments, 19) and not index.any_from(segments, 20)
    assert aborted_in_range(index.of(segments), 0, 30) == aborted_in_range(segments, 0, 30) == [(PID, 12)]
