"""Metadata snapshot and restore (issue #25): what they cost. Figures, not assertions.

    .venv/bin/python bench/bench_restore.py                      # 100 topics x 10 partitions x 50 segments
    .venv/bin/python bench/bench_restore.py --topics 10 --no-bucket-alone

The fixture is written directly with the storage code, not through a broker: on a private
moto_server, `--topics` x `--partitions` partitions of `--segments` segments each (one batch
of `--records` records of 100 bytes a segment) with their topic markers, and the same
metadata (topics, partition states, segment lists) in an embedded SQLite store. Then
`--late` segments per partition are put after the metadata's high watermark on one
partition in ten (committed after the snapshot, to be adopted).

Printed:
- snapshot: the time of `SnapshotStore.take` (one consistent read of the store, encoding,
  zstd, one PUT), its size, keys, and the time to load it back (GET, checks, decode);
- restore from the snapshot into an empty store: wall time, object-store requests by
  kind (counted on the store the restore is given), and what it reconciled;
- restore from the bucket alone (`--no-bucket-alone` skips it): the same figures; every
  segment object is read whole and checked.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench.brokers import create_bucket  # noqa: E402
from kafscale.backup.restore import restore  # noqa: E402
from kafscale.backup.snapshot import SnapshotStore  # noqa: E402
from kafscale.metadata import codec, keys  # noqa: E402
from kafscale.metadata.kv import Txn  # noqa: E402
from kafscale.metadata.sqlite import SqliteKV  # noqa: E402
from kafscale.metadata.store import MetadataStore, PartitionState, TopicMeta  # noqa: E402
from kafscale.protocol import records  # noqa: E402
from kafscale.storage import segment, topic_marker  # noqa: E402
from kafscale.storage.s3 import S3ObjectStore  # noqa: E402
from kafscale.storage.objectstore import ObjectStore  # noqa: E402
from tests.support.servers import start_moto  # noqa: E402

NS = "default"


class CountingStore(ObjectStore):
    """The store the restore uses, counting its S3 requests by kind (a LIST page holds up
    to 1000 keys; a delete of up to 1000 keys is one request)."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.requests: Counter = Counter()

    async def put(self, key, parts):
        self.requests["PUT"] += 1
        await self.inner.put(key, parts)

    async def create(self, key, parts):
        self.requests["PUT"] += 1
        await self.inner.create(key, parts)

    async def get_with_version(self, key):
        self.requests["GET"] += 1
        return await self.inner.get_with_version(key)

    async def replace(self, key, parts, expected):
        self.requests["PUT"] += 1
        await self.inner.replace(key, parts, expected)

    async def get(self, key, start=0, end=None):
        self.requests["GET"] += 1
        return await self.inner.get(key, start, end)

    async def get_tail(self, key, nbytes):
        self.requests["GET"] += 1
        return await self.inner.get_tail(key, nbytes)

    async def delete(self, keys):
        self.requests["DELETE"] += max(1, -(-len(keys) // 1000))
        await self.inner.delete(keys)

    async def list(self, prefix):
        found = await self.inner.list(prefix)
        self.requests["LIST"] += 1 + len(found) // 1000
        return found

    async def list_sizes(self, prefix):
        found = await self.inner.list_sizes(prefix)
        self.requests["LIST"] += 1 + len(found) // 1000
        return found


def _segment(base: int, n: int) -> segment.EncodedSegment:
    batch = records.build_batch([(b"k%d" % i, b"x" * 100) for i in range(n)], base_offset=base, timestamp=int(time.time() * 1000))
    return segment.encode([batch], base)


async def build_fixture(store, kv, args) -> int:
    sem = asyncio.Semaphore(16)
    puts: list[tuple[str, bytes]] = []
    objects = 0

    async def put(key, parts):
        async with sem:
            await store.put(key, parts)

    jobs = []
    for t in range(args.topics):
        name = f"topic-{t:03d}"
        meta = TopicMeta(name, args.partitions, configs={"retention.ms": "604800000"})
        puts.append((keys.topic(name), codec.encode(asdict(meta))))
        jobs.append(put(topic_marker.marker_key(NS, name), [topic_marker.TopicMarker.of(meta).encode()]))
        for p in range(args.partitions):
            base = 0
            for _ in range(args.segments):
                enc = _segment(base, args.records)
                jobs.append(put(segment.segment_key(NS, name, p, base), enc.parts))
                puts.append((keys.segment(name, p, base), codec.encode_segment(enc.info)))
                base = enc.info.last_offset + 1
                objects += 1
            puts.append((keys.partition(name, p), codec.encode(MetadataStore.state_doc(PartitionState(name, p, 0, base)))))
            if p == 0 and t % 10 == 0:  # one partition in ten got more after the snapshot
                for _ in range(args.late):
                    enc = _segment(base, args.records)
                    jobs.append(put(segment.segment_key(NS, name, p, base), enc.parts))
                    base = enc.info.last_offset + 1
                    objects += 1
    for i in range(0, len(jobs), 2000):  # a bounded number of waiting coroutines at a time
        await asyncio.gather(*jobs[i : i + 2000])
    for i in range(0, len(puts), 500):
        await kv.commit(Txn(puts=puts[i : i + 500]))
    return objects


async def run(args) -> None:
    moto = start_moto()
    try:
        os.environ.update(moto.env)
        bucket = "bench-restore"
        create_bucket(moto.endpoint, bucket)
        # moto answers a LIST page of a 50,000-object bucket in seconds (S3: well under one):
        # patient timeouts, so the figures are moto's speed, not a timeout.
        store = S3ObjectStore.from_url(f"s3://{bucket}/data", read_timeout=120.0, retry_budget=300.0)
        await store.put("warm-up", [b"x"])  # the client's connection pool, before the flood
        await store.delete(["warm-up"])
        tmp = Path(tempfile.mkdtemp(prefix="bench-restore-"))
        kv = SqliteKV(tmp / "before.sqlite")
        t0 = time.monotonic()
        n = await build_fixture(store, kv, args)
        print(f"fixture: {args.topics} topics x {args.partitions} partitions x {args.segments} segments "
              f"(+{args.late} after the snapshot on {len(range(0, args.topics, 10))} partitions): {n} segment objects in {time.monotonic() - t0:.1f}s")  # fmt: skip
        snaps = SnapshotStore(store, NS)
        t0 = time.monotonic()
        info = await snaps.take(kv, 0)
        took = time.monotonic() - t0
        t0 = time.monotonic()
        await snaps.load(info.id)
        loaded = time.monotonic() - t0
        print(f"snapshot: {info.key_count} keys, {info.size / 1e6:.2f} MB (zstd), taken in {took:.2f}s, loaded back in {loaded:.2f}s")
        await kv.close()

        cases = [("from the snapshot", True)] + ([] if args.no_bucket_alone else [("from the bucket alone", False)])
        for i, (label, use) in enumerate(cases):
            target = SqliteKV(tmp / f"after-{i}.sqlite")
            counting = CountingStore(store)
            t0 = time.monotonic()
            report = await restore(target, counting, SnapshotStore(counting, NS), NS, use_snapshots=use, fence_epochs=True)
            seconds = time.monotonic() - t0
            reqs = counting.requests
            await target.close()
            print(f"restore {label}: {seconds:.1f}s, {sum(reqs.values())} object-store requests ({', '.join(f'{k} {v}' for k, v in sorted(reqs.items()))})")
            print(f"  {report.partitions} partitions, segments: {report.segments_kept} as listed, {report.segments_adopted} adopted, "
                  f"{report.segments_replaced} replaced, {report.segments_dropped} dropped; {report.keys_written} keys written")  # fmt: skip
        await store.close()
    finally:
        moto.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--segments", type=int, default=50)
    ap.add_argument("--records", type=int, default=10, help="records (100 B values) per segment")
    ap.add_argument("--late", type=int, default=5, help="segments after the snapshot on one partition in ten")
    ap.add_argument("--no-bucket-alone", action="store_true", help="skip the restore from the bucket alone")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
