"""Production backends against real servers: S3ObjectStore on moto, EtcdKV on etcd."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import socket
import sqlite3
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from kafscale.metadata import keys
from kafscale.metadata.etcd import EtcdKV
from kafscale.metadata.backends import open_kv
from kafscale.metadata.kv import MetadataUnavailable, Txn
from kafscale.metadata import sqlite as sqlite_kv
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import (
    CommittedOffset,
    ConflictError,
    MetadataStore,
    TopicExistsError,
    TopicMeta,
)
from kafscale.storage.backends import open_store
from kafscale.storage import local_store
from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.objectstore import ObjectExistsError, ObjectNotFound, ObjectStoreError
from kafscale.storage.s3 import S3ObjectStore
from kafscale.storage.segment import SegmentInfo
from tests.support.page_cache import resident_pages, skip_unless_pages_can_be_dropped
from tests.support.servers import free_port, start_etcd, start_moto
from tests.support.wait import wait_until_async

# One loop for the module, so async fixtures and tests share it.
pytestmark = pytest.mark.asyncio(loop_scope="session")


def _name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


# ======================================================================================
# S3ObjectStore
# ======================================================================================


@pytest.fixture
async def bucket(moto_server):
    name = _name("bkt")
    store = open_store(f"s3://{name}")
    await store.create_bucket()
    await store.close()
    return name


async def test_s3_put_get_ranges(bucket):
    store = open_store(f"s3://{bucket}/data")
    assert isinstance(store, S3ObjectStore) and store.path_style
    try:
        await store.check()
        await store.put("t/0/seg.kfs", [b"hello ", bytearray(b"wide "), memoryview(b"world")])
        assert await store.get("t/0/seg.kfs") == b"hello wide world"
        assert await store.get("t/0/seg.kfs", 6) == b"wide world"
        assert await store.get("t/0/seg.kfs", 0, 5) == b"hello"
        assert await store.get("t/0/seg.kfs", 6, 10) == b"wide"
        assert await store.get("t/0/seg.kfs", 11, 1000) == b"world"  # end past the size
        assert await store.get("t/0/seg.kfs", 100) == b""  # start past the size
        assert await store.get("t/0/seg.kfs", 3, 3) == b""
        assert await store.get_tail("t/0/seg.kfs", 5) == (b"world", 16)  # suffix + total size
        assert await store.get_tail("t/0/seg.kfs", 100) == (b"hello wide world", 16)
        await store.put("t/0/seg.kfs", [b"replaced"])
        assert await store.get("t/0/seg.kfs") == b"replaced"
        await store.put("empty", [])
        assert await store.get("empty") == b""
        assert await store.get_tail("empty", 16) == (b"", 0)
    finally:
        await store.close()


async def test_s3_put_of_a_segment_sent_from_its_batches(bucket):
    """A flush uploads a segment from its batch buffers where they lie (no joined copy):
    thousands of small parts, parts larger than a write, and empty ones arrive byte-exact
    and in order, through create and put."""
    store = open_store(f"s3://{bucket}/parts")
    small = [bytes([i % 251]) * (100 + i % 7) for i in range(3000)]  # 100 B records' batches
    large = bytes(range(256)) * 2500  # 640,000 bytes: more than one write of the body
    parts = [b"HEAD", *small[:1500], memoryview(large), b"", bytearray(b"mid"), *small[1500:], large[:300_000], b"FOOT"]
    want = b"".join(parts)
    try:
        await store.create("t/0/seg.kfs", parts)
        assert await store.get("t/0/seg.kfs") == want
        await store.put("t/0/other.kfs", [large, *small])
        assert await store.get("t/0/other.kfs") == large + b"".join(small)
    finally:
        await store.close()


async def test_s3_put_carries_crc32c_instead_of_payload_hash(bucket):
    """Each PUT sends the CRC32C of its body (the server rejects a body that does not
    match) and no SHA-256 of the body (UNSIGNED-PAYLOAD), over plain HTTP too."""
    store = open_store(f"s3://{bucket}/c")
    sent = []
    try:
        client = await store._get_client()
        client.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
        await store.put("check.kfs", [b"1234", memoryview(b"56789")])
        assert await store.get("check.kfs") == b"123456789"
        # CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720, B.4).
        assert sent[-1]["x-amz-checksum-crc32c"] in (b"4waSgw==", "4waSgw==")
        assert sent[-1]["X-Amz-Content-SHA256"] in (b"UNSIGNED-PAYLOAD", "UNSIGNED-PAYLOAD")
    finally:
        await store.close()


async def test_s3_sha256_checksum_for_stores_without_checksum_headers(bucket, monkeypatch):
    """KAFSCALE_S3_CHECKSUM=sha256: no x-amz-checksum-* header (some stores refuse them);
    the body's SHA-256 is signed into the request instead."""
    import hashlib

    monkeypatch.setenv("KAFSCALE_S3_CHECKSUM", "sha256")
    store = open_store(f"s3://{bucket}/s")
    sent = []
    try:
        client = await store._get_client()
        client.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
        await store.put("check.kfs", [b"1234", b"56789"])
        assert await store.get("check.kfs") == b"123456789"
        assert not any(k.lower().startswith("x-amz-checksum") for k in sent[-1])
        signed = sent[-1]["X-Amz-Content-SHA256"]
        assert (signed.decode() if isinstance(signed, bytes) else signed) == hashlib.sha256(b"123456789").hexdigest()
    finally:
        await store.close()
    monkeypatch.setenv("KAFSCALE_S3_CHECKSUM", "md5")
    with pytest.raises(ValueError, match="checksum"):
        open_store(f"s3://{bucket}/s")


async def test_s3_missing_key(bucket):
    store = open_store(f"s3://{bucket}/p")
    try:
        for call in (store.get("nope"), store.get("nope", 5), store.get("nope", 0, 10), store.get_tail("nope", 16)):
            with pytest.raises(ObjectNotFound) as info:
                await call
            assert isinstance(info.value, ObjectStoreError) and isinstance(info.value, KeyError)
        await store.delete(["nope", "also/nope"])  # missing keys are ignored
    finally:
        await store.close()


async def test_s3_list_prefix_isolation_and_delete(bucket):
    a, b, root = open_store(f"s3://{bucket}/ns-a/"), open_store(f"s3://{bucket}/ns-ab"), open_store(f"s3://{bucket}")
    try:
        await a.put("orders/0/2.kfs", [b"2"])
        await a.put("orders/0/1.kfs", [b"1"])
        await a.put("orders/1/1.kfs", [b"x"])
        await a.put("other/0/1.kfs", [b"y"])
        await b.put("orders/0/1.kfs", [b"from b"])

        assert await a.list("") == ["orders/0/1.kfs", "orders/0/2.kfs", "orders/1/1.kfs", "other/0/1.kfs"]
        assert await a.list("orders/0/") == ["orders/0/1.kfs", "orders/0/2.kfs"]
        assert await a.list("orders/") == ["orders/0/1.kfs", "orders/0/2.kfs", "orders/1/1.kfs"]
        assert await a.list("nothing/") == []
        assert await b.list("") == ["orders/0/1.kfs"]  # ns-a's keys stay invisible to ns-ab
        assert await a.get("orders/0/1.kfs") == b"1" and await b.get("orders/0/1.kfs") == b"from b"
        assert await root.list("ns-a/") == [
            "ns-a/orders/0/1.kfs", "ns-a/orders/0/2.kfs", "ns-a/orders/1/1.kfs", "ns-a/other/0/1.kfs",
        ]  # fmt: skip

        await a.delete(["orders/0/1.kfs", "orders/1/1.kfs", "missing"])
        assert await a.list("") == ["orders/0/2.kfs", "other/0/1.kfs"]
        assert await b.list("") == ["orders/0/1.kfs"]
        with pytest.raises(ObjectNotFound):
            await a.get("orders/0/1.kfs")
        await a.delete([])
    finally:
        for s in (a, b, root):
            await s.close()


async def test_s3_list_and_delete_paginate(bucket):
    """Several ListObjectsV2 pages and several DeleteObjects batches (small sizes here)."""
    store = open_store(f"s3://{bucket}/many")
    store.list_page_size, store.delete_batch = 4, 3
    try:
        keys = [f"k/{i:03d}" for i in range(11)]
        await asyncio.gather(*(store.put(k, [k.encode()]) for k in reversed(keys)))
        await store.put("other", [b"x"])
        assert await store.list("k/") == keys
        await store.delete(keys[:8] + ["k/missing"])
        assert await store.list("") == keys[8:] + ["other"]
    finally:
        await store.close()


async def test_s3_create_bucket_from_env(moto_server, monkeypatch):
    name = _name("auto")
    monkeypatch.setenv("KAFSCALE_S3_CREATE_BUCKET", "true")
    store = open_store(f"s3://{name}/x")
    try:
        await store.put("k", [b"v"])
        assert await store.get("k") == b"v"
    finally:
        await store.close()


async def test_s3_url_and_env_config(monkeypatch):
    for var in ("KAFSCALE_S3_ENDPOINT", "KAFSCALE_S3_REGION", "KAFSCALE_S3_PATH_STYLE", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    s = S3ObjectStore.from_url("s3://my-bucket")
    assert (s.bucket, s.prefix, s.endpoint_url, s.region, s.path_style) == ("my-bucket", "", None, "eu-west-1", False)
    monkeypatch.setenv("KAFSCALE_S3_ENDPOINT", "http://minio:9000")
    monkeypatch.setenv("KAFSCALE_S3_REGION", "us-west-2")
    s = S3ObjectStore.from_url("s3://my-bucket/a/b/")
    assert (s.prefix, s.endpoint_url, s.region, s.path_style) == ("a/b/", "http://minio:9000", "us-west-2", True)
    monkeypatch.setenv("KAFSCALE_S3_PATH_STYLE", "false")
    assert S3ObjectStore.from_url("s3://my-bucket").path_style is False


async def test_s3_dead_endpoint_fails_fast(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("KAFSCALE_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nobody listens
    store = open_store("s3://dead-bucket/p")
    quick = S3ObjectStore.from_url("s3://dead-bucket/p", max_attempts=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreError, match="attempts"):
            await store.check()  # default retries: still bounded
        assert time.monotonic() - t0 < 4
        for call in (quick.put("k", [b"v"]), quick.get("k"), quick.list(""), quick.delete(["k"])):
            t0 = time.monotonic()
            with pytest.raises(ObjectStoreError) as info:
                await call
            assert not isinstance(info.value, ObjectNotFound)
            assert time.monotonic() - t0 < 3
    finally:
        await store.close()
        await quick.close()


async def test_s3_silent_endpoint_times_out(monkeypatch):
    """An endpoint that accepts connections but never answers must not hang callers."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)  # the kernel completes handshakes; nothing ever reads or replies
        store = S3ObjectStore(
            "silent-bucket", endpoint_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
            read_timeout=0.5, retry_budget=1.5,
        )  # fmt: skip
        try:
            t0 = time.monotonic()
            with pytest.raises(ObjectStoreError):
                await store.get("k")
            assert time.monotonic() - t0 < 4
        finally:
            await store.close()


class _FlakyClient:
    """Stands in for the botocore client: fails `failures` times, then answers."""

    def __init__(self, failures: int, code: str = "SlowDown", status: int = 503):
        self.failures, self.code, self.status, self.calls = failures, code, status, 0

    async def head_bucket(self, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise ClientError(
                {"Error": {"Code": self.code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": self.status}},
                "HeadBucket",
            )
        return {}


async def test_s3_retries_throttling_then_gives_up():
    store = S3ObjectStore("b", endpoint_url="http://unused", max_attempts=4, base_backoff=0.01)
    flaky = _FlakyClient(failures=3)

    async def client():
        return flaky

    store._get_client = client  # retry logic only: no network
    await store.check()
    assert flaky.calls == 4  # three SlowDowns retried

    flaky = _FlakyClient(failures=100, code="InternalError", status=500)
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreError, match="after 4 attempts"):
        await store.check()
    assert flaky.calls == 4 and time.monotonic() - t0 < 2

    flaky = _FlakyClient(failures=100, code="AccessDenied", status=403)
    with pytest.raises(ObjectStoreError):
        await store.check()
    assert flaky.calls == 1  # not retriable


async def test_s3_outage_and_recovery(monkeypatch):
    with start_moto() as srv:
        for k, v in srv.env.items():
            monkeypatch.setenv(k, v)
        store = S3ObjectStore.from_url("s3://outage-bucket/p", retry_budget=2.0)
        try:
            await store.create_bucket()
            await store.put("a", [b"before"])

            # Frozen server: requests time out, then everything is back, data intact.
            await store.close()  # the next call makes a client with the shorter timeout
            store.read_timeout = 0.5
            srv.pause()
            try:
                t0 = time.monotonic()
                with pytest.raises(ObjectStoreError):
                    await store.get("a")
                assert time.monotonic() - t0 < 4
            finally:
                srv.resume()
            assert await store.get("a") == b"before"

            # Stopped server: connection refused, errors; started again on the same port: works.
            srv.stop()
            t0 = time.monotonic()
            with pytest.raises(ObjectStoreError) as info:
                await store.put("b", [b"during"])
            assert not isinstance(info.value, ObjectNotFound)
            with pytest.raises(ObjectStoreError):
                await store.check()
            assert time.monotonic() - t0 < 6
            srv.start()
            await store.create_bucket()  # moto keeps no state across restarts
            await store.put("b", [b"after"])
            assert await store.get("b") == b"after"
            assert await store.list("") == ["b"]
            await store.check()
        finally:
            await store.close()


# ======================================================================================
# EtcdKV
# ======================================================================================


@pytest.fixture
async def kv(etcd_server):
    k = EtcdKV.from_url(etcd_server.url, prefix=f"/{_name('test')}")
    yield k
    await k.close()


async def test_etcd_get_range_versions(kv):
    assert await kv.get("/a") is None
    for i in range(1, 4):
        assert await kv.commit(Txn(puts=[("/a", f"v{i}".encode())]))
        got = await kv.get("/a")
        assert (got.key, got.value, got.version) == ("/a", f"v{i}".encode(), i)
    await kv.commit(Txn(puts=[("/r/b", b"2"), ("/r/a", b"1"), ("/r/c/d", b"3"), ("/rx", b"no")]))
    assert [(x.key, x.value, x.version) for x in await kv.range("/r/")] == [
        ("/r/a", b"1", 1), ("/r/b", b"2", 1), ("/r/c/d", b"3", 1),
    ]  # fmt: skip
    assert [x.key for x in await kv.range("/")] == ["/a", "/r/a", "/r/b", "/r/c/d", "/rx"]
    assert [x.key for x in await kv.range("")] == ["/a", "/r/a", "/r/b", "/r/c/d", "/rx"]
    assert await kv.range("/none/") == []
    # delete then re-create: the version restarts at 1 (etcd semantics)
    assert await kv.commit(Txn(compares=[("/a", 3)], deletes=["/a"]))
    assert await kv.get("/a") is None
    assert await kv.commit(Txn(compares=[("/a", 0)], puts=[("/a", b"new")]))
    assert (await kv.get("/a")).version == 1
    await kv.check()


async def test_etcd_prefix_isolation(etcd_server):
    base = f"/{_name('iso')}"
    a, ab = EtcdKV.from_url(etcd_server.url, prefix=base), EtcdKV.from_url(etcd_server.url, prefix=base + "b")
    try:
        await a.commit(Txn(puts=[("/k", b"a")]))
        await ab.commit(Txn(puts=[("/k", b"ab"), ("/j", b"ab")]))
        assert (await a.get("/k")).value == b"a" and (await ab.get("/k")).value == b"ab"
        assert [x.key for x in await a.range("")] == ["/k"]
        assert [x.key for x in await a.range("/")] == ["/k"]
        assert await a.get("/j") is None
        await a.commit(Txn(delete_prefixes=["/"]))
        assert await a.range("") == [] and len(await ab.range("")) == 2
        # Keys really live under the prefix in etcd.
        root = EtcdKV.from_url(etcd_server.url, prefix="")
        assert [x.key for x in await root.range(base + "b/")] == [base + "b/j", base + "b/k"]
        await root.close()
    finally:
        await a.close()
        await ab.close()


async def test_etcd_txn_compare_failure_applies_nothing(kv):
    await kv.commit(Txn(puts=[("/x", b"1"), ("/keep/1", b"k1"), ("/keep/2", b"k2"), ("/d", b"d")]))
    before = [(x.key, x.value, x.version) for x in await kv.range("/")]
    failing = Txn(
        compares=[("/x", 1), ("/absent", 1)],  # second compare fails
        puts=[("/x", b"2"), ("/new", b"n")],
        deletes=["/d"],
        delete_prefixes=["/keep/"],
    )
    assert await kv.commit(failing) is False
    assert [(x.key, x.value, x.version) for x in await kv.range("/")] == before

    failing.compares = [("/x", 1), ("/absent", 0)]
    assert await kv.commit(failing) is True
    assert [(x.key, x.value, x.version) for x in await kv.range("/")] == [("/new", b"n", 1), ("/x", b"2", 2)]
    assert await kv.commit(Txn(compares=[("/x", 1)], puts=[("/x", b"3")])) is False  # stale version
    assert (await kv.get("/x")).value == b"2"


async def test_etcd_delete_prefixes_with_puts_inside(kv):
    await kv.commit(Txn(puts=[(f"/seg/{i}", b"old") for i in range(5)] + [("/segx", b"outside"), ("/g", b"g")]))
    # Delete a prefix and re-put some keys under it, delete and put the same key, put twice.
    ok = await kv.commit(
        Txn(
            puts=[("/seg/2", b"new"), ("/seg/9", b"added"), ("/g", b"first"), ("/g", b"second")],
            deletes=["/g", "/missing"],
            delete_prefixes=["/seg/", "/nothing/"],
        )
    )
    assert ok
    assert [(x.key, x.value) for x in await kv.range("/")] == [
        ("/g", b"second"), ("/seg/2", b"new"), ("/seg/9", b"added"), ("/segx", b"outside"),
    ]  # fmt: skip
    assert (await kv.get("/seg/9")).version == 1


async def test_etcd_large_transactions(kv):
    # Unguarded writes past etcd's --max-txn-ops (128) are applied in chunks.
    n = 1234
    assert await kv.commit(Txn(puts=[(f"/big/{i:05d}", str(i).encode()) for i in range(n)]))
    got = await kv.range("/big/")  # also pages through Range (1000 keys a page)
    assert [x.key for x in got] == [f"/big/{i:05d}" for i in range(n)]
    assert got[777].value == b"777"
    # A guarded one that large cannot be split atomically: a clear error, nothing applied.
    with pytest.raises(MetadataUnavailable, match="max-txn-ops"):
        await kv.commit(Txn(compares=[(f"/g/{i}", 0) for i in range(200)], puts=[(f"/g/{i}", b"v") for i in range(200)]))
    assert await kv.range("/g/") == []
    assert await kv.commit(Txn(delete_prefixes=["/big/"]))
    assert await kv.range("/big/") == []


@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
async def test_get_many_in_order_with_absent_keys(backend, request, tmp_path):
    """KV.get_many: each key's record or None, in the order asked, past one etcd
    transaction's --max-txn-ops and one SQLite statement's parameters."""
    k = SqliteKV(tmp_path / "m.sqlite") if backend == "sqlite" else EtcdKV.from_url(request.getfixturevalue("etcd_server").url, prefix=f"/{_name('many')}")
    try:
        n = 1234
        assert await k.commit(Txn(puts=[(f"/m/{i:05d}", str(i).encode()) for i in range(0, n, 2)]))
        assert await k.commit(Txn(puts=[("/m/00000", b"again")]))
        asked = [f"/m/{i:05d}" for i in reversed(range(n))] + ["/m/00000", "/none"]
        got = await k.get_many(asked)
        assert len(got) == len(asked)
        for key, kv in zip(asked, got):
            i = int(key.rsplit("/", 1)[-1]) if key.startswith("/m/") else 1
            if i % 2:
                assert kv is None, key
            else:
                assert (kv.key, kv.value, kv.version) == ((key, b"again", 2) if i == 0 else (key, str(i).encode(), 1))
        assert await k.get_many([]) == []
    finally:
        await k.close()


async def test_sqlite_large_transactions_applied_whole(tmp_path):
    """Puts and deletes past one statement's rows (they go a few hundred keys a statement):
    every one applied, versions as key-by-key statements gave them, and a failed compare
    still applies none of them."""
    k = SqliteKV(tmp_path / "m.sqlite")
    try:
        n = 1234
        assert await k.commit(Txn(puts=[(f"/big/{i:05d}", str(i).encode()) for i in range(n)]))
        assert await k.commit(Txn(puts=[(f"/big/{i:05d}", b"twice") for i in range(0, n, 3)]))
        # a merge's swap: most keys deleted, one written, in one transaction
        doomed = [f"/big/{i:05d}" for i in range(1, n)]
        assert await k.commit(Txn(compares=[("/big/00000", 2)], deletes=doomed, puts=[("/big/00000", b"merged"), ("/big/99999", b"new")]))
        got = await k.range("/big/")
        assert [(x.key, x.value, x.version) for x in got] == [("/big/00000", b"merged", 3), ("/big/99999", b"new", 1)]
        # guarded by a compare that fails: nothing of it applied
        assert not await k.commit(Txn(compares=[("/big/00000", 1)], deletes=["/big/00000"], puts=[(f"/g/{i}", b"v") for i in range(900)]))
        assert [x.key for x in await k.range("/")] == ["/big/00000", "/big/99999"]
    finally:
        await k.close()


async def test_sqlite_guarded_puts_are_one_statement(tmp_path):
    """A transaction of puts guarded by compares (a segment's commit: the partition's state
    and its segment key) is one statement on the writer thread, its own transaction when it
    commits alone: written whole when every compare holds (the compare read before any of
    its rows is written), not at all when one fails; in a group with other transactions
    each keeps its own outcome."""
    k = SqliteKV(tmp_path / "m.sqlite")
    statements: list[str] = []
    k._writer.set_trace_callback(lambda sql: statements.append(sql) if not sql.startswith("PRAGMA") else None)

    async def commit(txn: Txn):
        statements.clear()
        ok = await k.commit(txn)
        return ok, list(statements)

    def rows(prefix="/p/"):
        found = k._db.execute("SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key", (prefix, prefix + "~")).fetchall()
        return [(key, bytes(value), version) for key, value, version in found]

    try:
        ok, ran = await commit(Txn(compares=[("/p/state", 0)], puts=[("/p/state", b"hw1"), ("/p/seg/0", b"s0")]))
        assert ok is True and len(ran) == 1 and ran[0].startswith("INSERT INTO kv (key, value, version) SELECT")
        # the compare's key is written by the same statement: its second row still goes in
        ok, ran = await commit(Txn(compares=[("/p/state", 1)], puts=[("/p/state", b"hw2"), ("/p/seg/1", b"s1")]))
        assert ok is True and len(ran) == 1
        assert rows() == [("/p/seg/0", b"s0", 1), ("/p/seg/1", b"s1", 1), ("/p/state", b"hw2", 2)]
        before = rows()
        for compares in ([("/p/state", 1)], [("/p/state", 2), ("/p/absent", 1)], [("/p/absent", 3)]):
            ok, ran = await commit(Txn(compares=compares, puts=[("/p/state", b"stale"), ("/p/seg/9", b"no")]))
            assert ok is False and len(ran) == 1, compares
        assert rows() == before
        ok, _ = await commit(Txn(compares=[("/p/state", 2), ("/p/absent", 0)], leased_puts=[("/p/lease", b"l")], puts=[("/p/seg/2", b"s2")]))
        assert ok is True and rows()[0] == ("/p/lease", b"l", 1)

        # A group: the first commit goes alone, the four behind it together, in one
        # transaction; a failed compare or a transaction of deletes leaves the others be.
        statements.clear()
        results = await asyncio.gather(
            k.commit(Txn(puts=[("/g/alone", b"a")])),
            k.commit(Txn(compares=[("/g/alone", 0)], puts=[("/g/x", b"x")])),  # /g/alone is written by now
            k.commit(Txn(compares=[("/g/alone", 1)], puts=[("/g/y", b"y"), ("/g/alone", b"a2")])),
            k.commit(Txn(compares=[("/p/seg/0", 1)], deletes=["/p/seg/0"], puts=[("/g/z", b"z")])),
            k.commit(Txn(puts=[("/g/twice", b"1"), ("/g/twice", b"2")])),
        )
        assert results == [True, False, True, True, True]
        assert rows("/g/") == [("/g/alone", b"a2", 2), ("/g/twice", b"2", 2), ("/g/y", b"y", 1), ("/g/z", b"z", 1)]
        assert k._db.execute("SELECT count(*) FROM kv WHERE key = '/p/seg/0'").fetchone()[0] == 0
        assert statements[0].startswith("INSERT INTO kv (key, value, version) SELECT") and statements[1] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
        assert sum(s.startswith("SAVEPOINT") for s in statements) == 2  # the deletes and the key written twice only
    finally:
        await k.close()


async def test_sqlite_checkpoints_between_groups(tmp_path, monkeypatch):
    """The WAL is checkpointed on the writer thread between groups, not inside a commit
    (SQLite's automatic checkpoint only past a bound): the database file holds the commits
    while the connections are open, the WAL starts over instead of growing, and what was
    committed is all there once the file is opened again."""
    monkeypatch.setattr(sqlite_kv, "_CHECKPOINT_EVERY_S", 0.0)
    path = tmp_path / "m.sqlite"
    k = SqliteKV(path)
    try:
        assert k._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == sqlite_kv._WAL_BOUND_PAGES
        for i in range(400):
            assert await k.commit(Txn(puts=[(f"/c/{i:04d}", bytes(2000))]))
        await wait_until_async(lambda: k.checkpoints > 0, 10, "a checkpoint between groups")
        ran = k.checkpoints
        assert await k.commit(Txn(puts=[("/c/last", b"x")]))  # its turn starts one more
        await wait_until_async(lambda: k.checkpoints > ran, 10, "a checkpoint after the last commit")
        # SQLite's own checkpoint would have waited for 1,000 pages of WAL (4 MiB); 400 x
        # 2 KB are in the database file, and the WAL was started over from its beginning
        # (400 commits of a page or two each would have made it over 1.6 MB).
        assert path.stat().st_size > 400 * 2000
        assert (tmp_path / "m.sqlite-wal").stat().st_size < 1_000_000
    finally:
        await k.close()
    direct = sqlite3.connect(str(path))
    try:
        assert direct.execute("SELECT count(*) FROM kv WHERE key >= '/c/'").fetchone()[0] == 401
    finally:
        direct.close()

    # A commit whose answer comes back after close() began: nothing is started after it.
    errors = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    try:
        k = SqliteKV(path)
        last = asyncio.ensure_future(k.commit(Txn(puts=[("/c/closing", b"x")])))
        await asyncio.sleep(0)  # on the commit thread
        await k.close()
        assert await asyncio.wait_for(last, 10) is True
        await asyncio.sleep(0.05)  # callbacks queued by the close's last group have run
        assert errors == []
    finally:
        asyncio.get_running_loop().set_exception_handler(None)
    direct = sqlite3.connect(str(path))
    try:
        assert direct.execute("SELECT value FROM kv WHERE key = '/c/closing'").fetchone()[0] == b"x"
    finally:
        direct.close()


async def test_etcd_open_kv_and_url_parsing(etcd_server, tmp_path):
    k = open_kv(etcd_server.url, tmp_path, prefix="/openkv")
    assert isinstance(k, EtcdKV) and k.prefix == "/openkv"
    await k.check()
    await k.close()
    k = EtcdKV.from_url("etcd://h1:1,h2:2, h3 ,[::1]:4/ignored")
    assert k.endpoints == ["h1:1", "h2:2", "h3:2379", "[::1]:4"]


async def test_etcd_failover_between_endpoints(etcd_server):
    dead = f"127.0.0.1:{free_port()}"
    for endpoints in ([dead, etcd_server.endpoint], [etcd_server.endpoint, dead]):
        k = EtcdKV(endpoints, prefix=f"/{_name('fo')}", op_timeout=3)
        try:
            assert await k.commit(Txn(compares=[("/k", 0)], puts=[("/k", b"v")]))
            assert (await k.get("/k")).value == b"v"
        finally:
            await k.close()


# -- the typed MetadataStore on etcd ------------------------------------------------------


def _seg(base: int, last: int) -> SegmentInfo:
    return SegmentInfo(base, last, 100 * (last - base + 1), last - base + 1, 1_700_000_000_000 + last, 1_700_000_000_000)


async def test_metadata_store_on_etcd(kv):
    store = MetadataStore(kv)
    meta = await store.create_topic(TopicMeta("orders", 3, configs={"retention.ms": "1000"}))
    with pytest.raises(TopicExistsError):
        await store.create_topic(TopicMeta("orders", 5))
    got = await store.get_topic("orders")
    assert (got.name, got.partitions, got.topic_id, got.configs) == ("orders", 3, meta.topic_id, {"retention.ms": "1000"})
    assert [t.name for t in await store.list_topics()] == ["orders"]

    st = await store.get_partition("orders", 1)
    assert (st.high_watermark, st.version, st.segments) == (0, 0, [])  # never written yet
    assert await store.get_partition("orders", 3) is None  # beyond the partition count
    st2 = await store.commit_segment(st, _seg(0, 9))
    assert (st2.high_watermark, st2.version) == (10, 1)
    with pytest.raises(ConflictError):  # a second writer still holding the old state is fenced
        await store.commit_segment(st, _seg(0, 4))
    st3 = await store.commit_segment(st2, _seg(10, 19))
    fresh = await store.get_partition("orders", 1)
    assert fresh.high_watermark == 20 and fresh.version == st3.version == 2
    assert [s.base_offset for s in fresh.segments] == [0, 10] and fresh.segments[1] == _seg(10, 19)

    # Merge: remove both segments and add one with the same base offset as a removed one.
    merged = await store.update_partition(fresh, remove_segments=[0, 10], add_segments=[_seg(0, 19)], owner=7)
    fresh = await store.get_partition("orders", 1)
    assert fresh.segments == [_seg(0, 19)] and fresh.owner == 7 and fresh.version == merged.version
    with pytest.raises(ConflictError):
        await store.update_partition(st3, log_start_offset=5)

    await store.set_topic_configs("orders", {"cleanup.policy": "delete"})
    await store.add_partitions("orders", 5)
    assert (await store.get_topic("orders")).partitions == 5
    assert await store.get_partition("orders", 4) is not None

    await store.delete_topic("orders")
    assert await store.get_topic("orders") is None
    assert await kv.range(keys.topic_partitions_prefix("orders")) == [] and await kv.range(keys.topic_segments_prefix("orders")) == []
    await store.create_topic(TopicMeta("orders", 1))  # the name is free again


async def test_metadata_store_groups_offsets_and_producer_ids(kv):
    store = MetadataStore(kv)
    await store.put_group("g1", {"state": "Stable", "generation": 3, "members": ["m1"]})
    await store.put_group("g2", {"state": "Empty"})
    assert await store.get_group("g1") == {"state": "Stable", "generation": 3, "members": ["m1"]}
    assert set(await store.list_groups()) == {"g1", "g2"}

    offsets = {("t/with/slash", 0): CommittedOffset(5, 1, "meta", 123), ("t", 2): CommittedOffset(9)}
    await store.commit_offsets("g1", offsets)
    assert await store.fetch_offsets("g1") == offsets
    await store.commit_offsets("g1", {("t", 2): CommittedOffset(11)})
    assert (await store.fetch_offsets("g1"))[("t", 2)].offset == 11
    await store.delete_offsets("g1", [("t", 2)])
    assert set(await store.fetch_offsets("g1")) == {("t/with/slash", 0)}
    await store.commit_offsets("g2", {("t", 0): CommittedOffset(1)})

    await store.delete_group("g1")
    assert await store.get_group("g1") is None and await store.fetch_offsets("g1") == {}
    assert await store.fetch_offsets("g2") == {("t", 0): CommittedOffset(1)}

    # Producer id blocks stay unique with many concurrent allocators (two clients).
    other = MetadataStore(EtcdKV(kv.endpoints, prefix=kv.prefix))
    try:
        starts = await asyncio.gather(
            *(s.allocate_producer_ids(100) for s in [store, other] * 10)
        )
    finally:
        await other.kv.close()
    assert sorted(starts) == list(range(0, 2000, 100))
    assert (await kv.get(keys.PRODUCER_IDS)).value == b"2000"


# -- leases and watches ---------------------------------------------------------------------


async def _absent(kv, key: str) -> bool:
    return await kv.get(key) is None


async def test_etcd_leases(kv):
    lease = await kv.grant_lease(10)
    await kv.commit(Txn(leased_puts=[("/brokers/1", b"host:9092")], lease=lease))
    assert await kv.commit(Txn(compares=[("/owner/p0", 0)], leased_puts=[("/owner/p0", b"1")], lease=lease))
    assert await kv.commit(Txn(compares=[("/owner/p0", 0)], leased_puts=[("/owner/p0", b"2")], lease=lease)) is False
    assert await kv.keepalive(lease) is True
    assert (await kv.get("/brokers/1")).value == b"host:9092"
    await kv.revoke_lease(lease)
    assert await kv.get("/brokers/1") is None and await kv.get("/owner/p0") is None
    assert await kv.keepalive(lease) is False
    await kv.revoke_lease(lease)  # already gone: no error

    # Expiry: etcd's minimum TTL is about 2s; without keepalive the key goes away.
    short = await kv.grant_lease(2)
    await kv.commit(Txn(leased_puts=[("/brokers/2", b"x")], lease=short))
    await kv.commit(Txn(puts=[("/plain", b"stays")]))
    await wait_until_async(lambda: _absent(kv, "/brokers/2"), 8, "the leased key to go with its TTL", interval=0.2)
    assert await kv.keepalive(short) is False
    assert (await kv.get("/plain")).value == b"stays"


async def test_etcd_watch_prefix(kv):
    events = []
    seen = asyncio.Event()
    watching = asyncio.Event()

    async def watch():
        async for ev in kv.watch_prefix("/w/"):
            if ev.key == "/w/ready":  # the marker written until the watch reports it
                watching.set()
                continue
            events.append(ev)
            if len(events) == 3:
                seen.set()
                return

    async def watch_reports_the_marker() -> bool:
        await kv.commit(Txn(puts=[("/w/ready", b"")]))
        await asyncio.sleep(0.05)
        return watching.is_set()

    task = asyncio.create_task(watch())
    await wait_until_async(watch_reports_the_marker, 5, "the watch to be created")
    await kv.commit(Txn(puts=[("/w/a", b"1")]))
    await kv.commit(Txn(puts=[("/elsewhere", b"ignored")]))
    await kv.commit(Txn(puts=[("/w/a", b"2")]))
    await kv.commit(Txn(deletes=["/w/a"]))
    await asyncio.wait_for(seen.wait(), 5)
    await task
    assert [(e.type, e.key, e.value, e.version) for e in events] == [
        ("put", "/w/a", b"1", 1), ("put", "/w/a", b"2", 2), ("delete", "/w/a", b"", 0),
    ]  # fmt: skip


# -- etcd outage ---------------------------------------------------------------------------


async def test_etcd_down_then_restarted():
    with start_etcd() as srv:
        kv = EtcdKV.from_url(srv.url, prefix="/outage", op_timeout=1.0, rpc_timeout=0.5)
        store = MetadataStore(kv)
        try:
            await store.create_topic(TopicMeta("t", 1))
            watched = []

            async def watch():
                async for ev in kv.watch_prefix("/topics/"):
                    watched.append(ev)

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.2)
            srv.stop()
            with pytest.raises(MetadataUnavailable):  # a broken watch ends, it does not hang
                await asyncio.wait_for(watcher, 5)
            for call in (kv.get("/topics/t"), kv.range("/"), kv.commit(Txn(puts=[("/x", b"1")])), kv.check()):
                t0 = time.monotonic()
                with pytest.raises(MetadataUnavailable):
                    await call
                assert time.monotonic() - t0 < 2.5
            with pytest.raises(MetadataUnavailable):
                await kv.grant_lease(5)

            srv.start()  # same ports, same data dir
            t0 = time.monotonic()
            while True:  # the channel reconnects within about a second
                try:
                    await kv.check()
                    break
                except MetadataUnavailable:
                    assert time.monotonic() - t0 < 10
            assert (await store.get_topic("t")).partitions == 1
            with pytest.raises(TopicExistsError):
                await store.create_topic(TopicMeta("t", 1))
            assert await kv.get("/x") is None  # the write during the outage did not happen
            st = await store.get_partition("t", 0)
            assert (await store.commit_segment(st, _seg(0, 0))).high_watermark == 1
        finally:
            await kv.close()


async def test_local_store_creates_through_kept_directory_handles(tmp_path, monkeypatch):
    """Creates write by names relative to a kept descriptor of the object's directory: the
    objects are whole and the second writer of a key is refused as before; a directory
    removed behind its handle is made again; no more handles are kept than the bound."""
    monkeypatch.setattr(local_store._DirHandles, "MAX_OPEN", 2)
    store = LocalObjectStore(tmp_path / "objects")
    try:
        await store.create_many([("t/0/seg-1.kfs", [b"seg", b"ment"]), ("t/0/seg-1.index", [b"idx"])])
        await store.create("t/0/seg-2.kfs", [b"two"])
        assert await store.get("t/0/seg-1.kfs") == b"segment" and await store.get("t/0/seg-1.index") == b"idx"
        assert await store.get("t/0/seg-2.kfs") == b"two"
        assert list(store._dirs._fds) == [str(tmp_path / "objects" / "t" / "0")]
        await store.create("t/0/seg-2.kfs", [b"two"])  # the same bytes again: taken as written
        with pytest.raises(ObjectExistsError):
            await store.create("t/0/seg-2.kfs", [b"other"])
        assert await store.get("t/0/seg-2.kfs") == b"two"

        shutil.rmtree(tmp_path / "objects" / "t")  # behind the kept handle
        await store.create("t/0/seg-3.kfs", [b"three"])
        assert await store.get("t/0/seg-3.kfs") == b"three"
        assert await store.list("t/") == ["t/0/seg-3.kfs"]

        for p in range(1, 6):
            await store.create(f"t/{p}/seg-0.kfs", [str(p).encode()])
        assert [await store.get(f"t/{p}/seg-0.kfs") for p in range(1, 6)] == [b"1", b"2", b"3", b"4", b"5"]
        assert len(store._dirs._fds) == 2 and not store._dirs._users
        assert not [n for n in (tmp_path / "objects").rglob(".tmp-*")]  # no temp file left behind
    finally:
        await store.close()


@pytest.mark.parametrize("piece", [0, 64 * 1024])
async def test_local_store_objects_leave_the_page_cache_once_durable(tmp_path, monkeypatch, piece):
    """A written object's pages are dropped from the page cache after its fsync (created, put,
    and, above WRITE_BACK_BYTES, each piece as it is written back), so the next writes reuse
    them; its bytes read back whole. (A plainly written file beside them stays cached until
    told to drop its pages: skip_unless_pages_can_be_dropped.)"""
    skip_unless_pages_can_be_dropped(tmp_path)
    monkeypatch.setattr(local_store, "WRITE_BACK_BYTES", piece)
    data = random.Random(7).randbytes(1024 * 1024)
    store = LocalObjectStore(tmp_path / "objects")
    try:
        await store.create_many([("t/0/seg-1.kfs", [data[:1000], memoryview(data)[1000:]]), ("t/0/seg-1.index", [data[:9000]])])
        await store.put("t/0/wal-1", [data])
        for key in ("t/0/seg-1.kfs", "t/0/seg-1.index", "t/0/wal-1"):
            assert resident_pages(tmp_path / "objects" / key) == 0, key
        assert await store.get("t/0/seg-1.kfs") == data and await store.get("t/0/wal-1") == data
        assert await store.get("t/0/seg-1.index") == data[:9000]
    finally:
        await store.close()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
async def test_local_store_page_cache_advice_refused_fails_nothing(tmp_path, monkeypatch):
    """posix_fadvise is advice: where the file system refuses it, objects are still created,
    put, written in pieces and read whole (it was called, and its error went nowhere)."""
    calls = []

    def refuse(fd, offset, length, advice):
        calls.append(advice)
        raise OSError(errno.EINVAL, "refused")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    monkeypatch.setattr(local_store, "WRITE_BACK_BYTES", 4096)
    store = LocalObjectStore(tmp_path / "objects")
    try:
        await store.create("t/0/seg-1.kfs", [b"a" * 10_000])
        await store.put("t/0/wal-1", [b"b" * 100])
        assert await store.get("t/0/seg-1.kfs") == b"a" * 10_000 and await store.get("t/0/wal-1") == b"b" * 100
        assert await store.get("t/0/seg-1.kfs", 9_990, 10_000) == b"a" * 10
    finally:
        await store.close()
    assert os.POSIX_FADV_DONTNEED in calls and os.POSIX_FADV_WILLNEED in calls


@pytest.mark.parametrize("piece", [0, 1000, 4096])
async def test_local_store_large_objects_written_in_pieces(tmp_path, monkeypatch, piece):
    """An object above WRITE_BACK_BYTES is written and sent to disk a piece at a time (parts
    split across pieces, parts larger than a piece, empty parts); its bytes are the parts'
    bytes in order, created and put alike. 0: the plain one-write path, for comparison."""
    monkeypatch.setattr(local_store, "WRITE_BACK_BYTES", piece)
    rng = random.Random(piece)
    parts = [rng.randbytes(rng.choice([0, 1, 17, 999, 1000, 1001, 3000, 9000])) for _ in range(40)]
    parts[5] = bytearray(parts[5])
    parts[9] = memoryview(rng.randbytes(5000))
    store = LocalObjectStore(tmp_path)
    await store.create_many([("t/0/big.kfs", parts), ("t/0/big.index", parts[::-1])])
    await store.put("t/0/put.kfs", parts)
    whole = b"".join(bytes(p) for p in parts)
    assert await store.get("t/0/big.kfs") == whole
    assert await store.get("t/0/big.index") == b"".join(bytes(p) for p in parts[::-1])
    assert await store.get("t/0/put.kfs") == whole


async def test_local_store_ranges_and_tail(tmp_path):
    store = LocalObjectStore(tmp_path)
    await store.put("t/0/seg.kfs", [b"hello ", bytearray(b"wide "), memoryview(b"world")])
    assert await store.get("t/0/seg.kfs", 6, 10) == b"wide"
    assert await store.get_tail("t/0/seg.kfs", 5) == (b"world", 16)
    assert await store.get_tail("t/0/seg.kfs", 100) == (b"hello wide world", 16)
    for call in (store.get("nope"), store.get_tail("nope", 16)):
        with pytest.raises(ObjectNotFound):
            await call
