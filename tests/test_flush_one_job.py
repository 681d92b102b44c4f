"""A small flush on the embedded default as one job on the metadata store's commit thread
(#33): the segment's write and fsyncs run there just ahead of the SQLite commit
(kv.KV.commit_after), one thread hop each way. What must hold: the objects are durable
before the commit (tests/test_durability_syscalls.py traces the order), a write that fails
commits nothing and answers only its own producers with a storage error, the transactions
sharing its group commit are unaffected, and the log goes on once the store is back.

A real embedded broker in this process (SQLite, file store) and a real SqliteKV.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kafscale.errors import ErrorCode
from kafscale.metadata.kv import BeforeCommitFailed, Txn
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment
from tests.support.broker import in_process_broker

TS = 1_700_000_000_000


def _append(lg, value: bytes):
    buf = memoryview(bytearray(records.build_batch([(None, value)], timestamp=TS)))
    return lg.append(buf, records.validate_record_set(buf), True)


async def _outcome(fut):
    await asyncio.wait_for(asyncio.gather(fut, return_exceptions=True), 10)
    exc = fut.exception()
    return None if exc is None else exc.error_code


async def _values(lg) -> list[bytes]:
    chunks = await lg.read(0, 1 << 20)
    return [r.value for c in chunks for pos, h in records.iter_batches(c) for r in records.decode_records(c, pos, h)]


async def test_commit_after_runs_its_step_before_its_commit_and_a_failed_step_commits_nothing(tmp_path):
    kv = SqliteKV(tmp_path / "meta.sqlite")
    try:
        ran_on = []

        def write_ok():
            ran_on.append(threading.current_thread().name)

        failed_on = []

        def write_fails():
            failed_on.append(threading.current_thread().name)
            raise OSError(28, "No space left on device")

        # The first goes alone, the writer thread idle: its step runs there. The other two
        # queue behind it as one group, the step started at once on a step thread; the
        # failed step leaves only its own txn out.
        ok, failed, plain = await asyncio.gather(
            kv.commit_after(write_ok, Txn(puts=[("/a", b"1")])),
            kv.commit_after(write_fails, Txn(puts=[("/b", b"1")])),
            kv.commit(Txn(puts=[("/c", b"1")])),
            return_exceptions=True,
        )
        assert ok is True and plain is True
        assert isinstance(failed, BeforeCommitFailed) and isinstance(failed.error, OSError)
        assert ran_on and ran_on[0].startswith("sqlite-commit")
        assert failed_on and failed_on[0].startswith("sqlite-step")
        assert (await kv.get("/a")).value == b"1" and (await kv.get("/c")).value == b"1"
        assert await kv.get("/b") is None

        # A compare that fails after the step ran: False, nothing applied (the step's
        # objects stay, unreferenced, as after a failed commit of the two-stage path).
        assert await kv.commit_after(write_ok, Txn(compares=[("/a", 7)], puts=[("/a", b"2")])) is False
        assert (await kv.get("/a")).value == b"1" and len(ran_on) == 2
    finally:
        await kv.close()


async def test_steps_of_one_group_run_side_by_side_before_its_commit(tmp_path):
    """Partitions flushing at once: their steps (write and fsyncs) overlap, they start while
    the group before theirs is still on the writer thread, and every one has ended before
    the COMMIT of their group; one failing leaves only its own txn out."""
    kv = SqliteKV(tmp_path / "meta.sqlite")
    try:
        release = threading.Event()
        side_by_side = threading.Barrier(3, timeout=10)  # broken unless three wait at once
        ended = []

        started = threading.Event()

        def hold():
            release.wait(10)
            assert started.is_set()  # a queued txn's step began while this group was on the writer thread

        def step(name, fails=False):
            def run():
                started.set()
                side_by_side.wait()
                ended.append(name)
                if fails:
                    raise OSError(5, "Input/output error")
            return run

        first = asyncio.ensure_future(kv.commit_after(hold, Txn(puts=[("/hold", b"1")])))
        await asyncio.sleep(0)  # the holding group is on the commit thread; the next three queue
        queued = [
            asyncio.ensure_future(kv.commit_after(step("a"), Txn(puts=[("/a", b"1")]))),
            asyncio.ensure_future(kv.commit_after(step("b", fails=True), Txn(puts=[("/b", b"1")]))),
            asyncio.ensure_future(kv.commit_after(step("c"), Txn(puts=[("/c", b"1")]))),
        ]
        await asyncio.sleep(0)
        await asyncio.to_thread(started.wait, 10)
        release.set()
        assert await asyncio.wait_for(first, 10) is True
        a, b, c = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 10)
        assert a is True and c is True, (a, c)
        assert isinstance(b, BeforeCommitFailed) and isinstance(b.error, OSError)
        assert sorted(ended) == ["a", "b", "c"]
        assert (await kv.get("/a")).value == b"1" and (await kv.get("/c")).value == b"1"
        assert await kv.get("/b") is None
    finally:
        await kv.close()


@pytest.fixture
async def eager_broker(tmp_path):
    """Flushes as soon as something waits (the embedded default), merges off, a segment per
    partition per flush."""
    async with in_process_broker(tmp_path, min_flush_interval_ms=0, write_ahead_objects=False) as broker:
        yield broker


async def test_a_failed_write_rejects_only_its_batches_and_the_log_goes_on(eager_broker):
    broker = eager_broker
    topic = "one-job"
    await broker.metadata.create_topic(TopicMeta(topic, 1))
    lg = await broker.logs.get_log(topic, 0)
    assert await _outcome(_append(lg, b"first")[2]) is None
    first_segment = Path(broker.config.data_dir) / "objects" / segment.segment_key(broker.logs.config.namespace, topic, 0, 0)
    part_dir = first_segment.parent
    first_bytes = first_segment.read_bytes()

    # The next segment's name is taken by a directory: it cannot be written. (The store
    # writes by names relative to the partition directory's kept descriptor, so moving the
    # directory away would not stop it: the writes would follow the directory.)
    taken = part_dir / Path(segment.segment_key(broker.logs.config.namespace, topic, 0, 1)).name
    taken.mkdir()
    try:
        _, _, lost = _append(lg, b"never written")
        assert await _outcome(lost) == ErrorCode.kafka_storage_error
        st = await broker.metadata.get_partition(topic, 0)
        assert st.high_watermark == 1 and [s.base_offset for s in st.segments] == [0]  # nothing committed
    finally:
        taken.rmdir()

    # The store is back: the rejected offset is handed out again, in order.
    base, _, again = _append(lg, b"second")
    assert base == 1 and await _outcome(again) is None
    assert lg.high_watermark == 2
    assert await _values(lg) == [b"first", b"second"]
    st = await broker.metadata.get_partition(topic, 0)
    assert [(s.base_offset, s.last_offset) for s in st.segments] == [(0, 0), (1, 1)]
    assert first_segment.read_bytes() == first_bytes  # the first segment untouched
