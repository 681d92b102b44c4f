"""What a round of the write-ahead cleanup (storage/write_ahead_cleanup.py) costs against
the number of topics (#32): object-store LISTs and GETs, metadata keys read, per round.

    PYTHONPATH=src .venv/bin/python bench/bench_wal_cleanup.py [--topics 10,100,1000] [--history 5]

In process: a LogManager with write-ahead objects on, over a file store and the embedded
metadata store, both wrapped as the broker wraps them (TimedObjectStore, TimedKV) so that
every call is counted. Per case, N topics of one partition each get `--history` rounds of
one record per partition, each round's pieces rewritten into the partitions' own segments
(a history of N x history segment keys), then 2 rounds whose pieces stay held. Once every
object is past the orphan age (8 s here), the first round reads each object's index; the
next rounds are the steady state: the held objects only. The old rule (before this file's
change) read every segment key of the metadata each round: that figure is printed beside.
Counts, not times: they do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from kafscale.broker.config import BrokerConfig  # noqa: E402
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster  # noqa: E402
from kafscale.metadata import keys  # noqa: E402
from kafscale.metadata.sqlite import SqliteKV  # noqa: E402
from kafscale.metadata.store import MetadataStore, TopicMeta  # noqa: E402
from kafscale.metadata.timed_kv import TimedKV  # noqa: E402
from kafscale.protocol import records  # noqa: E402
from kafscale.storage import write_ahead  # noqa: E402
from kafscale.storage.local_store import LocalObjectStore  # noqa: E402
from kafscale.storage.logs import LogManager  # noqa: E402
from kafscale.storage.timed_store import TimedObjectStore  # noqa: E402

ORPHAN_AGE_MS = 8000  # its quarter bounds a flush cycle (1,000 pieces on a loaded machine)


async def _append_all(logs) -> None:
    async def one(lg):
        data = memoryview(bytearray(records.build_batch([(None, b"x" * 100)], timestamp=int(time.time() * 1000))))
        await lg.append(data, records.validate_record_set(data), True)[2]

    await asyncio.gather(*(one(lg) for lg in logs))


async def case(n_topics: int, history: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        calls: collections.Counter = collections.Counter()
        store = TimedObjectStore(LocalObjectStore(Path(d) / "objects"))
        kv = TimedKV(SqliteKV(Path(d) / "meta.sqlite"))
        for wrapped in (store, kv):
            wrapped.request_hooks.append(lambda op, _s, _f, w=wrapped: calls.update([f"{type(w).__name__}.{op}"]))
        cfg = BrokerConfig(data_dir=d, http="", merge_interval_ms=0, write_ahead_objects=True, segment_max_age_ms=3_600_000,
                           merge_grace_ms=0, write_ahead_orphan_age_ms=ORPHAN_AGE_MS)
        mgr = LogManager(MetadataStore(kv), store, cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))
        cleanup = mgr.merger.write_ahead_cleanup
        mgr.merger.write_ahead_cleanup = None  # rounds run by hand below
        for i in range(n_topics):
            await mgr.metadata.create_topic(TopicMeta(f"t{i:04d}", 1))
        logs = [await mgr.get_log(f"t{i:04d}", 0) for i in range(n_topics)]
        for _ in range(history):
            await _append_all(logs)
            mgr.merger.segment_max_age_ms = 0
            await mgr.merger.run_once(merge_small=False)
            mgr.merger.segment_max_age_ms = 3_600_000
        for _ in range(2):
            await _append_all(logs)
        segment_keys = len(await kv.inner.range(keys.SEGMENTS))
        objects = len(await store.inner.list(write_ahead.wal_prefix("default")))
        while True:  # until every object is of age
            newest = max(write_ahead.created_ms_of_key(k) for k in await store.inner.list(write_ahead.wal_prefix("default")))
            if time.time() * 1000 - newest >= ORPHAN_AGE_MS:
                break
            await asyncio.sleep(0.1)
        rounds = []
        for _ in range(4):
            calls.clear()
            read_before = cleanup.metadata_keys_read
            deleted = await cleanup.run_once()
            rounds.append({
                "list": calls["TimedObjectStore.list"], "get": calls["TimedObjectStore.get"], "delete": calls["TimedObjectStore.delete"],
                "metadata_calls": sum(v for k, v in calls.items() if k.startswith("TimedKV.")),
                "metadata_keys": cleanup.metadata_keys_read - read_before, "deleted": deleted,
            })
        await mgr.stop()
        return {"topics": n_topics, "segment_keys": segment_keys, "objects": objects, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", default="10,100,1000", help="topic counts, comma-separated")
    ap.add_argument("--history", type=int, default=5, help="rounds of rewritten segments per partition before the measured ones")
    args = ap.parse_args()
    print("| topics | segment keys in the metadata (old rule: read each round) | objects | round 1: LIST / GET / DELETE | round 1: metadata calls / keys | rounds 2-4: LIST / GET | rounds 2-4: metadata keys each |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.topics.split(",")):
        r = asyncio.run(case(n, args.history))
        first, later = r["rounds"][0], r["rounds"][1:]
        print(
            f"| {n:,} | {r['segment_keys']:,} | {r['objects']} | {first['list']} / {first['get']} / {first['delete']} "
            f"| {first['metadata_calls']} / {first['metadata_keys']:,} | {'/'.join(str(x['list']) for x in later)} / {'/'.join(str(x['get']) for x in later)} "
            f"| {', '.join(str(x['metadata_keys']) for x in later)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
