"""The read path in process: a cold read of one segment reads the next one ahead, and a
segment bigger than the whole-read limit is served by index-guided ranged reads."""

from __future__ import annotations

import asyncio
import time

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.metadata.kv import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import logs as logs_mod
from kafscale.storage.logs import LogManager
from kafscale.storage.objectstore import LocalObjectStore


def _manager(tmp_path) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0)
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
    for _ in range(100):
        if reader.cache.contains(("ra", 0, 10)):
            break
        await asyncio.sleep(0.01)
    assert reader.cache.contains(("ra", 0, 10)) and reader.stats.get("read_aheads") == 1
    assert not reader.cache.contains(("ra", 0, 20))  # one ahead, not the whole log
    await reader.stop()


async def test_large_segment_is_read_by_ranges(tmp_path, monkeypatch):
    writer = _manager(tmp_path)
    await _write_segments(writer, "big", 1, 2000)
    await writer.stop()
    monkeypatch.setattr(logs_mod, "WHOLE_SEGMENT_READ_BYTES", 1000)  # every segment is "large"
    reader = _manager(tmp_path)
    lg = await reader.get_log("big", 0)
    reader.cache.drop_prefix(("big",))
    data = b"".join(await lg.read(1500, 1 << 20, True))
    recs = records.decode_records(data, 0)
    assert recs[0].offset == 0 and recs[-1].offset == 1999  # the one batch, whole
    assert [r.value for r in recs if r.offset >= 1500][:2] == [b"0-1500", b"0-1501"]
    assert not reader.cache.contains(("big", 0, 0))  # ranged reads are not cached whole
    await reader.stop()
