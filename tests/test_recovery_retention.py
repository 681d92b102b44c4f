"""Retention (retention.ms, retention.bytes), DeleteRecords, and durability across a
kill -9 and a graceful SIGTERM restart.

The shared `broker` fixture runs retention every 500 ms; private brokers come from
`broker_factory` and are restarted on the same data directory and port.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import threading
import time
import urllib.request
from pathlib import Path

import crc32c
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore
from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.broker import free_port, wait_for_leader
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

EARLIEST, LATEST = -2, -1
OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 1, 3
HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(15)


def committed_segments(data_dir: str, topic: str, partition: int = 0) -> list[SegmentInfo]:
    """The partition's committed segments, as the broker's embedded metadata store lists
    them: wherever their bytes live (the partition's own segment objects, or pieces of
    write-ahead objects, the default layout)."""
    async def read():
        md = MetadataStore(SqliteKV(Path(data_dir) / "metadata.sqlite"))
        try:
            st = await md.get_partition(topic, partition)
            return st.segments if st is not None else []
        finally:
            await md.close()

    return sorted(asyncio.run(read()), key=lambda s: s.base_offset)


def segment_files(data_dir: str, topic: str, partition: int = 0, namespace: str = "default") -> list[int]:
    pdir = Path(data_dir) / "objects" / namespace / topic / str(partition)
    if not pdir.exists():
        return []
    return sorted(int(p.name[8:28]) for p in pdir.glob("segment-*.kfs"))


def segment_bases(data_dir: str, topic: str, partition: int = 0) -> list[int] | None:
    """The base offsets of the partition's committed segments, once its own segment objects
    are exactly those of them not held in write-ahead objects (retention and DeleteRecords
    delete the objects right after their metadata commit); None until then."""
    segs = committed_segments(data_dir, topic, partition)
    if segment_files(data_dir, topic, partition) != [s.base_offset for s in segs if not s.wao_key]:
        return None
    return [s.base_offset for s in segs]


def segment_sizes(data_dir: str, topic: str, partition: int = 0) -> dict[int, int]:
    """Base offset -> size of each committed segment (its .kfs object's, or its piece's in a write-ahead object)."""
    return {s.base_offset: s.size for s in committed_segments(data_dir, topic, partition)}


def produce_segments(bootstrap: str, topic: str, groups: list[list[tuple[bytes | None, bytes, int | None]]], partition: int = 0) -> list[int]:
    """Each group is flushed separately (one produce request, so one segment).
    Records are (key, value, timestamp or None). Returns all offsets."""
    # a long linger and a flush per group: each group leaves as one batch in one request
    # (flush() sends at once), whatever the scheduling of this process
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2000, "acks": "all"})
    wait_for_leader(p, topic, partition)
    out = []
    for g in groups:
        reports = {}
        for i, (k, v, ts) in enumerate(g):
            kw = {"timestamp": ts} if ts is not None else {}
            p.produce(topic, key=k, value=v, partition=partition, on_delivery=lambda e, m, i=i: reports.__setitem__(i, (e, m.offset())), **kw)
        assert p.flush(15) == 0
        assert all(reports[i][0] is None for i in range(len(g))), reports
        out += [reports[i][1] for i in range(len(g))]
    return out


def consume_from(bootstrap: str, topic: str, partition: int, offset: int, count: int, reset: str = "earliest", timeout: float = 15.0):
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"unused-{topic}", "enable.auto.commit": False,
        "fetch.wait.max.ms": 50, "auto.offset.reset": reset, "enable.partition.eof": False,
    })
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            assert not m.error(), m.error()
            out.append(m)
        return out
    finally:
        c.close()


def raw_read_all(bootstrap: str, topic: str, partition: int) -> list:
    """Every record from the log start to the high watermark via raw Fetch."""
    with RawClient(bootstrap) as c:
        start = c.list_offsets(topic, partition, EARLIEST).offset
        hw = c.list_offsets(topic, partition, LATEST).offset
        out, offset = [], start
        while offset < hw:
            p = c.fetch(topic, partition, offset)
            assert error_code(p.error_code) == 0, p
            progressed = False
            for pos, h in iter_batches(p.records):
                for r in decode_records(p.records, pos, h):
                    if r.offset >= offset:
                        out.append(r)
                progressed = progressed or h.last_offset >= offset
                offset = max(offset, h.last_offset + 1)
            assert progressed, f"no progress at offset {offset} (hw {hw})"
        return out


# ---------------------------------------------------------------------------------------
# retention.ms


def test_retention_ms_deletes_old_segments(broker, topic_name):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    create_topic(broker.bootstrap, topic_name, 1, {"retention.ms": "60000"})
    old = now_ms() - 2 * HOUR_MS  # far older than retention.ms
    old_groups = [[(None, f"old-{g}-{i}".encode(), old + g * 10 + i) for i in range(5)] for g in range(3)]
    new_groups = [[(None, f"new-{g}-{i}".encode(), None) for i in range(4)] for g in range(2)]
    offsets = produce_segments(broker.bootstrap, topic_name, old_groups + new_groups)
    assert offsets == list(range(23))
    # the three old segments go, the two recent ones stay
    wait_until(lambda: segment_bases(broker.data_dir, topic_name) == [15, 19], 15, "old segments to be deleted")
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 15
        assert c.list_offsets(topic_name, 0, LATEST).offset == 23
        # below the log start: OFFSET_OUT_OF_RANGE, and the response carries the new start
        p = c.fetch(topic_name, 0, 0, max_wait_ms=10)
        assert error_code(p.error_code) == OFFSET_OUT_OF_RANGE and p.log_start_offset == 15
        # a lookup by an old timestamp now lands on the first surviving record
        r = c.list_offsets(topic_name, 0, old, version=7)
        assert r.offset == 15
    # a consumer that asks for offset 0 is reset to the new log start
    msgs = consume_from(broker.bootstrap, topic_name, 0, 0, 8)
    assert [(m.offset(), m.value()) for m in msgs] == [(15 + i, f"new-{i // 4}-{i % 4}".encode()) for i in range(8)]
    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                       auto_offset_reset="earliest", fetch_max_wait_ms=50, consumer_timeout_ms=5000)
    try:
        tp = KTP(topic_name, 0)
        kc.assign([tp])
        kc.seek(tp, 0)
        got = []
        for m in kc:
            got.append(m.offset)
            if len(got) == 8:
                break
        assert got == list(range(15, 23))
    finally:
        kc.close()


def test_retention_ms_small_deletes_everything_old_and_offsets_continue(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, {"retention.ms": "1000"})
    old = now_ms() - HOUR_MS
    produce_segments(broker.bootstrap, topic_name, [[(b"k", f"v{g}{i}".encode(), old) for i in range(3)] for g in range(2)])
    wait_until(lambda: segment_bases(broker.data_dir, topic_name) == [], 15, "all segments to be deleted")
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 6
        assert c.list_offsets(topic_name, 0, LATEST).offset == 6
        # new records continue the offsets; nothing is reused
        r = c.produce(topic_name, 0, build_batch([(b"k", b"fresh")], timestamp=now_ms()))
        assert error_code(r.error_code) == 0 and r.base_offset == 6 and r.log_start_offset == 6
        p = c.fetch(topic_name, 0, 6)
        recs = [r for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)]
        assert [(r.offset, r.value) for r in recs] == [(6, b"fresh")]


# ---------------------------------------------------------------------------------------
# retention.bytes


def test_retention_bytes_keeps_newest_segments(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    groups = [[(None, f"{g}-{i}-".encode() + b"x" * 400, None) for i in range(3)] for g in range(8)]
    assert produce_segments(broker.bootstrap, topic_name, groups) == list(range(24))
    sizes = segment_sizes(broker.data_dir, topic_name)
    bases = sorted(sizes)
    assert bases == [3 * g for g in range(8)]
    limit = sizes[bases[-1]] + sizes[bases[-2]] + sizes[bases[-3]] + 1
    # Kafka semantics: drop the oldest segments while what remains is still >= retention.bytes
    keep, total = [], 0
    for b in reversed(bases):
        keep.insert(0, b)
        total += sizes[b]
        if total >= limit:
            break
    assert keep == bases[-4:]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name,
                         incremental_configs=[ConfigEntry("retention.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)
    wait_until(lambda: segment_bases(broker.data_dir, topic_name) == keep, 15, f"segments {keep} to remain")
    time.sleep(1.2)  # two more retention rounds must not delete anything else
    assert segment_bases(broker.data_dir, topic_name) == keep
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == keep[0]
    recs = raw_read_all(broker.bootstrap, topic_name, 0)
    assert [r.offset for r in recs] == list(range(keep[0], 24))
    assert [r.value for r in recs] == [v for g in groups for (_k, v, _t) in g][keep[0]:]


# ---------------------------------------------------------------------------------------
# DeleteRecords


def test_delete_records_confluent_admin(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    groups = [[(None, f"g{g}-{i}".encode(), None) for i in range(5)] for g in range(4)]
    assert produce_segments(broker.bootstrap, topic_name, groups) == list(range(20))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    fut = admin.delete_records([TopicPartition(topic_name, 0, 12)])
    [(tp, f)] = list(fut.items())
    assert f.result(15).low_watermark == 12
    # segments wholly below 12 (0-4, 5-9) are gone; 10-14 holds the new start and stays
    assert segment_bases(broker.data_dir, topic_name) == [10, 15]
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 12
        assert c.list_offsets(topic_name, 0, LATEST).offset == 20
        p = c.fetch(topic_name, 0, 11, max_wait_ms=10)
        assert error_code(p.error_code) == OFFSET_OUT_OF_RANGE and p.log_start_offset == 12
    msgs = consume_from(broker.bootstrap, topic_name, 0, OFFSET_BEGINNING, 8)
    assert [(m.offset(), m.value()) for m in msgs] == [(o, f"g{o // 5}-{o % 5}".encode()) for o in range(12, 20)]
    # moving backwards is a no-op; the other partition is untouched
    fut = admin.delete_records([TopicPartition(topic_name, 0, 3)])
    assert list(fut.values())[0].result(15).low_watermark == 12
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 1, EARLIEST).offset == 0


def _raw_delete_records(c: RawClient, topic: str, partition: int, offset: int, version: int = 2):
    p = req(21, version, "DeleteRecordsPartition", partition_index=partition, offset=offset)
    t = req(21, version, "DeleteRecordsTopic", name=topic, partitions=(p,))
    resp = c.request(21, version, req(21, version, topics=(t,), timeout=5000))
    return resp.topics[0].partitions[0]


def test_delete_records_raw(broker, topic_name):
    create_topic(broker.bootstrap, topic_name)
    produce_segments(broker.bootstrap, topic_name, [[(None, f"{g}-{i}".encode(), None) for i in range(3)] for g in range(3)])
    with RawClient(broker.bootstrap) as c:
        r = _raw_delete_records(c, topic_name, 0, 4)
        assert error_code(r.error_code) == 0 and r.low_watermark == 4
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 4
        assert segment_bases(broker.data_dir, topic_name) == [3, 6]
        r = _raw_delete_records(c, topic_name, 0, 10)  # past the high watermark
        assert error_code(r.error_code) == OFFSET_OUT_OF_RANGE
        r = _raw_delete_records(c, topic_name, 5, 1)
        assert error_code(r.error_code) == UNKNOWN_TOPIC_OR_PARTITION
        r = _raw_delete_records(c, topic_name, 0, -1)  # -1: up to the high watermark
        assert error_code(r.error_code) == 0 and r.low_watermark == 9
        assert c.list_offsets(topic_name, 0, EARLIEST).offset == 9
        assert segment_bases(broker.data_dir, topic_name) == []
        # the log continues at 9
        assert c.produce(topic_name, 0, build_batch([(None, b"after")], timestamp=now_ms())).base_offset == 9
        p = c.fetch(topic_name, 0, 9)
        assert [r.value for pos, h in iter_batches(p.records) for r in decode_records(p.records, pos, h)] == [b"after"]


# ---------------------------------------------------------------------------------------
# kill -9 and restart


def _consume_everything(bootstrap: str, topic: str, partitions: int) -> dict[int, list]:
    out = {}
    for p in range(partitions):
        out[p] = raw_read_all(bootstrap, topic, p)
    return out


def test_kill9_keeps_every_acknowledged_record(broker_factory, topic_name):
    b = broker_factory()
    create_topic(b.bootstrap, topic_name, 2, {"retention.ms": "-1"})
    acked: dict[tuple[int, int], bytes] = {}

    # phase 1: everything acknowledged before the crash
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(300):
        v = f"a-{i}".encode()
        p.produce(topic_name, key=f"k{i % 7}".encode(), value=v, partition=i % 2,
                  on_delivery=lambda e, m: e is None and acked.__setitem__((m.partition(), m.offset()), m.value()))
        p.poll(0)
    assert p.flush(20) == 0
    assert len(acked) == 300

    # phase 2: keep producing while the broker is killed
    stop = threading.Event()
    errors = []

    def produce_loop():
        q = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 1, "message.timeout.ms": 3000,
                      "reconnect.backoff.ms": 50, "retries": 0})
        i = 0
        while not stop.is_set():
            try:
                q.produce(topic_name, value=f"b-{i}".encode(), partition=i % 2,
                          on_delivery=lambda e, m: acked.__setitem__((m.partition(), m.offset()), m.value()) if e is None else errors.append(e))
            except BufferError:
                pass
            i += 1
            q.poll(0.001)
        q.purge()
        q.flush(1)

    t = threading.Thread(target=produce_loop)
    t.start()
    try:
        wait_until(lambda: len(acked) >= 500, 30, "acks during phase 2")
        b.kill9()
    finally:
        stop.set()
        t.join(15)
    assert not t.is_alive()
    n_acked = len(acked)
    assert n_acked >= 500

    b.start()  # same data dir, same port
    log = _consume_everything(b.bootstrap, topic_name, 2)
    hw = {}
    for part, recs in log.items():
        offs = [r.offset for r in recs]
        assert offs == list(range(len(offs))), f"partition {part}: offsets have gaps or repeats after restart"
        hw[part] = len(offs)
        stored = {r.offset: r.value for r in recs}
        for (pp, off), v in acked.items():
            if pp == part:
                assert stored.get(off) == v, f"acknowledged record {part}@{off}={v!r} came back as {stored.get(off)!r}"
    # values are unique across the log: nothing was duplicated or renumbered
    all_values = [r.value for recs in log.values() for r in recs]
    assert len(all_values) == len(set(all_values))

    # phase 3: new records continue right after what survived
    after: dict[int, list[int]] = {0: [], 1: []}
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(40):
        p.produce(topic_name, value=f"c-{i}".encode(), partition=i % 2,
                  on_delivery=lambda e, m: e is None and after[m.partition()].append(m.offset()))
    assert p.flush(20) == 0
    for part in (0, 1):
        assert sorted(after[part]) == list(range(hw[part], hw[part] + 20)), f"partition {part}: offsets after restart"
    log2 = _consume_everything(b.bootstrap, topic_name, 2)
    for part in (0, 1):
        assert [r.offset for r in log2[part]] == list(range(hw[part] + 20))
    # the topic's config survived too
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    cfg = admin.describe_configs([res])[res].result(15)
    assert cfg["retention.ms"].value == "-1"
    assert "Traceback" not in b.log_text()


def test_sigterm_flushes_buffered_records_and_exits_zero(broker_factory, topic_name):
    # a long flush interval: acks=0 records wait in the write buffer until shutdown
    b = broker_factory(extra_args=["--flush-interval-ms", "60000"])
    ts = now_ms()
    with RawClient(b.bootstrap) as c:
        c.metadata([topic_name])
        for i in range(5):
            c.produce(topic_name, 0, build_batch([(None, f"v{i}-{j}".encode()) for j in range(3)], timestamp=ts), acks=0)
        # responses come in request order, so this answer means every produce was appended
        c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1"))
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0, "records should still be buffered, not flushed"
    started = time.monotonic()
    rc = b.stop(signal.SIGTERM)
    assert rc == 0, b.log_text()[-2000:]
    assert time.monotonic() - started < 10
    assert segment_bases(b.data_dir, topic_name) == [0]
    b.start()
    recs = raw_read_all(b.bootstrap, topic_name, 0)
    assert [(r.offset, r.value) for r in recs] == [(i * 3 + j, f"v{i}-{j}".encode()) for i in range(5) for j in range(3)]
    with RawClient(b.bootstrap) as c:
        assert c.produce(topic_name, 0, build_batch([(None, b"next")], timestamp=ts)).base_offset == 15


def _records_produced(http: str) -> float:
    """kafscale_produce_records_total from the broker's /metrics."""
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "kafscale_produce_records_total")


def test_sigterm_with_confluent_acks0(broker_factory, topic_name):
    http = f"127.0.0.1:{free_port()}"
    b = broker_factory(extra_args=["--flush-interval-ms", "60000", "--http", http])
    create_topic(b.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": 0, "linger.ms": 0})
    for i in range(50):
        p.produce(topic_name, value=f"r{i}".encode(), partition=0)
    assert p.flush(10) == 0
    # acks=0: no answer says the broker has taken the records; its produce counter does.
    wait_until(lambda: _records_produced(http) >= 50, 10, "the broker to take the 50 acks=0 records")
    assert b.stop(signal.SIGTERM) == 0
    b.start()
    recs = raw_read_all(b.bootstrap, topic_name, 0)
    assert [(r.offset, r.value) for r in recs] == [(i, f"r{i}".encode()) for i in range(50)]


# ---------------------------------------------------------------------------------------
# recovery of a segment uploaded but never committed


def _write_segment(path: Path, base: int, batches: list[bytes]) -> None:
    """An independent segment writer (spec layout): header | batches | footer, plus index."""
    body = bytearray()
    count = 0
    last = base - 1
    positions = []
    off = base
    for b in batches:
        b = bytearray(b)
        struct.pack_into(">q", b, 0, off)
        n = struct.unpack_from(">i", b, 57)[0]
        positions.append((off, 32 + len(body)))
        body += b
        count += n
        last = off + n - 1
        off += n
    header = struct.pack(">4sHHqiqI", b"KAFS", 1, 0, base, count, now_ms(), 0)
    footer = struct.pack(">Iq4s", crc32c.crc32c(bytes(body)), last, b"END!")
    path.write_bytes(header + bytes(body) + footer)
    idx = struct.pack(">IHIIH", 0x00494458, 1, 1, 100, 0) + struct.pack(">qi", *positions[0])
    path.with_suffix(".index").write_bytes(idx)


def test_recovery_adopts_uncommitted_segment_and_ignores_corrupt_one(broker_factory, topic_name):
    # A segment per partition per flush: the uncommitted object a crash leaves is that layout's.
    b = broker_factory(extra_args=["--write-ahead-objects", "false"])
    ts = now_ms()
    with RawClient(b.bootstrap) as c:
        c.metadata([topic_name])
        assert c.produce(topic_name, 0, build_batch([(None, b"c0"), (None, b"c1")], timestamp=ts)).base_offset == 0
    assert b.stop() == 0
    pdir = Path(b.data_dir) / "objects" / "default" / topic_name / "0"
    # a crash between upload and metadata commit leaves exactly such an object behind
    _write_segment(pdir / f"segment-{2:020d}.kfs", 2, [build_batch([(b"k", b"u2"), (b"k", b"u3")], timestamp=ts)])
    # and one after it that was only partly written (no footer): must not be adopted
    torn = pdir / f"segment-{4:020d}.kfs"
    _write_segment(torn, 4, [build_batch([(None, b"torn")], timestamp=ts)])
    torn.write_bytes(torn.read_bytes()[:-10])
    b.start()
    with RawClient(b.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, LATEST).offset == 4
        recs = raw_read_all(b.bootstrap, topic_name, 0)
        assert [(r.offset, r.value) for r in recs] == [(0, b"c0"), (1, b"c1"), (2, b"u2"), (3, b"u3")]
        r = c.produce(topic_name, 0, build_batch([(None, b"n4")], timestamp=ts))
        assert error_code(r.error_code) == 0 and r.base_offset == 4
    recs = raw_read_all(b.bootstrap, topic_name, 0)
    assert [(r.offset, r.value) for r in recs][-1] == (4, b"n4")
