"""Round trips through real clients, shared by tests that only vary how a client connects."""

from __future__ import annotations

import asyncio
import subprocess
import threading

from confluent_kafka import Consumer, Producer

from tests.support.wait import wait_until


def confluent_roundtrip(conf: dict, topic: str, n: int = 3) -> list[bytes]:
    """Produce n records to `topic` with confluent-kafka under `conf` (security settings
    included), then read them back from the beginning with a consumer of the same conf."""
    p = Producer(conf)
    for i in range(n):
        p.produce(topic, value=f"{topic}-{i}".encode())
    assert p.flush(20) == 0
    c = Consumer({**conf, "group.id": f"{topic}-g", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    try:
        def more() -> bool:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
            return len(got) >= n
        wait_until(more, 30, f"{n} records from {topic}")
    finally:
        c.close()
    return got


def kafka_python_roundtrip(topic: str, n: int = 3, **conf) -> list[bytes]:
    """kafka-python's producer sends kp-0..kp-{n-1} to `topic` under `conf` (connection
    settings), its consumer of the same conf reads them back from the beginning."""
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(**conf)
    for i in range(n):
        p.send(topic, f"kp-{i}".encode()).get(20)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=15000, **conf)
    got = [m.value for _, m in zip(range(n), c)]
    c.close()
    return got


def aiokafka_roundtrip(topic: str, n: int = 3, **conf) -> list[bytes]:
    """aiokafka's producer sends ak-0..ak-{n-1} to `topic` under `conf` (connection
    settings), its consumer of the same conf reads them back from the beginning."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(**conf)
        await p.start()
        try:
            for i in range(n):
                await p.send_and_wait(topic, f"ak-{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **conf)
        await c.start()
        try:
            out: list[bytes] = []
            while len(out) < n:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 20)
                out += [m.value for msgs in batch.values() for m in msgs]
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


def kcat_roundtrip(args: list[str], topic: str, read_args: list[str] | None = None) -> list[bytes]:
    """kcat with connection `args` produces "one" and "two" to `topic`; kcat with
    `read_args` (default: the same) reads the topic to its end."""
    subprocess.run(["kcat", "-P", *args, "-t", topic], input=b"one\ntwo\n", check=True, timeout=30)
    out = subprocess.run(["kcat", "-C", *(read_args or args), "-t", topic, "-e", "-f", "%s\n"], capture_output=True, check=True, timeout=30)
    return out.stdout.split()


class AckedLoad:
    """A producer thread sending to partitions 0..partitions-1 of `topic` round robin, as
    fast as its queue takes records, until `stop()`; `acked` holds {(partition, offset):
    value} of every record the broker acknowledged (values `prefix` + a running number)."""

    def __init__(self, conf: dict, topic: str, partitions: int, prefix: str, poll_s: float = 0.001, flush_s: float = 10):
        self.acked: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(conf, topic, partitions, prefix, poll_s, flush_s), daemon=True)

    def start(self) -> AckedLoad:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> dict[tuple[int, int], bytes]:
        """Stops the producer (after flushing what it can) and returns what was acknowledged."""
        self._stop.set()
        self._thread.join(timeout)
        with self._lock:
            return dict(self.acked)

    def _run(self, conf: dict, topic: str, partitions: int, prefix: str, poll_s: float, flush_s: float) -> None:
        p = Producer(conf)

        def done(err, msg):
            if err is None:
                with self._lock:
                    self.acked[(msg.partition(), msg.offset())] = msg.value()

        i = 0
        while not self._stop.is_set():
            try:
                p.produce(topic, value=f"{prefix}{i}".encode(), partition=i % partitions, on_delivery=done)
                i += 1
            except BufferError:
                pass
            p.poll(poll_s)
        p.flush(flush_s)
