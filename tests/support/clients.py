"""Round trips through real clients, shared by tests that only vary how a client connects."""

from __future__ import annotations

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
