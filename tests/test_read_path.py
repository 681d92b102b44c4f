"""The read path in process: a cold read of one segment reads the next one ahead, a
segment bigger than the whole-read limit is served by index-guided ranged reads, and one
without a usable index is read whole."""

from __future__ import annotations

import time

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import reader as reader_mod
from kafscale.storage import segment
from kafscale.storage.logs import LogManager
from kafscale.storage.local_store import LocalObjectStore
from tests.support.wait import wait_until_async


def _manager(tmp_path, **settings) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0, **settings)
    meta = MetadataStore(SqliteKV(tmp_path / "meta.sqlite"))
    return LogManager(meta, LocalObjectStore(tmp_path / "objects"), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


async def _write_segments(mgr: LogManager, topic: str, n_segments: int, per_segment: int) -> None:
    await mgr.metadata.create_topic(TopicMeta(topic, 1))
    lg = await mgr.get_log(topic, 0)
    now = int(time.time() * 1000)
    for s in range(n_segments):
        data = memoryview(bytearray(records.build_batch([(None, b"%d-%d" % (s, i)) for i in range(per_segment)], timestamp=now)))
        _base, _t, waiter = lg.append(data, records.validate_record_set(data), True)
        await waiter  # one flush, one segment


async def test_cold_read_reads_the_next_segment_ahead(tmp_path):
    writer = _manager(tmp_path)
    await _write_segments(writer, "ra", 3, 10)
    await writer.stop()
    reader = _manager(tmp_path)  # fresh cache, as after a restart
    lg = await reader.get_log("ra", 0)
    assert [s.base_offset for s in lg.state.segments] == [0, 10, 20]
    reader.cache.drop_prefix(("ra",))  # loading the log warmed it (producer state rebuild)
    chunks = await lg.read(0, 100, True)  # budget ends in segment 0
    assert records.read_header(chunks[0]).base_offset == 0
    await wait_until_async(lambda: reader.cache.contains(("ra", 0, 10)), 5, "segment 10 to be read ahead", interval=0.01)
    assert reader.cache.contains(("ra", 0, 10)) and reader.metrics.read_aheads == 1
    assert not reader.cache.contains(("ra", 0, 20))  # one ahead, not the whole log
    await reader.stop()


async def test_large_segment_is_read_by_ranges(tmp_path, monkeypatch):
    writer = _manager(tmp_path, index_min_bytes=0, segment_max_age_ms=0)  # index every segment
    await _write_segments(writer, "big", 1, 2000)
    await writer.merger.run_once()  # (with write-ahead objects: their piece into the spec's segment and index)
    assert (tmp_path / "objects" / "default" / "big" / "0" / f"segment-{0:020d}.index").exists()
    await writer.stop()
    monkeypatch.setattr(reader_mod, "WHOLE_SEGMENT_READ_BYTES", 1000)  # every segment is "large"
    reader = _manager(tmp_path)
    lg = await reader.get_log("big", 0)
    reader.cache.drop_prefix(("big",))
    data = b"".join(await lg.read(1500, 1 << 20, True))
    recs = records.decode_records(data, 0)
    assert recs[0].offset == 0 and recs[-1].offset == 1999  # the one batch, whole
    assert [r.value for r in recs if r.offset >= 1500][:2] == [b"0-1500", b"0-1501"]
    assert not reader.cache.contains(("big", 0, 0))  # ranged reads are not cached whole
    await reader.stop()


async def test_segments_below_index_min_bytes_get_no_index(tmp_path):
    mgr = _manager(tmp_path, index_min_bytes=2000, write_ahead_objects=False)  # (the objects of a flush per partition)
    await mgr.metadata.create_topic(TopicMeta("idx", 1))
    lg = await mgr.get_log("idx", 0)
    now = int(time.time() * 1000)
    for value in (b"small", b"x" * 3000):  # one segment under the limit, one over it
        data = memoryview(bytearray(records.build_batch([(None, value)], timestamp=now)))
        await lg.append(data, records.validate_record_set(data), True)[2]
    objects = sorted(p.name for p in (tmp_path / "objects" / "default" / "idx" / "0").iterdir())
    assert objects == [f"segment-{0:020d}.kfs", f"segment-{1:020d}.index", f"segment-{1:020d}.kfs"]
    assert mgr.metrics.puts == 3
    await mgr.stop()


async def test_large_segment_without_usable_index_is_read_whole(tmp_path, monkeypatch):
    # default index_min_bytes: these small segments get no index; a segment object per flush
    writer = _manager(tmp_path, write_ahead_objects=False)
    await _write_segments(writer, "noidx", 2, 500)
    await writer.stop()
    pdir = tmp_path / "objects" / "default" / "noidx" / "0"
    assert not list(pdir.glob("*.index"))
    # A stale index for the second segment: its one entry points at no batch of this object.
    (pdir / f"segment-{500:020d}.index").write_bytes(segment.INDEX_HEADER.pack(segment.INDEX_MAGIC, 1, 1, 1, 0) + segment.INDEX_ENTRY.pack(777, 40))
    monkeypatch.setattr(reader_mod, "WHOLE_SEGMENT_READ_BYTES", 1000)  # both count as large
    reader = _manager(tmp_path)
    lg = await reader.get_log("noidx", 0)
    reader.cache.drop_prefix(("noidx",))
    for offset, segment_base in ((250, 0), (750, 500)):
        recs = records.decode_records(b"".join(await lg.read(offset, 1 << 20, True)), 0)
        assert recs[0].offset == segment_base and recs[-1].offset == segment_base + 499
        assert [r.value for r in recs if r.offset >= offset][:2] == [b"%d-%d" % (segment_base // 500, offset - segment_base), b"%d-%d" % (segment_base // 500, offset - segment_base + 1)]
        assert reader.cache.contains(("noidx", 0, segment_base))  # read whole, and cached
    await reader.stop()


async def test_start_load_warms_a_cold_segment_once(tmp_path):
    writer = _manager(tmp_path)
    await _write_segments(writer, "warm", 3, 10)
    await writer.stop()
    reader = _manager(tmp_path)
    lg = await reader.get_log("warm", 0)
    reader.cache.drop_prefix(("warm",))
    first = lg.start_load(15)  # segment [10, 19]
    assert first is not None and lg.start_load(15) is first  # one load, shared
    await first
    assert reader.cache.contains(("warm", 0, 10))
    assert lg.start_load(12) is None  # cached now
    assert lg.start_load(30) is None  # past the last stored offset
    await wait_until_async(lambda: reader.cache.contains(("warm", 0, 20)), 5, "the next segment to be read ahead", interval=0.01)
    assert reader.cache.contains(("warm", 0, 20)) and not reader.cache.contains(("warm", 0, 0))
    await reader.stop()
