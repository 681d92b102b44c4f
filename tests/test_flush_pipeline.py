"""Pipelined flushes of one partition (#33): the next segment is written and fsynced while
the one before it commits to the metadata, commits stay in offset order, and a failed
commit rejects the upload stored after it as well, whose object recovery then adopts only
after the earlier one (no offset served twice, none skipped).

A real embedded broker in this process (SQLite, file store); the metadata commit is held
back or failed by wrapping the metadata store's commit_segment.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kafscale.broker.app import Broker
from kafscale.errors import ErrorCode
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.metadata.store import TopicMeta
from kafscale.protocol import records
from kafscale.storage import partition_log, segment
from kafscale.storage.failures import StorageError
from tests.support.broker import in_process_broker
from tests.support.wait import wait_until_async

TS = 1_700_000_000_000


@pytest.fixture
async def eager_broker(tmp_path, monkeypatch):
    """Flushes as soon as something waits (the embedded default), merges off; every flush
    in two stages (upload, then commit), as a large flush is (a small one with no commit in
    flight is one job on the commit thread: tests/test_flush_one_job.py)."""
    monkeypatch.setattr(partition_log, "ONE_JOB_MAX_BYTES", -1)
    # Per-partition layout: these tests are about one partition's own segment uploads and commits.
    async with in_process_broker(tmp_path, min_flush_interval_ms=0, write_ahead_objects=False) as broker:
        yield broker


def _append(lg, value: bytes):
    buf = memoryview(bytearray(records.build_batch([(None, value)], timestamp=TS)))
    return lg.append(buf, records.validate_record_set(buf), True)


def _segment_file(broker: Broker, topic: str, base: int) -> Path:
    return Path(broker.config.data_dir) / "objects" / segment.segment_key(broker.logs.config.namespace, topic, 0, base)


async def _values(lg) -> list[bytes]:
    chunks = await lg.read(0, 1 << 20)
    return [r.value for c in chunks for pos, h in records.iter_batches(c) for r in records.decode_records(c, pos, h)]


class HeldCommits:
    """Wraps commit_segment: each commit waits until released, then lands or fails."""

    def __init__(self, original):
        self.original = original
        self.started: list[int] = []  # the base offsets of the commits begun, in order
        self.release = asyncio.Event()
        self.fail_first = False

    async def __call__(self, st, seg, before=None):
        self.started.append(seg.base_offset)
        await self.release.wait()
        if self.fail_first and len(self.started) == 1:
            raise MetadataUnavailable("metadata store unavailable")
        return await self.original(st, seg, before)


async def _outcome(fut):
    await asyncio.wait_for(asyncio.gather(fut, return_exceptions=True), 10)
    exc = fut.exception()
    return None if exc is None else exc.error_code


async def _log_with_two_uploads(broker: Broker, topic: str, monkeypatch) -> tuple:
    """A log whose first upload's commit is held while the second upload is stored."""
    await broker.metadata.create_topic(TopicMeta(topic, 1))
    lg = await broker.logs.get_log(topic, 0)
    held = HeldCommits(broker.logs.metadata.commit_segment)
    monkeypatch.setattr(broker.logs.metadata, "commit_segment", held)
    _, _, first = _append(lg, b"first")
    await wait_until_async(lambda: held.started == [0], 10, "the first upload to be stored and its commit to begin", interval=0.01)
    _, _, second = _append(lg, b"second")
    await wait_until_async(lambda: _segment_file(broker, topic, 1).exists(), 10, "the second segment written meanwhile", interval=0.01)
    return lg, held, first, second


async def test_the_next_upload_is_stored_while_the_one_before_commits_and_commits_follow(eager_broker, monkeypatch):
    topic = "pipelined"
    lg, held, first, second = await _log_with_two_uploads(eager_broker, topic, monkeypatch)
    assert held.started == [0]  # the second's commit waits for the first's
    assert not first.done() and not second.done()
    assert lg.high_watermark == 0  # nothing readable before its commit
    assert _segment_file(eager_broker, topic, 0).exists()

    held.release.set()
    assert await _outcome(first) is None and await _outcome(second) is None
    assert held.started == [0, 1]
    st = await eager_broker.metadata.get_partition(topic, 0)
    assert st.high_watermark == 2
    assert [(s.base_offset, s.last_offset) for s in st.segments] == [(0, 0), (1, 1)]
    assert await _values(lg) == [b"first", b"second"]


async def test_a_failed_commit_rejects_the_upload_stored_after_it_and_recovery_adopts_both_in_order(eager_broker, monkeypatch):
    topic = "pipelined-failure"
    lg, held, first, second = await _log_with_two_uploads(eager_broker, topic, monkeypatch)
    held.fail_first = True
    monkeypatch.setattr(eager_broker.logs.metadata, "get_partition", _unavailable)  # the re-check after the failure
    held.release.set()
    assert await _outcome(first) == ErrorCode.kafka_storage_error
    assert await _outcome(second) == ErrorCode.kafka_storage_error  # never committed
    assert held.started == [0]
    monkeypatch.undo()

    # Both objects stay (the first's commit might have landed: only a reload can tell);
    # loading the partition again adopts them in offset order, as a crash would have left them.
    assert _segment_file(eager_broker, topic, 0).exists() and _segment_file(eager_broker, topic, 1).exists()
    eager_broker.logs.forget(topic, 0)
    lg = await eager_broker.logs.get_log(topic, 0)
    assert lg.high_watermark == 2
    assert await _values(lg) == [b"first", b"second"]
    _, _, third = _append(lg, b"third")
    assert await _outcome(third) is None
    assert lg.high_watermark == 3


async def _unavailable(*args, **kwargs):
    raise MetadataUnavailable("metadata store unavailable")


async def test_stopping_waits_for_both_uploads_in_flight(eager_broker, monkeypatch):
    topic = "pipelined-stop"
    lg, held, first, second = await _log_with_two_uploads(eager_broker, topic, monkeypatch)
    stopping = asyncio.ensure_future(lg.stop(StorageError("moving", ErrorCode.not_leader_or_follower), flush=True))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done() and not first.done() and not second.done()
    held.release.set()
    await asyncio.wait_for(stopping, 10)
    assert await _outcome(first) is None and await _outcome(second) is None
    st = await eager_broker.metadata.get_partition(topic, 0)
    assert st.high_watermark == 2
