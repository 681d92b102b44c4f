"""Segment (.kfs) and index (.index) objects parsed back from disk and checked against the
spec's layout (kafscale-spec.md, "Segment File Format" / "Index File Format" / "S3 Key
Structure").

The parser here is deliberately independent of the broker's codec: plain `struct`, the
`crc32c` package and a small varint reader. The project's `segment.decode` /
`decode_index` are only used afterwards, to check that both readings agree.
"""

from __future__ import annotations

import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest
from confluent_kafka import Producer

from kafscale.protocol.records import COMPRESSION_GZIP, COMPRESSION_ZSTD, build_batch
from kafscale.storage import segment as project_segment
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code
from tests.support.wait import wait_until

SEG_HEADER = struct.Struct(">4sHHqiqI")  # magic, version, flags, base offset, count, created ms, reserved
SEG_FOOTER = struct.Struct(">Iq4s")  # crc32c of the batches, last offset, magic
IDX_HEADER = struct.Struct(">IHIIH")  # magic, version, entry count, interval, reserved
IDX_ENTRY = struct.Struct(">qi")  # offset, file position
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # 61 bytes, Kafka v2 record batch
SEGMENT_NAME = re.compile(r"^segment-(\d{20})\.kfs$")
INDEX_NAME = re.compile(r"^segment-(\d{20})\.index$")


@pytest.fixture(scope="module")
def broker():
    """This module's own broker, indexing every segment (by default only segments of 16 MiB
    and more get an index, and none of the ones here is that big), each flush uploading a
    segment per partition (--write-ahead-objects false: the tests check the segments each
    produce makes; the segments the write-ahead pieces are rewritten into are checked by
    test_segments_rewritten_from_write_ahead_objects_follow_the_spec)."""
    b = BrokerProcess(extra_args=["--index-min-bytes", "0", "--merge-interval-ms", "0", "--write-ahead-objects", "false"]).start()
    yield b
    b.stop()


@dataclass
class Batch:
    pos: int  # position in the .kfs file
    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_ts: int
    max_ts: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    raw: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


@dataclass
class Segment:
    path: Path
    base_offset: int
    version: int
    flags: int
    count: int
    created_ms: int
    reserved: int
    crc: int
    last_offset: int
    batches: list
    body: bytes


def parse_segment(path: Path) -> Segment:
    data = path.read_bytes()
    assert len(data) >= SEG_HEADER.size + SEG_FOOTER.size, f"{path.name}: {len(data)} bytes"
    magic, version, flags, base, count, created, reserved = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"KAFS" and struct.unpack(">I", magic)[0] == 0x4B414653, f"{path.name}: header magic {magic!r}"
    crc, last, fmagic = SEG_FOOTER.unpack_from(data, len(data) - SEG_FOOTER.size)
    assert fmagic == b"END!" and struct.unpack(">I", fmagic)[0] == 0x454E4421, f"{path.name}: footer magic {fmagic!r}"
    body_end = len(data) - SEG_FOOTER.size
    batches = []
    pos = SEG_HEADER.size
    while pos < body_end:
        assert pos + BATCH_HEADER.size <= body_end, f"{path.name}: truncated batch header at byte {pos}"
        fields = BATCH_HEADER.unpack_from(data, pos)
        length = fields[1]
        end = pos + 12 + length
        assert end <= body_end, f"{path.name}: batch at byte {pos} runs into the footer"
        b = Batch(pos, *fields, raw=data[pos:end])
        batches.append(b)
        pos = end
    assert pos == body_end, f"{path.name}: {pos - body_end} stray bytes before the footer"
    return Segment(path, base, version, flags, count, created, reserved, crc, last, batches, data[SEG_HEADER.size:body_end])


def parse_index(path: Path):
    data = path.read_bytes()
    magic, version, n, interval, reserved = IDX_HEADER.unpack_from(data, 0)
    assert len(data) == IDX_HEADER.size + n * IDX_ENTRY.size, f"{path.name}: {len(data)} bytes for {n} entries"
    entries = [IDX_ENTRY.unpack_from(data, IDX_HEADER.size + i * IDX_ENTRY.size) for i in range(n)]
    return magic, version, interval, reserved, entries


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _varbytes(buf: bytes, pos: int):
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    return buf[pos:pos + n], pos + n


def records_of(b: Batch):
    """(offset, timestamp, key, value, headers) of an uncompressed batch."""
    assert b.attributes & 0x07 == 0
    body = b.raw[61:]
    out, pos = [], 0
    for _ in range(b.count):
        length, pos = _varint(body, pos)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _varint(body, pos)
        off_delta, pos = _varint(body, pos)
        key, pos = _varbytes(body, pos)
        value, pos = _varbytes(body, pos)
        nh, pos = _varint(body, pos)
        headers = []
        for _h in range(nh):
            hk, pos = _varbytes(body, pos)
            hv, pos = _varbytes(body, pos)
            headers.append((hk.decode(), hv))
        assert pos == end
        out.append((b.base_offset + off_delta, b.first_ts + ts_delta, key, value, headers))
    assert pos == len(body)
    return out


def check_partition(pdir: Path, started_ms: int) -> list[Segment]:
    """Everything the spec promises about one partition's objects; returns its segments."""
    names = sorted(p.name for p in pdir.iterdir())
    kfs = [n for n in names if SEGMENT_NAME.match(n)]
    idx = [n for n in names if INDEX_NAME.match(n)]
    assert sorted(kfs + idx) == names, f"unexpected objects in {pdir}: {set(names) - set(kfs) - set(idx)}"
    assert [n[:-4] for n in kfs] == [n[:-6] for n in idx], "every segment has exactly one index"
    segments = []
    expected_base = None
    for name in kfs:
        seg = parse_segment(pdir / name)
        base_from_name = int(SEGMENT_NAME.match(name).group(1))
        assert seg.base_offset == base_from_name, f"{name}: header base {seg.base_offset}"
        assert seg.version == 1
        assert seg.reserved == 0
        assert started_ms - 5000 <= seg.created_ms <= int(time.time() * 1000) + 5000, seg.created_ms
        assert seg.batches, f"{name}: empty segment"
        if expected_base is not None:
            assert seg.base_offset == expected_base, f"{name}: gap or overlap, expected base {expected_base}"
        # batches: contiguous offsets, v2 magic, valid CRC32C over attributes..end
        nxt = seg.base_offset
        for b in seg.batches:
            assert b.magic == 2
            assert b.base_offset == nxt, f"{name}: batch at byte {b.pos} has base {b.base_offset}, expected {nxt}"
            assert crc32c.crc32c(b.raw[21:]) == b.crc, f"{name}: batch CRC mismatch at byte {b.pos}"
            assert b.count == b.last_offset_delta + 1 and b.count > 0
            nxt = b.last_offset + 1
        assert seg.count == sum(b.count for b in seg.batches), f"{name}: header message count"
        assert seg.last_offset == seg.batches[-1].last_offset, f"{name}: footer last offset"
        assert seg.crc == crc32c.crc32c(seg.body), f"{name}: footer CRC32C of the batches"
        # index
        magic, version, interval, reserved, entries = parse_index(pdir / (name[:-4] + ".index"))
        assert magic == 0x00494458 and version == 1 and reserved == 0 and interval > 0
        starts = {b.pos: b for b in seg.batches}
        assert entries, f"{name}: index has no entries"
        assert entries[0] == (seg.base_offset, SEG_HEADER.size)
        for off, pos in entries:
            assert pos in starts, f"{name}: index entry ({off}, {pos}) is not at a batch start"
            assert starts[pos].base_offset == off, f"{name}: index entry offset {off} != batch base {starts[pos].base_offset}"
        assert [e[0] for e in entries] == sorted({e[0] for e in entries}), "index offsets strictly increasing"
        # sparse: an entry once at least `interval` records passed since the previous one
        expected_entries, since = [], interval
        for b in seg.batches:
            if since >= interval:
                expected_entries.append((b.base_offset, b.pos))
                since = 0
            since += b.count
        assert entries == expected_entries
        # the project's reader agrees with this one
        dec = project_segment.decode((pdir / name).read_bytes())
        assert (dec.info.base_offset, dec.info.last_offset, dec.info.record_count) == (seg.base_offset, seg.last_offset, seg.count)
        pidx = project_segment.decode_index((pdir / (name[:-4] + ".index")).read_bytes())
        assert list(zip(pidx.offsets, pidx.positions)) == entries
        segments.append(seg)
        expected_base = seg.last_offset + 1
    return segments


def test_segment_and_index_layout(broker, topic_name):
    started = int(time.time() * 1000)
    ts = started
    with RawClient(broker.bootstrap) as c:
        md = c.metadata([topic_name])  # auto-creates with 1 partition
        assert error_code(md.topics[0].error_code) == 0
        epoch = md.topics[0].partitions[0].leader_epoch
        # request 1: two batches; request 2: one gzip batch; request 3: one zstd batch
        b1 = build_batch([(b"k0", b"v0", [("h", b"x")]), (None, b"v1"), (b"k2", None)], timestamp=ts)
        b2 = build_batch([(b"k3", b"v3"), (b"k4", b"v4")], timestamp=ts + 5)
        assert c.produce(topic_name, 0, b1 + b2).base_offset == 0
        assert c.produce(topic_name, 0, build_batch([(b"g", b"gz" * 100)] * 4, timestamp=ts, codec=COMPRESSION_GZIP)).base_offset == 5
        assert c.produce(topic_name, 0, build_batch([(b"z", b"zs" * 100)] * 2, timestamp=ts, codec=COMPRESSION_ZSTD)).base_offset == 9
    root = Path(broker.data_dir) / "objects"
    pdir = root / "default" / topic_name / "0"
    # key layout: {namespace}/{topic}/{partition}/segment-{base:020d}.kfs (+ .index)
    keys = sorted(str(p.relative_to(root)) for p in (root / "default" / topic_name).rglob("*") if p.is_file())
    # ... and the topic's marker (storage/topic_marker.py) beside its partition directories
    assert keys == sorted([f"default/{topic_name}/0/segment-{b:020d}.{ext}" for b in (0, 5, 9) for ext in ("kfs", "index")] + [f"default/{topic_name}/topic.json"])
    segs = check_partition(pdir, started)
    assert [(s.base_offset, s.last_offset, s.count) for s in segs] == [(0, 4, 5), (5, 8, 4), (9, 10, 2)]
    assert [[b.attributes & 7 for b in s.batches] for s in segs] == [[0, 0], [1], [4]]
    assert all(b.leader_epoch == epoch for s in segs for b in s.batches)
    recs = [r for b in segs[0].batches for r in records_of(b)]
    assert recs == [
        (0, ts, b"k0", b"v0", [("h", b"x")]),
        (1, ts, None, b"v1", []),
        (2, ts, b"k2", None, []),
        (3, ts + 5, b"k3", b"v3", []),
        (4, ts + 5, b"k4", b"v4", []),
    ]
    assert segs[0].batches[0].max_ts == ts and segs[0].batches[1].max_ts == ts + 5


def test_stored_batch_is_byte_identical_to_produced(broker, topic_name):
    """Only the base offset and the partition leader epoch (neither under the CRC) change."""
    ts = int(time.time() * 1000)
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        assert c.produce(topic_name, 0, build_batch([(b"a", b"1")], timestamp=ts)).base_offset == 0
        sent = build_batch([(b"key", b"value", [("hk", b"hv")]), (None, b"x" * 300)], timestamp=ts, base_offset=12345)
        assert c.produce(topic_name, 0, sent).base_offset == 1
    pdir = Path(broker.data_dir) / "objects" / "default" / topic_name / "0"
    seg = parse_segment(pdir / f"segment-{1:020d}.kfs")
    assert len(seg.batches) == 1
    stored = seg.batches[0].raw
    assert len(stored) == len(sent)
    assert struct.unpack_from(">q", stored, 0)[0] == 1
    assert stored[8:12] == sent[8:12]
    assert stored[16:] == sent[16:], "the broker changed bytes covered by the batch CRC"


def test_sparse_index_over_many_batches(broker, topic_name):
    started = int(time.time() * 1000)
    batches = [build_batch([(f"k{b}-{i}".encode(), b"v") for i in range(n)], timestamp=started) for b, n in enumerate([40, 70, 30, 120, 5, 60, 90, 1, 100])]
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        r = c.produce(topic_name, 0, b"".join(batches))
        assert error_code(r.error_code) == 0 and r.base_offset == 0
    pdir = Path(broker.data_dir) / "objects" / "default" / topic_name / "0"
    segs = check_partition(pdir, started)
    assert len(segs) == 1 and segs[0].count == 516 and len(segs[0].batches) == 9
    _m, _v, interval, _r, entries = parse_index(pdir / f"segment-{0:020d}.index")
    assert 1 < len(entries) < 9, f"expected a sparse index over 9 batches with interval {interval}, got {entries}"


def test_multi_partition_segments_from_client(broker, topic_name):
    from confluent_kafka.admin import AdminClient, NewTopic

    started = int(time.time() * 1000)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # keep the handle alive until the result
    admin.create_topics([NewTopic(topic_name, 3, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    for round_ in range(3):
        for part in range(3):
            for i in range(4):
                p.produce(topic_name, key=f"{part}-{i}".encode(), value=f"r{round_}".encode(), partition=part)
        assert p.flush(15) == 0
    root = Path(broker.data_dir) / "objects" / "default" / topic_name
    assert sorted(d.name for d in root.iterdir()) == ["0", "1", "2", "topic.json"]
    for part in range(3):
        segs = check_partition(root / str(part), started)
        assert segs[0].base_offset == 0 and segs[-1].last_offset == 11
        assert sum(s.count for s in segs) == 12


def test_namespace_is_first_key_component(broker_factory, topic_name):
    # (with write-ahead objects, the data is rewritten into the partition's segment at once)
    b = broker_factory(extra_args=["--namespace", "prod-eu", "--index-min-bytes", "0", "--segment-max-age-ms", "0", "--merge-interval-ms", "100"])
    started = int(time.time() * 1000)
    with RawClient(b.bootstrap) as c:
        c.metadata([topic_name])
        assert c.produce(topic_name, 0, build_batch([(b"k", b"v")], timestamp=started)).base_offset == 0
    root = Path(b.data_dir) / "objects"
    wait_until(lambda: (root / "prod-eu" / topic_name / "0" / f"segment-{0:020d}.index").exists(), 30, "the partition's segment and index")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    # Besides the topic's objects: topic markers, the metadata snapshots (under ~metadata/,
    # a name no topic can have) and the write-ahead objects (~wal/), all under the namespace.
    snapshots = [f for f in files if f.startswith("prod-eu/~metadata/")]  # (one may be being written)
    assert all(re.fullmatch(r"prod-eu/~metadata/(snapshot-\d{8}T\d{9}Z-0\.kms|\.tmp-.*)", f) for f in snapshots)
    wal = [f for f in files if f.startswith("prod-eu/~wal/")]
    assert all(re.fullmatch(r"prod-eu/~wal/(\d{13}-0-[0-9a-f]{8}-\d{10}\.wal|\.tmp-.*)", f) for f in wal), wal
    assert [f for f in files if f not in snapshots and f not in wal] == [
        "prod-eu/__consumer_offsets/topic.json",
        f"prod-eu/{topic_name}/0/segment-{0:020d}.index", f"prod-eu/{topic_name}/0/segment-{0:020d}.kfs", f"prod-eu/{topic_name}/topic.json",
    ]
    check_partition(root / "prod-eu" / topic_name / "0", started)


def test_segments_rewritten_from_write_ahead_objects_follow_the_spec(broker_factory, topic_name):
    """With --write-ahead-objects a flush writes one object for all partitions; the merger
    rewrites each partition's pieces into the spec's own segments and indexes, which read
    back as above: the batches as produced, at their offsets, in one segment per run."""
    b = broker_factory(extra_args=["--write-ahead-objects", "true", "--index-min-bytes", "0", "--segment-max-age-ms", "0", "--merge-interval-ms", "100",
                                   "--merge-grace-ms", "0"])  # (merged-away segments go at once)
    started = int(time.time() * 1000)
    ts = started
    sent = [
        build_batch([(b"k0", b"v0", [("h", b"x")]), (None, b"v1"), (b"k2", None)], timestamp=ts),
        build_batch([(b"g", b"gz" * 100)] * 4, timestamp=ts, codec=COMPRESSION_GZIP),
        build_batch([(b"z", b"zs" * 100)] * 2, timestamp=ts + 5, codec=COMPRESSION_ZSTD),
    ]
    with RawClient(b.bootstrap) as c:
        c.metadata([topic_name])
        assert [c.produce(topic_name, 0, batch).base_offset for batch in sent] == [0, 3, 7]
    objects = Path(b.data_dir) / "objects" / "default"
    pdir = objects / topic_name / "0"

    def rewritten() -> list[Segment]:
        # every offset in segments, no piece left (the objects go later, once old enough)
        segs = check_partition(pdir, started) if pdir.exists() else []
        return segs if segs and segs[-1].last_offset == 8 else []

    segs = wait_until(rewritten, 30, "the pieces rewritten into the partition's segments", interval=0.2)
    assert segs[0].base_offset == 0 and sum(s.count for s in segs) == 9
    stored = [bt.raw for s in segs for bt in s.batches]
    assert [raw[16:] for raw in stored] == [batch[16:] for batch in sent]  # byte-identical under the CRC
    assert [struct.unpack_from(">q", raw, 0)[0] for raw in stored] == [0, 3, 7]
    assert [r[:4] for r in records_of(segs[0].batches[0])] == [(0, ts, b"k0", b"v0"), (1, ts, None, b"v1"), (2, ts, b"k2", None)]


def test_batches_through_keeps_only_batches_within_the_segment_and_skips_the_walk_when_known():
    """A rewrite reads a segment's batches out of an object that may hold more; with the end
    known (the footer, a cached view) within the segment, the batches are kept as they are."""
    a = bytearray(build_batch([(b"k", b"v")] * 3))  # offsets 0-2
    b = bytearray(build_batch([(b"k", b"v")] * 2))
    struct.pack_into(">q", b, 0, 3)  # offsets 3-4
    body = bytes(a + b)
    assert bytes(project_segment.batches_through(body, 2)) == bytes(a)
    assert bytes(project_segment.batches_through(body, 4)) == body
    assert bytes(project_segment.batches_through(body, 2, known_last=4)) == bytes(a)  # known end past: walked
    assert bytes(project_segment.batches_through(body, 4, known_last=4)) == body
