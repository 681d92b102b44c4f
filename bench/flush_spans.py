"""Where an acknowledged produce's milliseconds go on the embedded default: a broker run with
time.perf_counter_ns spans around each step of a flush's life, for bench_flush_latency.py.

    python bench/flush_spans.py OUT.json broker --listen ... (kafscale's own arguments)

runs `kafscale` with the steps below wrapped (the broker's code is not changed; nothing
here runs in a normal broker) and writes OUT.json when the broker exits. Per acknowledged
Produce request: handler start, each append, each partition's answer; per flush: when its
log's flusher picked it up, the encoding, the worker thread's start, the write, the
file's fsync, the link (and index), the directory's fsync, the return to the event loop,
the start of its commit (pipelined flushes: after the commit of the flush before it), the
SQLite commit (and the KV commit alone), the answers; and when the response was handed to
the socket. With write-ahead objects (--write-ahead-objects true, or
KAFSCALE_WRITE_AHEAD_OBJECTS=true) a flush is a cycle of the broker's write-ahead flusher:
"picked" is when its loop started the cycle, the encoding ends with the object's index, and
the commit is the one metadata transaction of all its partitions. SPANS_MAX_CYCLES=N sets
the flusher's cycles at once (an experiment).
"""

from __future__ import annotations

import atexit
import contextvars
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
if importlib.util.find_spec("kafscale") is None:  # PYTHONPATH may name another tree's src (a before/after comparison)
    sys.path.insert(0, str(SRC))

from time import perf_counter_ns as now  # noqa: E402

FLUSH: contextvars.ContextVar[dict | None] = contextvars.ContextVar("flush", default=None)
REQUEST: contextvars.ContextVar[dict | None] = contextvars.ContextVar("request", default=None)
_local = threading.local()
requests: list[dict] = []
flushes: list[dict] = []
_by_future: dict = {}  # waiter future -> its request's record
_by_task: dict = {}  # handler task -> its request's record
_flush_picked: dict = {}  # partition log -> when its flusher called flush_once
_by_upload: dict = {}  # id of an upload between its store stage and its commit task -> its flush record


def install() -> None:
    import asyncio

    from kafscale.broker import server
    from kafscale.broker.handlers import produce as produce_handler
    from kafscale.metadata import sqlite
    from kafscale.storage import local_store, partition_log, segment

    # -- the request: handler start, appends, response built and sent --------------------
    original_produce = produce_handler.produce

    async def produce(ctx, req):
        rec = {"start": now(), "appends": [], "acks": req.acks}
        REQUEST.set(rec)
        _by_task[asyncio.current_task()] = rec
        out = await original_produce(ctx, req)
        rec["built"] = now()
        if req.acks != 0:
            requests.append(rec)
        return out

    produce_handler.produce = produce

    original_on_done = server.KafkaConnection._on_done

    def _on_done(self, task):
        done = [t for t in self._pending if t.done()]
        original_on_done(self, task)
        t = now()
        for d in done:
            rec = _by_task.pop(d, None)
            if rec is not None:
                rec["sent"] = t

    server.KafkaConnection._on_done = _on_done

    original_append = partition_log.PartitionLog.append

    def append(self, data, headers, want_ack):
        t = now()
        base, append_time, waiter = original_append(self, data, headers, want_ack)
        rec = REQUEST.get()
        if rec is not None and waiter is not None:
            a = {"at": t, "log": f"{self.topic}-{self.partition}", "bytes": len(data)}
            rec["appends"].append(a)
            _by_future[waiter] = a
        return base, append_time, waiter

    partition_log.PartitionLog.append = append

    original_deliver = partition_log.PartitionLog._deliver

    def _deliver(answer):
        original_deliver(answer)
        t = now()
        fl = FLUSH.get()
        for w in answer.waiters:
            a = _by_future.pop(w, None)
            if a is not None:
                a["answered"] = t
                a["flush"] = fl["id"] if fl is not None else None

    partition_log.PartitionLog._deliver = staticmethod(_deliver)

    # -- the flush: picked, encoded, written, fsynced, committed, answered ---------------
    original_flush_once = partition_log.PartitionLog.flush_once

    async def flush_once(self):
        _flush_picked.setdefault(self, now())
        try:
            await original_flush_once(self)
        finally:
            _flush_picked.pop(self, None)

    partition_log.PartitionLog.flush_once = flush_once

    def new_flush(self, batches) -> dict:
        fl = {"id": len(flushes), "log": f"{self.topic}-{self.partition}", "picked": _flush_picked.get(self), "upload": now(),
              "batches": len(batches), "bytes": sum(b.nbytes for b in batches)}
        flushes.append(fl)
        return fl

    if hasattr(partition_log.PartitionLog, "_commit"):  # pipelined flushes: an upload stage, then a commit task
        original_store = partition_log.PartitionLog._store
        original_commit = partition_log.PartitionLog._commit

        if hasattr(partition_log.PartitionLog, "_encode"):  # encoded once, before either way of storing it
            original_encode_upload = partition_log.PartitionLog._encode

            def _encode(self, upload):
                FLUSH.set(new_flush(self, upload.batches))  # flush_once's context: the way it is stored sees it
                return original_encode_upload(self, upload)

            partition_log.PartitionLog._encode = _encode

        async def _store(self, upload, *args):
            fl = FLUSH.get() or new_flush(self, upload.batches)
            fl.pop("one_job", None)  # (not taken that way)
            _by_upload[id(upload)] = fl
            FLUSH.set(fl)
            try:
                stored = await original_store(self, upload, *args)
            finally:
                FLUSH.set(None)
            if stored is None:
                fl["end"] = now()
                _by_upload.pop(id(upload), None)
            return stored

        async def _commit(self, upload, *args):
            fl = _by_upload.pop(id(upload), None)
            if fl is not None:
                fl["commit_start"] = now()
            FLUSH.set(fl)  # this task's own context
            try:
                await original_commit(self, upload, *args)
            finally:
                if fl is not None:
                    fl["end"] = now()

        partition_log.PartitionLog._store = _store
        partition_log.PartitionLog._commit = _commit

        if hasattr(partition_log.PartitionLog, "_store_and_commit"):  # a small flush as one job on the commit thread
            original_one_job = partition_log.PartitionLog._store_and_commit

            async def _store_and_commit(self, upload, *args):
                fl = FLUSH.get() or new_flush(self, upload.batches)
                fl["one_job"] = True
                FLUSH.set(fl)
                taken = False
                try:
                    taken = await original_one_job(self, upload, *args)
                finally:
                    if taken:
                        fl["end"] = now()
                        FLUSH.set(None)
                return taken  # (not taken: the two-stage path goes on with the same record)

            partition_log.PartitionLog._store_and_commit = _store_and_commit

            original_blocking = local_store.LocalObjectStore.blocking_create_many

            def blocking_create_many(self, objects):
                call = original_blocking(self, objects)
                fl = FLUSH.get()
                if call is None or fl is None:
                    return call

                def run():  # on the commit thread: the flush's spans go on there
                    token = FLUSH.set(fl)
                    try:
                        call()
                    finally:
                        FLUSH.reset(token)
                        fl["stored"] = fl["commit_start"] = now()  # then the SQLite commit, and the hop back

                return run

            local_store.LocalObjectStore.blocking_create_many = blocking_create_many
    else:
        original_upload = partition_log.PartitionLog._upload

        async def _upload(self, batches, base, *args, **kwargs):
            fl = new_flush(self, batches)
            FLUSH.set(fl)
            try:
                await original_upload(self, batches, base, *args, **kwargs)
            finally:
                fl["end"] = now()
                FLUSH.set(None)

        partition_log.PartitionLog._upload = _upload

    # -- the write-ahead flusher (one object for all partitions, storage/write_ahead_flusher.py)
    try:
        from kafscale.metadata.store import MetadataStore
        from kafscale.storage import write_ahead_flusher
    except ImportError:  # a tree from before write-ahead objects
        write_ahead_flusher = None
    if write_ahead_flusher is not None:
        original_cycle = write_ahead_flusher.WriteAheadFlusher._cycle
        original_write = write_ahead_flusher.WriteAheadFlusher._write
        original_commit_segments = MetadataStore.commit_segments

        def _cycle(self, requests):
            created = now()  # called by the flusher's loop when it starts the cycle's task

            async def run():
                FLUSH.set({"created": created})  # this task's own context: _write fills it in
                await original_cycle(self, requests)

            return run()

        async def _write(self, held):
            taken = getattr(held, "taken", held)  # (a tree before pipelined cycles passed the list)
            pending = FLUSH.get() or {}
            fl = {"id": len(flushes), "log": "write-ahead", "picked": pending.get("created"), "cycle_runs": now(),
                  "batches": sum(len(up.batches) for _lg, up in taken), "bytes": sum(b.nbytes for _lg, up in taken for b in up.batches),
                  "partitions": len(taken), "logs": [f"{lg.topic}-{lg.partition}" for lg, _up in taken],
                  "pipelined": taken is not held}
            fl["upload"] = fl["cycle_runs"]
            flushes.append(fl)
            FLUSH.set(fl)
            try:
                await original_write(self, held)
            finally:
                fl["end"] = now()
                FLUSH.set(None)

        async def commit_segments(self, commits, *args):
            fl = FLUSH.get()
            if fl is not None and not fl.get("one_job"):
                fl["commit_start"] = now()
            out = await original_commit_segments(self, commits, *args)
            if fl is not None:
                fl["committed"] = now()
            return out

        original_wao_encode = write_ahead_flusher.write_ahead.encode

        def wao_encode(*args, **kwargs):
            out = original_wao_encode(*args, **kwargs)
            fl = FLUSH.get()
            if fl is not None:
                fl["encoded"] = now()  # every piece and the object's index
            return out

        write_ahead_flusher.write_ahead.encode = wao_encode
        write_ahead_flusher.WriteAheadFlusher._cycle = _cycle
        if os.environ.get("SPANS_MAX_CYCLES"):  # an experiment: cycles at once
            write_ahead_flusher.MAX_CYCLES = int(os.environ["SPANS_MAX_CYCLES"])
        write_ahead_flusher.WriteAheadFlusher._write = _write
        MetadataStore.commit_segments = commit_segments

    original_encode = segment.encode

    def encode(*args, **kwargs):
        out = original_encode(*args, **kwargs)
        fl = FLUSH.get()
        if fl is not None and "encoded" not in fl:
            fl["encoded"] = now()
        return out

    segment.encode = encode

    original_create_many = local_store.LocalObjectStore.create_many

    async def create_many(self, objects):
        await original_create_many(self, objects)
        fl = FLUSH.get()
        if fl is not None:
            fl["stored"] = now()

    local_store.LocalObjectStore.create_many = create_many

    original_create_sync = local_store.LocalObjectStore._create_sync

    def _create_sync(self, key, parts):
        fl = FLUSH.get()
        if fl is not None:
            fl["thread"] = now()
        path = original_create_sync(self, key, parts)
        if fl is not None:
            fl["linked"] = now()
        return path

    local_store.LocalObjectStore._create_sync = _create_sync

    # A tree that writes by names relative to a kept directory descriptor (874b420 on): the
    # worker thread's start is its _create_many_sync, the link its _create_at.
    original_create_many_sync = getattr(local_store.LocalObjectStore, "_create_many_sync", None)
    original_create_at = getattr(local_store.LocalObjectStore, "_create_at", None)

    def _create_many_sync(self, objects):
        fl = FLUSH.get()
        if fl is not None:
            fl.setdefault("thread", now())
        return original_create_many_sync(self, objects)

    def _create_at(self, *args):
        fl = FLUSH.get()
        if fl is not None:
            fl.setdefault("thread", now())
        original_create_at(self, *args)
        if fl is not None:
            fl["linked"] = now()

    if original_create_at is not None:
        local_store.LocalObjectStore._create_many_sync = _create_many_sync
        local_store.LocalObjectStore._create_at = _create_at

    original_write_all = local_store._write_all

    def _write_all(fd, parts):
        original_write_all(fd, parts)
        fl = FLUSH.get()
        if fl is not None and "written" not in fl:
            fl["written"] = now()

    local_store._write_all = _write_all

    original_fsync = os.fsync

    def fsync(fd):
        original_fsync(fd)
        fl = FLUSH.get()
        if fl is None or getattr(_local, "dir", False):
            return
        if "file_synced" not in fl:
            fl["file_synced"] = now()
        elif "linked" in fl and "dir_synced" not in fl:  # the kept directory descriptor's (no _fsync_dir)
            fl["dir_synced"] = now()

    local_store.os.fsync = fsync  # the os module: every caller in this process, recorded only inside a flush

    original_fsync_dir = getattr(local_store, "_fsync_dir", None)  # None: a tree from before directories were fsynced

    def _fsync_dir(path):
        _local.dir = True
        try:
            original_fsync_dir(path)
        finally:
            _local.dir = False
        fl = FLUSH.get()
        if fl is not None:
            fl["dir_synced"] = now()

    if original_fsync_dir is not None:
        local_store._fsync_dir = _fsync_dir

    original_kv_commit = sqlite.SqliteKV.commit

    async def kv_commit(self, txn):
        t = now()
        ok = await original_kv_commit(self, txn)
        fl = FLUSH.get()
        if fl is not None:
            fl["kv_commit_ns"] = fl.get("kv_commit_ns", 0) + now() - t
        return ok

    sqlite.SqliteKV.commit = kv_commit

    original_kv_commit_after = getattr(sqlite.SqliteKV, "commit_after", None)

    async def kv_commit_after(self, before, txn):
        t = now()
        ok = await original_kv_commit_after(self, before, txn)
        fl = FLUSH.get()
        if fl is not None:
            fl["kv_commit_ns"] = fl.get("kv_commit_ns", 0) + now() - fl.get("stored", t)  # the commit after the objects
        return ok

    if original_kv_commit_after is not None:
        sqlite.SqliteKV.commit_after = kv_commit_after

    original_landed = partition_log.PartitionLog.flush_landed

    def flush_landed(self, *args, **kwargs):
        fl = FLUSH.get()
        if fl is not None:
            fl.setdefault("committed", now())  # (a write-ahead flush: when commit_segments returned)
        original_landed(self, *args, **kwargs)
        if fl is not None:
            fl["answered"] = now()

    partition_log.PartitionLog.flush_landed = flush_landed


gc_pauses: list[tuple[int, int, int]] = []  # (generation, ns, start) of each cyclic-GC collection
_gc_started = [0]


def _gc_callback(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_started[0] = now()
    else:
        gc_pauses.append((info["generation"], now() - _gc_started[0], _gc_started[0]))


def dump(path: str) -> None:
    Path(path).write_text(json.dumps({"requests": requests, "flushes": flushes, "gc": gc_pauses}))


def main() -> int:
    out = sys.argv[1]
    sys.argv = ["kafscale", *sys.argv[2:]]
    install()
    import gc

    gc.callbacks.append(_gc_callback)
    atexit.register(dump, out)
    from kafscale.cli.main import main as kafscale_main

    return kafscale_main()


if __name__ == "__main__":
    raise SystemExit(main())
