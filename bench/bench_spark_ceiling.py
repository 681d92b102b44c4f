"""Spark's own ceiling for a Python data source on this machine: a source with the kafscale
schema whose reader does no work (it yields ready-made rows), as Arrow batches and as tuples.

bench/bench_pipeline.py compares the kafscale reader's Arrow and tuple paths; this shows how
far apart those two paths can be at most, whatever the reader does: the JVM-side conversion of
Arrow batches to rows and the per-task cost are paid by both.

    .venv/bin/python bench/bench_spark_ceiling.py [--records 1000000] [--cores 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


def _rows_batch(n: int):
    """n rows like bench_pipeline's: 8-byte key, 90-byte value, a header on every 10th row."""
    import pyarrow as pa

    from kafscale.pipeline.segments import arrow_schema

    schema = arrow_schema()
    header_type = schema.field("headers").type
    headers = [[{"key": "h", "value": b"v"}] if i % 10 == 0 else None for i in range(n)]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b"k%07d" % i for i in range(n)], pa.binary()),
            pa.array([b"%010d|" % i + b"x" * 79 for i in range(n)], pa.binary()),
            pa.array(["bench"] * n, pa.string()),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([1_700_000_000_000_000] * n, schema.field("timestamp").type),
            pa.array([0] * n, pa.int32()),
            pa.array(headers, header_type),
        ],
        schema=schema,
    )


def _worker_cache() -> dict:
    """A dict that lives as long as the Python worker process. Classes defined in a script are
    pickled by value, so a module-level dict here would be a new one for every task; a module
    in sys.modules survives between the tasks a reused worker runs."""
    import sys
    import types

    mod = sys.modules.setdefault("_kafscale_ceiling_cache", types.ModuleType("_kafscale_ceiling_cache"))
    if not hasattr(mod, "batches"):
        mod.batches = {}
    return mod.batches


class _Part(InputPartition):
    def __init__(self, rows: int):
        self.rows = rows


class CeilingReader(DataSourceReader):
    def __init__(self, options):
        self.records = int(options.get("records", 1_000_000))
        self.tasks = int(options.get("tasks", 8))
        self.arrow = options.get("arrow", "true") == "true"

    def partitions(self):
        per = self.records // self.tasks
        return [_Part(per) for _ in range(self.tasks)]

    def read(self, partition):
        cache = _worker_cache()
        key = partition.rows
        if key not in cache:  # built once per worker, outside the timed work of later runs
            batch = _rows_batch(partition.rows)
            cols = [c.to_pylist() for c in batch.columns]
            cols[7] = [None if h is None else [(x["key"], x["value"]) for x in h] for h in cols[7]]  # as the kafscale reader yields them
            cache[key] = (batch, list(zip(*cols)))
        batch, rows = cache[key]
        if self.arrow:
            for start in range(0, batch.num_rows, 10_000):
                yield batch.slice(start, 10_000)
        else:
            yield from rows


class CeilingSource(DataSource):
    @classmethod
    def name(cls):
        return "kafscale_ceiling"

    def schema(self):
        from kafscale.pipeline.source import KafScaleDataSource

        return KafScaleDataSource({}).schema()

    def reader(self, schema):
        return CeilingReader(self.options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    from kafscale.pipeline import jobs

    spark = jobs.local_spark("kafscale-ceiling", cores=args.cores)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CeilingSource)
    modes = [(f"{kind}, {tasks} tasks", arrow, tasks) for tasks in (28, 8) for kind, arrow in (("Arrow batches", "true"), ("row tuples", "false"))]

    def once(arrow: str, tasks: int) -> float:
        df = spark.read.format("kafscale_ceiling").option("records", args.records).option("tasks", tasks).option("arrow", arrow).load()
        t = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t

    for _ in range(args.warmup):
        for _label, arrow, tasks in modes:
            once(arrow, tasks)
    times: dict = {m: [] for m in modes}
    for _ in range(args.runs):
        for m in modes:
            times[m].append(once(m[1], m[2]))
    med = {m: statistics.median(t) for m, t in times.items()}
    for m in modes:
        print(f"no-op source, {m[0]:28s} {med[m]:6.2f}s  {args.records / med[m]:12,.0f} rows/s  (median of {args.runs})")
    for tasks in (28, 8):
        a = next(m for m in modes if m[2] == tasks and m[1] == "true")
        t = next(m for m in modes if m[2] == tasks and m[1] == "false")
        print(f"largest Arrow/tuples ratio any reader can show with {tasks} tasks: {med[t] / med[a]:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
