"""The share partition state machine (share/partition.py) and the share session cache
(share/sessions.py), without I/O: acquisition, acknowledgement types, delivery counts and
their limit, lock expiry, the in-flight limit, gaps, log start moves, persistence, and
Kafka's session epoch rules and errors."""

from __future__ import annotations

import pytest

from kafscale.errors import ErrorCode, KafkaError
from kafscale.share.partition import Ack, Acquired, LogBatch, RecordState, SharePartition
from kafscale.share.sessions import ShareSessionCache

ACCEPT, RELEASE, REJECT, GAP, RENEW = 1, 2, 3, 0, 4
LOCK = 1_000


def batches(*ranges, deliverable=True):
    return [LogBatch(a, b, deliverable) for a, b in ranges]


def refused(code: ErrorCode, fn, *args):
    with pytest.raises(KafkaError) as e:
        fn(*args)
    assert e.value.code is code, e.value


def test_acquire_accept_and_the_start_offset_moves():
    sp = SharePartition(10)
    got = sp.acquire("a", 0, LOCK, batches((10, 14), (15, 19)), max_records=100)
    assert got == [Acquired(10, 19, 1)] and sp.end == 20
    # another member finds nothing new in the same batches
    assert sp.acquire("b", 0, LOCK, batches((10, 19)), max_records=100) == []
    refused(ErrorCode.invalid_record_state, sp.acknowledge, "b", [Ack(10, 10, (ACCEPT,))])
    sp.acknowledge("a", [Ack(10, 14, (ACCEPT,))])
    assert sp.spso == 15 and sp.counts()["acquired"] == 5
    # per-offset types; accepting again is INVALID_RECORD_STATE and changes nothing
    refused(ErrorCode.invalid_record_state, sp.acknowledge, "a", [Ack(15, 16, (ACCEPT,)), Ack(14, 14, (ACCEPT,))])
    assert sp.records[15].state is RecordState.ACQUIRED
    sp.acknowledge("a", [Ack(15, 19, (ACCEPT, REJECT, ACCEPT, GAP, ACCEPT))])
    assert (sp.spso, sp.end, sp.records) == (20, 20, {})
    refused(ErrorCode.invalid_request, sp.acknowledge, "a", [Ack(20, 22, (ACCEPT, ACCEPT))])


def test_release_redelivers_with_a_higher_count_until_the_limit_archives():
    sp = SharePartition(0, delivery_count_limit=3)
    for delivery in (1, 2, 3):
        member = f"m{delivery}"
        assert sp.next_fetch_offset() == 0
        assert sp.acquire(member, 0, LOCK, batches((0, 1)), max_records=10) == [Acquired(0, 1, delivery)]
        sp.acknowledge(member, [Ack(0, 1, (RELEASE,))])
    # the third release reached the limit: archived, never delivered again
    assert sp.spso == 2 and sp.acquire("m4", 0, LOCK, batches((0, 1)), max_records=10) == []


def test_lock_expiry_releases_and_counts():
    sp = SharePartition(0, delivery_count_limit=2)
    sp.acquire("a", 0, LOCK, batches((0, 4)), max_records=10)
    assert sp.next_deadline() == LOCK and sp.expire(LOCK - 1) == 0
    assert sp.expire(LOCK) == 5 and sp.counts()["available"] == 5
    refused(ErrorCode.invalid_record_state, sp.acknowledge, "a", [Ack(0, 0, (ACCEPT,))])
    assert sp.acquire("b", 2_000, LOCK, batches((0, 4)), max_records=10) == [Acquired(0, 4, 2)]
    assert sp.expire(3_000) == 5 and sp.spso == 5  # limit reached: archived


def test_release_member_and_max_records_in_whole_batches():
    sp = SharePartition(0)
    got = sp.acquire("a", 0, LOCK, batches((0, 2), (3, 5), (6, 8)), max_records=4)
    assert got == [Acquired(0, 5, 1)]  # whole batches: stops after reaching 4
    assert sp.release_member("a") == 6 and sp.next_fetch_offset() == 0
    assert sp.acquire("b", 0, LOCK, batches((0, 2)), max_records=1) == [Acquired(0, 2, 2)]


def test_record_limit_mode_acquires_no_more_than_max_records():
    sp = SharePartition(0)
    got = sp.acquire("a", 0, LOCK, batches((0, 9), (10, 19)), max_records=3, record_limit=True)
    # KIP-1206: exactly 3, the rest of the stored batch in flight and available
    assert got == [Acquired(0, 2, 1)] and sp.end == 10 and sp.counts()["available"] == 7
    assert sp.next_fetch_offset() == 3
    assert sp.acquire("b", 0, LOCK, batches((0, 9), (10, 19)), max_records=4, record_limit=True) == [Acquired(3, 6, 1)]
    # redelivery is limited too, and new records after the available ones
    sp.acknowledge("a", [Ack(0, 2, (RELEASE,))])
    got = sp.acquire("c", 0, LOCK, batches((0, 9), (10, 19)), max_records=8, record_limit=True)
    assert got == [Acquired(0, 2, 2), Acquired(7, 11, 1)] and sp.end == 20


def test_batch_size_cuts_acquired_ranges_at_stored_batches():
    sp = SharePartition(0)
    got = sp.acquire("a", 0, LOCK, batches((0, 2), (3, 5), (6, 8), (9, 11)), max_records=100, batch_size=5)
    # a range of 5 or more ends at the next stored batch: 0-5 (6 records), 6-11
    assert got == [Acquired(0, 5, 1), Acquired(6, 11, 1)]
    got = SharePartition(0).acquire("a", 0, LOCK, batches((0, 2), (3, 5)), max_records=100, batch_size=100)
    assert got == [Acquired(0, 5, 1)]


def test_renew_restarts_the_lock_and_changes_nothing_else():
    sp = SharePartition(0)
    sp.acquire("a", 0, LOCK, batches((0, 4)), max_records=10)
    assert sp.acknowledge("a", [Ack(0, 4, (RENEW,))], now=800, lock_ms=LOCK) is False  # nothing to persist
    assert sp.next_deadline() == 800 + LOCK and sp.expire(LOCK) == 0
    assert {r.delivery_count for r in sp.records.values()} == {1} and sp.counts()["acquired"] == 5
    # another member's records cannot be renewed; a mix renews some and accepts others
    refused(ErrorCode.invalid_record_state, sp.acknowledge, "b", [Ack(0, 0, (RENEW,))], 900, LOCK)
    assert sp.acknowledge("a", [Ack(0, 4, (ACCEPT, RENEW, ACCEPT, ACCEPT, ACCEPT))], 1_500, LOCK) is True
    assert sp.spso == 1 and sp.next_deadline() == 1_500 + LOCK
    assert sp.expire(1_500 + LOCK) == 1 and sp.counts()["available"] == 1


def test_in_flight_limit_gaps_and_undeliverable_batches():
    sp = SharePartition(0, max_in_flight=4)
    assert sp.acquire("a", 0, LOCK, batches((0, 2), (3, 5)), max_records=100) == [Acquired(0, 5, 1)]
    assert not sp.has_available(100)
    assert sp.acquire("a", 0, LOCK, batches((6, 8)), max_records=100) == []  # 6 in flight >= 4
    sp.acknowledge("a", [Ack(0, 5, (ACCEPT,))])
    # offsets 6-9 are not in the log (compacted), 10 is a control batch: archived, never delivered
    got = sp.acquire("a", 0, LOCK, [LogBatch(10, 10, False), LogBatch(11, 12)], max_records=100)
    assert got == [Acquired(11, 12, 1)] and sp.spso == 11 and sp.counts()["archived"] == 0


def test_log_start_past_the_start_offset_moves_it():
    sp = SharePartition(0)
    sp.acquire("a", 0, LOCK, batches((0, 9)), max_records=100)
    assert sp.move_start(5) and sp.spso == 5 and min(sp.records) == 5
    assert sp.acquire("b", 0, LOCK, batches((20, 21)), max_records=100, log_start=20) == [Acquired(20, 21, 1)]
    assert sp.spso == 20


def test_persisted_doc_keeps_done_records_and_makes_acquired_available():
    sp = SharePartition(0, delivery_count_limit=2)
    sp.acquire("a", 0, LOCK, batches((0, 5)), max_records=100)
    sp.acknowledge("a", [Ack(1, 1, (ACCEPT,)), Ack(2, 2, (RELEASE,)), Ack(3, 3, (REJECT,))])
    doc = sp.to_doc()
    assert doc == dict(start_offset=0, end_offset=6, records=[[0, 0, 0, 1], [1, 1, 2, 1], [2, 2, 0, 1], [3, 3, 4, 1], [4, 5, 0, 1]])
    back = SharePartition.from_doc(doc, delivery_count_limit=2)
    got = back.acquire("b", 0, LOCK, batches((0, 5)), max_records=100)
    assert got == [Acquired(0, 0, 2), Acquired(2, 2, 2), Acquired(4, 5, 2)]  # never 1 or 3
    # a record delivered as often as allowed before the crash is not delivered again
    sp.expire(LOCK)
    assert len(sp.acquire("c", LOCK, LOCK, batches((0, 5)), max_records=100)) == 3  # 0, 2, 4-5, second delivery
    assert SharePartition.from_doc(sp.to_doc(), delivery_count_limit=2).acquire("d", 0, LOCK, batches((0, 5)), 100) == []


def test_share_sessions_epochs_and_errors():
    cache = ShareSessionCache(max_sessions=1, idle_ms=10_000)
    key = ("g", "m")
    tp = ("topic-id", 0)
    s, closing = cache.fetch(key, 0, 0, {tp}, set(), fetching=True)
    assert (s.epoch, s.partitions, closing) == (1, {tp}, False)
    refused(ErrorCode.invalid_share_session_epoch, cache.fetch, key, 5, 0, set(), set(), True)
    refused(ErrorCode.share_session_not_found, cache.fetch, ("g", "other"), 1, 0, set(), set(), True)
    refused(ErrorCode.share_session_limit_reached, cache.fetch, ("g", "other"), 0, 0, set(), set(), True)
    s, _ = cache.fetch(key, 1, 0, set(), {tp}, fetching=True)
    assert (s.epoch, s.partitions) == (2, set())
    s, _ = cache.acknowledge(key, 2, 0)
    assert s.epoch == 3
    refused(ErrorCode.invalid_share_session_epoch, cache.acknowledge, key, 0, 0)
    refused(ErrorCode.invalid_request, cache.fetch, key, -1, 0, {tp}, set(), True)
    s, closing = cache.acknowledge(key, -1, 0)
    assert closing and key not in cache.sessions
    refused(ErrorCode.share_session_not_found, cache.acknowledge, key, -1, 0)
    cache.fetch(key, 0, 0, set(), set(), fetching=False)
    assert [x.key for x in cache.evict_idle(10_000)] == [key]


def test_share_lag_counts_waiting_records_of_the_window_and_past_it():
    from kafscale.broker.handlers.share_offsets import share_lag

    # window 10..19: 10-12 acknowledged, 13-14 available (or acquired), 15 archived, 16-19 no run (archived)
    doc = {"start_offset": 10, "end_offset": 20, "records": [[10, 12, 2, 1], [13, 14, 0, 1], [15, 15, 4, 5]]}
    assert share_lag(doc, 25) == 2 + 5
    assert share_lag(doc, 14) == 1  # only 13 is below the high watermark
    assert share_lag({"start_offset": 7, "end_offset": 7, "records": []}, 7) == 0
