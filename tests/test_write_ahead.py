"""Write-ahead objects (issue #32): the codec (storage/write_ahead.py) and, in process, the
broker-wide flush (storage/write_ahead_flusher.py) over a real file store and SQLite: one
object per flush for many partitions, each partition's piece a byte-exact spec segment,
read back through the shared read path; a failed upload fails every waiter and renumbers
nothing; a partition fenced mid-flush fails only its own waiters."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import pytest

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.errors import ErrorCode
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment, write_ahead
from kafscale.storage.failures import StorageError
from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.logs import LogManager
from tests.support.wait import wait_until_async


def _enc(base: int, values: list[bytes], created_ms: int = 1_700_000_000_000) -> segment.EncodedSegment:
    batch = records.build_batch([(None, v) for v in values], timestamp=created_ms)
    body = bytearray(batch)
    records.patch_batch(memoryview(body), 0, base, 0)
    return segment.encode([bytes(body)], base, created_ms=created_ms)


def _object(n: int = 3) -> tuple[bytes, list[segment.EncodedSegment], list[str]]:
    encs = [_enc(10 * i, [b"p%d-%d" % (i, j) for j in range(i + 1)]) for i in range(n)]
    ids = [str(uuid.uuid4()) for _ in range(n)]
    obj = write_ahead.encode([(f"topic-{i}", ids[i], i, e) for i, e in enumerate(encs)], 1_700_000_000_123)
    data = b"".join(bytes(p) for p in obj.parts)
    assert len(data) == obj.size
    return data, encs, ids


def test_codec_round_trip_and_pieces_are_spec_segments():
    data, encs, ids = _object()
    created, pieces = write_ahead.decode(data)
    assert created == 1_700_000_000_123
    assert [(p.topic, p.topic_id, p.partition, p.base_offset, p.last_offset) for p in pieces] == [
        (f"topic-{i}", ids[i], i, 10 * i, 10 * i + i) for i in range(3)
    ]
    for p, enc in zip(pieces, encs):
        piece = data[p.position : p.position + p.length]
        assert piece == b"".join(bytes(x) for x in enc.parts)  # byte-exact: what a segment flush writes
        assert segment.decode(piece).info == dataclasses.replace(enc.info, aborted=(), open_txns=())
    assert data[:4] == b"KWAL" and data[-4:] == b"KWAL"


@pytest.mark.parametrize("damage", ["index_crc", "truncated", "trailer_magic", "short", "header_magic"])
def test_codec_refuses_damaged_objects(damage):
    data, _encs, _ids = _object()
    index_pos = write_ahead.TRAILER.unpack_from(data, len(data) - write_ahead.TRAILER_SIZE)[0]
    if damage == "index_crc":
        data = data[:index_pos] + bytes([data[index_pos] ^ 1]) + data[index_pos + 1 :]
        match = "CRC32C of the index"
    elif damage == "truncated":
        data = data[:-5]
        match = "trailer magic"
    elif damage == "trailer_magic":
        data = data[:-1] + b"X"
        match = "trailer magic"
    elif damage == "short":
        data = data[:20]
        match = "too short"
    else:
        data = b"XXXX" + data[4:]
        match = "header magic"
    with pytest.raises(write_ahead.WriteAheadFormatError, match=match):
        write_ahead.decode(data)


def test_codec_refuses_an_index_promising_more_than_it_holds():
    data, _encs, _ids = _object()
    index_pos, index_len, count, crc, magic = write_ahead.TRAILER.unpack_from(data, len(data) - write_ahead.TRAILER_SIZE)
    bad = data[: len(data) - write_ahead.TRAILER_SIZE] + write_ahead.TRAILER.pack(index_pos, index_len, count + 1, crc, magic)
    with pytest.raises(write_ahead.WriteAheadFormatError, match="cut short"):
        write_ahead.decode(bad)


def test_keys_sort_by_time_and_parse():
    a = write_ahead.object_key("ns", 1_700_000_000_000, 3, "abcd1234", 7)
    b = write_ahead.object_key("ns", 1_700_000_000_001, 1, "ffff0000", 1)
    assert a.startswith("ns/~wal/") and a < b
    assert write_ahead.created_ms_of_key(a) == 1_700_000_000_000
    assert write_ahead.created_ms_of_key("ns/t/0/segment-00000000000000000000.kfs") is None


async def test_read_index_from_the_tail_of_a_stored_object(tmp_path, monkeypatch):
    store = LocalObjectStore(tmp_path)
    data, _encs, _ids = _object(5)
    await store.create("ns/~wal/x.wal", [data])
    pieces = await write_ahead.read_index(store, "ns/~wal/x.wal")
    assert [p.partition for p in pieces] == list(range(5))
    monkeypatch.setattr(write_ahead, "INDEX_TAIL_BYTES", 40)  # an index longer than the first read
    assert await write_ahead.read_index(store, "ns/~wal/x.wal") == pieces


# -- the broker-wide flush, in process -------------------------------------------------


class _FailingStore(LocalObjectStore):
    """A file store whose creates fail while `failing` (an unreachable store at the edge)."""

    failing = False

    async def create(self, key, parts):
        if self.failing:
            from kafscale.storage.objectstore import ObjectStoreError

            raise ObjectStoreError("store unreachable")
        await super().create(key, parts)


def _manager(tmp_path, store=None, **settings) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0, write_ahead_objects=True, **settings)
    meta = MetadataStore(SqliteKV(tmp_path / "meta.sqlite"))
    return LogManager(meta, store or LocalObjectStore(tmp_path / "objects"), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


def _append(lg, values: list[bytes]):
    data = memoryview(bytearray(records.build_batch([(None, v) for v in values], timestamp=int(time.time() * 1000))))
    return lg.append(data, records.validate_record_set(data), True)


def _wal_objects(tmp_path) -> list:
    d = tmp_path / "objects" / "default" / "~wal"
    return sorted(d.iterdir()) if d.exists() else []


async def _read_all(lg) -> list[tuple[int, bytes]]:
    out = []
    for chunk in await lg.read(0, 1 << 24, True):
        for pos, _h in records.iter_batches(chunk):
            out += [(r.offset, r.value) for r in records.decode_records(chunk, pos)]
    return out


async def test_one_object_per_flush_for_many_partitions(tmp_path):
    mgr = _manager(tmp_path, flush_interval_ms=200, min_flush_interval_ms=200)
    await mgr.metadata.create_topic(TopicMeta("many", 16))
    logs = [await mgr.get_log("many", p) for p in range(16)]
    waiters = []
    for rnd in range(3):
        for p, lg in enumerate(logs):
            waiters.append(_append(lg, [b"%d-%d-%d" % (rnd, p, i) for i in range(5)])[2])
    await asyncio.gather(*waiters)
    objects = _wal_objects(tmp_path)
    # Everything waited in the buffers together: far fewer objects than partition flushes.
    assert 1 <= len(objects) <= 3, objects
    assert mgr.write_ahead.objects_written == len(objects) and mgr.metrics.puts == len(objects)
    assert not (tmp_path / "objects" / "default" / "many").exists() or not list((tmp_path / "objects" / "default" / "many").rglob("*.kfs"))
    for p, lg in enumerate(logs):
        assert lg.high_watermark == 15
        assert await _read_all(lg) == [(rnd * 5 + i, b"%d-%d-%d" % (rnd, p, i)) for rnd in range(3) for i in range(5)]
        assert all(s.wao_key.startswith("default/~wal/") for s in lg.state.segments)
    # each segment's range of its object is a whole spec segment holding what the metadata says
    st = await mgr.metadata.get_partition("many", 3)
    for seg in st.segments:
        raw = (tmp_path / "objects" / seg.wao_key).read_bytes()
        got = segment.decode(raw[seg.wao_position : seg.wao_position + seg.size]).info
        assert (got.base_offset, got.last_offset, got.created_ms, got.size) == (seg.base_offset, seg.last_offset, seg.created_ms, seg.size)
    await mgr.stop()
    # and a fresh broker (cold cache) reads them from the objects
    again = _manager(tmp_path)
    lg = await again.get_log("many", 7)
    again.cache.drop_prefix(("many",))
    assert await _read_all(lg) == [(rnd * 5 + i, b"%d-%d-%d" % (rnd, 7, i)) for rnd in range(3) for i in range(5)]
    await again.stop()


async def test_failed_upload_fails_every_waiter_and_renumbers_nothing(tmp_path):
    store = _FailingStore(tmp_path / "objects")
    mgr = _manager(tmp_path, store=store)
    await mgr.metadata.create_topic(TopicMeta("fail", 4))
    logs = [await mgr.get_log("fail", p) for p in range(4)]
    for lg in logs:
        await _append(lg, [b"ok"])[2]
    store.failing = True
    pending = [_append(lg, [b"lost-1", b"lost-2"])[2] for lg in logs]
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(r, StorageError) and r.error_code == ErrorCode.kafka_storage_error for r in results), results
    store.failing = False
    for p, lg in enumerate(logs):
        base, _t, w = _append(lg, [b"again-%d" % p])
        await w
        assert base == 1  # the failed offsets were handed out again
        assert await _read_all(lg) == [(0, b"ok"), (1, b"again-%d" % p)]
    await mgr.stop()


async def test_a_partition_fenced_mid_flush_fails_only_its_own_waiters(tmp_path):
    mgr = _manager(tmp_path)
    await mgr.metadata.create_topic(TopicMeta("fence", 3))
    logs = [await mgr.get_log("fence", p) for p in range(3)]
    for lg in logs:
        await _append(lg, [b"first"])[2]
    # Another owner takes partition 1 over (its leader epoch bumped) behind this broker's back.
    st = await mgr.metadata.get_partition("fence", 1)
    await mgr.metadata.update_partition(st, leader_epoch=st.leader_epoch + 1, owner=99)
    pending = [_append(lg, [b"second"])[2] for lg in logs]
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StorageError) and results[1].error_code == ErrorCode.not_leader_or_follower
    for p in (0, 2):
        assert (await mgr.metadata.get_partition("fence", p)).high_watermark == 2
    assert (await mgr.metadata.get_partition("fence", 1)).high_watermark == 1
    assert len(_wal_objects(tmp_path)) == 4  # 3 single-partition flushes, then one for all three
    await mgr.stop()


class _ListingStore(LocalObjectStore):
    """A file store that notes the prefixes it lists."""

    def __init__(self, root):
        super().__init__(root)
        self.listed: list[str] = []

    async def list(self, prefix):
        self.listed.append(prefix)
        return await super().list(prefix)


async def test_the_first_owner_loads_without_listing_and_a_reload_still_recovers(tmp_path):
    """A partition this broker is the first ever to own (its etcd takeover wrote leader epoch 1
    and its id) loads without listing its prefix: nobody flushed it before. Loaded again
    in the same epoch (after a flush whose commit failed, the log is forgotten), it lists
    and adopts the segment that reached the store but not the metadata."""
    store = _ListingStore(tmp_path / "objects")
    mgr = _manager(tmp_path, store=store)
    await mgr.metadata.create_topic(TopicMeta("first", 2))
    for p in (0, 1):
        st = await mgr.metadata.get_partition("first", p)
        await mgr.metadata.update_partition(st, leader_epoch=1, owner=0 if p == 0 else 5)  # 1: another broker's before
    await mgr.get_log("first", 0)
    await mgr.get_log("first", 1)
    prefix = lambda p: segment.partition_prefix("default", "first", p)  # noqa: E731
    assert not any(x.startswith(prefix(0)) for x in store.listed), store.listed
    assert any(x.startswith(prefix(1)) for x in store.listed), "a partition another broker owned before is listed"
    # the upload of a flush whose commit never happened, then the log forgotten (as after a failed flush)
    enc = _enc(0, [b"uploaded", b"not committed"], created_ms=int(time.time() * 1000))
    await store.create(segment.segment_key("default", "first", 0, 0), enc.parts)
    mgr.forget("first", 0)
    lg = await mgr.get_log("first", 0)
    assert any(x.startswith(prefix(0)) for x in store.listed)
    assert lg.high_watermark == 2 and await _read_all(lg) == [(0, b"uploaded"), (1, b"not committed")]
    await mgr.stop()


# -- the rewrite into spec segments and the cleanup, in process --------------------------


async def test_rewrite_makes_byte_exact_spec_segments_and_cleanup_deletes_the_objects(tmp_path):
    mgr = _manager(tmp_path, segment_max_age_ms=0, merge_grace_ms=0, write_ahead_orphan_age_ms=4000)
    await mgr.metadata.create_topic(TopicMeta("rw", 4))
    logs = [await mgr.get_log("rw", p) for p in range(4)]
    for rnd in range(2):
        await asyncio.gather(*(_append(lg, [b"%d-%d" % (rnd, p)])[2] for p, lg in enumerate(logs)))
    before = {p: list(lg.state.segments) for p, lg in enumerate(logs)}
    pieces = {}
    for p, segs in before.items():
        for seg in segs:
            raw = (tmp_path / "objects" / seg.wao_key).read_bytes()
            pieces[(p, seg.base_offset)] = raw[seg.wao_position : seg.wao_position + seg.size]
    assert await mgr.merger.run_once() == 4  # one run per partition: its two pieces
    for p, lg in enumerate(logs):
        assert [s.wao_key for s in lg.state.segments] == [""]
        spec = tmp_path / "objects" / "default" / "rw" / str(p) / f"segment-{0:020d}.kfs"
        decoded = segment.decode(spec.read_bytes())
        # the spec's layout, the batches as produced, at their offsets, the first piece's creation time
        assert bytes(decoded.batches) == b"".join(bytes(segment.decode(pieces[(p, s.base_offset)]).batches) for s in before[p])
        assert decoded.info.created_ms == before[p][0].created_ms and decoded.info.last_offset == 1
        assert await _read_all(lg) == [(0, b"0-%d" % p), (1, b"1-%d" % p)]
    # A run of one piece is rewritten byte for byte: the spec object IS the piece.
    await asyncio.gather(*(_append(lg, [b"third"])[2] for lg in logs))
    third = logs[0].state.segments[-1]
    piece = (tmp_path / "objects" / third.wao_key).read_bytes()[third.wao_position : third.wao_position + third.size]
    await mgr.merger.run_once()
    assert (tmp_path / "objects" / "default" / "rw" / "0" / f"segment-{2:020d}.kfs").read_bytes() == piece
    # nothing refers to the objects any more: deleted once old enough (the orphan age)
    assert _wal_objects(tmp_path)
    await wait_until_async(lambda: _cleanup_done(mgr, tmp_path), 15, "the objects to be deleted")
    for p, lg in enumerate(logs):
        mgr.cache.drop_prefix(("rw",))
        assert await _read_all(lg) == [(0, b"0-%d" % p), (1, b"1-%d" % p), (2, b"third")]
    await mgr.stop()


async def _cleanup_done(mgr, tmp_path) -> bool:
    await mgr.merger.write_ahead_cleanup.run_once()
    return not _wal_objects(tmp_path)


async def test_an_uncommitted_object_is_deleted_only_once_old_enough(tmp_path):
    mgr = _manager(tmp_path, merge_grace_ms=0, write_ahead_orphan_age_ms=3000)
    await mgr.metadata.create_topic(TopicMeta("orph", 1))
    lg = await mgr.get_log("orph", 0)
    await _append(lg, [b"committed"])[2]
    # an object uploaded whose commit never happened (a kill -9 in between)
    obj = write_ahead.encode([("orph", lg.topic_id, 0, _enc(1, [b"never acknowledged"]))], int(time.time() * 1000))
    orphan = write_ahead.object_key("default", int(time.time() * 1000), 0, "deadbeef", 1)
    await mgr.store.create(orphan, obj.parts)
    cleanup = mgr.merger.write_ahead_cleanup
    assert await cleanup.run_once() == 0  # too young: its commit might still come
    assert (tmp_path / "objects" / orphan).exists()
    await wait_until_async(lambda: _cleanup_done_keeping(cleanup, tmp_path / "objects" / orphan), 15, "the orphan to be deleted")
    assert [s.wao_key for s in lg.state.segments] != [""]  # the committed one stays: it is referenced
    assert (tmp_path / "objects" / lg.state.segments[0].wao_key).exists()
    assert await _read_all(lg) == [(0, b"committed")]
    await mgr.stop()


async def _cleanup_done_keeping(cleanup, path) -> bool:
    await cleanup.run_once()
    return not path.exists()


async def _objects_aged(tmp_path, age_ms: int) -> bool:
    return all(time.time() * 1000 - write_ahead.created_ms_of_key(p.name) >= age_ms for p in _wal_objects(tmp_path))


async def test_cleanup_reads_only_the_pieces_of_objects_of_age_and_never_deletes_a_held_one(tmp_path):
    """A round looks at the objects old enough to go, and asks the metadata about their
    pieces only: not about a topic's history of rewritten segments. A released object goes
    after the grace, an object with a piece still held never does."""
    mgr = _manager(tmp_path, segment_max_age_ms=3_600_000, merge_grace_ms=400, write_ahead_orphan_age_ms=1000)
    cleanup = mgr.merger.write_ahead_cleanup
    mgr.merger.write_ahead_cleanup = None  # rounds run by hand here
    await mgr.metadata.create_topic(TopicMeta("hist", 64))  # a history: 64 partitions' data rewritten into their own segments
    hist = [await mgr.get_log("hist", p) for p in range(64)]
    for rnd in range(3):
        await asyncio.gather(*(_append(lg, [b"h%d" % rnd])[2] for lg in hist))
        mgr.merger.segment_max_age_ms = 0
        await mgr.merger.run_once()
        mgr.merger.segment_max_age_ms = 3_600_000
    assert all(not s.wao_key for lg in hist for s in lg.state.segments)
    released = {p.name for p in _wal_objects(tmp_path)}
    assert len(released) >= 3
    await mgr.metadata.create_topic(TopicMeta("live", 2))  # pieces that stay in their objects
    live = [await mgr.get_log("live", p) for p in range(2)]
    for rnd in range(2):
        await asyncio.gather(*(_append(lg, [b"%d-%d" % (rnd, p)])[2] for p, lg in enumerate(live)))
    held = {s.wao_key.rsplit("/", 1)[-1] for lg in live for s in lg.state.segments}
    assert len(held) == 2 and not held & released
    await wait_until_async(lambda: _objects_aged(tmp_path, 1000), 15, "every object to be of age")

    assert await cleanup.run_once() == 0  # released, but the grace starts now
    assert cleanup.index_reads == len(released) + 2  # each object's index, once
    assert cleanup.metadata_keys_read <= 2 * 3 * 64 + 2  # the released objects' 3 x 64 pieces (chunks of 1, 2, 4, ...), one piece of each held object
    before = cleanup.metadata_keys_read
    await wait_until_async(lambda: _cleanup_round_deleted(cleanup, len(released)), 15, "the released objects to go")
    assert {p.name for p in _wal_objects(tmp_path)} == held
    assert cleanup.index_reads == len(released) + 2  # not read again
    rounds_since = cleanup.metadata_keys_read - before
    for _ in range(3):
        before = cleanup.metadata_keys_read
        assert await cleanup.run_once() == 0
        assert cleanup.metadata_keys_read - before == 2  # one piece of each held object: nothing of the history
    assert {p.name for p in _wal_objects(tmp_path)} == held and rounds_since >= 2
    # rewritten: released, deleted after the grace, the records read from the segments
    mgr.merger.segment_max_age_ms = 0
    await mgr.merger.run_once()
    mgr.merger.write_ahead_cleanup = cleanup
    await wait_until_async(lambda: _cleanup_done(mgr, tmp_path), 15, "the last objects to go")
    for p, lg in enumerate(live):
        mgr.cache.drop_prefix(("live",))
        assert await _read_all(lg) == [(0, b"0-%d" % p), (1, b"1-%d" % p)]
    await mgr.stop()


async def test_cleanup_checks_an_object_with_a_damaged_index_against_every_segment_key(tmp_path):
    """An object whose index cannot be read: kept while a segment refers to it, deleted
    (after the grace) once none does, as before indexes were read."""
    mgr = _manager(tmp_path, merge_grace_ms=0, write_ahead_orphan_age_ms=1000)
    cleanup = mgr.merger.write_ahead_cleanup
    await mgr.metadata.create_topic(TopicMeta("dmg", 1))
    lg = await mgr.get_log("dmg", 0)
    await _append(lg, [b"kept"])[2]
    held = tmp_path / "objects" / lg.state.segments[0].wao_key
    obj = write_ahead.encode([("dmg", lg.topic_id, 0, _enc(1, [b"never committed"]))], int(time.time() * 1000))
    data = bytearray(b"".join(bytes(p) for p in obj.parts))
    data[-write_ahead.TRAILER_SIZE] ^= 0xFF  # the trailer's index position: the index cannot be found
    damaged = write_ahead.object_key("default", int(time.time() * 1000), 0, "damaged", 1)
    await mgr.store.create(damaged, [bytes(data)])
    # the referenced object's index damaged too (same bytes, as a store might return them)
    good = held.read_bytes()
    held.write_bytes(good[:-write_ahead.TRAILER_SIZE] + bytes([good[-write_ahead.TRAILER_SIZE] ^ 0xFF]) + good[-write_ahead.TRAILER_SIZE + 1 :])
    await wait_until_async(lambda: _objects_aged(tmp_path, 1000), 15, "both objects to be of age")
    await wait_until_async(lambda: _cleanup_done_keeping(cleanup, tmp_path / "objects" / damaged), 15, "the damaged orphan to go")
    assert held.exists()  # a segment refers to it
    held.write_bytes(good)
    mgr.cache.drop_prefix(("dmg",))
    assert await _read_all(lg) == [(0, b"kept")]
    await mgr.stop()


async def _cleanup_round_deleted(cleanup, n: int) -> bool:
    await cleanup.run_once()
    return cleanup.deleted >= n


# -- commit_segments on both metadata backends ----------------------------------------------


@pytest.fixture(params=["sqlite", "etcd"])
async def metadata(request, tmp_path):
    if request.param == "sqlite":
        kv = SqliteKV(tmp_path / "meta.sqlite")
    else:
        from kafscale.metadata.etcd import EtcdKV

        kv = EtcdKV.from_url(request.getfixturevalue("etcd_server").url, prefix=f"/wal-{uuid.uuid4().hex[:10]}")
    store = MetadataStore(kv)
    yield store
    await store.close()


async def test_commit_segments_of_many_partitions_fails_only_the_moved_ones(metadata):
    """100 partitions (more than one etcd transaction's --max-txn-ops allows at once): two
    taken over meanwhile fail alone; the others are committed, each as commit_segment would."""
    await metadata.create_topic(TopicMeta("cs", 100))
    states = [await metadata.get_partition("cs", p) for p in range(100)]
    for p in (7, 70):  # another owner took these over (their state changed)
        await metadata.update_partition(states[p], leader_epoch=1, owner=9)
    infos = [segment.SegmentInfo(0, 4, 100, 5, 1, 1, wao_key="default/~wal/x.wal", wao_position=16 + 100 * p) for p in range(100)]
    results = await metadata.commit_segments(list(zip(states, infos)))
    for p, res in enumerate(results):
        if p in (7, 70):
            assert isinstance(res, Exception) and "changed concurrently" in str(res), res
            assert (await metadata.get_partition("cs", p)).high_watermark == 0
        else:
            stored = await metadata.get_partition("cs", p)
            assert stored.high_watermark == 5 == res.high_watermark and res.version == stored.version
            assert stored.segments == [infos[p]]  # the location round-trips
    assert await metadata.write_ahead_keys_in_use() == {"default/~wal/x.wal"}


async def test_wao_keys_in_use_read_any_key_the_json_escapes(metadata):
    """The cleanup cuts wao keys out of the stored JSON; a key the JSON escapes (a quote, a
    non-ASCII namespace) is still read as written, so its object is never deleted in use."""
    odd = ['ns "é"/~wal/0000000000001-0-ab-0000000001.wal', "plain/~wal/0000000000001-0-ab-0000000002.wal"]
    await metadata.create_topic(TopicMeta("odd", 3))
    states = [await metadata.get_partition("odd", p) for p in range(3)]
    infos = [segment.SegmentInfo(0, 0, 100, 1, 1, 1, wao_key=odd[0], wao_position=16), segment.SegmentInfo(0, 0, 100, 1, 1, 1, wao_key=odd[1]),
             segment.SegmentInfo(0, 0, 100, 1, 1, 1)]
    assert all(not isinstance(r, Exception) for r in await metadata.commit_segments(list(zip(states, infos))))
    assert await metadata.write_ahead_keys_in_use() == set(odd)


@pytest.mark.parametrize("info", [
    segment.SegmentInfo(7, 9, 300, 3, 1_700_000_000_000, 1_700_000_000_001),
    segment.SegmentInfo(7, 9, 300, 3, -1, 5, wao_key='n "é"/~wal/x.wal', wao_position=16),
    segment.SegmentInfo(7, 9, 300, 3, -1, 5, aborted=((1, 7, 9),), open_txns=((2, 0, 8),), wao_key="k", wao_position=3),
    segment.SegmentInfo(7, 9, 300, 3, -1, 5, cleaned=True, delete_horizon_ms=42),
])
def test_documents_formatted_directly_are_the_json_encoders(info):
    """The flush's directly formatted documents are byte for byte what the general encoder
    writes (a restore writes them back through it, and readers compare)."""
    from kafscale.metadata import codec
    from kafscale.metadata.store import PartitionState

    doc = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    for name in ("aborted", "open_txns", "cleaned"):
        if not doc[name]:
            del doc[name]
    if doc["delete_horizon_ms"] < 0:
        del doc["delete_horizon_ms"]
    if not doc["wao_key"]:
        del doc["wao_key"], doc["wao_position"]
    assert codec.encode_segment(info) == codec.encode(doc)
    assert codec.decode_segment(codec.encode_segment(info)) == info
    st = PartitionState("t", 1, 3, 100, 2, -1, 7)
    assert MetadataStore.state_value(st) == codec.encode(MetadataStore.state_doc(st))


async def test_cycles_are_spaced_by_the_min_flush_interval_however_many_partitions(tmp_path):
    """Records reaching 64 idle partitions one at a time (each partition alone would upload
    at once): the broker still uploads at most about once per min flush interval."""
    mgr = _manager(tmp_path, flush_interval_ms=400, min_flush_interval_ms=400)
    await mgr.metadata.create_topic(TopicMeta("spaced", 64))
    logs = [await mgr.get_log("spaced", p) for p in range(64)]
    start = time.monotonic()
    waiters = []
    for i in range(256):
        waiters.append(_append(logs[i % 64], [b"r%d" % i])[2])
        await asyncio.sleep(0.01)  # the load: one record every 10 ms, each to the next partition
    await asyncio.gather(*waiters)
    elapsed = time.monotonic() - start
    assert mgr.write_ahead.objects_written <= elapsed / 0.4 + 2, (mgr.write_ahead.objects_written, elapsed)
    assert all(lg.high_watermark == 4 for lg in logs)
    await mgr.stop()


# -- cycles pipelined per partition (#33) ------------------------------------------------


class _HeldCommits:
    """Wraps MetadataStore.commit_segments: each commit waits until released, then lands
    or (the first, with `fail_first`) fails as with an unreachable metadata store (each
    partition's outcome unknown)."""

    def __init__(self, original):
        self.original = original
        self.started: list[list[int]] = []  # each commit's base offsets, in order
        self.release = asyncio.Event()
        self.fail_first = False

    async def __call__(self, commits):
        self.started.append([seg.base_offset for _st, seg in commits])
        await self.release.wait()
        if self.fail_first and len(self.started) == 1:
            return [MetadataUnavailable("metadata store unavailable")] * len(commits)  # its outcome unknown
        return await self.original(commits)


async def _log_with_two_cycles(tmp_path, monkeypatch, topic: str):
    """A log whose piece in one cycle is being committed (held) while its next data goes
    into the next cycle's object."""
    mgr = _manager(tmp_path, min_flush_interval_ms=0)
    await mgr.metadata.create_topic(TopicMeta(topic, 1))
    lg = await mgr.get_log(topic, 0)
    held = _HeldCommits(mgr.metadata.commit_segments)
    monkeypatch.setattr(mgr.metadata, "commit_segments", held)
    first = _append(lg, [b"first"])[2]
    await wait_until_async(lambda: held.started == [[0]], 10, "the first cycle's object written and its commit begun", interval=0.01)
    second = _append(lg, [b"second"])[2]
    await wait_until_async(lambda: len(_wal_objects(tmp_path)) == 2, 10, "the next cycle's object written meanwhile", interval=0.01)
    return mgr, lg, held, first, second


async def test_a_partition_goes_into_the_next_object_while_its_last_piece_commits(tmp_path, monkeypatch):
    mgr, lg, held, first, second = await _log_with_two_cycles(tmp_path, monkeypatch, "wa-pipelined")
    assert held.started == [[0]]  # the second piece's commit waits for the first's
    assert not first.done() and not second.done()
    assert lg.high_watermark == 0  # nothing readable before its commit
    held.release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert held.started == [[0], [1]]
    st = await mgr.metadata.get_partition("wa-pipelined", 0)
    assert st.high_watermark == 2 and [(s.base_offset, s.last_offset) for s in st.segments] == [(0, 0), (1, 1)]
    assert len({s.wao_key for s in st.segments}) == 2
    assert await _read_all(lg) == [(0, b"first"), (1, b"second")]
    await mgr.stop()


async def test_a_failed_commit_fails_the_piece_written_after_it_which_is_never_committed(tmp_path, monkeypatch):
    mgr, lg, held, first, second = await _log_with_two_cycles(tmp_path, monkeypatch, "wa-pipelined-failure")
    held.fail_first = True

    async def unavailable(*args, **kwargs):  # the re-read that settles the failed commit
        raise MetadataUnavailable("metadata store unavailable")

    monkeypatch.setattr(mgr.metadata, "get_partition", unavailable)
    held.release.set()
    for fut in (first, second):
        await asyncio.wait_for(asyncio.gather(fut, return_exceptions=True), 10)
        assert isinstance(fut.exception(), StorageError) and fut.exception().error_code == ErrorCode.kafka_storage_error
    assert held.started == [[0]]  # the second piece never went to the metadata
    monkeypatch.undo()
    assert lg.high_watermark == 0
    base, _t, again = _append(lg, [b"again"])
    assert base == 0  # the offsets were handed out again
    await asyncio.wait_for(again, 10)
    assert await _read_all(lg) == [(0, b"again")]
    await mgr.stop()
