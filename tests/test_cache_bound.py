"""--cache-bytes is the ceiling of what the segment cache holds, batch tables included.

Segments of one-record batches of 100 bytes are the worst case: as lists of Python ints
the batch table cost about as much as the bytes themselves, uncounted, so the cache held
nearly twice its budget. Measured with tracemalloc on real views of real batches.
"""

from __future__ import annotations

import os
import time
import tracemalloc
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol.records import build_batch
from kafscale.storage.cache import SegmentCache, SegmentView
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.reader import SegmentReader
from tests.support.broker import free_port

MiB = 1024 * 1024


def tiny_batch_segment(base: int, batches: int) -> bytes:
    return b"".join(build_batch([(None, b"v" * 100)], base_offset=base + i) for i in range(batches))


def test_cache_of_tiny_batches_stays_within_its_budget():
    budget = 4 * MiB
    segments = [tiny_batch_segment(i * 2000, 2000) for i in range(40)]  # 40 x 340 KB: 3x the budget
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = SegmentCache(budget)
        for i, seg in enumerate(segments):
            # The view's bytes are a copy made for the cache (as a flush's joined body is).
            cache.put(("t", 0, i * 2000), SegmentView(i * 2000, bytes(bytearray(seg))))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.bytes <= budget
    # Within 5% of the budget: what the cache counts is what it holds.
    assert held <= budget * 1.05, f"cache holds {held / MiB:.2f} MiB for a budget of {budget / MiB:.0f} MiB"
    view = cache.get(("t", 0, 39 * 2000))
    assert view is not None and view.read(39 * 2000 + 5, 1000, True)  # the table still finds batches


def test_cache_gives_way_to_segment_data_held_outside_it():
    held = [0]
    cache = SegmentCache(4 * MiB, held_outside=lambda: held[0])
    segments = [tiny_batch_segment(i * 2000, 2000) for i in range(12)]  # 12 x 340 KB
    for i, seg in enumerate(segments[:8]):
        cache.put(("t", 0, i * 2000), SegmentView(i * 2000, seg))
    assert 2 * MiB < cache.bytes <= 4 * MiB
    held[0] = 3 * MiB  # produce requests waiting to become durable
    for i, seg in enumerate(segments[8:], start=8):
        cache.put(("t", 0, i * 2000), SegmentView(i * 2000, seg))
        assert cache.bytes + held[0] <= 4 * MiB
    held[0] = 8 * MiB  # more than the whole budget: the newest view alone stays
    cache.put(("t", 1, 0), SegmentView(0, segments[0]))
    assert cache.contains(("t", 1, 0)) and not cache.contains(("t", 0, 11 * 2000))
    assert cache.bytes < 1 * MiB


def test_a_flushed_batch_is_cached_from_its_frame_only_when_it_fills_it():
    reader = SegmentReader(None, "ns", 64 * MiB, StorageMetrics())
    batch = build_batch([(None, b"v" * 1000)] * 200, base_offset=0)
    # A produce frame holding one partition's batch behind a small request header.
    frame = bytearray(b"h" * 100 + batch)
    reader.cache_segment("t", 0, 0, [memoryview(frame)[100:]])
    view = reader.cache.get(("t", 0, 0))
    assert view.data.obj is frame and view.data.readonly  # no copy, and no writer through the cache
    assert bytes(view.data) == batch and view.read(150, 1 << 20, True)
    # The same batch as a small part of a larger frame (other partitions' batches): copied,
    # so the cache never keeps a frame much larger than the bytes it counts.
    big = bytearray(b"o" * (4 * len(batch)) + batch)
    reader.cache_segment("t", 1, 0, [memoryview(big)[4 * len(batch) :]])
    view = reader.cache.get(("t", 1, 0))
    assert view.data.obj is not big and bytes(view.data) == batch
    # The batch filling the frame, but the frame in a buffer allocated twice as large (a
    # reused frame buffer, broker/memory.py FramePool): the buffer's allocation counts.
    roomy = bytearray(b"h" * 100 + batch + b"x" * (len(batch) + 100))
    del roomy[100 + len(batch) :]  # shorter, same allocation
    assert roomy.__alloc__() > 2 * len(batch)
    reader.cache_segment("t", 2, 0, [memoryview(roomy)[100:]])
    view = reader.cache.get(("t", 2, 0))
    assert view.data.obj is not roomy and bytes(view.data) == batch


def _scrape(url: str) -> dict[str, float]:
    """Every sample of one /metrics answer (made in one pass on the broker's event loop, so
    its values are of one moment), by name and labels as printed there."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return {name: float(value) for name, _, value in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}


def _gauge(url: str, name: str, labels: str = "") -> float:
    """The value of one sample of /metrics (`labels` as printed there, e.g. '{op="get"}')."""
    sample = _scrape(url).get(name + labels)
    assert sample is not None, f"{name}{labels} not in /metrics"
    return sample


def test_cache_bytes_stay_within_cache_bytes_under_a_fetch_load_that_overflows_it(broker_factory, topic_name):
    """A broker with a 1 MiB cache serves two consumers reading 4 MiB from the start: the
    segments are loaded from the store and evicted again, and the cache's accounted bytes
    never pass --cache-bytes whenever they are looked at."""
    port = free_port()
    b = broker_factory(extra_args=["--cache-bytes", str(MiB), "--http", f"127.0.0.1:{port}"])
    url = f"http://127.0.0.1:{port}/metrics"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1, config={"segment.bytes": str(256 * 1024)})])[topic_name].result(30)
    value = os.urandom(1000)
    now_ms = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    n = 4096
    for i in range(n):
        p.produce(topic_name, value, key=str(i).encode(), partition=i % 2, timestamp=now_ms)
        p.poll(0)
    assert p.flush(60) == 0
    assert _gauge(url, "kafscale_cache_max_bytes") == MiB
    gets_before = _gauge(url, "kafscale_object_store_requests_total", '{op="get"}')
    for reader in range(2):
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"{topic_name}-{reader}", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "fetch.max.bytes": 1024 * 1024, "message.max.bytes": 1024 * 1024, "max.partition.fetch.bytes": 64 * 1024})
        c.assign([TopicPartition(topic_name, part, 0) for part in range(2)])
        got = 0
        deadline = time.monotonic() + 60
        try:
            while got < n and time.monotonic() < deadline:
                for m in c.consume(200, 1.0):
                    assert m.error() is None, m.error()
                    assert m.value() == value
                    got += 1
                assert _gauge(url, "kafscale_cache_bytes") <= MiB
        finally:
            c.close()
        assert got == n
    # the 4 MiB did not fit: the readers' segments came from the store, again and again
    assert _gauge(url, "kafscale_object_store_requests_total", '{op="get"}') - gets_before >= 16


def test_cache_and_requests_stay_within_cache_bytes_while_producers_wait_on_s3(broker_factory, moto_server, topic_name):
    """Producers flat out against a broker on S3 (moto: uploads are the bottleneck, so
    produce requests wait in memory to become durable) while a consumer reads from the
    start: the cache gives way to those requests as they are read, not only at its next
    put, so cache plus request memory never pass --cache-bytes by more than the one view
    the cache always keeps (the newest), whenever /metrics is looked at."""
    budget = 32 * MiB  # the request memory floor: requests may take all of it
    segment_bytes = 1 * MiB
    port = free_port()
    b = broker_factory(
        extra_args=["--cache-bytes", str(budget), "--http", f"127.0.0.1:{port}", "--storage", f"s3://cache-bound-{topic_name.rsplit('-', 1)[1]}/data"],
        env={**moto_server.env, "KAFSCALE_S3_CREATE_BUCKET": "true"},
    )
    url = f"http://127.0.0.1:{port}/metrics"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 4, 1, config={"segment.bytes": str(segment_bytes)})])[topic_name].result(30)
    value = os.urandom(16 * 1024)
    now_ms = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, "queue.buffering.max.kbytes": 256 * 1024})
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": topic_name, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, part, 0) for part in range(4)])
    n = 8192  # 128 MiB: four times the budget
    samples, worst, most_requests, got = 0, 0.0, 0.0, 0
    try:
        for i in range(n):
            while True:
                try:
                    p.produce(topic_name, value, partition=i % 4, timestamp=now_ms)
                    break
                except BufferError:  # the producer's queue is full: the broker holds back
                    p.poll(0.05)
            p.poll(0)
            if i % 64 == 0:
                for m in c.consume(100, 0):
                    assert m.error() is None, m.error()
                    got += 1
                now = _scrape(url)
                cached, requests = now["kafscale_cache_bytes"], now["kafscale_request_memory_bytes"]
                samples += 1
                most_requests = max(most_requests, requests)
                worst = max(worst, cached + requests)
                assert cached + requests <= budget + segment_bytes + MiB, f"cache {cached / MiB:.1f} MiB + requests {requests / MiB:.1f} MiB over --cache-bytes {budget / MiB:.0f} MiB"
        assert p.flush(120) == 0
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                assert m.value() == value
                got += 1
    finally:
        c.close()
    assert got == n
    # the budget was in use: cache and requests held half of it or more at once, and requests
    # waited in it (how many depends on how fast moto takes the uploads)
    assert worst >= budget / 2 and most_requests >= 2 * MiB, f"at most {worst / MiB:.1f} MiB held, requests {most_requests / MiB:.1f} MiB: no pressure to test"
