"""ObjectStore: where segments live. One small async interface, several backends.

The broker, the cleaner and the Spark reader only see this interface and its errors. The
backends are `local_store.py` (a directory) and `s3.py`; `backends.open_store(url)` picks
one for a storage URL (`file:///dir`, `s3://bucket/prefix`).
"""

from __future__ import annotations

import abc
import asyncio


class ObjectStoreError(IOError):
    """The store is unreachable or failed; callers answer a retriable Kafka error."""


class ObjectNotFound(ObjectStoreError, KeyError):
    pass


class ObjectExistsError(ObjectStoreError):
    """A conditional create found the key already holding other bytes: another writer
    (an old or a new owner of the partition) got there first, and its object stands."""


class ObjectChangedError(ObjectStoreError):
    """A conditional replace found the key no longer holding the expected version (another
    writer replaced or deleted it since it was read): the replacing writer lost, and the
    object now there stands."""


async def _each_found(calls: list, concurrency: int) -> list:
    """Await each call (a coroutine function), at most `concurrency` at once, in order;
    None for an object not found."""
    sem = asyncio.Semaphore(concurrency)

    async def one(call):
        async with sem:
            try:
                return await call()
            except ObjectNotFound:
                return None

    return list(await asyncio.gather(*(one(c) for c in calls)))


class ObjectStore(abc.ABC):
    @abc.abstractmethod
    async def put(self, key: str, parts: list) -> None:
        """Store the concatenation of `parts` (bytes-like) at `key`, atomically."""

    async def put_many(self, objects: list[tuple[str, list]]) -> None:
        """Store several objects (a segment and its index); each one atomically."""
        await asyncio.gather(*(self.put(key, parts) for key, parts in objects))

    @abc.abstractmethod
    async def create(self, key: str, parts: list) -> None:
        """Store `parts` at `key` only if no object is there yet, atomically.

        Raises ObjectExistsError when the key already holds different bytes, however late
        this writer's request arrives. The key holding these very bytes already counts as
        success: the retry of an upload whose first attempt landed (its answer was lost)."""

    async def create_many(self, objects: list[tuple[str, list]]) -> None:
        """Create objects[0] (a segment) with `create`, then put the others (its index).

        Only the writer that created the segment writes its index, so a loser of the race
        leaves nothing behind; the winner's own index overwrites any stale one."""
        await self.create(*objects[0])
        if len(objects) > 1:
            await self.put_many(objects[1:])

    def blocking_create_many(self, objects: list[tuple[str, list]]):
        """`create_many` as one blocking call for a worker thread, or None when this store
        has no such call (only network stores: the local directory has one). A flush hands
        it to the metadata store's commit thread to run just before its commit (one thread
        hop for the object and the commit, kv.KV.commit_after). Raises what create_many would."""
        return None

    @abc.abstractmethod
    async def get_with_version(self, key: str) -> tuple[bytes, str]:
        """(the whole object, an opaque version token of exactly these bytes) in one read.
        The token is what `replace` compares. Raises ObjectNotFound."""

    @abc.abstractmethod
    async def replace(self, key: str, parts: list, expected: str) -> None:
        """Store `parts` at `key` only if the key still holds the version `expected` (from
        `get_with_version`), atomically: a compare-and-swap of the object.

        Raises ObjectChangedError when the key holds anything else or nothing, however
        late this writer's request arrives. The key holding these very bytes already counts
        as success: the retry of a replace whose first attempt landed (its answer was lost)."""

    @abc.abstractmethod
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object (end None: to the end). Raises ObjectNotFound."""

    async def get_many(self, requests: list[tuple[str, tuple[int, int] | None]], concurrency: int = 32) -> list[bytes | None]:
        """Several reads at once: for each (key, (start, end) or None for the whole object)
        its bytes, or None for an object not found. Backends override it where one call can
        do better than concurrent `get`s (the local store reads them all in one thread hop)."""
        return await _each_found([lambda k=k, r=r: self.get(k, *(r or (0, None))) for k, r in requests], concurrency)

    async def get_tails(self, keys: list[str], nbytes: int, concurrency: int = 32) -> list[tuple[bytes, int] | None]:
        """`get_tail` of several objects at once; None for an object not found."""
        return await _each_found([lambda k=k: self.get_tail(k, nbytes) for k in keys], concurrency)

    @abc.abstractmethod
    async def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        """(the last `nbytes` of the object, or all of a shorter one; its total size).
        One request: how a reader finds a segment's footer without its index."""

    async def copy(self, source: str, target: str) -> None:
        """Store a copy of the object at `source` under `target` (replacing any object
        there), atomically, inside the store where it can: no download. Raises
        ObjectNotFound. This default, for stores that cannot copy, reads and writes it."""
        await self.put(target, [await self.get(source)])

    @abc.abstractmethod
    async def delete(self, keys: list[str]) -> None:
        """Delete objects; missing ones are ignored."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[str]:
        """Keys under `prefix`, sorted."""

    async def list_sizes(self, prefix: str) -> dict[str, int]:
        """{key: size in bytes} under `prefix`. Backends whose listing carries sizes (S3's
        does) answer from the listing alone; this default reads each object's tail."""
        keys = await self.list(prefix)
        return {k: t[1] for k, t in zip(keys, await self.get_tails(keys, 1)) if t is not None}

    async def check(self) -> None:
        """Raise ObjectStoreError when the store is unreachable (readiness probe)."""
        await self.list("__kafscale_health__/")

    async def close(self) -> None:
        pass
