"""Running the async ObjectStore from synchronous Spark code."""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable, Callable, TypeVar

from kafscale.pipeline.segments.pieces import PieceStore
from kafscale.storage.backends import open_store
from kafscale.storage.objectstore import ObjectStore

T = TypeVar("T")

METADATA_CONCURRENCY = 32  # parallel small GETs while planning


def run_with_store(storage_url: str, fn: Callable[[ObjectStore], Awaitable[T]]) -> T:
    """Open the store (as a PieceStore), run `fn(store)` to completion on a private event
    loop, close the store.

    Spark calls the reader from plain threads (driver planner, executor workers); the store's
    clients (e.g. an S3 session) are bound to the loop they were created on, so store and loop
    live and die together here. If the calling thread already runs a loop (a notebook), the
    work moves to a helper thread instead of nesting loops.
    """

    out: list = []

    async def main() -> None:
        # The value is handed over in `out`, not returned: on the main thread asyncio.run()
        # (Python 3.11) formats repr(main task) -- result included -- when it restores the
        # SIGINT handler, which for a segment GET is the repr of megabytes of bytes (~30 ms
        # per 4 MiB object, as much as decoding it).
        store = PieceStore(open_store(storage_url))  # piece keys read write-ahead objects (pieces.py)
        try:
            out.append(await fn(store))
        finally:
            await store.close()

    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if not in_loop:
        # outside the except block: an error of fn is raised as itself, not chained to
        # get_running_loop's "no running event loop"
        asyncio.run(main())
        return out[0]
    result: list = []

    def in_thread() -> None:
        try:
            asyncio.run(main())
            result.append((True, out[0]))
        except BaseException as e:  # re-raised in the caller's thread
            result.append((False, e))

    t = threading.Thread(target=in_thread, name="kafscale-store")
    t.start()
    t.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


async def gather_limited(coros: list[Awaitable[T]], limit: int = METADATA_CONCURRENCY) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))
