"""Fetch paths across segment boundaries with byte budgets smaller than a segment: every
offset comes back exactly once, in order (a budget ending inside a segment must not skip
to the next one)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, TopicPartition

from kafscale.protocol import records
from tests.support.raw import RawClient, error_code


def test_small_fetch_budgets_walk_every_offset(broker, topic_name):
    # Each produce request carries 50 batches of uneven sizes, so each segment holds many
    # batches and a 64 KiB budget ends in the middle of a segment with room to spare.
    n, per_request = 20_000, 50
    sizes = [1, 120, 3, 60, 1, 1]
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        i = k = 0
        while i < n:
            batches = []
            for _ in range(per_request):
                size = min(sizes[k % len(sizes)], n - i)
                k += 1
                if size <= 0:
                    break
                batch = [(None, b"%06d" % j + b"x" * 94) for j in range(i, i + size)]
                batches.append(records.build_batch(batch, timestamp=int(time.time() * 1000)))
                i += size
            assert error_code(c.produce(topic_name, 0, b"".join(batches)).error_code) == 0
    # raw fetches with a partition budget far below the segment size
    offset, seen = 0, []
    with RawClient(broker.bootstrap) as c:
        while offset < n:
            pd = c.fetch(topic_name, 0, offset, max_bytes=64 * 1024)
            assert error_code(pd.error_code) == 0
            data = pd.records
            assert data, f"empty fetch at {offset}"
            for pos, h in records.iter_batches(data):
                for r in records.decode_records(data, pos, h):
                    if r.offset >= offset:
                        seen.append(r.offset)
            offset = seen[-1] + 1
    assert seen == list(range(n))
    # and a real consumer with a small max.partition.fetch.bytes
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "fp", "enable.auto.commit": False, "max.partition.fetch.bytes": 50_000})
    c.assign([TopicPartition(topic_name, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        for m in c.consume(5000, 0.2):
            if not m.error():
                got.append((m.offset(), int(m.value()[:6])))
    c.close()
    assert got == [(i, i) for i in range(n)]
