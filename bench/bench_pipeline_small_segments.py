"""A micro-batch over thousands of tiny segments: tasks planned by bytes vs one per segment.

A broker that flushes small batches often (low traffic, short --flush-interval-ms) leaves
many small segment objects. Writes `--segments` one-batch segments (default 3,000, spread
over `--partitions` partitions, `--records` records of ~100 bytes each) into a file:// store
and runs one Trigger.AvailableNow micro-batch of the `kafscale` source into Parquet, with the
default planning (segments packed into tasks of up to maxPartitionBytes, 64 MiB) and with
`packSegments=false` (one task per segment, the old default). Prints, per mode: planned
tasks, Parquet files written, rows, seconds and rows/s. Nothing is asserted.

    .venv/bin/python bench/bench_pipeline_small_segments.py [--segments 3000] [--partitions 6] [--cores 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from kafscale.pipeline import segments as seg
from kafscale.protocol import records as R
from kafscale.storage import segment as S


def write(root: str, segments: int, partitions: int, records: int) -> int:
    per_segment = max(1, records // segments)
    next_offset = [0] * partitions
    uploads = []
    for i in range(segments):
        p = i % partitions
        base = next_offset[p]
        recs = [(b"k%07d" % (base + j), b"%010d|" % (base + j) + b"x" * 79) for j in range(per_segment)]
        enc = S.encode([R.build_batch(recs, base_offset=base, timestamp=int(time.time() * 1000))], base)
        uploads.append((S.segment_key("default", "tiny", p, base), enc.parts))
        next_offset[p] += per_segment

    async def put(store):
        for key, parts in uploads:
            await store.put(key, parts)

    seg.run_with_store(f"file://{root}", put)
    return sum(next_offset)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=3000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--records", type=int, default=30_000)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from kafscale.pipeline import jobs
    from kafscale.pipeline.source import KafScaleBatchReader, parse_options

    work = tempfile.mkdtemp(prefix="kafscale-bench-small-")
    try:
        root = os.path.join(work, "objects")
        rows = write(root, args.segments, args.partitions, args.records)
        url = f"file://{root}"
        print(f"{args.segments} segments, {rows} records, {args.partitions} partitions")
        spark = jobs.local_spark("bench-small-segments", cores=args.cores, **{"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        spark.sparkContext.setLogLevel("ERROR")
        print(f"{'mode':<24}{'tasks':>8}{'files':>8}{'rows':>9}{'seconds':>10}{'rows/s':>10}")
        for name, extra in (("packed by bytes", {}), ("packSegments=false", {"packSegments": "false"})):
            options = {"storage": url, "subscribe": "tiny", "startingOffsets": "earliest", "metadata": "none", **extra}
            tasks = len(KafScaleBatchReader(parse_options(options, streaming=False)).partitions())
            out = os.path.join(work, f"out-{len(extra)}")
            reader = spark.readStream.format("kafscale")
            for k, v in options.items():
                reader = reader.option(k, v)
            t0 = time.monotonic()
            q = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", out + "-chk").trigger(availableNow=True).start()
            q.awaitTermination()
            took = time.monotonic() - t0
            got = sum(p["numInputRows"] for p in q.recentProgress)
            files = sum(1 for _, _, fs in os.walk(out) for f in fs if f.endswith(".parquet"))
            print(f"{name:<24}{tasks:>8}{files:>8}{got:>9}{took:>10.1f}{got / took:>10.0f}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
