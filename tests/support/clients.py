"""Round trips through real clients, shared by tests that only vary how a client connects."""

from __future__ import annotations

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
