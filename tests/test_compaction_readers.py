"""A broker that does not own a partition reads it through its own segment cache
(FlushedPartition): after the owner merges or compacts segments, a view it cached for the
old first segment of a run must not stand for the new, longer one under the same key (the
reader would pass over the rest of the run as a compacted-away gap)."""

from __future__ import annotations

import asyncio
import time

import pytest

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import merger, segment
from kafscale.storage.logs import LogManager
from kafscale.storage.backends import open_store
from tests.support.wait import wait_until_async


class _Elsewhere(SingleNodeCluster):
    """A broker that owns nothing: it serves flushed segments only."""

    def owns(self, topic: str, partition: int) -> bool:
        return False


def _manager(tmp_path, cluster_cls) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0, compaction_interval_ms=0)
    meta = MetadataStore(SqliteKV(tmp_path / "metadata.sqlite"))
    return LogManager(meta, open_store(f"file://{tmp_path}/objects"), cfg, cluster_cls(BrokerNode(0, "127.0.0.1", 9092)))


def _runs(segments, segment_bytes: int) -> list:
    """The merger's runs of these segments: small segment objects, or pieces of write-ahead
    objects (rewritten into a segment object as soon as the merger looks: max age 0)."""
    return merger.plan_runs(segments, segment_bytes) or merger.plan_write_ahead_runs(segments, segment_bytes, 0, int(time.time() * 1000))


async def _read_all(mgr, topic: str) -> list[tuple[int, bytes]]:
    reader = await mgr.get_reader(topic, 0)
    out, offset = [], 0
    while offset < reader.high_watermark:
        chunks = await reader.read(offset, 1 << 20)
        if not chunks:
            break
        for chunk in chunks:
            for pos, h in records.iter_batches(chunk):
                out += [(r.offset, r.value) for r in records.decode_records(chunk, pos)]
                offset = h.last_offset + 1
    return out


@pytest.mark.parametrize("rewrite", ["merge", "compact"])
async def test_a_non_owner_never_serves_a_stale_cached_view_of_a_rewritten_segment(tmp_path, rewrite):
    owner, other = _manager(tmp_path, SingleNodeCluster), _manager(tmp_path, _Elsewhere)
    await owner.metadata.create_topic(TopicMeta("t", 1, configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}))
    lg = await owner.get_log("t", 0)
    for i in range(4):
        keys = [b"k%d" % j for j in range(5)] if i < 3 else [b"sentinel"]
        data = memoryview(bytearray(records.build_batch([(k, b"v%d-%s" % (i, k)) for k in keys], timestamp=int(time.time() * 1000))))
        _b, _t, waiter = lg.append(data, records.validate_record_set(data), True)
        await lg.flush()
        await waiter
    everything = await _read_all(other, "t")  # the non-owner caches every segment
    assert [o for o, _v in everything] == list(range(16))
    if rewrite == "merge":
        [run] = _runs(lg.state.segments, lg.settings.segment_bytes)
        assert await owner.merger.merge(lg, run)  # [0-4, 5-9, 10-14, 15] -> [0-15]
        expected = everything
    else:
        assert await owner.compactor.compact(lg)  # [0-4, 5-9, 10-14] -> [0-14]: 10-14 left
        expected = everything[10:]
    assert len(lg.state.segments) < 4

    async def refreshed() -> bool:
        return (await other.get_reader("t", 0)).state.segments == lg.state.segments

    await wait_until_async(refreshed, 10, "the non-owner to see the new segment list")
    assert await _read_all(other, "t") == expected
    for mgr in (owner, other):
        await mgr.stop()
        await mgr.metadata.close()
        await mgr.store.close()


async def test_the_owner_never_caches_a_load_of_the_old_object_that_ends_after_a_swap(tmp_path):
    """A whole-segment load of a run's first segment has read the old object when the owner
    merges the run, and its view lands in the cache after the swap: it stands for the old
    segment, not the merged one under its key, so reads load the object again."""
    owner = _manager(tmp_path, SingleNodeCluster)
    await owner.metadata.create_topic(TopicMeta("t", 1))
    lg = await owner.get_log("t", 0)
    for i in range(4):
        data = memoryview(bytearray(records.build_batch([(b"k", b"v%d-%d" % (i, j)) for j in range(5)], timestamp=int(time.time() * 1000))))
        _b, _t, waiter = lg.append(data, records.validate_record_set(data), True)
        await lg.flush()
        await waiter
    owner.reader.drop("t")
    first_key = segment.stored_at(owner.namespace, "t", 0, lg.state.segments[0])[0]  # its own object or a write-ahead one
    real_get = owner.store.get
    read_old, release = asyncio.Event(), asyncio.Event()

    async def slow_get(key, *a, **kw):
        data = await real_get(key, *a, **kw)
        if key == first_key and not read_old.is_set():  # the load's read only (a rewrite of pieces reads the object too)
            read_old.set()
            await release.wait()  # the old object, answered late
        return data

    owner.store.get = slow_get
    load = asyncio.ensure_future(lg.read(0, 1 << 20))
    await asyncio.wait_for(read_old.wait(), 10)
    run = _runs(lg.state.segments[:3], lg.settings.segment_bytes)[0]
    merge = asyncio.ensure_future(owner.merger.merge(lg, run))  # [0-4, 5-9, 10-14] -> [0-14]
    await asyncio.wait([merge], timeout=1)  # the merge swaps while the load is held
    release.set()
    await load
    assert await merge
    owner.store.get = real_get
    assert [o for o, _v in await _read_all(owner, "t")] == list(range(20))
    await owner.stop()
    await owner.metadata.close()
    await owner.store.close()
