"""Segments are created, never replaced by a late writer (issue #20, part 4).

Two LogManagers over one metadata store and one object store both believe they own a
partition, as an old owner whose upload is still in flight and the new owner do. Both
write `segment-{base_offset}.kfs` at the same high watermark: exactly one wins, the other's
producers get NOT_LEADER_OR_FOLLOWER, and a consumer (a real client against a broker
started on the same stores) reads only the winner's records. Run on the file store, on S3
(moto) with `If-None-Match: *`, and on S3 with the documented fallback
(KAFSCALE_S3_CONDITIONAL_WRITES=false: existence check before the PUT, read-back after).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.failures import StorageError
from kafscale.storage.logs import LogManager
from kafscale.storage.backends import open_store
from kafscale.storage.objectstore import ObjectExistsError
from kafscale.storage.s3 import S3ObjectStore
from tests.support.broker import BrokerProcess

NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value
NAMESPACE = "default"


@dataclass
class Backend:
    url: str
    env: dict = field(default_factory=dict)


async def _backend(kind: str, request, tmp_path, monkeypatch) -> Backend:
    if kind == "file":
        return Backend(f"file://{tmp_path}/objects")
    request.getfixturevalue("moto_server")  # AWS_* and KAFSCALE_S3_ENDPOINT in os.environ
    env = {"KAFSCALE_S3_CONDITIONAL_WRITES": "false" if kind == "s3-fallback" else "true"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # read by S3ObjectStore.from_url here and in the broker
    bucket = f"cond-{uuid.uuid4().hex[:12]}"
    store = open_store(f"s3://{bucket}")
    await store.create_bucket()
    await store.close()
    return Backend(f"s3://{bucket}/data", env)


@pytest.fixture(params=["file", "s3", "s3-fallback"])
async def backend(request, tmp_path, monkeypatch):
    return await _backend(request.param, request, tmp_path, monkeypatch)


@pytest.fixture(params=["file", "s3"])
async def atomic_backend(request, tmp_path, monkeypatch):
    """Stores whose create is atomic. The fallback (no conditional writes) is not: two
    uploads that overlap in time can both pass its checks, as the s3.py docstring says."""
    return await _backend(request.param, request, tmp_path, monkeypatch)


def _manager(data_dir: Path, backend: Backend) -> LogManager:
    """A broker's storage side, as the broker builds it, on the embedded metadata of data_dir,
    uploading a segment object per partition (the objects these tests race; write-ahead
    objects are created under unique keys: tests/test_write_ahead*.py)."""
    cfg = BrokerConfig(data_dir=str(data_dir), http="", storage=backend.url, merge_interval_ms=0, write_ahead_objects=False)
    meta = MetadataStore(SqliteKV(data_dir / "metadata.sqlite"))
    return LogManager(meta, open_store(backend.url), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


async def _close(*managers: LogManager) -> None:
    for mgr in managers:
        await mgr.stop()
        await mgr.metadata.close()
        await mgr.store.close()


def _append(lg, values: list[bytes]) -> tuple[int, asyncio.Future]:
    data = memoryview(bytearray(records.build_batch([(None, v) for v in values], timestamp=int(time.time() * 1000))))
    base, _t, waiter = lg.append(data, records.validate_record_set(data), True)
    return base, waiter


async def _stored_values(store, topic: str, base: int) -> list[bytes]:
    """The records of the segment object at `base`, straight from the store."""
    decoded = segment.decode(await store.get(segment.segment_key(NAMESPACE, topic, 0, base)))
    return [r.value for pos, _h in records.iter_batches(decoded.batches) for r in records.decode_records(decoded.batches, pos)]


def _consume_all(bootstrap: str, topic: str, timeout: float = 30.0) -> tuple[list[tuple[int, bytes]], int]:
    """(offset, value) of every record up to the high watermark, and the high watermark."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cond-check", "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while (not got or got[-1][0] < high - 1) and time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append((m.offset(), m.value()))
        return got, high
    finally:
        c.close()


async def test_late_upload_of_an_old_owner_never_replaces_the_committed_segment(backend, tmp_path, topic_name):
    winner, zombie = _manager(tmp_path, backend), _manager(tmp_path, backend)
    await winner.metadata.create_topic(TopicMeta(topic_name, 1))
    lg_winner = await winner.get_log(topic_name, 0)
    lg_zombie = await zombie.get_log(topic_name, 0)  # both own it, both at high watermark 0
    won = [b"winner-%d" % i for i in range(5)]
    lost = [b"zombie-%d" % i for i in range(5)]  # as many records: same last offset
    base, acked = _append(lg_winner, won)
    await acked
    assert base == 0 and lg_winner.high_watermark == 5
    # The old owner's upload of the same offsets lands after the commit.
    _base, late = _append(lg_zombie, lost)
    with pytest.raises(StorageError) as err:
        await late
    assert err.value.error_code == NOT_LEADER_OR_FOLLOWER
    assert await _stored_values(winner.store, topic_name, 0) == won
    await _close(winner, zombie)

    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--storage", backend.url, "--merge-interval-ms", "0", "--write-ahead-objects", "false"], env=backend.env).start()
    try:
        got, high = await asyncio.to_thread(_consume_all, b.bootstrap, topic_name)
    finally:
        b.stop()
    assert high == 5
    assert got == list(enumerate(won))


async def test_concurrent_uploads_of_one_segment_exactly_one_wins(atomic_backend, tmp_path, topic_name):
    backend = atomic_backend
    first, second = _manager(tmp_path, backend), _manager(tmp_path, backend)
    await first.metadata.create_topic(TopicMeta(topic_name, 1))
    logs = [await first.get_log(topic_name, 0), await second.get_log(topic_name, 0)]
    values = [[b"first-%d" % i for i in range(3)], [b"second-%d" % i for i in range(3)]]
    waiters = [_append(lg, v)[1] for lg, v in zip(logs, values)]  # both flushes start together
    results = await asyncio.gather(*waiters, return_exceptions=True)
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1, results
    w = winners[0]
    loss = results[1 - w]
    assert isinstance(loss, StorageError) and loss.error_code == NOT_LEADER_OR_FOLLOWER, loss
    assert await _stored_values(first.store, topic_name, 0) == values[w]

    # The loser re-reads the partition on its next produce and continues after the winner.
    loser = (first, second)[1 - w]
    lg = await loser.get_log(topic_name, 0)
    assert lg.high_watermark == 3
    base, acked = _append(lg, [b"after"])
    await acked
    assert base == 3

    fresh = _manager(tmp_path, backend)  # a reader with an empty cache: the store's bytes
    reader = await fresh.get_reader(topic_name, 0)
    data = b"".join(bytes(c) for c in await reader.read(0, 1 << 20))
    got = [(r.offset, r.value) for pos, _h in records.iter_batches(data) for r in records.decode_records(data, pos)]
    assert got == list(enumerate(values[w] + [b"after"]))
    await _close(first, second, fresh)


async def test_create_is_idempotent_for_the_same_bytes_and_refuses_others(backend, tmp_path):
    """A retried upload whose first attempt landed (its answer was lost) finds its own
    bytes under the key: that is success, not a lost race."""
    store = open_store(backend.url)
    key = f"{NAMESPACE}/t/0/segment-{0:020d}.kfs"
    try:
        await store.create(key, [b"ours ", b"bytes"])
        await store.create(key, [b"ours bytes"])  # the retry
        with pytest.raises(ObjectExistsError):
            await store.create(key, [b"other bytes"])
        assert await store.get(key) == b"ours bytes"
        assert await store.list(f"{NAMESPACE}/t/0/") == [key]  # no temp files left behind
    finally:
        await store.close()


class _AnswerDroppingProxy:
    """A TCP proxy in front of moto that, when armed, forwards one PUT but cuts the
    connection instead of passing on its 200: the upload landed, the client never hears."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.armed = False
        self.dropped = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        last_request = [b""]

        async def to_upstream() -> None:
            while data := await client_r.read(65536):
                if data[:8].split(b" ")[0] in (b"PUT", b"GET", b"HEAD", b"POST", b"DELETE"):
                    last_request[0] = data[:8]
                up_w.write(data)
                await up_w.drain()

        async def to_client() -> None:
            while data := await up_r.read(65536):
                if self.armed and last_request[0].startswith(b"PUT ") and data.startswith(b"HTTP/1.1 200"):
                    self.armed = False
                    self.dropped += 1
                    break  # the answer to a landed PUT is lost
                client_w.write(data)
                await client_w.drain()

        try:
            await asyncio.wait([asyncio.ensure_future(to_upstream()), asyncio.ensure_future(to_client())], return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for w in (client_w, up_w):
                w.close()


@pytest.mark.parametrize("conditional", [True, False], ids=["if-none-match", "fallback"])
async def test_s3_retry_of_an_upload_whose_answer_was_lost_is_not_a_lost_race(moto_server, conditional):
    """The first PUT lands but its answer is lost; the store's retry finds the key taken
    (412, or the fallback's HEAD) by its own bytes: that is success."""
    bucket = f"cond-{uuid.uuid4().hex[:12]}"
    direct = open_store(f"s3://{bucket}")
    await direct.create_bucket()
    proxy = _AnswerDroppingProxy(moto_server.port)
    store = S3ObjectStore(bucket, "p", endpoint_url=await proxy.start(), conditional_writes=conditional, base_backoff=0.01)
    key = f"{NAMESPACE}/t/0/segment-{0:020d}.kfs"
    try:
        proxy.armed = True
        await store.create(key, [b"segment bytes"])
        assert proxy.dropped == 1
        assert await direct.get(f"p/{key}") == b"segment bytes"
        with pytest.raises(ObjectExistsError):  # and the key is still guarded
            await store.create(key, [b"other bytes"])
    finally:
        await store.close()
        await direct.close()
        await proxy.close()


async def test_object_left_at_the_high_watermark_by_a_failed_flush_is_adopted(backend, tmp_path, topic_name):
    """An upload that landed although its flush failed (never acknowledged) holds the key
    of the next flush: that flush loses, and the log reloads and adopts the object instead
    of failing every flush at that offset."""
    mgr = _manager(tmp_path, backend)
    await mgr.metadata.create_topic(TopicMeta(topic_name, 1))
    lg = await mgr.get_log(topic_name, 0)
    leftover = memoryview(bytearray(records.build_batch([(None, b"leftover-%d" % i) for i in range(2)], timestamp=int(time.time() * 1000))))
    records.patch_batch(leftover, 0, 0, lg.leader_epoch)
    enc = segment.encode([leftover], 0)
    await mgr.store.put(segment.segment_key(NAMESPACE, topic_name, 0, 0), enc.parts)

    _base, waiter = _append(lg, [b"new"])
    with pytest.raises(StorageError) as err:
        await waiter
    assert err.value.error_code == NOT_LEADER_OR_FOLLOWER  # the client refreshes and retries
    lg = await mgr.get_log(topic_name, 0)
    assert lg.high_watermark == 2
    base, acked = _append(lg, [b"new"])
    await acked
    assert base == 2
    data = b"".join(bytes(c) for c in await lg.read(0, 1 << 20))
    assert [r.value for pos, _h in records.iter_batches(data) for r in records.decode_records(data, pos)] == [b"leftover-0", b"leftover-1", b"new"]
    await _close(mgr)


async def test_unusable_object_at_the_high_watermark_is_deleted_by_recovery(backend, tmp_path, topic_name):
    mgr = _manager(tmp_path, backend)
    await mgr.metadata.create_topic(TopicMeta(topic_name, 1))
    key = segment.segment_key(NAMESPACE, topic_name, 0, 0)
    await mgr.store.put(key, [b"not a segment"])
    lg = await mgr.get_log(topic_name, 0)
    assert lg.high_watermark == 0
    base, acked = _append(lg, [b"first"])
    await acked
    assert base == 0
    assert await _stored_values(mgr.store, topic_name, 0) == [b"first"]
    await _close(mgr)


async def test_reader_refuses_an_object_that_is_not_the_committed_segment(backend, tmp_path, topic_name):
    """What the fallback cannot prevent (a late PUT that passed its existence check before
    the winner's upload) is detected: a reader answers an error, never other records."""
    mgr = _manager(tmp_path, backend)
    await mgr.metadata.create_topic(TopicMeta(topic_name, 1))
    lg = await mgr.get_log(topic_name, 0)
    await _append(lg, [b"acknowledged-%d" % i for i in range(3)])[1]
    late = memoryview(bytearray(records.build_batch([(None, b"late-%d" % i) for i in range(3)], timestamp=int(time.time() * 1000))))
    enc = segment.encode([late], 0, created_ms=lg.state.segments[0].created_ms - 1)
    await mgr.store.put(segment.segment_key(NAMESPACE, topic_name, 0, 0), enc.parts)  # as an unconditional PUT would
    await _close(mgr)

    fresh = _manager(tmp_path, backend)  # empty cache: reads the object
    with pytest.raises(StorageError) as err:  # loading it (producer state) reads the segment
        reader = await fresh.get_reader(topic_name, 0)
        await reader.read(0, 1 << 20)
    assert err.value.error_code == ErrorCode.kafka_storage_error.value
    await _close(fresh)


def test_conditional_writes_setting(monkeypatch):
    monkeypatch.delenv("KAFSCALE_S3_CONDITIONAL_WRITES", raising=False)
    assert S3ObjectStore.from_url("s3://b").conditional_writes is True
    monkeypatch.setenv("KAFSCALE_S3_CONDITIONAL_WRITES", "false")
    assert S3ObjectStore.from_url("s3://b").conditional_writes is False
