"""Timed wrappers of the stores for their observers: TimedObjectStore (storage/timed_store.py)
and TimedKV (metadata/timed_kv.py) are a `Timed` over the backend and report each call to
their hooks through `timed`."""

from __future__ import annotations

import asyncio
import time


async def timed(hooks: list, op: str, call, answers: tuple[type[BaseException], ...] = ()):
    """Await `call` and tell each hook(op, seconds, failed). An exception in `answers` is an
    outcome of the call (a missing object), not a failure; a cancelled call is not told."""
    started = time.perf_counter()
    failed = False
    try:
        return await call
    except asyncio.CancelledError:
        hooks = ()
        raise
    except answers:
        raise
    except BaseException:
        failed = True
        raise
    finally:
        seconds = time.perf_counter() - started
        for hook in hooks:
            hook(op, seconds, failed)


class Timed:
    """The wrapper's part: the wrapped backend, the hooks, and what only a backend has (a
    local store's root, an S3 store's bucket, etcd's leases and watches) passed through."""

    def __init__(self, inner):
        self.inner = inner
        self.request_hooks: list = []  # hook(operation, seconds, failed)

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return repr(self.inner)
