"""TimedKV: a KV that times every call of the backend it wraps (SQLite or etcd) and tells
its `request_hooks` (ops' kafscale_metadata_request_duration_seconds by operation). The
broker wraps its metadata backend in one; tools do not.

A call is timed as the caller waits for it, the backend's retries included. A transaction
whose compare fails is an answer (False), not a failure.
"""

from __future__ import annotations

from kafscale.metadata.kv import KV
from kafscale.observed import Timed, timed


class TimedKV(Timed, KV):
    # operations told to the hooks: get, get_many, range, commit or read_all

    def get(self, key):
        return timed(self.request_hooks, "get", self.inner.get(key))

    def get_many(self, keys):
        return timed(self.request_hooks, "get_many", self.inner.get_many(keys))

    def range(self, prefix):
        return timed(self.request_hooks, "range", self.inner.range(prefix))

    def commit(self, txn):
        return timed(self.request_hooks, "commit", self.inner.commit(txn))

    def commit_after(self, before, txn):
        return timed(self.request_hooks, "commit", self.inner.commit_after(before, txn))

    def read_all(self):
        return timed(self.request_hooks, "read_all", self.inner.read_all())

    async def check(self):
        return await self.inner.check()  # the health probe: /readyz reports it

    async def close(self):
        return await self.inner.close()
