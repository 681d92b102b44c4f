"""Retention and DeleteRecords delete the dropped segments' objects after the partition's
flush lock is released: a slow object-store delete (S3 retries) must not hold back the
partition's next commits, nor, with write-ahead objects, every partition of the flush
cycle that took it. A real embedded broker in this process (SQLite, file store); only the
store's delete is held back."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.metadata.store import TopicMeta
from kafscale.protocol import records
from tests.support.broker import in_process_broker
from tests.support.wait import wait_until_async

TS = 1_700_000_000_000


def _append(lg, value: bytes):
    buf = memoryview(bytearray(records.build_batch([(None, value)], timestamp=TS)))
    return lg.append(buf, records.validate_record_set(buf), True)[2]  # answered once durable


async def _values(lg, offset: int) -> list[bytes]:
    chunks = await lg.read(offset, 1 << 20)
    return [r.value for c in chunks for pos, h in records.iter_batches(c) for r in records.decode_records(c, pos, h)]


@pytest.mark.parametrize("write_ahead", [False, True], ids=["segments", "write-ahead"])
@pytest.mark.parametrize("drop", ["retention", "delete-records"])
async def test_a_held_delete_of_dropped_segments_holds_back_no_commit(tmp_path, write_ahead, drop):
    async with in_process_broker(tmp_path, min_flush_interval_ms=0, write_ahead_objects=write_ahead) as broker:
        await broker.metadata.create_topic(TopicMeta("t", 2))
        lg, other = await broker.logs.get_log("t", 0), await broker.logs.get_log("t", 1)
        await asyncio.wait_for(_append(lg, b"a"), 10)
        assert [s.base_offset for s in lg.state.segments] == [0]

        started, release = asyncio.Event(), asyncio.Event()
        original = lg.store.delete

        async def held_delete(keys):
            started.set()
            await release.wait()
            await original(keys)

        lg.store.delete = held_delete  # this instance only: the store object is the broker's own
        try:
            if drop == "retention":
                dropping = asyncio.create_task(lg.drop_leading_segments(list(lg.state.segments)))
            else:
                dropping = asyncio.create_task(lg.advance_log_start(1))
            await asyncio.wait_for(started.wait(), 10)
            assert lg.state.log_start_offset == 1  # committed before the delete
            # While the delete hangs, both partitions' next records are stored and answered.
            await asyncio.wait_for(asyncio.gather(_append(lg, b"b"), _append(other, b"c")), 10)
            assert lg.state.high_watermark == 2 and other.state.high_watermark == 1
            assert not dropping.done()
        finally:
            release.set()
        await asyncio.wait_for(dropping, 10)
        del lg.store.delete
        assert lg.state.log_start_offset == 1
        assert await _values(lg, 1) == [b"b"]
        assert await _values(other, 0) == [b"c"]
        await wait_until_async(lambda: [s.base_offset for s in lg.state.segments] == [1], 10, "only the new segment listed")
