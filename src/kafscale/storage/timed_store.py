"""TimedObjectStore: an ObjectStore that times every call of the store it wraps and tells
its `request_hooks` (ops' latency histogram by operation: kafscale_object_store_request_
duration_seconds). The broker wraps its store in one; tools and Spark tasks do not.

A call is timed as the caller waits for it, retries (s3.py's) included. A call naming
several objects (a segment and its index, a batch of range reads) is one observation of
its operation. A missing object or a lost conditional write is an answer, not a failure.
"""

from __future__ import annotations

import asyncio
import time

from kafscale.observed import Timed, timed
from kafscale.storage.objectstore import ObjectChangedError, ObjectExistsError, ObjectNotFound, ObjectStore

ANSWERS = (ObjectNotFound, ObjectExistsError, ObjectChangedError)  # outcomes, not failures of the store


class TimedObjectStore(Timed, ObjectStore):
    # operations told to the hooks: put, get, list, delete or copy

    def put(self, key, parts):
        return timed(self.request_hooks, "put", self.inner.put(key, parts), ANSWERS)

    def put_many(self, objects):
        return timed(self.request_hooks, "put", self.inner.put_many(objects), ANSWERS)

    def create(self, key, parts):
        return timed(self.request_hooks, "put", self.inner.create(key, parts), ANSWERS)

    def create_many(self, objects):
        return timed(self.request_hooks, "put", self.inner.create_many(objects), ANSWERS)

    def blocking_create_many(self, objects):
        call = self.inner.blocking_create_many(objects)
        if call is None:
            return None
        loop = asyncio.get_running_loop()

        def tell(seconds: float, failed: bool) -> None:
            for hook in self.request_hooks:
                hook("put", seconds, failed)

        def timed_call() -> None:
            # Timed on the thread that runs it, told on the event loop (the hooks' metrics
            # are observed from the loop only), as `timed` tells a put.
            started = time.perf_counter()
            failed = False
            try:
                call()
            except ANSWERS:
                raise
            except BaseException:
                failed = True
                raise
            finally:
                loop.call_soon_threadsafe(tell, time.perf_counter() - started, failed)

        return timed_call

    def replace(self, key, parts, expected):
        return timed(self.request_hooks, "put", self.inner.replace(key, parts, expected), ANSWERS)

    def get_with_version(self, key):
        return timed(self.request_hooks, "get", self.inner.get_with_version(key), ANSWERS)

    def get(self, key, start=0, end=None):
        return timed(self.request_hooks, "get", self.inner.get(key, start, end), ANSWERS)

    def get_many(self, requests, concurrency=32):
        return timed(self.request_hooks, "get", self.inner.get_many(requests, concurrency), ANSWERS)

    def get_tail(self, key, nbytes):
        return timed(self.request_hooks, "get", self.inner.get_tail(key, nbytes), ANSWERS)

    def get_tails(self, keys, nbytes, concurrency=32):
        return timed(self.request_hooks, "get", self.inner.get_tails(keys, nbytes, concurrency), ANSWERS)

    def copy(self, source, target):
        return timed(self.request_hooks, "copy", self.inner.copy(source, target), ANSWERS)

    def delete(self, keys):
        return timed(self.request_hooks, "delete", self.inner.delete(keys), ANSWERS)

    def list(self, prefix):
        return timed(self.request_hooks, "list", self.inner.list(prefix), ANSWERS)

    def list_sizes(self, prefix):
        return timed(self.request_hooks, "list", self.inner.list_sizes(prefix), ANSWERS)

    async def check(self):
        return await self.inner.check()  # the health probe: /readyz reports it

    async def close(self):
        return await self.inner.close()
