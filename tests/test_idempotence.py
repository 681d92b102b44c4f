"""Idempotent producers: InitProducerId, duplicate suppression, sequence and epoch errors,
and state surviving a kill -9 of the broker."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kafscale.protocol import records
from tests.support.raw import RawClient, error_code, req

INIT_PRODUCER_ID = 22
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, UNKNOWN_PRODUCER_ID = 45, 47, 59


def init_producer_id(client: RawClient, producer_id: int = -1, epoch: int = -1, version: int = 4):
    resp = client.request(INIT_PRODUCER_ID, version, req(INIT_PRODUCER_ID, version, transactional_id=None, transaction_timeout=60000, producer_id=producer_id, producer_epoch=epoch))
    assert error_code(resp.error_code) == 0
    return resp.producer_id, resp.producer_epoch


def idem_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return records.build_batch([(None, v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=int(time.time() * 1000))


def fetch_values(client: RawClient, topic: str, offset: int = 0) -> list[tuple[int, bytes]]:
    data = client.fetch(topic, 0, offset).records or b""
    out = []
    for pos, h in records.iter_batches(data):
        out += [(r.offset, r.value) for r in records.decode_records(data, pos, h)]
    return out


def test_producer_ids_are_unique_with_epoch_0(broker):
    with RawClient(broker.bootstrap) as c:
        given = [init_producer_id(c) for _ in range(5)]
        pid, epoch = given[0]
        # Without a transactional id the sent id/epoch are ignored (no KIP-360 bump): a new id.
        given.append(init_producer_id(c, pid, epoch))
        assert len({p for p, _ in given}) == 6
        assert {e for _, e in given} == {0}


def test_retried_batch_is_acknowledged_with_original_offset_and_stored_once(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        pid, epoch = init_producer_id(c)
        first = idem_batch([b"a", b"b"], pid, epoch, 0)
        r1 = c.produce(topic_name, 0, first)
        assert error_code(r1.error_code) == 0
        r2 = c.produce(topic_name, 0, idem_batch([b"c"], pid, epoch, 2))
        assert (error_code(r2.error_code), r2.base_offset) == (0, r1.base_offset + 2)
        again = c.produce(topic_name, 0, first)  # a retry of the first batch
        assert (error_code(again.error_code), again.base_offset) == (0, r1.base_offset)
        assert fetch_values(c, topic_name) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_sequence_gap_stale_epoch_and_unknown_producer(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        pid, epoch = init_producer_id(c)
        assert error_code(c.produce(topic_name, 0, idem_batch([b"x"], pid, epoch, 0)).error_code) == 0
        gap = c.produce(topic_name, 0, idem_batch([b"y"], pid, epoch, 5))
        assert error_code(gap.error_code) == OUT_OF_ORDER_SEQUENCE_NUMBER
        # A producer that bumps its epoch itself (as idempotent clients do) restarts at 0.
        assert error_code(c.produce(topic_name, 0, idem_batch([b"z"], pid, epoch + 1, 0)).error_code) == 0
        stale = c.produce(topic_name, 0, idem_batch([b"old"], pid, epoch, 1))
        assert error_code(stale.error_code) == INVALID_PRODUCER_EPOCH
        unknown = c.produce(topic_name, 0, idem_batch([b"?"], 999_999_999, 0, 7))
        assert error_code(unknown.error_code) == UNKNOWN_PRODUCER_ID
        assert [v for _, v in fetch_values(c, topic_name)] == [b"x", b"z"]


def _consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 20.0) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "idem-check", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append((m.offset(), m.value()))
    # linger a little to see anything beyond what we expected (duplicates)
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        m = c.poll(0.1)
        if m is not None and not m.error():
            got.append((m.offset(), m.value()))
    c.close()
    return got


def test_clients_with_idempotence_on_get_each_record_once_in_order(broker, topic_name):
    import aiokafka
    import kafka

    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 1})
    for i in range(300):
        p.produce(topic_name, value=b"ck-%d" % i)
    assert p.flush(15) == 0
    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotence on by default in 3.x
    for i in range(100):
        kp.send(topic_name, b"kp-%d" % i).get(10)
    kp.close()

    async def aio():
        ap = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await ap.start()
        try:
            for i in range(100):
                await ap.send_and_wait(topic_name, b"ap-%d" % i)
        finally:
            await ap.stop()

    asyncio.run(aio())
    got = _consume_all(broker.bootstrap, topic_name, 500)
    expected = [b"ck-%d" % i for i in range(300)] + [b"kp-%d" % i for i in range(100)] + [b"ap-%d" % i for i in range(100)]
    assert [v for _, v in got] == expected
    assert [o for o, _ in got] == list(range(500))


def test_transactional_producer_fails_at_start_without_transactions(broker_factory):
    b = broker_factory(extra_args=["--transactions", "false"])
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "tx-1", "transaction.timeout.ms": 5000})
    with pytest.raises(KafkaException):
        p.init_transactions(10)


def test_state_survives_kill9_and_retries_do_not_duplicate(broker_factory, topic_name):
    b = broker_factory()
    with RawClient(b.bootstrap) as c:
        c.metadata([topic_name])
        pid, epoch = init_producer_id(c)
        first = idem_batch([b"one", b"two"], pid, epoch, 0)
        assert error_code(c.produce(topic_name, 0, first).error_code) == 0
    # A producer sending continuously while the broker dies and comes back.
    acked: list[bytes] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 60000, "reconnect.backoff.max.ms": 200})

    def on_delivery(err, msg):
        if err is None:
            acked.append(msg.value())

    for i in range(2000):
        p.produce(topic_name, value=b"m-%d" % i, on_delivery=on_delivery)
        if i == 1000:
            p.poll(0)
            b.kill9()
            b.start()
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    with RawClient(b.bootstrap) as c:
        again = c.produce(topic_name, 0, first)  # retry of a batch acknowledged before the crash
        assert (error_code(again.error_code), again.base_offset) == (0, 0)
    got = _consume_all(b.bootstrap, topic_name, 2 + len(acked))
    values = [v for _, v in got]
    assert values[:2] == [b"one", b"two"]
    assert len(values) == len(set(values)), "a record was stored twice"
    assert set(acked) <= set(values), "an acknowledged record was lost"
    assert [o for o, _ in got] == list(range(len(got)))
