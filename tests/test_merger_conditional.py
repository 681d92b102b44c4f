"""A merged segment replaces the first segment's object only over the version it was built
from (issue #20, follow-up to part 4).

The merger can only store a merged segment under the key of its run's first segment, so an
old owner whose merge lands late (S3 retries outlast the lease margin) and the new owner
write the same key. `ObjectStore.replace` is a compare-and-swap of the object (S3
`If-Match: <ETag>`, the file store a check and rename under an flock): of two replaces
based on one version exactly one wins, a stale one is refused and leaves the object as it
is, and a consumer reads every acknowledged record after both owners' merges. Run on the
file store, on S3 (moto) with If-Match, and on S3 with the documented fallback
(KAFSCALE_S3_CONDITIONAL_WRITES=false: ETag compared by a HEAD before the PUT) where the
outcome does not depend on two requests overlapping.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest

from kafscale.metadata.store import ConflictError, TopicMeta
from kafscale.protocol import records
from kafscale.storage import merger, segment
from kafscale.storage.backends import open_store
from kafscale.storage.objectstore import ObjectChangedError, ObjectNotFound
from kafscale.storage.s3 import S3ObjectStore
from tests.support.broker import BrokerProcess
from tests.support.servers import MotoServer
from tests.test_conditional_segments import NAMESPACE, _AnswerDroppingProxy, _append, _backend, _close, _consume_all, _manager

RECORDS_PER_SEGMENT = 3


@pytest.fixture(params=["file", "s3", "s3-fallback"])
async def backend(request, tmp_path, monkeypatch):
    return await _backend(request.param, request, tmp_path, monkeypatch)


class SerialMotoServer(MotoServer):
    """moto answering one request at a time. moto_server checks If-Match and then stores,
    unlocked, on a thread per request, so two PUTs over one ETag can both win (seen under
    load; S3 itself is atomic): one request at a time makes each conditional PUT atomic."""

    def _command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; from werkzeug.serving import run_simple; "
                "from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app; "
                "run_simple('127.0.0.1', int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False)",
                str(self.port)]


@pytest.fixture(scope="module")
def serial_moto():
    server = SerialMotoServer()
    server.start()
    with server:
        yield server


@pytest.fixture(params=["file", "s3"])
async def atomic_backend(request, tmp_path, monkeypatch):
    """Stores whose replace is atomic; the fallback's HEAD-then-PUT is not (see s3.py)."""
    if request.param == "s3":
        request.getfixturevalue("moto_server")  # AWS_* in os.environ
        monkeypatch.setenv("KAFSCALE_S3_ENDPOINT", request.getfixturevalue("serial_moto").endpoint)
    return await _backend(request.param, request, tmp_path, monkeypatch)


def _key(base: int, topic: str = "t") -> str:
    return segment.segment_key(NAMESPACE, topic, 0, base)


async def test_stale_replace_is_refused_and_leaves_the_object_intact(backend):
    store = open_store(backend.url)
    key = _key(0)
    try:
        await store.put(key, [b"first segment"])
        data, first = await store.get_with_version(key)
        assert data == b"first segment"
        await store.replace(key, [b"new owner's ", b"merge"], first)
        # A retry whose first attempt landed (its answer lost) finds its own bytes: success.
        await store.replace(key, [b"new owner's merge"], first)
        with pytest.raises(ObjectChangedError):
            await store.replace(key, [b"old owner's merge"], first)
        data, current = await store.get_with_version(key)
        assert data == b"new owner's merge" and current != first
        await store.delete([key])
        with pytest.raises(ObjectChangedError):  # gone (retention): never brought back
            await store.replace(key, [b"old owner's merge"], current)
        with pytest.raises(ObjectNotFound):
            await store.get(key)
        assert await store.list(f"{NAMESPACE}/t/0/") == []  # no temp files left behind
    finally:
        await store.close()


async def test_concurrent_replaces_over_one_version_exactly_one_wins(atomic_backend):
    writers = [open_store(atomic_backend.url) for _ in range(4)]  # as many brokers
    try:
        for round_ in range(25):
            key = _key(round_)
            await writers[0].put(key, [b"first segment %d" % round_])
            _data, version = await writers[1].get_with_version(key)
            merges = [b"merge %d of writer %d" % (round_, w) for w in range(len(writers))]
            results = await asyncio.gather(*(w.replace(key, [m], version) for w, m in zip(writers, merges)), return_exceptions=True)
            winners = [i for i, r in enumerate(results) if r is None]
            assert len(winners) == 1, results
            assert all(isinstance(r, ObjectChangedError) for i, r in enumerate(results) if i != winners[0]), results
            assert await writers[0].get(key) == merges[winners[0]]
    finally:
        for w in writers:
            await w.close()


async def test_replace_racing_a_delete_never_brings_the_object_back(atomic_backend):
    """Retention (or DeleteTopics) deletes the first segment while an old owner's merge
    replaces it: whichever comes first, the key ends empty. A merged object brought back
    under a deleted topic's key would be adopted by a re-created topic of the same name."""
    merging, deleting = open_store(atomic_backend.url), open_store(atomic_backend.url)
    first = bytes(1 << 20)  # big enough that comparing it takes a while: a wide window

    async def delete_after(key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await deleting.delete([key])

    try:
        for round_ in range(80):  # the delete starts a little later each round
            key = _key(round_)
            await merging.put(key, [first])
            _data, version = await merging.get_with_version(key)
            await asyncio.gather(merging.replace(key, [b"merge %d" % round_], version), delete_after(key, round_ * 0.0003), return_exceptions=True)
            with pytest.raises(ObjectNotFound):
                await deleting.get(key)
    finally:
        await merging.close()
        await deleting.close()


@pytest.mark.parametrize("conditional", [True, False], ids=["if-match", "fallback"])
async def test_s3_retry_of_a_replace_whose_answer_was_lost_is_not_a_lost_race(moto_server, conditional):
    bucket = f"merge-{uuid.uuid4().hex[:12]}"
    direct = open_store(f"s3://{bucket}")
    await direct.create_bucket()
    proxy = _AnswerDroppingProxy(moto_server.port)
    store = S3ObjectStore(bucket, "p", endpoint_url=await proxy.start(), conditional_writes=conditional, base_backoff=0.01)
    key = _key(0)
    try:
        await store.put(key, [b"first segment"])
        _data, first = await store.get_with_version(key)
        proxy.armed = True
        await store.replace(key, [b"merged segment"], first)
        assert proxy.dropped == 1
        assert await direct.get(f"p/{key}") == b"merged segment"
        with pytest.raises(ObjectChangedError):  # and the first version no longer matches
            await store.replace(key, [b"other merge"], first)
    finally:
        await store.close()
        await direct.close()
        await proxy.close()


# -- two owners' merges through LogManagers over one metadata store and one object store --


async def _produce_segments(lg, count: int, tag: bytes) -> list[bytes]:
    """`count` acknowledged flushes, one segment each; the values in offset order."""
    values: list[bytes] = []
    for i in range(count):
        batch = [b"%s-%d-%d" % (tag, i, j) for j in range(RECORDS_PER_SEGMENT)]
        await _append(lg, batch)[1]
        values += batch
    return values


def _hold_replaces(mgr) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold back mgr's replaces until released, as an old owner's merge whose PUT is still
    in flight (retried) when the new owner merges. (reached, release)."""
    reached, release = asyncio.Event(), asyncio.Event()
    real_replace = mgr.store.replace

    async def late_replace(key, parts, expected):
        reached.set()
        await release.wait()
        await real_replace(key, parts, expected)

    mgr.store.replace = late_replace
    return reached, release


def _only_run(lg) -> list[segment.SegmentInfo]:
    [run] = merger.plan_runs(lg.state.segments, lg.settings.segment_bytes)
    return run


async def _read_all(mgr, topic: str) -> list[tuple[int, bytes]]:
    reader = await mgr.get_reader(topic, 0)
    data = b"".join(bytes(c) for c in await reader.read(0, 1 << 20))
    return [(r.offset, r.value) for pos, _h in records.iter_batches(data) for r in records.decode_records(data, pos)]


async def _two_owners(tmp_path, backend, topic: str):
    """(new owner, its log, old owner, its log, acknowledged values): the old owner's view
    of the partition is 4 segments; the new owner has flushed 2 more since."""
    owner, zombie = _manager(tmp_path, backend), _manager(tmp_path, backend)
    await owner.metadata.create_topic(TopicMeta(topic, 1))
    lg = await owner.get_log(topic, 0)
    acked = await _produce_segments(lg, 4, b"early")
    zlg = await zombie.get_log(topic, 0)
    acked += await _produce_segments(lg, 2, b"late")
    assert len(zlg.state.segments) == 4 and len(lg.state.segments) == 6
    return owner, lg, zombie, zlg, acked


async def _consume_through_broker(tmp_path, backend, topic: str) -> tuple[list[tuple[int, bytes]], int]:
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--storage", backend.url, "--merge-interval-ms", "0"], env=backend.env).start()
    try:
        return await asyncio.to_thread(_consume_all, b.bootstrap, topic)
    finally:
        b.stop()


@pytest.mark.parametrize("timing", ["lands-late", "starts-late"])
async def test_old_owners_merge_never_replaces_the_new_owners_longer_merge(backend, tmp_path, topic_name, timing):
    """lands-late: the old owner read the first segment and built its merge before the new
    owner merged, its PUT lands after. starts-late: it reads after the new owner merged.
    Either way the new owner's merged object stands, and once the grace period has deleted
    the run's other objects every acknowledged record is still read."""
    owner, lg, zombie, zlg, acked = await _two_owners(tmp_path, backend, topic_name)
    zombie_run = _only_run(zlg)
    late_merge = None
    if timing == "lands-late":
        reached, release = _hold_replaces(zombie)
        late_merge = asyncio.create_task(zombie.merger.merge(zlg, zombie_run))
        await asyncio.wait_for(reached.wait(), 30)  # read, merged, its PUT under way

    assert await owner.merger.merge(lg, _only_run(lg))
    await owner.merger.delete_expired(force=True)  # the grace period is over
    merged = lg.state.segments
    assert [(s.base_offset, s.last_offset) for s in merged] == [(0, 6 * RECORDS_PER_SEGMENT - 1)]

    if late_merge is not None:
        release.set()
        assert await late_merge is False
    else:
        assert await zombie.merger.merge(zlg, zombie_run) is False
    stored = segment.decode(await owner.store.get(_key(0, topic_name))).info
    assert (stored.base_offset, stored.last_offset, stored.created_ms) == (0, merged[0].last_offset, merged[0].created_ms)
    assert [(s.base_offset, s.last_offset) for s in (await owner.metadata.get_partition(topic_name, 0)).segments] == [(0, merged[0].last_offset)]
    await _close(owner, zombie)

    got, high = await _consume_through_broker(tmp_path, backend, topic_name)
    assert high == len(acked)
    assert got == list(enumerate(acked))


async def test_old_owners_merge_landing_first_leaves_a_readable_superset(backend, tmp_path, topic_name):
    """The old owner's replace wins (the new owner has not merged yet) but its metadata
    swap is refused: the first key holds a superset of the committed first segment, which
    readers bound by offset; the new owner's merge then replaces it, and nothing is lost."""
    owner, lg, zombie, zlg, acked = await _two_owners(tmp_path, backend, topic_name)
    with pytest.raises(ConflictError):
        await zombie.merger.merge(zlg, _only_run(zlg))
    stored = segment.decode(await owner.store.get(_key(0, topic_name))).info
    assert stored.last_offset == 4 * RECORDS_PER_SEGMENT - 1  # the old owner's merge is there
    assert len((await owner.metadata.get_partition(topic_name, 0)).segments) == 6  # not committed

    fresh = _manager(tmp_path, backend)  # a reader with an empty cache: the store's bytes
    assert await _read_all(fresh, topic_name) == list(enumerate(acked))
    await _close(fresh)

    assert await owner.merger.merge(lg, _only_run(lg))
    await owner.merger.delete_expired(force=True)
    assert [(s.base_offset, s.last_offset) for s in lg.state.segments] == [(0, len(acked) - 1)]
    await _close(owner, zombie)

    got, high = await _consume_through_broker(tmp_path, backend, topic_name)
    assert high == len(acked)
    assert got == list(enumerate(acked))
