"""The compactor's driver (storage/compactor.py) in process, pass by pass: a bounded key map
spreads the work over several passes, a pass interrupted between its replace and its swap
(as a crash would) leaves the log readable and the next pass finishes, and nothing at or
after an open transaction is cleaned."""

from __future__ import annotations

import time

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import cleaner, segment
from kafscale.storage.cache import SegmentView
from kafscale.storage.logs import LogManager
from kafscale.storage.local_store import LocalObjectStore

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


def _manager(tmp_path, **settings) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0, compaction_interval_ms=0, **settings)
    meta = MetadataStore(SqliteKV(tmp_path / "metadata.sqlite"))
    return LogManager(meta, LocalObjectStore(tmp_path / "objects"), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


async def _close(mgr: LogManager) -> None:
    await mgr.stop()
    await mgr.metadata.close()
    await mgr.store.close()


async def _append(lg, recs, **kw) -> None:
    """One record set, flushed as one segment."""
    data = memoryview(bytearray(records.build_batch(recs, timestamp=int(time.time() * 1000), **kw)))
    _b, _t, waiter = lg.append(data, records.validate_record_set(data), True)
    await lg.flush()
    await waiter


async def _read(mgr, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    lg = await mgr.get_log(topic, 0)
    out, offset = [], lg.log_start_offset
    while offset < lg.high_watermark:
        chunks = await lg.read(offset, 1 << 20)
        if not chunks:
            break
        for chunk in chunks:
            for pos, h in records.iter_batches(chunk):
                out += [(r.offset, r.key, r.value) for r in records.decode_records(chunk, pos)]
                offset = h.last_offset + 1
    return out


def _latest(written: dict[int, tuple[bytes, bytes]]) -> list[tuple[int, bytes, bytes]]:
    last = {}
    for off in sorted(written):
        last[written[off][0]] = off
    return sorted((off, *written[off]) for off in last.values())


def _check(got, written) -> None:
    """A read at any point of compaction: offsets increasing, each record the one written
    there, every key's latest record present."""
    assert [o for o, _k, _v in got] == sorted({o for o, _k, _v in got})
    assert all(written[o] == (k, v) for o, k, v in got)
    assert set(_latest(written)) <= set(got)


async def _setup(mgr, topic: str, segments: int, keys_per_segment: int, keys: int) -> dict[int, tuple[bytes, bytes]]:
    await mgr.metadata.create_topic(TopicMeta(topic, 1, configs=COMPACT))
    lg = await mgr.get_log(topic, 0)
    written = {}
    for s in range(segments):
        base = lg.next_offset
        recs = [(b"k%d" % ((s * keys_per_segment + i) % keys), b"s%d-%d" % (s, i)) for i in range(keys_per_segment)]
        await _append(lg, recs)
        written.update({base + i: r for i, r in enumerate(recs)})
    written[lg.next_offset] = (b"sentinel", b"end")  # the newest segment, never cleaned
    await _append(lg, [(b"sentinel", b"end")])
    return written


async def test_a_bounded_key_map_spreads_compaction_over_passes(tmp_path):
    mgr = _manager(tmp_path, compaction_key_map_bytes=25 * cleaner.KEY_MAP_ENTRY_BYTES)
    written = await _setup(mgr, "t", 8, 10, 40)  # segments of 10 records; the key map takes 2
    lg = await mgr.get_log("t", 0)
    passes = 0
    while await mgr.compactor.compact(lg):
        passes += 1
        flags = [s.cleaned for s in lg.state.segments]
        assert flags == sorted(flags, reverse=True), flags  # a cleaned prefix, then dirty
        _check(await _read(mgr, "t"), written)
    assert passes == 4  # 8 cleanable segments, 2 mapped a pass (the newest is never cleaned)
    assert [s.cleaned for s in lg.state.segments][-1] is False
    assert mgr.compactor.counters.key_map_peak_entries == 20
    assert await _read(mgr, "t") == _latest(written)
    await _close(mgr)


async def test_a_pass_stopped_between_its_replace_and_its_swap_leaves_the_log_readable(tmp_path):
    mgr = _manager(tmp_path)
    written = await _setup(mgr, "t", 6, 10, 10)
    lg = await mgr.get_log("t", 0)
    segments_before = list(lg.state.segments)
    real_swap = lg.swap_segments
    swaps = []

    async def crash(run, new):  # the object is replaced; the metadata never learns it
        swaps.append(new)
        return False

    lg.swap_segments = crash
    assert not await mgr.compactor.compact(lg)
    assert swaps and lg.state.segments == segments_before
    first_key = segment.segment_key(mgr.namespace, "t", 0, 0)
    stored = segment.decode(await mgr.store.get(first_key)).info
    assert stored.last_offset == swaps[0].last_offset > segments_before[0].last_offset  # a cleaned superset
    mgr.reader.drop("t")  # a reader that never cached the old object
    _check(await _read(mgr, "t"), written)
    lg.swap_segments = real_swap
    assert await mgr.compactor.compact(lg)
    assert await _read(mgr, "t") == _latest(written)
    await _close(mgr)


async def test_nothing_at_or_after_an_open_transaction_is_cleaned(tmp_path):
    mgr = _manager(tmp_path)
    await _setup(mgr, "t", 3, 5, 5)
    lg = await mgr.get_log("t", 0)
    txn_first = lg.next_offset
    await _append(lg, [(b"k0", b"in-txn")], producer_id=77, producer_epoch=0, base_sequence=0, attributes=records.TRANSACTIONAL_MASK)
    await _append(lg, [(b"k0", b"later")])
    await _append(lg, [(b"k1", b"newest")])
    assert lg.last_stable_offset == txn_first
    assert await mgr.compactor.compact(lg)
    cleaned = [(s.base_offset, s.cleaned) for s in lg.state.segments]
    assert all(c for b, c in cleaned if b < txn_first) and not any(c for b, c in cleaned if b >= txn_first), cleaned
    got = await _read(mgr, "t")
    assert (txn_first, b"k0", b"in-txn") in got and (txn_first + 1, b"k0", b"later") in got
    await _close(mgr)


async def test_a_stale_cached_view_is_never_a_rewrites_input(tmp_path):
    """The cache may hold, under a segment's key, a view of an older object (a load that
    ended after a merge's swap): a pass reads such a segment from the store instead."""
    mgr = _manager(tmp_path)
    written = await _setup(mgr, "t", 4, 10, 10)
    lg = await mgr.get_log("t", 0)
    seg = lg.state.segments[3]  # the latest values, read by _read (not the group's first)
    older = records.build_batch([written[seg.base_offset + i] for i in range(3)], base_offset=seg.base_offset)  # an older, shorter object
    mgr.cache.put(("t", 0, seg.base_offset), SegmentView(seg.base_offset, older))
    assert await mgr.compactor.compact(lg)
    mgr.reader.drop("t")
    assert await _read(mgr, "t") == _latest(written)
    await _close(mgr)


async def test_segment_metadata_keeps_the_compaction_fields_and_reads_old_entries(tmp_path):
    """SegmentInfo.cleaned / delete_horizon_ms round-trip through the metadata store; an
    entry written before compaction (without them) reads as dirty, with no horizon."""
    from kafscale.metadata import keys
    from kafscale.metadata.kv import Txn

    meta = MetadataStore(SqliteKV(tmp_path / "metadata.sqlite"))
    await meta.create_topic(TopicMeta("t", 1))
    st = await meta.get_partition("t", 0)
    st = await meta.commit_segment(st, segment.SegmentInfo(0, 9, 100, 10, 5, 5, cleaned=True, delete_horizon_ms=1234))
    st = await meta.commit_segment(st, segment.SegmentInfo(10, 19, 100, 10, 5, 5))
    old = b'{"base_offset":20,"last_offset":29,"size":100,"record_count":10,"max_timestamp":5,"created_ms":5}'
    assert await meta.kv.commit(Txn(puts=[(keys.segment("t", 0, 20), old)]))
    got = (await meta.get_partition("t", 0)).segments
    assert [(s.cleaned, s.delete_horizon_ms) for s in got] == [(True, 1234), (False, -1), (False, -1)]
    raw = await meta.kv.get(keys.segment("t", 0, 10))
    assert b"cleaned" not in raw.value and b"delete_horizon_ms" not in raw.value  # defaults stay out
    await meta.close()
