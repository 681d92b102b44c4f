"""Transactions end to end with confluent-kafka's transactional producer against a real broker:
committed records visible to a read_committed consumer and aborted ones not, zombie
fencing, the transaction timeout, and send_offsets_to_transaction."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def txb():
    b = BrokerProcess(extra_args=[
        "--transactions", "true", "--merge-interval-ms", "0", "--group-initial-rebalance-delay-ms", "0",
        "--transaction-abort-timed-out-transaction-cleanup-interval-ms", "300",
    ]).start()
    yield b
    b.stop()


def producer(b, tid: str, **extra) -> Producer:
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "linger.ms": 5, **extra})
    p.init_transactions(30)
    return p


def consume_all(b, topic: str, isolation: str, expect: int | None = None, timeout: float = 20.0) -> list[bytes]:
    """Every record of partition 0 up to the end the consumer sees, in order."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"read-{uuid.uuid4()}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and (expect is None or len(out) >= expect):
                    return out
                continue
            out.append(m.value())
        raise AssertionError(f"read {len(out)} records of {topic} ({isolation}) before the timeout: {out}")
    finally:
        c.close()


def test_commit_visible_abort_not(txb, topic_name):
    p = producer(txb, f"tx-{topic_name}")
    p.begin_transaction()
    for i in range(5):
        p.produce(topic_name, b"c-%d" % i)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic_name, b"a-%d" % i)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, b"c-last")
    p.commit_transaction(30)
    committed = [b"c-%d" % i for i in range(5)] + [b"c-last"]
    assert consume_all(txb, topic_name, "read_committed", expect=6) == committed
    assert consume_all(txb, topic_name, "read_uncommitted", expect=9) == committed[:5] + [b"a-0", b"a-1", b"a-2", b"c-last"]


def test_zombie_producer_is_fenced(txb, topic_name):
    tid = f"tx-{topic_name}"
    old = producer(txb, tid)
    old.begin_transaction()
    old.produce(topic_name, b"zombie")
    old.flush(30)
    new = producer(txb, tid)  # aborts the old producer's transaction, bumps the epoch
    with pytest.raises(KafkaException) as err:
        old.commit_transaction(30)
    assert err.value.args[0].fatal() or err.value.args[0].txn_requires_abort()
    assert err.value.args[0].name() in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
    new.begin_transaction()
    new.produce(topic_name, b"fresh")
    new.commit_transaction(30)
    assert consume_all(txb, topic_name, "read_committed", expect=1) == [b"fresh"]


def test_transaction_timeout_aborts_and_lso_moves_on(txb, topic_name):
    silent = producer(txb, f"tx-silent-{topic_name}", **{"transaction.timeout.ms": 1500})
    silent.begin_transaction()
    silent.produce(topic_name, b"never")
    silent.flush(30)
    other = producer(txb, f"tx-other-{topic_name}")
    other.begin_transaction()
    other.produce(topic_name, b"after")
    other.commit_transaction(30)
    # The silent producer's transaction is aborted after its timeout: the LSO passes it and
    # a read_committed consumer gets the later committed record.
    assert consume_all(txb, topic_name, "read_committed", expect=1, timeout=30) == [b"after"]
    with pytest.raises(KafkaException):
        silent.commit_transaction(30)


def test_send_offsets_to_transaction(txb, topic_name):
    group = f"g-{topic_name}"
    src = Producer({"bootstrap.servers": txb.bootstrap})
    for i in range(4):
        src.produce(topic_name, b"in-%d" % i)
    src.flush(30)
    out_topic = f"{topic_name}-out"
    c = Consumer({"bootstrap.servers": txb.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([topic_name])
    p = producer(txb, f"tx-{topic_name}")
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    assert [m.value() for m in got] == [b"in-%d" % i for i in range(4)]
    p.begin_transaction()
    for m in got:
        p.produce(out_topic, m.value().replace(b"in", b"out"))
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, got[-1].offset() + 1)], c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
    wait_until(lambda: c.committed([TopicPartition(topic_name, 0)], 5)[0].offset == 4, 20, "the transactional offset")
    c.close()
    assert consume_all(txb, out_topic, "read_committed", expect=4) == [b"out-%d" % i for i in range(4)]


def test_kafka_python_commit_and_abort(txb, topic_name):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    p = KafkaProducer(bootstrap_servers=txb.bootstrap, transactional_id=f"kp-{topic_name}")
    p.init_transactions()
    p.begin_transaction()
    p.send(topic_name, b"kp-c0", partition=0)
    p.send(topic_name, b"kp-c1", partition=0)
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic_name, b"kp-a0", partition=0)
    p.flush()
    p.abort_transaction()
    p.close()

    def read(isolation: str, n: int) -> list[bytes]:
        c = KafkaConsumer(bootstrap_servers=txb.bootstrap, isolation_level=isolation, auto_offset_reset="earliest",
                          enable_auto_commit=False, consumer_timeout_ms=3000)
        c.assign([KTP(topic_name, 0)])
        c.seek_to_beginning()
        out = []
        deadline = time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                out += [r.value for r in recs]
        c.close()
        return out

    assert read("read_committed", 2) == [b"kp-c0", b"kp-c1"]
    assert read("read_uncommitted", 3) == [b"kp-c0", b"kp-c1", b"kp-a0"]
    assert consume_all(txb, topic_name, "read_committed", expect=2) == [b"kp-c0", b"kp-c1"]


def test_aiokafka_commit_and_abort(txb, topic_name):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=txb.bootstrap, transactional_id=f"ap-{topic_name}")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(topic_name, b"ap-c0", partition=0)
            await p.begin_transaction()
            await p.send_and_wait(topic_name, b"ap-a0", partition=0)
            await p.abort_transaction()
            async with p.transaction():
                await p.send_and_wait(topic_name, b"ap-c1", partition=0)
        finally:
            await p.stop()

        async def read(isolation: str, n: int) -> list[bytes]:
            c = AIOKafkaConsumer(bootstrap_servers=txb.bootstrap, isolation_level=isolation,
                                 auto_offset_reset="earliest", enable_auto_commit=False)
            await c.start()
            try:
                c.assign([ATP(topic_name, 0)])
                await c.seek_to_beginning()
                out = []
                deadline = time.monotonic() + 20
                while len(out) < n and time.monotonic() < deadline:
                    for recs in (await c.getmany(timeout_ms=500)).values():
                        out += [r.value for r in recs]
                return out
            finally:
                await c.stop()

        assert await read("read_committed", 2) == [b"ap-c0", b"ap-c1"]
        assert await read("read_uncommitted", 3) == [b"ap-c0", b"ap-a0", b"ap-c1"]

    asyncio.run(go())


PROCESSOR = r"""
import sys
from confluent_kafka import Consumer, Producer, TopicPartition, KafkaException
bootstrap, src, dst, group, tid = sys.argv[1:6]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
c.assign([TopicPartition(src, 0)])  # position: the group's committed offset
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2})
p.init_transactions(60)
print("ready", flush=True)
while True:
    msgs = [m for m in c.consume(10, 0.5) if not m.error()]
    if not msgs:
        continue
    p.begin_transaction()
    for m in msgs:
        p.produce(dst, m.value().replace(b"in-", b"out-"))
    p.send_offsets_to_transaction([TopicPartition(src, 0, msgs[-1].offset() + 1)], c.consumer_group_metadata(), 60)
    p.commit_transaction(60)
"""


def test_consume_transform_produce_exactly_once_across_kill9(txb, topic_name):
    """A consume-transform-produce loop (read_committed consumer, transactional producer,
    send_offsets_to_transaction) killed with SIGKILL 10 times at random moments and
    restarted: the output holds each input record's result exactly once."""
    import random
    import signal
    import subprocess
    import sys

    n = 400
    src, dst, group, tid = topic_name, f"{topic_name}-out", f"g-{topic_name}", f"tx-{topic_name}"
    p = Producer({"bootstrap.servers": txb.bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(src, b"in-%d" % i)
    p.flush(30)
    rng = random.Random(15)

    def start():
        proc = subprocess.Popen([sys.executable, "-c", PROCESSOR, txb.bootstrap, src, dst, group, tid],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    for _ in range(10):
        proc = start()
        time.sleep(rng.uniform(0.05, 0.8))  # let it get somewhere, then kill it mid-flight
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = start()
    try:
        out = consume_all(txb, dst, "read_committed", expect=n, timeout=90)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert sorted(out) == sorted(b"out-%d" % i for i in range(n))
