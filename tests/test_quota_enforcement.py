"""Client quotas enforced (#18): producer_byte_rate, consumer_byte_rate and
request_percentage answer with throttle_time_ms and mute the connection (KIP-219); a
confluent-kafka producer capped at a byte rate gets about that rate; clients without a
quota are not slowed."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import Producer

from kafscale.protocol.records import build_batch
from tests.support.raw import RawClient, error_code, req
from tests.test_quotas_telemetry import alter


@pytest.fixture(scope="module")
def qb(tmp_path_factory):
    from tests.support.broker import BrokerProcess

    # Rates over 3 one-second windows (Kafka's default is 11): a fresh client's allowance to
    # run ahead (the windows' worth at the start) is then 2 s of its quota, not 10 s
    b = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0", "--quota-window-num", "3"]).start()
    yield b
    b.stop()


def _throttle_ms(resp) -> float:
    t = resp.throttle_time
    return t.total_seconds() * 1000 if hasattr(t, "total_seconds") else t


def test_byte_rate_and_request_quotas_throttle_and_mute(qb):
    topic = "quota-raw"
    assert alter(qb.bootstrap, {"client-id": "slow-producer"}, {"producer_byte_rate": 1000}) == (0, None)
    assert alter(qb.bootstrap, {"client-id": "slow-consumer"}, {"consumer_byte_rate": 1000}) == (0, None)
    assert alter(qb.bootstrap, {"client-id": "busy"}, {"request_percentage": 0.01}) == (0, None)
    big = build_batch([(None, b"x" * 50_000)], timestamp=int(time.time() * 1000))  # read back below: 1970 is retention's to delete
    with RawClient(qb.bootstrap, client_id="free") as c:
        c.metadata([topic])
        p = req(0, 9, "PartitionProduceData", index=0, records=big)
        body = req(0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(req(0, 9, "TopicProduceData", name=topic, partition_data=(p,)),))
        r = c.request(0, 9, body)
        assert error_code(r.responses[0].partition_responses[0].error_code) == 0 and _throttle_ms(r) == 0
    with RawClient(qb.bootstrap, client_id="slow-producer", timeout=30) as c:
        r = c.request(0, 9, body)
        # 50 kB against 1 kB/s measured over at least 2 s: (25000 - 1000) / 1000 x 2.0 s,
        # capped at the 3 s the rate is measured over
        assert error_code(r.responses[0].partition_responses[0].error_code) == 0
        assert _throttle_ms(r) == 3_000
        # muted: the next request is read only when the throttle time is over
        started = time.monotonic()
        c.metadata([topic])
        assert time.monotonic() - started > 2
    with RawClient(qb.bootstrap, client_id="slow-consumer") as c:
        f = c.request(1, 12, req(1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                                 session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(req(1, 12, "FetchTopic", topic=topic, partitions=(
                                     req(1, 12, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                         log_start_offset=-1, partition_max_bytes=1 << 20),)),)))
        assert len(f.responses[0].partitions[0].records) > 50_000
        assert _throttle_ms(f) > 0
    with RawClient(qb.bootstrap, client_id="busy") as c:
        # 0.01 % of a thread is 0.1 ms of handling per second, 0.2 ms over the 2 s window:
        # one or a few Metadata requests take more
        throttles = []
        for _ in range(200):
            resp = c.request(3, 12, req(3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            throttles.append(_throttle_ms(resp))
            if throttles[-1] > 0:
                break
        assert throttles[-1] > 0, throttles


@pytest.mark.timeout(120)
def test_confluent_producer_capped_at_its_byte_rate(qb):
    """A producer with producer_byte_rate 200 kB/s, sending as fast as it can for 12 s, gets
    about 200 kB/s (the rate is measured over the last 3 windows, at least 2 s: the first
    2 s may run ahead, the average comes back to the quota)."""
    cap = 200_000
    assert alter(qb.bootstrap, {"client-id": "capped"}, {"producer_byte_rate": cap}) == (0, None)
    acked = [0]

    def run(client_id: str, seconds: float) -> float:
        acked[0] = 0
        p = Producer({"bootstrap.servers": qb.bootstrap, "client.id": client_id, "linger.ms": 5, "batch.size": 65536,
                      "queue.buffering.max.kbytes": 4096})

        def done(err, msg):
            if err is None:
                acked[0] += len(msg.value())

        value = b"v" * 10_000
        start = time.monotonic()
        while time.monotonic() - start < seconds:  # noqa: B023
            try:
                p.produce("quota-rate", value, on_delivery=done)
            except BufferError:
                p.poll(0.05)
            p.poll(0)
        elapsed = time.monotonic() - start
        counted = acked[0]  # what was acknowledged within the run
        # What is still queued or sent would take the capped producer 20 s more (4 MB at
        # 200 kB/s): dropped, not waited for (the rate is what was acknowledged in the run)
        p.purge(in_queue=True, in_flight=True)
        p.flush(60)
        return counted / elapsed

    capped = run("capped", 12.0)
    assert 0.5 * cap < capped < 1.5 * cap, f"{capped:.0f} B/s with a {cap} B/s quota"
    free = run("uncapped", 2.0)
    assert free > 3 * cap, f"{free:.0f} B/s without a quota"  # the cap, not the machine, held it back
