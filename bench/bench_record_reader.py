"""Record-body parsing, per record, through the public entry points of each reader of it.

Every reader of a v2 batch's records (the protocol tools, the log compactor, the Spark
source's decoder) goes through one record-body reader (protocol/record_reader.py); this
times each entry point on the same batches, so that a change of the reader shows where it
costs. Figures, not assertions.

    .venv/bin/python bench/bench_record_reader.py [--batches 200] [--batch-records 500] [--repeat 5]

Batches as bench_pipeline.py writes them: records of ~100 bytes (key 8, value ~90, one
header on every 10th), timestamps a few ms apart. Printed per entry point: ns per record
of CPU time (the best of --repeat runs):

* `decode_records`: protocol/records.py, a Record object per record (tools, ListOffsets);
* `check_keys`: the produce-side walk of a compacted topic's records (key lengths only);
* `KeyMap.add`: the compactor filling its key map (parse + key digest per record);
* `BatchCleaner.clean`: the compactor cleaning a batch whose records all survive (parse +
  key-map lookups, the batch kept as it is);
* `read_slice`: the Spark source's decoder over a file:// segment (vectorized path, Arrow
  columns out), from the object read to the columns, one process, no Spark.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from kafscale.protocol import records as R  # noqa: E402
from kafscale.storage import cleaner  # noqa: E402
from kafscale.storage import segment as S  # noqa: E402


def make_batches(n_batches: int, per_batch: int) -> list[bytes]:
    out = []
    offset = 0
    for b in range(n_batches):
        recs = []
        for i in range(per_batch):
            n = offset + i
            hdrs = [("trace", b"%08d" % n)] if n % 10 == 0 else []
            recs.append((b"k%07d" % n, b"%010d|" % n + b"x" * 79, hdrs))
        ts = 1_700_000_000_000 + b * 1000
        out.append(R.build_batch(recs, base_offset=offset, timestamp=ts, timestamps=[ts + 3 * i for i in range(per_batch)]))
        offset += per_batch
    return out


def best(fn, repeat: int) -> float:
    """Least CPU time of `repeat` runs: on a machine shared with other work, wall time
    mostly measures the wait for a core."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch-records", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    batches = make_batches(args.batches, args.batch_records)
    body = b"".join(batches)
    n = args.batches * args.batch_records
    headers = [h for _, h in R.iter_batches(body)]

    def decode_records():
        for pos, h in R.iter_batches(body):
            R.decode_records(body, pos, h, verify_crc=False)

    def check_keys():
        R.check_keys(body, headers, "t-0")

    def key_map_add():
        cleaner.KeyMap(1 << 30).add(body)

    km = cleaner.KeyMap(1 << 30)
    km.add(body)

    def clean():
        cleaner.BatchCleaner(km, now_ms=0, delete_retention_ms=0).clean(body)

    results = [
        ("decode_records", best(decode_records, args.repeat)),
        ("check_keys", best(check_keys, args.repeat)),
        ("KeyMap.add", best(key_map_add, args.repeat)),
        ("BatchCleaner.clean", best(clean, args.repeat)),
    ]

    from kafscale.pipeline import segments as seg

    root = tempfile.mkdtemp(prefix="bench-record-reader-")
    try:
        url = f"file://{root}"
        enc = S.encode(batches, 0)

        async def put(store):
            await store.put(S.segment_key("default", "t", 0, 0), enc.parts)

        seg.run_with_store(url, put)
        opts = seg.ReadOptions(url)
        sl = seg.SegmentSlice("t", 0, S.segment_key("default", "t", 0, 0), 0, n, None, enc.info.size)

        def read_slice():
            assert sum(len(c) for c in seg.read_slice(opts, sl)) == n

        results.append(("read_slice (vectorized)", best(read_slice, args.repeat)))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"{n:,} records in {args.batches} batches of {args.batch_records}, ~{len(body) // n} B each, best of {args.repeat} (pid {os.getpid()})")
    for name, secs in results:
        print(f"  {name:<26} {secs / n * 1e9:8.1f} ns/record  ({secs * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
