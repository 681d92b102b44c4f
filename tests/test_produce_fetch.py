"""Produce / Fetch / ListOffsets semantics: offsets by timestamp (offsets_for_times in
confluent-kafka and kafka-python, raw ListOffsets with MAX_TIMESTAMP), earliest/latest,
LogAppendTime, fetch edge cases, long polling and concurrent producers."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.raw import RawClient, error_code
from tests.support.stored import stored_segments
from tests.support.wait import wait_until
from tests.support.broker import wait_for_leader

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 1, 3


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(15)


def produce_timestamped(bootstrap: str, topic: str, groups: list[list[tuple[bytes, int]]]) -> list[int]:
    """Produce (value, timestamp) records; each group is flushed on its own (so it lands in
    its own segment). Returns the offsets."""
    # a long linger and a flush per group: each group leaves as one batch in one request
    # (flush() sends at once), whatever the scheduling of this process
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2000, "acks": "all"})
    wait_for_leader(p, topic)
    offsets: list[int] = []
    for group in groups:
        reports = {}
        for i, (value, ts) in enumerate(group):
            p.produce(topic, value=value, timestamp=ts, partition=0,
                      on_delivery=lambda err, msg, i=i: reports.__setitem__(i, (err, msg.offset())))
        assert p.flush(15) == 0
        assert all(reports[i][0] is None for i in range(len(group))), reports
        offsets += [reports[i][1] for i in range(len(group))]
    return offsets


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def timestamped_topic(broker, topic_name):
    """10 records over 3 segments, timestamps not monotonic: offset 6 holds the maximum."""
    base = now_ms() - 600_000  # ten minutes ago: well inside the default retention
    ts = [base + d for d in (0, 1000, 2000, 3000, 4000, 5000, 9000, 6000, 7000, 8000)]
    create_topic(broker.bootstrap, topic_name)
    values = [f"ts-{i}".encode() for i in range(10)]
    recs = list(zip(values, ts))
    offsets = produce_timestamped(broker.bootstrap, topic_name, [recs[:4], recs[4:7], recs[7:]])
    assert offsets == list(range(10))
    # At least one segment per group (the lookups below cross segments), its own object or
    # a write-ahead piece. More is possible: librdkafka sent a group's first record in a
    # request of its own once in a full run (4 segments: offsets 0, 1-3, 4-6, 7-9), which
    # the broker stored correctly.
    assert len(stored_segments(broker.data_dir, topic_name)) >= 3
    return topic_name, ts


def expected_offset_for(ts: list[int], target: int) -> int:
    """Kafka semantics: the earliest offset whose timestamp is >= target (-1: none)."""
    return next((i for i, t in enumerate(ts) if t >= target), -1)


def test_offsets_for_times_confluent(broker, timestamped_topic):
    topic, ts = timestamped_topic
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        targets = [ts[0] - 10_000, ts[0], ts[0] + 1, ts[3], ts[5] + 500, ts[6], ts[6] - 1, ts[9] + 1, ts[6] + 1]
        # one lookup per call: librdkafka merges duplicate partitions in one request
        got = [c.offsets_for_times([TopicPartition(topic, 0, t)], timeout=10)[0] for t in targets]
        expected = [expected_offset_for(ts, t) for t in targets]
        assert expected == [0, 0, 1, 3, 6, 6, 6, 6, -1]  # the fixture's shape
        assert [g.offset for g in got] == expected
        assert all(g.error is None for g in got)
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        assert (lo, hi) == (0, 10)
    finally:
        c.close()


def test_offsets_for_times_kafka_python(broker, timestamped_topic):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic, ts = timestamped_topic
    tp = KTP(topic, 0)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        for target in (ts[0] - 1, ts[2], ts[4] + 1, ts[7] - 1, ts[8] + 1):
            r = c.offsets_for_times({tp: target})[tp]
            exp = expected_offset_for(ts, target)
            assert r is not None and r.offset == exp and r.timestamp == ts[exp], (target, r)
        assert c.offsets_for_times({tp: ts[6] + 1})[tp] is None  # nothing that late
        assert c.beginning_offsets([tp])[tp] == 0
        assert c.end_offsets([tp])[tp] == 10
    finally:
        c.close()


def test_list_offsets_raw_earliest_latest_max_timestamp(broker, timestamped_topic):
    topic, ts = timestamped_topic
    with RawClient(broker.bootstrap) as c:
        for v in (1, 4, 7, 8):
            e = c.list_offsets(topic, 0, EARLIEST, version=v)
            lt = c.list_offsets(topic, 0, LATEST, version=v)
            assert error_code(e.error_code) == 0 and e.offset == 0
            assert error_code(lt.error_code) == 0 and lt.offset == 10
        m = c.list_offsets(topic, 0, MAX_TIMESTAMP, version=7)
        assert error_code(m.error_code) == 0
        assert (m.offset, m.timestamp) == (6, max(ts))
        by_ts = c.list_offsets(topic, 0, ts[4] + 1, version=7)
        assert (by_ts.offset, by_ts.timestamp) == (5, ts[5])
        late = c.list_offsets(topic, 0, max(ts) + 1, version=7)
        assert error_code(late.error_code) == 0 and (late.offset, late.timestamp) == (-1, -1)


def test_max_timestamp_on_empty_partition(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        m = c.list_offsets(topic_name, 0, MAX_TIMESTAMP, version=7)
        assert error_code(m.error_code) == 0 and (m.offset, m.timestamp) == (-1, -1)
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 0
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0


def test_log_append_time(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, {"message.timestamp.type": "LogAppendTime"})
    before = now_ms()
    offsets = produce_timestamped(broker.bootstrap, topic_name, [[(b"a", 1_000), (b"b", 2_000)], [(b"c", 3_000)]])
    after = now_ms()
    assert offsets == [0, 1, 2]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        msgs = []
        deadline = time.monotonic() + 10
        while len(msgs) < 3 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                msgs.append(m)
        assert [m.value() for m in msgs] == [b"a", b"b", b"c"]
        for m in msgs:
            kind, t = m.timestamp()
            assert kind == TIMESTAMP_LOG_APPEND_TIME and before - 1000 <= t <= after + 1000, m.timestamp()
        # the create times (1970) are gone: a lookup by a time before the append finds offset 0
        got = c.offsets_for_times([TopicPartition(topic_name, 0, before - 1000)], timeout=10)
        assert got[0].offset == 0
    finally:
        c.close()


def test_create_time_kept_as_sent(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    t0 = now_ms() - 3_600_000
    produce_timestamped(broker.bootstrap, topic_name, [[(b"x", t0), (b"y", t0 + 7)]])
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        msgs = []
        deadline = time.monotonic() + 10
        while len(msgs) < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                msgs.append(m)
        assert [m.timestamp() for m in msgs] == [(TIMESTAMP_CREATE_TIME, t0), (TIMESTAMP_CREATE_TIME, t0 + 7)]
    finally:
        c.close()


# ---------------------------------------------------------------------------------------
# raw produce / fetch


def test_multi_batch_produce_and_fetch_edges(broker, topic_name):
    ts = now_ms()
    create_topic(broker.bootstrap, topic_name, 2)
    with RawClient(broker.bootstrap) as c:
        b1 = build_batch([(b"k1", b"v1"), (b"k2", b"v2"), (None, b"v3")], timestamp=ts)
        b2 = build_batch([(b"k4", None)], timestamp=ts)
        r = c.produce(topic_name, 0, b1 + b2)
        assert error_code(r.error_code) == 0 and r.base_offset == 0 and r.log_start_offset == 0
        r = c.produce(topic_name, 0, build_batch([(b"k5", b"v5")], timestamp=ts))
        assert r.base_offset == 4
        r = c.produce(topic_name, 1, build_batch([(b"p1", b"p1")], timestamp=ts))
        assert error_code(r.error_code) == 0 and r.base_offset == 0

        # from the middle of a batch: the whole batch comes back, the offsets are exact
        p = c.fetch(topic_name, 0, 1)
        assert error_code(p.error_code) == 0 and p.high_watermark == 5 and p.log_start_offset == 0
        recs = [r for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)]
        assert [(r.offset, r.key, r.value) for r in recs] == [
            (0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, None, b"v3"), (3, b"k4", None), (4, b"k5", b"v5")]
        # at the high watermark: no records, no error
        p = c.fetch(topic_name, 0, 5, max_wait_ms=10)
        assert error_code(p.error_code) == 0 and p.records in (b"", None) and p.high_watermark == 5
        # past it: OFFSET_OUT_OF_RANGE
        p = c.fetch(topic_name, 0, 6, max_wait_ms=10)
        assert error_code(p.error_code) == OFFSET_OUT_OF_RANGE
        # a tiny byte limit still returns the first batch whole (KIP-74)
        p = c.fetch(topic_name, 0, 0, max_bytes=10)
        hs = [h for _pos, h in iter_batches(p.records)]
        assert len(hs) >= 1 and hs[0].base_offset == 0 and hs[0].record_count == 3
        # the other partition is independent
        p = c.fetch(topic_name, 1, 0)
        recs = [r for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)]
        assert [(r.offset, r.value) for r in recs] == [(0, b"p1")]


def test_acks_zero_then_acks_one_offsets_continue(broker, topic_name):
    ts = now_ms()
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        for i in range(3):
            assert c.produce(topic_name, 0, build_batch([(None, f"z{i}".encode())], timestamp=ts), acks=0) is None
        r = c.produce(topic_name, 0, build_batch([(None, b"one")], timestamp=ts), acks=1)
        assert error_code(r.error_code) == 0 and r.base_offset == 3
        wait_until(lambda: c.list_offsets(topic_name, 0, LATEST).offset >= 4, 10, "the acks=0 records to be durable", interval=0.05)
        p = c.fetch(topic_name, 0, 0)
        recs = [r for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)]
        assert [(r.offset, r.value) for r in recs] == [(0, b"z0"), (1, b"z1"), (2, b"z2"), (3, b"one")]


def test_fetch_long_poll_wakes_on_produce(broker, topic_name):
    ts = now_ms()
    create_topic(broker.bootstrap, topic_name)
    result = {}

    def waiter():
        with RawClient(broker.bootstrap) as c:
            started = time.monotonic()
            result["p"] = c.fetch(topic_name, 0, 0, max_wait_ms=5000)
            result["elapsed"] = time.monotonic() - started

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    with RawClient(broker.bootstrap) as c:
        assert c.produce(topic_name, 0, build_batch([(b"k", b"wake")], timestamp=ts)).base_offset == 0
    t.join(10)
    assert not t.is_alive()
    p = result["p"]
    recs = [r for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)]
    assert [(r.offset, r.value) for r in recs] == [(0, b"wake")]
    assert result["elapsed"] < 4.0, "the fetch waited out max_wait instead of waking on new data"


def test_fetch_long_poll_times_out_empty(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        started = time.monotonic()
        p = c.fetch(topic_name, 0, 0, max_wait_ms=400)
        elapsed = time.monotonic() - started
    assert error_code(p.error_code) == 0 and not p.records
    assert 0.3 <= elapsed < 3.0, elapsed


def test_concurrent_producers_get_unique_contiguous_offsets(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    n_threads, per_thread = 4, 150
    reports: dict[int, list] = {}

    def run(tid: int):
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", "batch.num.messages": 20})
        mine = []
        for i in range(per_thread):
            p.produce(topic_name, value=f"{tid}-{i}".encode(), partition=0,
                      on_delivery=lambda err, msg: mine.append((err, msg.offset(), msg.value())))
            p.poll(0)
        assert p.flush(20) == 0
        reports[tid] = mine

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(reports) == n_threads
    all_offsets = []
    for tid, mine in reports.items():
        assert all(err is None for err, _o, _v in mine)
        # each producer's records in its send order (one connection, in-order delivery)
        by_value = {v: o for _e, o, v in mine}
        offs = [by_value[f"{tid}-{i}".encode()] for i in range(per_thread)]
        assert offs == sorted(offs)
        all_offsets += offs
    assert sorted(all_offsets) == list(range(n_threads * per_thread))
    # what a consumer reads matches the delivery reports exactly
    expected = {o: v for mine in reports.values() for _e, o, v in mine}
    got = {}
    with RawClient(broker.bootstrap) as c:
        offset = 0
        while offset < n_threads * per_thread:
            p = c.fetch(topic_name, 0, offset)
            for pos, h in iter_batches(p.records):
                for r in decode_records(p.records, pos, h):
                    got[r.offset] = r.value
                offset = h.last_offset + 1
    assert got == expected


def test_unknown_partition_on_fetch_and_list_offsets(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        assert error_code(c.fetch(topic_name, 7, 0, max_wait_ms=10).error_code) == UNKNOWN_TOPIC_OR_PARTITION
        assert error_code(c.list_offsets(topic_name, 7, LATEST).error_code) == UNKNOWN_TOPIC_OR_PARTITION
