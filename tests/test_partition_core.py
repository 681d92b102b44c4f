"""The partition-log state machine without I/O (`kafscale.storage.partition_core`).

Driven like `groups/state.py` in test_groups_unit.py: time is passed in (`now`, monotonic
seconds; `now_ms`, wall-clock milliseconds), waiters are plain strings, and every step's
`Outcome` is checked for exactly who is answered with what. The store side is played by
the test: an upload "commits" by handing `flush_committed` the next PartitionState.
"""

from __future__ import annotations

import dataclasses

import pytest

from kafscale.errors import ErrorCode
from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.store import ConflictError, PartitionState
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import records
from kafscale.protocol.records import InvalidRecordError
from kafscale.storage.failures import StorageError
from kafscale.storage.objectstore import ObjectExistsError, ObjectStoreError
from kafscale.storage.partition_core import Answer, Appended, BufferedBatch, Outcome, PartitionCore, Upload

E = ErrorCode
EPOCH = 7  # the partition's leader epoch
HW = 10  # the committed high watermark each core starts from
CREATE_TS = 1_600_000_000_000  # the producer's record timestamp
NOW_MS = 1_700_000_000_000  # the broker's wall clock
T0 = 100.0  # the broker's monotonic clock
FLUSH_INTERVAL = 0.5
MIN_FLUSH_INTERVAL = 0.125
PID = 4242


def plain(n: int = 1) -> bytes:
    """A non-idempotent batch of n one-byte records (69 bytes for n=1)."""
    return records.build_batch([(None, b"v")] * n, timestamp=CREATE_TS)


def idem(seq: int, n: int = 1, pid: int = PID, epoch: int = 0) -> bytes:
    """An idempotent batch (as tests/test_idempotence.py's idem_batch), same size as plain(n)."""
    return records.build_batch([(None, b"v")] * n, producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=CREATE_TS)


BATCH = len(plain())  # every one-record batch here has this size
SEGMENT_BYTES = 2 * BATCH + BATCH // 2  # a flush of one-batch record sets takes three


def make_core(hw: int = HW, segment_bytes: int = SEGMENT_BYTES, log_append_time: bool = False) -> PartitionCore:
    configs = {"segment.bytes": str(segment_bytes)}
    if log_append_time:
        configs["message.timestamp.type"] = "LogAppendTime"
    state = PartitionState("t", 0, high_watermark=hw, leader_epoch=EPOCH, epoch_start_offset=hw)
    return PartitionCore("t-0", state, LogSettings.from_configs(configs), FLUSH_INTERVAL, MIN_FLUSH_INTERVAL)


def record_set(*batches: bytes) -> tuple[memoryview, list[records.BatchHeader]]:
    """A produced record set as the handler hands it over: writable, validated."""
    data = memoryview(bytearray(b"".join(batches)))
    return data, records.validate_record_set(data)


def append(core: PartitionCore, *batches: bytes, waiter=None, now: float = T0, now_ms: int = NOW_MS) -> Appended:
    data, headers = record_set(*batches)
    return core.append(data, headers, waiter, now, now_ms)


def headers_of(data) -> list[records.BatchHeader]:
    return [h for _, h in records.iter_batches(data)]


def code(answer: Answer) -> ErrorCode | None:
    """What the waiters of an answer get: None (acknowledged) or the error code."""
    return None if answer.error is None else answer.error.code


def answered(out: Outcome) -> list[tuple[list, ErrorCode | None]]:
    return [(a.waiters, code(a)) for a in out.answers]


def segment_of(upload: Upload, created_ms: int = NOW_MS) -> SegmentInfo:
    """The SegmentInfo the store side would record for an upload."""
    hs = [h for b in upload.batches for h in headers_of(b.data)]
    return SegmentInfo(
        base_offset=upload.base_offset,
        last_offset=hs[-1].last_offset,
        size=sum(b.nbytes for b in upload.batches),
        record_count=sum(h.record_count for h in hs),
        max_timestamp=max(h.max_timestamp for h in hs),
        created_ms=created_ms,
    )


def committed(state: PartitionState, info: SegmentInfo) -> PartitionState:
    """`state` after committing the segment `info`."""
    return dataclasses.replace(state, high_watermark=info.last_offset + 1, segments=[*state.segments, info], version=state.version + 1)


def flush_and_commit(core: PartitionCore, now: float = T0) -> Outcome:
    out = core.begin_flush(now, owned=True)
    assert out is not None and out.upload is not None
    return core.flush_committed(committed(core.state, segment_of(out.upload)))


# -- append -------------------------------------------------------------------------------


def test_append_assigns_consecutive_offsets_and_patches_each_batch():
    core = make_core()
    first = append(core, plain(3), plain(2), waiter="a")  # one record set, two batches
    second = append(core, plain(1), waiter="b")
    third = append(core, plain(4), waiter="c")

    assert (first.base_offset, second.base_offset, third.base_offset) == (10, 15, 16)
    assert core.next_offset == 20
    assert core.state.high_watermark == HW  # nothing is durable yet
    assert [b.base_offset for b in core.buffer] == [10, 15, 16]
    assert [b.waiters for b in core.buffer] == [["a"], ["b"], ["c"]]
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers_of(core.buffer[0].data)] == [(10, 12, EPOCH), (13, 14, EPOCH)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers_of(core.buffer[2].data)] == [(16, EPOCH)]
    assert records.read_header(core.buffer[1].data).base_offset == 15
    assert core.buffered_bytes == sum(len(b.data) for b in core.buffer) == len(plain(3)) + len(plain(2)) + len(plain(1)) + len(plain(4))
    assert core.waiting_acks == 3
    for b in core.buffer:
        records.validate_record_set(b.data)  # base offset and epoch are outside the CRC


def test_create_time_topic_keeps_the_producer_timestamps():
    core = make_core()
    got = append(core, plain(2), waiter="a", now_ms=NOW_MS)
    assert got == Appended(10, -1, buffered=True)
    h = records.read_header(core.buffer[0].data)
    assert (h.max_timestamp, h.is_log_append_time) == (CREATE_TS, False)


def test_log_append_time_topic_stamps_now_ms_into_every_batch():
    core = make_core(log_append_time=True)
    got = append(core, plain(2), plain(1), waiter="a", now_ms=NOW_MS + 5)
    assert got == Appended(10, NOW_MS + 5, buffered=True)
    hs = headers_of(core.buffer[0].data)
    assert [(h.base_offset, h.max_timestamp, h.is_log_append_time) for h in hs] == [(10, NOW_MS + 5, True), (12, NOW_MS + 5, True)]
    records.validate_record_set(core.buffer[0].data)  # re-CRCed after the change


def test_acks_0_appends_are_buffered_but_not_waited_for():
    core = make_core()
    assert append(core, plain(), waiter=None) == Appended(10, -1, buffered=True)
    assert (core.waiting_acks, core.buffer[0].waiters) == (0, [])
    append(core, plain(), waiter="w")
    assert (core.waiting_acks, [b.waiters for b in core.buffer]) == (1, [[], ["w"]])
    out = flush_and_commit(core)
    assert answered(out) == [(["w"], None)]


# -- when to flush ----------------------------------------------------------------------


def test_flush_due_in_is_none_with_nothing_buffered():
    core = make_core()
    assert core.flush_due_in(T0) is None
    append(core, plain(), waiter="w", now=T0)
    flush_and_commit(core, now=T0)
    assert core.flush_due_in(T0 + 10) is None


def test_flush_due_in_counts_flush_interval_from_the_first_buffered_batch():
    core = make_core()
    append(core, plain(), waiter=None, now=T0)
    append(core, plain(), waiter=None, now=T0 + 0.25)  # does not restart the interval
    assert core.flush_due_in(T0 + 0.25) == FLUSH_INTERVAL - 0.25
    assert core.flush_due_in(T0 + FLUSH_INTERVAL) == 0.0
    assert core.flush_due_in(T0 + 1.0) == FLUSH_INTERVAL - 1.0  # overdue: negative


def test_flush_due_in_group_commits_min_flush_interval_after_the_last_flush_when_someone_waits():
    core = make_core()
    append(core, plain(), waiter="first", now=T0)
    assert core.flush_due_in(T0) <= 0  # never flushed: an ack is due at once
    flush_and_commit(core, now=T0)

    # Only acks=0 batches buffered: the flush interval applies, not the group commit.
    append(core, plain(), waiter=None, now=T0 + 0.0625)
    assert core.flush_due_in(T0 + 0.0625) == FLUSH_INTERVAL  # T0 + 0.5625 - (T0 + 0.0625)

    # Someone waits: min_flush_interval after the last flush, earlier than the interval.
    append(core, plain(), waiter="w", now=T0 + 0.0625)
    assert core.flush_due_in(T0 + 0.0625) == MIN_FLUSH_INTERVAL - 0.0625  # T0 + 0.125 - (T0 + 0.0625)
    assert core.flush_due_in(T0 + MIN_FLUSH_INTERVAL) == 0.0


def test_flush_due_in_is_zero_once_segment_bytes_are_buffered():
    core = make_core(segment_bytes=2 * BATCH)
    append(core, plain(), waiter=None, now=T0)
    assert core.flush_due_in(T0) == FLUSH_INTERVAL
    append(core, plain(), waiter=None, now=T0)
    assert core.flush_due_in(T0) == 0.0


# -- flush ------------------------------------------------------------------------------


def test_begin_flush_with_nothing_buffered_takes_nothing():
    core = make_core()
    assert core.begin_flush(T0, owned=True) is None
    assert core.begin_flush(T0, owned=False) is None  # nothing to lose: no halt either
    assert core.closed is False


def test_begin_flush_takes_up_to_segment_bytes_and_leaves_the_rest_buffered():
    core = make_core()
    for i in range(5):
        append(core, plain(), waiter=f"w{i}", now=T0)

    out = core.begin_flush(T0 + 1, owned=True)
    assert out.answers == [] and not out.forget and not out.notify_readers
    # 3 batches = 207 bytes >= 172: the segment ends one record set past segment.bytes.
    assert out.upload.base_offset == HW
    assert [b.base_offset for b in out.upload.batches] == [10, 11, 12]
    assert core.in_flight == out.upload.batches and core.uploading
    assert [b.base_offset for b in core.buffer] == [13, 14]
    assert (core.buffered_bytes, core.waiting_acks) == (2 * BATCH, 2)
    assert core.next_offset == 15
    assert core.flush_due_in(T0 + 1) == MIN_FLUSH_INTERVAL  # last_flush and buffer_since: now

    info = segment_of(out.upload)
    assert (info.base_offset, info.last_offset, info.record_count) == (10, 12, 3)
    state = committed(core.state, info)
    done = core.flush_committed(state)
    assert answered(done) == [(["w0", "w1", "w2"], None)]
    assert done.notify_readers and not done.forget and done.upload is None
    assert core.state is state and core.state.high_watermark == 13
    assert (core.in_flight, core.uploading) == ([], False)

    rest = core.begin_flush(T0 + 2, owned=True)
    assert rest.upload.base_offset == 13
    assert [b.base_offset for b in rest.upload.batches] == [13, 14]
    assert (core.buffer, core.buffered_bytes, core.waiting_acks) == ([], 0, 0)
    done = core.flush_committed(committed(core.state, segment_of(rest.upload)))
    assert answered(done) == [(["w3", "w4"], None)]
    assert core.state.high_watermark == core.next_offset == 15
    assert [(s.base_offset, s.last_offset) for s in core.state.segments] == [(10, 12), (13, 14)]


def test_a_record_set_is_never_split_across_segments():
    core = make_core(segment_bytes=2 * BATCH)
    append(core, plain(), waiter="a")
    append(core, plain(), plain(), plain(), waiter="b")  # one record set of three batches
    append(core, plain(), waiter="c")
    out = core.begin_flush(T0, owned=True)
    assert [(b.base_offset, b.waiters) for b in out.upload.batches] == [(10, ["a"]), (11, ["b"])]
    assert [b.base_offset for b in core.buffer] == [14]


def test_the_next_upload_begins_where_the_one_committing_ends_and_commits_answer_in_order():
    core, first, second = two_uploads(5)  # the second taken while the first commits
    assert (first.base_offset, first.end_offset) == (10, 13)
    assert (second.base_offset, second.end_offset) == (13, 15)
    assert core.uploads == [first, second] and core.uploading
    assert [b.base_offset for b in core.in_flight] == [10, 11, 12, 13, 14]
    assert core.in_flight_upload(first) and core.in_flight_upload(second)

    done = core.flush_committed(committed(core.state, segment_of(first)))
    assert answered(done) == [(["w0", "w1", "w2"], None)]
    assert core.state.high_watermark == 13  # the second is not readable before its commit
    assert not core.in_flight_upload(first) and core.uploading
    assert [b.base_offset for b in core.in_flight] == [13, 14]

    done = core.flush_committed(committed(core.state, segment_of(second)))
    assert answered(done) == [(["w3", "w4"], None)]
    assert core.state.high_watermark == core.next_offset == 15
    assert (core.uploads, core.in_flight, core.uploading) == ([], [], False)


def two_uploads(batches: int = 7) -> tuple[PartitionCore, Upload, Upload]:
    """A core with w0..w2 and w3..w5 in two uploads in flight and the rest buffered."""
    core = make_core()
    for i in range(batches):
        append(core, plain(), waiter=f"w{i}")
    return core, core.begin_flush(T0, owned=True).upload, core.begin_flush(T0, owned=True).upload


def test_a_failed_commit_also_rejects_the_upload_after_it_and_hands_out_both_ranges_again():
    core, first, second = two_uploads()
    failed = core.flush_failed(ObjectStoreError("metadata commit failed"))
    assert answered(failed) == [([f"w{i}" for i in range(7)], E.kafka_storage_error)]
    assert failed.rejected_batches == 7
    assert not core.in_flight_upload(first) and not core.in_flight_upload(second)  # the driver skips its commit
    assert (core.uploads, core.in_flight, core.buffer, core.uploading) == ([], [], [], False)
    assert core.next_offset == core.state.high_watermark == HW
    append(core, plain(), waiter="again")
    assert core.begin_flush(T0, owned=True).upload.base_offset == HW  # not after the dropped second


def test_halt_leaves_both_uploads_in_flight_to_their_outcomes():
    core, first, second = two_uploads()
    out = core.halt(deleted())
    assert answered(out) == [(["w6"], E.unknown_topic_or_partition)]
    assert core.uploads == [first, second]
    assert answered(core.flush_committed(committed(core.state, segment_of(first)))) == [(["w0", "w1", "w2"], None)]
    assert answered(core.flush_failed(RuntimeError("boom"))) == [(["w3", "w4", "w5"], E.unknown_topic_or_partition)]


# -- upload failures ------------------------------------------------------------------------


def test_failed_upload_rejects_in_flight_and_buffered_and_hands_their_offsets_out_again():
    core = make_core()
    append(core, idem(0), waiter="durable")
    flush_and_commit(core)  # offset 10 durable; the producer's next sequence is 1
    for seq in range(1, 5):  # with seq 0, five batches: none trimmed from the producer state
        append(core, idem(seq), waiter=f"w{seq}")  # offsets 11..14
    out = core.begin_flush(T0, owned=True)
    assert [b.base_offset for b in out.upload.batches] == [11, 12, 13]

    failed = core.flush_failed(ObjectStoreError("bucket unreachable"))
    assert answered(failed) == [(["w1", "w2", "w3", "w4"], E.kafka_storage_error)]
    assert isinstance(failed.answers[0].error, StorageError)
    assert (failed.forget, failed.notify_readers, failed.upload, failed.rejected_batches) == (False, False, None, 4)
    assert (core.in_flight, core.buffer, core.uploading, core.buffered_bytes, core.waiting_acks) == ([], [], False, 0, 0)
    assert core.next_offset == core.state.high_watermark == 11
    assert core.closed is False
    assert core.flush_due_in(T0) is None

    # Producer state rolled back: sequence 1 is new again (not a duplicate of the dropped
    # batch) and lands on the offset handed out again; sequence 5 would now be a gap.
    retried = append(core, idem(1), waiter="retry")
    assert retried == Appended(11, -1, buffered=True)
    assert [(b.base_offset, b.waiters) for b in core.buffer] == [(11, ["retry"])]
    with pytest.raises(InvalidRecordError) as gap:
        append(core, idem(5), waiter="gap")
    assert gap.value.code == E.out_of_order_sequence_number
    assert core.next_offset == 12


def test_failed_upload_with_only_acks_0_batches_answers_nobody():
    core = make_core()
    append(core, plain(), waiter=None)
    core.begin_flush(T0, owned=True)
    failed = core.flush_failed(RuntimeError("boom"))
    assert answered(failed) == [([], E.kafka_storage_error)]
    assert failed.rejected_batches == 1
    assert core.next_offset == HW


def test_fenced_upload_adopts_the_new_state_and_is_forgotten():
    core = make_core()
    append(core, plain(), waiter="a")
    core.begin_flush(T0, owned=True)
    append(core, plain(), waiter="b")
    latest = PartitionState("t", 0, high_watermark=25, leader_epoch=EPOCH + 1, owner=2, epoch_start_offset=20, version=9)

    failed = core.flush_failed(ConflictError("version changed"), latest)
    assert answered(failed) == [(["a", "b"], E.not_leader_or_follower)]
    assert (failed.forget, failed.rejected_batches) == (True, 2)
    assert core.state is latest
    assert core.next_offset == 25


def test_conflict_without_a_reread_state_keeps_the_old_one():
    core = make_core()
    before = core.state
    append(core, plain(), waiter="a")
    core.begin_flush(T0, owned=True)
    failed = core.flush_failed(ConflictError("version changed"), None)
    assert answered(failed) == [(["a"], E.not_leader_or_follower)]
    assert failed.forget
    assert core.state is before and core.next_offset == HW


def test_losing_the_segment_race_to_another_writer_is_not_leader_and_forgotten():
    core = make_core()
    before = core.state
    append(core, plain(), waiter="a")
    core.begin_flush(T0, owned=True)
    append(core, plain(), waiter="b")
    other = PartitionState("t", 0, high_watermark=12, leader_epoch=EPOCH, version=3)
    failed = core.flush_failed(ObjectExistsError("segment-10 exists"), other)
    assert answered(failed) == [(["a", "b"], E.not_leader_or_follower)]
    assert failed.forget
    assert "segment 10" in str(failed.answers[0].error)
    assert core.state is before  # only a ConflictError adopts the re-read state
    assert core.next_offset == HW


def test_commit_landed_only_for_this_very_segment_under_this_epoch():
    core = make_core()
    append(core, plain(2), waiter="a")
    out = core.begin_flush(T0, owned=True)
    info = segment_of(out.upload)
    assert (info.base_offset, info.last_offset) == (10, 11)
    landed = committed(core.state, info)

    assert core.commit_landed(landed, info) is True
    assert core.commit_landed(None, info) is False
    assert core.commit_landed(dataclasses.replace(landed, leader_epoch=EPOCH + 1), info) is False
    assert core.commit_landed(dataclasses.replace(landed, high_watermark=13), info) is False  # more was committed after it
    other_writer = dataclasses.replace(info, created_ms=info.created_ms + 1)  # same offsets, another writer's segment
    assert core.commit_landed(committed(core.state, other_writer), info) is False
    assert core.commit_landed(core.state, info) is False  # not committed at all

    done = core.flush_committed(landed)  # what the driver does when it landed
    assert answered(done) == [(["a"], None)]


# -- retried idempotent batches --------------------------------------------------------------


def test_retry_of_a_durable_batch_is_answered_at_once_with_its_original_offset():
    core = make_core()
    append(core, idem(0, n=2), waiter="orig")
    append(core, idem(2), waiter="next")
    flush_and_commit(core)
    retry = append(core, idem(0, n=2), waiter="retry")
    assert retry == Appended(10, -1, buffered=False, answer=Answer(["retry"], None))
    assert core.next_offset == 13 and core.buffer == []


def test_retry_of_a_buffered_batch_shares_its_answer():
    core = make_core()
    append(core, idem(0), waiter="orig")
    append(core, idem(1), waiter="other")
    retry = append(core, idem(0), waiter="retry")
    assert retry == Appended(10, -1, buffered=False)  # answered when the original is durable
    assert core.next_offset == 12
    assert [(b.base_offset, b.waiters) for b in core.buffer] == [(10, ["orig", "retry"]), (11, ["other"])]
    done = flush_and_commit(core)
    assert answered(done) == [(["orig", "retry", "other"], None)]


def test_retry_with_acks_of_a_buffered_acks_0_batch_makes_it_wait_for_group_commit():
    core = make_core()
    append(core, idem(0), waiter=None)  # acks=0: nobody waits, the flush interval applies
    assert core.flush_due_in(T0) == pytest.approx(FLUSH_INTERVAL)
    append(core, idem(0), waiter="retry")
    assert core.waiting_acks == 1  # now someone waits: group commit
    assert core.flush_due_in(T0) <= 0
    out = core.begin_flush(T0, owned=True)
    assert core.waiting_acks == 0 and out.upload.batches[0].waiters == ["retry"]


def test_retry_of_an_in_flight_batch_shares_its_answer():
    core = make_core()
    append(core, idem(0), waiter="orig")
    core.begin_flush(T0, owned=True)
    assert append(core, idem(0), waiter="retry") == Appended(10, -1, buffered=False)
    assert core.buffer == [] and core.in_flight[0].waiters == ["orig", "retry"]
    failed = core.flush_failed(RuntimeError("boom"))
    assert answered(failed) == [(["orig", "retry"], E.kafka_storage_error)]


def test_acks_0_retry_gets_no_answer_and_joins_nothing():
    core = make_core()
    append(core, idem(0), waiter="orig")
    assert append(core, idem(0), waiter=None) == Appended(10, -1, buffered=False)
    assert [b.waiters for b in core.buffer] == [["orig"]]
    flush_and_commit(core)
    assert append(core, idem(0), waiter=None) == Appended(10, -1, buffered=False)  # durable: still no answer


def test_a_record_set_mixing_a_retry_with_a_new_batch_is_refused():
    core = make_core()
    append(core, idem(0), waiter="orig")
    with pytest.raises(InvalidRecordError) as refused:
        append(core, idem(0), idem(1), waiter="mixed")
    assert refused.value.code == E.out_of_order_sequence_number
    assert core.next_offset == 11
    assert [b.waiters for b in core.buffer] == [["orig"]]


# -- ownership loss, deletion, shutdown ---------------------------------------------------------


def test_flush_without_ownership_halts_the_log():
    core = make_core()
    append(core, plain(), waiter="a")
    append(core, plain(), waiter=None)
    append(core, plain(), waiter="b")
    out = core.begin_flush(T0, owned=False)
    assert answered(out) == [(["a", "b"], E.not_leader_or_follower)]
    assert (out.forget, out.notify_readers, out.upload) == (True, True, None)
    assert core.closed and core.stopped_by.code == E.not_leader_or_follower
    assert (core.buffer, core.in_flight, core.buffered_bytes, core.waiting_acks) == ([], [], 0, 0)
    assert core.refusal().code == E.not_leader_or_follower
    with pytest.raises(StorageError) as refused:
        append(core, plain(), waiter="late")
    assert refused.value.code == E.not_leader_or_follower
    assert core.next_offset == 13  # never handed out again by this log: it is forgotten


def deleted() -> StorageError:
    return StorageError("topic t was deleted", E.unknown_topic_or_partition)


def halted_during_upload() -> tuple[PartitionCore, Outcome, Upload, StorageError]:
    """A log with w0..w2 uploading and w3, w4 buffered, halted by a topic deletion."""
    core = make_core()
    for i in range(5):
        append(core, plain(), waiter=f"w{i}")
    upload = core.begin_flush(T0, owned=True).upload
    reason = deleted()
    return core, core.halt(reason), upload, reason


def test_halt_during_an_upload_rejects_only_the_buffered_batches():
    core, out, _, reason = halted_during_upload()
    assert answered(out) == [(["w3", "w4"], E.unknown_topic_or_partition)]
    assert out.answers[0].error is reason
    assert (out.notify_readers, out.forget) == (True, False)
    assert core.closed and core.stopped_by is reason
    assert [b.waiters for b in core.in_flight] == [["w0"], ["w1"], ["w2"]]  # answered by the upload
    assert (core.buffer, core.buffered_bytes, core.waiting_acks) == ([], 0, 0)
    with pytest.raises(StorageError) as refused:
        append(core, plain(), waiter="late")
    assert refused.value.code == E.unknown_topic_or_partition


def test_upload_committing_after_halt_is_acknowledged():
    core, _, upload, _ = halted_during_upload()
    done = core.flush_committed(committed(core.state, segment_of(upload)))
    assert answered(done) == [(["w0", "w1", "w2"], None)]
    assert core.state.high_watermark == 13


def test_upload_failing_after_halt_is_rejected_with_the_stop_reason():
    core, _, _, reason = halted_during_upload()
    failed = core.flush_failed(RuntimeError("boom"))
    assert answered(failed) == [(["w0", "w1", "w2"], E.unknown_topic_or_partition)]
    assert failed.answers[0].error is reason  # the stop reason wins over the flush error
    assert failed.forget is False


def test_fenced_upload_after_halt_carries_the_stop_reason_and_is_forgotten():
    core, _, _, reason = halted_during_upload()
    failed = core.flush_failed(ConflictError("version changed"), None)
    assert answered(failed) == [(["w0", "w1", "w2"], E.unknown_topic_or_partition)]
    assert failed.forget is True  # decided by the failure, answered with the reason


def test_halt_with_no_upload_running_answers_batches_left_in_flight():
    core = make_core()
    for i in range(4):
        append(core, plain(), waiter=f"w{i}")
    core.begin_flush(T0, owned=True)  # takes w0..w2
    core.uploading = False  # the driver's flush died without an outcome (a bug)
    out = core.halt(deleted())
    assert answered(out) == [(["w0", "w1", "w2", "w3"], E.unknown_topic_or_partition)]
    assert (core.in_flight, core.buffer) == ([], [])


def test_ownership_loss_also_answers_batches_a_crashed_flush_left_in_flight():
    # The old PartitionLog kept these unanswered (it halted while holding its flush lock);
    # nothing else would ever answer them, so the core rejects them with the stop reason.
    core = make_core()
    for i in range(4):
        append(core, plain(), waiter=f"w{i}")
    core.begin_flush(T0, owned=True)  # takes w0..w2
    core.uploading = False  # the driver's flush died without an outcome (a bug)
    out = core.begin_flush(T0 + 1, owned=False)
    assert answered(out) == [(["w0", "w1", "w2", "w3"], E.not_leader_or_follower)]
    assert out.forget and core.in_flight == []


def shutdown() -> StorageError:
    return StorageError("broker shutting down", E.not_leader_or_follower)


def test_stop_with_flush_closes_for_appends_and_its_reason_wins():
    core = make_core()
    for i in range(4):
        append(core, plain(), waiter=f"w{i}")
    reason = shutdown()
    assert core.begin_stop(reason, flush=True) is True
    assert core.begin_stop(deleted(), flush=True) is False  # once
    assert core.closed and core.stopped_by is reason
    with pytest.raises(StorageError) as refused:
        append(core, plain(), waiter="late")
    assert refused.value.code == E.not_leader_or_follower
    assert core.next_offset == 14

    # The final flush runs: the first segment commits, the rest fails to upload.
    assert answered(flush_and_commit(core)) == [(["w0", "w1", "w2"], None)]
    core.begin_flush(T0, owned=True)
    failed = core.flush_failed(RuntimeError("bucket unreachable"))
    assert answered(failed) == [(["w3"], E.not_leader_or_follower)]
    assert failed.answers[0].error is reason  # not KAFKA_STORAGE_ERROR

    out = core.halt(deleted())  # whatever halts it afterwards, the first reason stays
    assert answered(out) == [([], E.not_leader_or_follower)]
    assert core.stopped_by is reason
    assert core.refusal().code == E.not_leader_or_follower


def test_stop_without_flush_leaves_closing_to_halt():
    core = make_core()
    append(core, plain(), waiter="a")
    reason = deleted()
    assert core.begin_stop(reason, flush=False) is False
    assert core.closed is False and core.stopped_by is reason
    out = core.halt(shutdown())  # another reason: the first one is kept
    assert answered(out) == [(["a"], E.unknown_topic_or_partition)]
    assert out.answers[0].error is reason
    assert core.closed and core.stopped_by is reason
    assert core.refusal().code == E.unknown_topic_or_partition
    assert core.begin_stop(shutdown(), flush=True) is False  # already closed: nothing to flush


def test_halt_of_an_idle_log_answers_nobody():
    core = make_core()
    out = core.halt(deleted())
    assert answered(out) == [([], E.unknown_topic_or_partition)]
    assert out.notify_readers and core.closed
    assert core.begin_flush(T0, owned=True) is None


def test_buffered_batch_records_its_size_and_offsets():
    core = make_core()
    append(core, plain(2), plain(1), waiter="w")
    (b,) = core.buffer
    assert isinstance(b, BufferedBatch)
    assert (b.base_offset, b.nbytes, b.waiters) == (10, len(plain(2)) + len(plain(1)), ["w"])
