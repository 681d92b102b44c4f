"""Point-in-time topic restore (`kafscale topics restore`): time and object-store requests.

Builds a source topic straight in the stores (P partitions x S segments, each segment B lz4
batches of R records stamped one ms apart), then restores it to a time inside the last
segment's middle batch (every partition: S - 1 whole segments copied, one cut), on the file
store with SQLite and on moto S3 with SQLite, and prints the time and the requests by kind.

    .venv/bin/python bench/bench_topic_restore.py [--partitions 10] [--segments 50] [--stores file,s3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kafscale.metadata.backends import open_kv  # noqa: E402
from kafscale.metadata.store import MetadataStore, TopicMeta  # noqa: E402
from kafscale.protocol import records  # noqa: E402
from kafscale.storage import segment  # noqa: E402
from kafscale.storage.backends import open_store  # noqa: E402
from kafscale.storage.topic_restore import TopicRestore  # noqa: E402

NS = "bench"
T0 = 1_700_000_000_000


class Counted:
    """The store, with each call counted by method name (put_many: one per object)."""

    def __init__(self, store):
        self.store = store
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def counted(*args, **kwargs):
            if name in ("put_many", "get_many", "get_tails"):
                self.calls[name] += len(args[0])
            else:
                self.calls[name] += 1
            return await attr(*args, **kwargs)

        return counted


async def build(md: MetadataStore, store, topic: str, partitions: int, segments: int, batches: int, per_batch: int) -> int:
    """The source topic; returns the cut time (inside the last segment's middle batch)."""
    await md.create_topic(TopicMeta(topic, partitions, configs={"retention.ms": "-1"}))
    value = b"restore bench record, compressible. " * 3
    for p in range(partitions):
        st = await md.get_partition(topic, p)
        offset = 0
        for _s in range(segments):
            bufs = []
            for _b in range(batches):
                ts = [T0 + offset + i for i in range(per_batch)]
                bufs.append(records.build_batch([(b"k%d" % (offset + i), value) for i in range(per_batch)], base_offset=offset,
                                                timestamp=ts[0], timestamps=ts, codec=records.COMPRESSION_LZ4))
                offset += per_batch
            enc = segment.encode(bufs, st.high_watermark)
            await store.put(segment.segment_key(NS, topic, p, enc.info.base_offset), enc.parts)
            st = await md.commit_segment(st, enc.info)
    per_segment = batches * per_batch
    return T0 + (segments - 1) * per_segment + (batches // 2) * per_batch + per_batch // 2


async def one(kind: str, url: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-restore-") as tmp:
        md = MetadataStore(open_kv("embedded", tmp))
        raw = open_store(url if kind != "file" else f"file://{tmp}/objects")
        if kind == "s3":
            await raw.create_bucket()
        t = time.perf_counter()
        cut = await build(md, raw, "src", args.partitions, args.segments, args.batches, args.records)
        built = time.perf_counter() - t
        store = Counted(raw)
        t = time.perf_counter()
        done = await TopicRestore(md, store, NS).run("src", "dst", to_time_ms=cut)
        took = time.perf_counter() - t
        await md.close()
        await raw.close()
    copied = sum(p.segments_copied for p in done.partitions)
    return {"store": kind, "build_s": built, "restore_s": took, "copied": copied, "rewritten": sum(p.segments_rewritten for p in done.partitions),
            "bytes": sum(p.bytes_copied for p in done.partitions), "calls": dict(store.calls)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--segments", type=int, default=50)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--records", type=int, default=100, help="records per batch")
    ap.add_argument("--stores", default="file,s3")
    args = ap.parse_args()
    rows = []
    for kind in args.stores.split(","):
        if kind == "s3":
            from tests.support.servers import start_moto
            import os

            with start_moto() as moto:
                os.environ.update(moto.env)
                rows.append(asyncio.run(one(kind, f"s3://bench-{uuid.uuid4().hex[:8]}/data", args)))
        else:
            rows.append(asyncio.run(one(kind, "", args)))
    print(f"{args.partitions} partitions x {args.segments} segments x {args.batches} lz4 batches x {args.records} records; cut inside each last segment")
    print(f"{'store':6} {'build s':>8} {'restore s':>9} {'copied':>7} {'rewritten':>9} {'MB copied':>9}  requests")
    for r in rows:
        print(f"{r['store']:6} {r['build_s']:8.2f} {r['restore_s']:9.2f} {r['copied']:7d} {r['rewritten']:9d} {r['bytes'] / 1e6:9.1f}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(r["calls"].items())))


if __name__ == "__main__":
    main()
