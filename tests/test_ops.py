"""Operations endpoint: /metrics after real traffic, /healthz, /readyz through an object
store and a metadata store outage, several brokers in one process.

The brokers here run in the test's own event loop (a Broker plus `start_ops`), so the
Kafka clients run in threads (`asyncio.to_thread`) while the loop serves them.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.app import Broker
from kafscale.broker.config import BrokerConfig
from kafscale.ops.http import start_ops
from kafscale.storage import write_ahead
from tests.support.broker import REPO, free_port, wait_port
from tests.support.wait import wait_until, wait_until_async

pytestmark = pytest.mark.asyncio(loop_scope="session")


# -- helpers -----------------------------------------------------------------------------


class Running:
    def __init__(self, broker: Broker, ops, data_dir: str):
        self.broker, self.ops, self.data_dir = broker, ops, data_dir

    @property
    def bootstrap(self) -> str:
        return "%s:%d" % self.broker.listen_address

    @property
    def http(self) -> str:
        return "http://%s:%d" % self.ops.address


async def start_broker(**overrides) -> Running:
    data_dir = tempfile.mkdtemp(prefix="kafscale-ops-")
    port = free_port()
    settings = {"listen": f"127.0.0.1:{port}", "data_dir": data_dir, "http": "127.0.0.1:0", "group_initial_rebalance_delay_ms": 0, **overrides}
    cfg = BrokerConfig(**settings)
    broker = Broker(cfg)
    await broker.start()
    # Once broker/app.py wires the endpoint, start() has already started it.
    ops = getattr(broker, "ops", None) or await start_ops(broker)
    return Running(broker, ops, data_dir)


async def stop_broker(r: Running) -> None:
    await r.ops.stop()
    await r.broker.stop()
    shutil.rmtree(r.data_dir, ignore_errors=True)


@pytest.fixture
async def running():
    r = await start_broker()
    yield r
    await stop_broker(r)


def _get(url: str, method: str = "GET") -> tuple[int, str, dict]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


async def get(url: str, method: str = "GET") -> tuple[int, str, dict]:
    return await asyncio.to_thread(_get, url, method)


async def scrape(r: Running) -> dict[tuple[str, tuple], float]:
    """Every sample as {(name, sorted label items): value}."""
    status, text, headers = await get(r.http + "/metrics")
    assert status == 200, text
    assert headers["Content-Type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name: str, **labels) -> float:
    """Sum of every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


class Stats:
    """librdkafka's own statistics: how many requests of each type the client sent."""

    def __init__(self):
        self.last: dict | None = None

    def __call__(self, raw: str) -> None:
        self.last = json.loads(raw)

    def sent(self, request_type: str) -> int:
        return sum(b.get("req", {}).get(request_type, 0) for b in self.last["brokers"].values())


def _produce(bootstrap: str, topic: str, n: int) -> int:
    """Produce n records in several batches; returns the Produce requests the client sent."""
    stats = Stats()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 40, "acks": "all",
                  "statistics.interval.ms": 100, "stats_cb": stats})
    errors = []
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"value-%04d" % i, partition=0,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        if i % 100 == 99:
            p.flush(15)
    assert p.flush(15) == 0
    assert not errors, errors
    # statistics are emitted from poll(): wait for one taken after the last delivery
    deadline = time.monotonic() + 5
    stats.last = None
    while (stats.last is None or stats.last["txmsgs"] < n) and time.monotonic() < deadline:
        p.poll(0.1)
    sent = stats.sent("Produce")
    return sent


def _consume(bootstrap: str, topic: str, n: int) -> int:
    """Read n records from the start without a group; returns the Fetch requests sent."""
    stats = Stats()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100, "statistics.interval.ms": 100, "stats_cb": stats})
    tp = TopicPartition(topic, 0, 0)
    c.assign([tp])
    got = 0
    deadline = time.monotonic() + 20
    while got < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    assert got == n
    # Stop fetching and read the client's final count once its last long poll has been
    # answered: two statistics reports in a row with nothing in flight and the same count.
    c.pause([tp])
    reports: list[tuple[bool, int]] = []

    def settled() -> bool:
        stats.last = None
        while stats.last is None:
            c.poll(0.05)
        idle = all(b.get("waitresp_cnt", 0) == 0 and b.get("outbuf_cnt", 0) == 0 for b in stats.last["brokers"].values())
        reports.append((idle, stats.sent("Fetch")))
        return len(reports) >= 2 and reports[-1][0] and reports[-2] == reports[-1]

    wait_until(settled, 10, "the consumer's last Fetch to be answered", interval=0)
    c.close()
    return reports[-1][1]


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    c.close()


# -- /metrics ----------------------------------------------------------------------------


async def test_metrics_after_real_traffic(running):
    r = running
    topic, n = "ops-metrics", 500
    before = await scrape(r)

    produce_requests = await asyncio.to_thread(_produce, r.bootstrap, topic, n)
    fetch_requests = await asyncio.to_thread(_consume, r.bootstrap, topic, n)
    after = await scrape(r)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    # Request counters agree exactly with what librdkafka says it sent.
    assert produce_requests > 1
    assert delta("kafscale_requests_total", api="Produce") == produce_requests
    assert delta("kafscale_requests_total", api="Fetch") == fetch_requests
    assert delta("kafscale_request_duration_seconds_count", api="Produce") == produce_requests
    assert delta("kafscale_request_errors_total", api="Produce") == 0
    assert any(n_ == "kafscale_requests_total" and dict(ls)["api"] == "Produce" and dict(ls)["version"].isdigit() for n_, ls in after)
    assert delta("kafscale_request_duration_seconds_bucket", api="Produce", le="+Inf") == produce_requests

    # Produce path
    assert delta("kafscale_produce_records_total") == n
    assert delta("kafscale_produce_bytes_total") > n * 10
    assert value(after, "kafscale_topic_bytes_in_total", topic=topic) == delta("kafscale_produce_bytes_total")
    assert 1 < value(after, "kafscale_produce_batches_total", topic=topic) <= produce_requests
    assert value(after, "kafscale_topic_bytes_out_total", topic=topic) >= value(after, "kafscale_topic_bytes_in_total", topic=topic)

    # Storage
    assert delta("kafscale_flushes_total") > 0
    assert value(after, "kafscale_flush_failures_total") == 0
    assert delta("kafscale_segment_bytes_total") >= delta("kafscale_produce_bytes_total")
    # segments this small get no .index (index_min_bytes): one PUT per flush
    assert delta("kafscale_object_store_requests_total", op="put") == delta("kafscale_flushes_total")
    assert ("kafscale_object_store_requests_total", (("op", "get"),)) in after
    assert value(after, "kafscale_unflushed_records") == 0
    assert delta("kafscale_flush_duration_seconds_count") == delta("kafscale_flushes_total")
    # A flush's size is its object's: the segment itself, or with write-ahead objects the
    # one piece (one partition written here) inside its object's header, index entry and trailer.
    framing = 0
    if r.broker.config.write_ahead_objects:
        framing = write_ahead.HEADER_SIZE + 2 + len(topic) + write_ahead.ENTRY_FIXED.size + write_ahead.TRAILER_SIZE
    assert delta("kafscale_flush_size_bytes_sum") == delta("kafscale_segment_bytes_total") + framing * delta("kafscale_flushes_total")
    # Latency of every store call: each flush is one put call (its segment and index
    # together) and one metadata commit; snapshots and merges add more.
    assert delta("kafscale_object_store_request_duration_seconds_count", op="put") >= delta("kafscale_flushes_total")
    assert delta("kafscale_object_store_request_duration_seconds_bucket", op="put", le="+Inf") == delta("kafscale_object_store_request_duration_seconds_count", op="put")
    assert delta("kafscale_object_store_request_duration_seconds_sum", op="put") > 0
    assert delta("kafscale_metadata_request_duration_seconds_count", op="commit") >= delta("kafscale_flushes_total")
    assert value(after, "kafscale_object_store_request_failures_total", op="put") == 0

    # Cache: present with numbers; the fetches were served from just-flushed segments.
    for name in ("kafscale_cache_hits_total", "kafscale_cache_misses_total", "kafscale_cache_bytes", "kafscale_cache_max_bytes"):
        assert isinstance(after[(name, ())], float), name
    assert value(after, "kafscale_cache_hits_total") > 0
    assert 0 < value(after, "kafscale_cache_bytes") <= value(after, "kafscale_cache_max_bytes")

    # Partitions, process, health
    assert value(after, "kafscale_partitions_owned") == 1
    assert value(after, "kafscale_partition_high_watermark", topic=topic, partition="0") == n
    assert value(after, "kafscale_partition_log_start_offset", topic=topic, partition="0") == 0

    async def segments_as_committed():
        # The merger may join segments between a scrape and the read: until both agree.
        s = await scrape(r)
        committed = (await r.broker.metadata.get_partition(topic, 0)).segments
        return (value(s, "kafscale_partition_segments", topic=topic, partition="0"), value(s, "kafscale_partition_size_bytes", topic=topic, partition="0")) \
            == (len(committed), sum(seg.size for seg in committed)) and len(committed) > 0

    await wait_until_async(segments_as_committed, 10, "the segment gauges to match the committed segment list")
    assert value(after, "kafscale_process_resident_memory_bytes") > 0
    assert ("kafscale_process_cpu_seconds_total", ()) in after
    assert value(after, "kafscale_broker_info", broker_id="0", storage="file", metadata="embedded") == 1
    assert ("kafscale_connections", ()) in after


def _produce_and_read_compressed(bootstrap: str, topic: str) -> None:
    """Produce with every codec, then read everything back: values must round-trip."""
    sent = []
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5, "acks": "all"})
        for i in range(50):
            value = b"%s-%03d-" % (codec.encode(), i) + b"compressible " * 20
            p.produce(topic, value=value, partition=0)
            sent.append(value)
        assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < len(sent) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert got == sent


async def test_produce_and_fetch_never_decompress(running):
    """The issue's "zero decompressions on the produce path", counted: compressed batches of
    every codec go in and come out without the broker decompressing one of them."""
    from kafscale.protocol import records

    r = running
    before = value(await scrape(r), "kafscale_decompressions_total")
    await asyncio.to_thread(_produce_and_read_compressed, r.bootstrap, "ops-codecs")
    after = await scrape(r)
    assert value(after, "kafscale_produce_records_total") >= 200
    assert value(after, "kafscale_decompressions_total") == before
    # ... and the metric does count: one decompression in this process shows up.
    records.decompress(records.COMPRESSION_GZIP, gzip.compress(b"x"))
    assert value(await scrape(r), "kafscale_decompressions_total") == before + 1


async def test_connections_gauge(running):
    r = running
    base = value(await scrape(r), "kafscale_connections")

    async def connections_are(n: float) -> bool:
        return value(await scrape(r), "kafscale_connections") == n

    conns = [await asyncio.open_connection(*r.broker.listen_address) for _ in range(3)]
    await wait_until_async(lambda: connections_are(base + 3), 5, "the gauge to count three more connections")
    for _reader, writer in conns:
        writer.close()
    await wait_until_async(lambda: connections_are(base), 5, "the gauge to drop the closed connections")


async def test_consumer_lag_and_group_states(running):
    r = running
    topic, group = "ops-lag", "ops-lag-group"
    await asyncio.to_thread(_produce, r.bootstrap, topic, 100)
    await asyncio.to_thread(_commit, r.bootstrap, group, topic, 40)
    await r.ops.sample()  # what the 15 s sampler does
    s = await scrape(r)
    assert value(s, "kafscale_consumer_lag", group=group, topic=topic, partition="0") == 60
    assert value(s, "kafscale_consumer_committed_offset", group=group, topic=topic, partition="0") == 40
    assert value(s, "kafscale_consumer_group_lag", group=group) == 60
    assert value(s, "kafscale_consumer_lag_sampled_timestamp_seconds") > time.time() - 60
    if r.broker.groups is not None:
        assert value(s, "kafscale_consumer_groups", state="Empty") >= 1
    for state in ("Empty", "Stable", "PreparingRebalance", "CompletingRebalance", "Dead"):
        assert ("kafscale_consumer_groups", (("state", state),)) in s

    # The group catches up: lag 0 on the next sample.
    await asyncio.to_thread(_commit, r.bootstrap, group, topic, 100)
    await r.ops.sample()
    assert value(await scrape(r), "kafscale_consumer_lag", group=group, topic=topic, partition="0") == 0


def _member_commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """A KIP-848 member (group.protocol=consumer) commits `offset` of partition 0 and stays."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer", "enable.auto.commit": False})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment()
    c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    return c


async def test_consumer_protocol_group_lag_and_state(running):
    r = running
    topic, group = "ops-lag-kip848", "ops-lag-kip848-group"
    await asyncio.to_thread(_produce, r.bootstrap, topic, 100)
    c = await asyncio.to_thread(_member_commit, r.bootstrap, group, topic, 30)
    try:
        await r.ops.sample()
        s = await scrape(r)
        assert value(s, "kafscale_consumer_lag", group=group, topic=topic, partition="0") == 70
        if r.broker.groups is not None:
            assert value(s, "kafscale_consumer_groups", state="Stable") >= 1
    finally:
        await asyncio.to_thread(c.close)


def _share_run(bootstrap: str, group: str, topic: str) -> tuple[list[int], object]:
    """A share consumer (explicit acknowledgement) reads 20 records from the start, accepts
    10, rejects 5 and releases 5, then acquires the 5 released again and holds them: the
    consumer, still open, and the offsets it holds."""
    from confluent_kafka import AcknowledgeType, ShareConsumer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([r]).values():
        fut.result(15)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    held: list = []
    wait_until(lambda: held.extend(m for m in c.poll(0.5) if m.error() is None) or len(held) >= 20, 30, "20 records")
    assert sorted(m.offset() for m in held) == list(range(20))
    for m in held:
        c.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() < 10 else
                      AcknowledgeType.REJECT if m.offset() < 15 else AcknowledgeType.RELEASE)
    assert all(err is None for err in c.commit_sync(10).values())
    again: list = []
    wait_until(lambda: again.extend(m for m in c.poll(0.5) if m.error() is None) or len(again) >= 5, 30, "the released 5")
    assert sorted((m.offset(), m.delivery_count()) for m in again) == [(o, 2) for o in range(15, 20)]
    return c


async def test_share_group_metrics_after_a_share_consumer_run():
    # (a lock of 3 s, below Kafka's least: the least lowered too)
    r = await start_broker(group_share_record_lock_duration_ms=3000, group_share_min_record_lock_duration_ms=1000,
                           group_share_heartbeat_interval_ms=300, group_share_min_heartbeat_interval_ms=300)
    topic, group = "ops-share", "ops-share-group"
    c = None
    try:
        await asyncio.to_thread(_produce, r.bootstrap, topic, 20)
        c = await asyncio.to_thread(_share_run, r.bootstrap, group, topic)
        s = await scrape(r)
        assert value(s, "kafscale_share_records_acquired_total") == 25
        assert value(s, "kafscale_share_records_redelivered_total") == 5
        for kind, n in (("accept", 10), ("reject", 5), ("release", 5), ("gap", 0), ("renew", 0)):
            assert value(s, "kafscale_share_acknowledgements_total", type=kind) == n, kind
        assert value(s, "kafscale_share_records_archived_total", reason="rejected") == 5
        assert value(s, "kafscale_share_records_archived_total", reason="delivery_limit") == 0
        assert value(s, "kafscale_share_state_writes_total") >= 2  # the state's first write, the acknowledgements
        assert value(s, "kafscale_share_sessions") == 1
        labels = dict(group=group, topic=topic, partition="0")
        # 0-9 accepted and 10-14 rejected: the start offset is 15; 15-19 held again
        assert value(s, "kafscale_share_partition_start_offset", **labels) == 15
        assert value(s, "kafscale_share_partition_in_flight_records", **labels) == 5
        assert value(s, "kafscale_share_partition_acquired_records", **labels) == 5
        # the consumer keeps them past the 3 s lock: they time out, available again
        async def timed_out() -> bool:
            return value(await scrape(r), "kafscale_share_lock_timeouts_total") == 5

        await wait_until_async(timed_out, 30, "5 lock timeouts")
        s = await scrape(r)
        assert value(s, "kafscale_share_partition_acquired_records", **labels) == 0
        assert value(s, "kafscale_share_partition_in_flight_records", **labels) == 5
        await asyncio.to_thread(c.close)  # its session ends: nothing held any more, nothing released
        c = None

        async def closed() -> bool:
            return value(await scrape(r), "kafscale_share_sessions") == 0

        await wait_until_async(closed, 15, "the share session closed")
        s = await scrape(r)
        assert total(s, "kafscale_share_records_released_total") == 0
    finally:
        if c is not None:
            await asyncio.to_thread(c.close)
        await stop_broker(r)


async def test_deleted_topic_series_are_dropped(running):
    r = running
    topic = "ops-deleted"
    await asyncio.to_thread(_produce, r.bootstrap, topic, 10)
    assert value(await scrape(r), "kafscale_topic_bytes_in_total", topic=topic) > 0

    def delete():
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": r.bootstrap})
        admin.delete_topics([topic])[topic].result(10)

    await asyncio.to_thread(delete)
    await r.ops.sample()
    s = await scrape(r)
    assert ("kafscale_topic_bytes_in_total", (("topic", topic),)) not in s
    assert ("kafscale_partition_high_watermark", (("partition", "0"), ("topic", topic))) not in s


async def test_flush_failures_are_counted(running, monkeypatch):
    from kafscale.storage.objectstore import ObjectStoreError

    r = running
    topic = "ops-flush-fail"
    await asyncio.to_thread(_produce, r.bootstrap, topic, 5)  # the topic exists, the log is loaded

    async def failing_put(key, parts):
        raise ObjectStoreError(f"put {key}: simulated outage")

    async def failing_put_many(objects):
        raise ObjectStoreError(f"put {objects[0][0]}: simulated outage")

    # Flushes create segments (never replacing one); every write path of the backend fails
    # (under the broker's timing wrapper, which counts the failed calls).
    failed_puts = value(await scrape(r), "kafscale_object_store_request_failures_total", op="put")
    for name, failing in (("put", failing_put), ("create", failing_put), ("put_many", failing_put_many), ("create_many", failing_put_many)):
        monkeypatch.setattr(r.broker.store.inner, name, failing)

    def produce_one() -> object:
        p = Producer({"bootstrap.servers": r.bootstrap, "message.timeout.ms": 1500, "retry.backoff.ms": 100, "acks": "all"})
        errors = []
        p.produce(topic, value=b"lost", partition=0, on_delivery=lambda err, _m: errors.append(err))
        p.flush(10)
        return errors[0]

    err = await asyncio.to_thread(produce_one)
    assert err is not None  # never acknowledged
    s = await scrape(r)
    assert value(s, "kafscale_flush_failures_total") >= 1
    assert value(s, "kafscale_object_store_request_failures_total", op="put") - failed_puts >= 1
    assert value(s, "kafscale_partition_errors_total", api="Produce", error="kafka_storage_error") >= 1
    assert value(s, "kafscale_unflushed_records") == 0  # rejected batches are dropped, not kept
    assert value(s, "kafscale_partition_high_watermark", topic=topic, partition="0") == 5

    monkeypatch.undo()
    await asyncio.to_thread(_produce, r.bootstrap, topic, 5)
    assert value(await scrape(r), "kafscale_partition_high_watermark", topic=topic, partition="0") == 10


async def test_stop_unhooks_everything():
    r = await start_broker()
    original = r.broker.router.apis[0].handler
    assert original is not None
    await r.ops.stop()
    assert r.broker.server.request_hooks == []
    assert "metrics_flushed" not in vars(r.broker.logs)
    assert r.broker.router.apis[0].handler.__name__ == "produce"
    assert r.broker.router.apis[1].handler.__name__ == "fetch"
    await r.ops.stop()  # twice is fine
    await r.broker.stop()
    shutil.rmtree(r.data_dir, ignore_errors=True)


async def test_metrics_observe_through_public_hooks_and_leave_none_behind():
    """Produce/Fetch bytes and flush sizes come from the server's response hooks and the
    log manager's flush hooks, registered by start_ops and gone after stop."""
    r = await start_broker()
    try:
        server, logs = r.broker.server, r.broker.logs
        assert sorted(server.response_hooks) == [0, 1]  # Produce, Fetch
        assert r.ops.metrics.on_flush in logs.flush_hooks
        assert r.ops.metrics.on_store_request in r.broker.store.request_hooks
        assert r.ops.metrics.on_metadata_request in r.broker.metadata.kv.request_hooks
        topic = f"hooks-{os.getpid()}-{time.monotonic_ns()}"
        await asyncio.to_thread(_produce, r.bootstrap, topic, 3)
        text = await scrape(r)
        assert value(text, "kafscale_topic_bytes_in_total", topic=topic) > 0
        assert value(text, "kafscale_flush_size_bytes_count") >= 1
        await r.ops.stop()
        assert server.response_hooks == {}
        assert logs.flush_hooks == []
        assert r.broker.store.request_hooks == [] and r.broker.metadata.kv.request_hooks == []
    finally:
        await stop_broker(r)


async def test_two_brokers_in_one_process_do_not_clash():
    a, b = await start_broker(), await start_broker(broker_id=7)
    try:
        await asyncio.to_thread(_produce, a.bootstrap, "ops-two", 20)
        sa, sb = await scrape(a), await scrape(b)
        assert value(sa, "kafscale_produce_records_total") == 20
        assert value(sb, "kafscale_produce_records_total") == 0
        assert value(sb, "kafscale_broker_info", broker_id="7", storage="file", metadata="embedded") == 1
    finally:
        await stop_broker(a)
        await stop_broker(b)


async def test_openmetrics_negotiation(running):
    def fetch():
        req = urllib.request.Request(running.http + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.headers["Content-Type"], resp.read().decode()

    ctype, body = await asyncio.to_thread(fetch)
    assert ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


# -- /healthz, /readyz -------------------------------------------------------------------


async def test_healthz_and_http_basics(running):
    status, body, _ = await get(running.http + "/healthz")
    assert (status, body) == (200, "ok\n")
    status, body, _ = await get(running.http + "/healthz", "HEAD")
    assert (status, body) == (200, "")
    assert (await get(running.http + "/nope"))[0] == 404
    status, _, headers = await get(running.http + "/metrics", "POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"

    # A garbage request line gets a 400 and the server keeps serving (the status line's
    # version is the server library's choice: aiohttp answers an unparsable request in 1.0).
    reader, writer = await asyncio.open_connection(*running.ops.address)
    writer.write(b"garbage\r\n\r\n")
    await writer.drain()
    assert re.match(rb"HTTP/1\.[01] 400 ", await reader.read())
    writer.close()
    assert (await get(running.http + "/healthz"))[0] == 200


async def test_malformed_http_request_is_one_log_line(running, caplog):
    """Bad input on the ops port: a 400, one warning line without a traceback, and the
    server keeps serving."""
    huge = "a" * 20_000  # past the server's limit for one header line
    with caplog.at_level(logging.DEBUG):
        status, _, _ = await asyncio.to_thread(_get_with_header, running.http + "/healthz", "X-Big", huge)
    assert status == 400
    lines = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert len(lines) == 1, [rec.getMessage() for rec in lines]
    assert "bad HTTP request" in lines[0].getMessage() and lines[0].exc_info is None
    assert (await get(running.http + "/healthz"))[0] == 200


def _get_with_header(url: str, name: str, value: str) -> tuple[int, str, dict]:
    req = urllib.request.Request(url, headers={name: value})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


async def readyz_when(r: Running, holds, what: str, timeout: float = 10.0) -> tuple[int, str, float]:
    """The first /readyz answer (status, body, seconds it took) for which `holds(status, body)`:
    readiness is cached for a second, so a change shows up within about that."""

    async def answer():
        started = time.monotonic()
        status, body, _ = await get(r.http + "/readyz")
        return (status, body, time.monotonic() - started) if holds(status, body) else None

    return await wait_until_async(answer, timeout, what)


async def test_readiness_follows_object_store_outage(running):
    r = running
    status, body, _ = await get(r.http + "/readyz")
    assert (status, body) == (200, "ready\n")

    objects = r.broker.store.root
    away = objects.with_name(objects.name + ".away")
    os.rename(objects, away)  # works as root too, where chmod would not stop anyone
    try:
        status, body, _ = await readyz_when(r, lambda status, _: status != 200, "/readyz to notice the object store is gone")
        assert status == 503
        assert "object store" in body
        s = await scrape(r)
        assert value(s, "kafscale_object_store_up") == 0
        assert value(s, "kafscale_ready") == 0
        assert value(s, "kafscale_metadata_store_up") == 1
        assert (await get(r.http + "/healthz"))[0] == 200  # alive all the same
    finally:
        os.rename(away, objects)
    status, body, _ = await readyz_when(r, lambda status, _: status == 200, "/readyz to see the object store back")
    assert (status, body) == (200, "ready\n")
    assert value(await scrape(r), "kafscale_object_store_up") == 1


async def test_readiness_follows_metadata_store_failures(running, monkeypatch):
    r = running

    async def broken():
        raise OSError("connection refused")

    async def hung():
        await asyncio.sleep(60)

    monkeypatch.setattr(r.broker.metadata, "check", broken)
    status, body, _ = await readyz_when(r, lambda _, body: "metadata" in body, "/readyz to notice the metadata store failing")
    assert status == 503 and "metadata store unreachable: connection refused" in body

    monkeypatch.setattr(r.broker.metadata, "check", hung)
    status, body, took = await readyz_when(r, lambda _, body: "did not answer" in body, "/readyz to notice the metadata store hanging")
    assert status == 503 and "metadata store did not answer" in body
    assert took < 5  # the probe is bounded

    monkeypatch.undo()
    status, _, _ = await readyz_when(r, lambda _, body: "metadata" not in body, "/readyz to see the metadata store back")
    assert status == 200


async def test_readiness_false_when_listener_stops():
    r = await start_broker()
    try:
        assert (await get(r.http + "/readyz"))[0] == 200
        await r.broker.server.stop_accepting()
        status, body, _ = await readyz_when(r, lambda status, _: status != 200, "/readyz to notice the listener stopped")
        assert status == 503 and "listener" in body
    finally:
        await stop_broker(r)


async def test_http_port_in_use_is_a_clear_error():
    r = await start_broker()
    try:
        cfg = BrokerConfig(listen=f"127.0.0.1:{free_port()}", data_dir=tempfile.mkdtemp(prefix="kafscale-ops-"), http="%s:%d" % r.ops.address)
        other = Broker(cfg)
        try:
            with pytest.raises(OSError, match="--http"):
                await other.start()  # fails here once app.py starts the endpoint itself
                await start_ops(other)
            assert other.server.request_hooks == []  # nothing left behind
        finally:
            await other.stop()
    finally:
        await stop_broker(r)


async def test_http_disabled():
    r = await start_broker(http="")
    try:
        assert r.ops.address is None
        assert r.ops.metrics.on_request in r.broker.server.request_hooks
    finally:
        await stop_broker(r)


# -- the real command ---------------------------------------------------------------------


async def test_broker_command_serves_http():
    await asyncio.to_thread(_broker_command_serves_http)


def _broker_command_serves_http() -> None:
    data_dir = tempfile.mkdtemp(prefix="kafscale-ops-")
    port, http_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafscale", "broker", "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--http", f"127.0.0.1:{http_port}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(http_port, proc=proc)
        assert _get(f"http://127.0.0.1:{http_port}/healthz")[0] == 200
        assert _get(f"http://127.0.0.1:{http_port}/readyz")[0] == 200
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
        for i in range(7):
            p.produce("ops-cmd", value=b"v%d" % i)
        assert p.flush(15) == 0
        del p  # close the client while the broker still runs
        text = _get(f"http://127.0.0.1:{http_port}/metrics")[1]
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert value(samples, "kafscale_produce_records_total") == 7
        assert total(samples, "kafscale_requests_total", api="Produce") >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        shutil.rmtree(data_dir, ignore_errors=True)


def _seek_by_time(bootstrap: str, topic: str, t0: int) -> list[tuple[int, int]]:
    """Two gzip batches (timestamps t0 and t0 + 1000, 3 records each), then ListOffsets for
    t0 + 500 and for the max timestamp, then a Fetch of everything: (offset, timestamp) answers."""
    from kafscale.protocol import records
    from tests.support.raw import RawClient, error_code

    with RawClient(bootstrap) as c:
        c.metadata([topic])
        for ts in (t0, t0 + 1000):
            batch = records.build_batch([(None, b"v%d" % i) for i in range(3)], timestamp=ts, codec=records.COMPRESSION_GZIP)
            assert error_code(c.produce(topic, 0, batch).error_code) == 0
        out = []
        for target in (t0 + 500, -3):  # -3: the max timestamp
            r = c.list_offsets(topic, 0, target)
            assert error_code(r.error_code) == 0
            out.append((r.offset, r.timestamp))
        assert error_code(c.fetch(topic, 0, 0).error_code) == 0
        return out


async def test_decompressions_move_only_with_list_offsets_by_timestamp(running):
    """What docs/operations.md says of kafscale_decompressions_total: produce and fetch add
    nothing; a ListOffsets by timestamp decompresses the one batch holding the answer, a
    max-timestamp lookup the one batch holding the max."""
    r = running
    before = value(await scrape(r), "kafscale_decompressions_total")
    t0 = int(time.time() * 1000) - 60_000
    answers = await asyncio.to_thread(_seek_by_time, r.bootstrap, "ops-seek-by-time", t0)
    assert answers == [(3, t0 + 1000), (3, t0 + 1000)]
    assert value(await scrape(r), "kafscale_decompressions_total") == before + 2
