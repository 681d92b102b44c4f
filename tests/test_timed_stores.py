"""The broker's timing wrappers of its object store and metadata store (storage/timed_store.py,
metadata/timed_kv.py): each call told to the hooks with its operation, time and whether it
failed; answers (a missing object, a lost compare) are no failures; a cancelled call is not
told; what only a backend has passes through."""

from __future__ import annotations

import asyncio

import pytest

from kafscale.metadata.kv import Txn
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.timed_kv import TimedKV
from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.objectstore import ObjectNotFound, ObjectStoreError
from kafscale.storage.timed_store import TimedObjectStore

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _told(wrapper) -> list:
    calls: list = []
    wrapper.request_hooks.append(lambda op, seconds, failed: calls.append((op, failed, seconds >= 0)))
    return calls


async def test_object_store_calls_are_told_by_operation(tmp_path):
    store = TimedObjectStore(LocalObjectStore(tmp_path / "objects"))
    calls = _told(store)
    await store.put_many([("ns/t/0/a.kfs", [b"segment"]), ("ns/t/0/a.index", [b"index"])])
    await store.create("ns/t/0/b.kfs", [b"other"])
    assert await store.get("ns/t/0/a.kfs", 0, 3) == b"seg"
    assert await store.get_many([("ns/t/0/a.kfs", None), ("ns/t/0/gone.kfs", None)]) == [b"segment", None]
    with pytest.raises(ObjectNotFound):
        await store.get("ns/t/0/gone.kfs")
    assert await store.list("ns/t/0/") == ["ns/t/0/a.index", "ns/t/0/a.kfs", "ns/t/0/b.kfs"]
    await store.delete(["ns/t/0/b.kfs"])
    await store.check()  # the health probe is not a request of the store's users
    assert calls == [("put", False, True), ("put", False, True), ("get", False, True), ("get", False, True), ("get", False, True),
                     ("list", False, True), ("delete", False, True)]
    assert store.root == tmp_path / "objects"  # the backend's own attribute


async def test_a_failed_call_is_told_failed_and_a_cancelled_one_not_at_all(tmp_path):
    inner = LocalObjectStore(tmp_path)
    store = TimedObjectStore(inner)
    calls = _told(store)
    (tmp_path / "ns").write_bytes(b"a file where a directory has to be")
    with pytest.raises(ObjectStoreError):
        await store.put("ns/t/0/a.kfs", [b"x"])
    assert calls == [("put", True, True)]

    started, never = asyncio.Event(), asyncio.Event()

    async def hanging_get(key, start=0, end=None):
        started.set()
        await never.wait()

    inner.get = hanging_get
    task = asyncio.ensure_future(store.get("ns/x"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == [("put", True, True)]


async def test_metadata_calls_are_told_and_a_lost_compare_is_no_failure(tmp_path):
    kv = TimedKV(SqliteKV(tmp_path / "meta.sqlite"))
    calls = _told(kv)
    try:
        assert await kv.commit(Txn(puts=[("/k", b"1")]))
        assert not await kv.commit(Txn(compares=[("/k", 0)], puts=[("/k", b"2")]))  # /k is at version 1
        assert (await kv.get("/k")).value == b"1"
        assert [x.key for x in await kv.range("/")] == ["/k"]
        await kv.read_all()
    finally:
        await kv.close()
    assert calls == [("commit", False, True), ("commit", False, True), ("get", False, True), ("range", False, True), ("read_all", False, True)]
