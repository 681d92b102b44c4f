"""A live stream to Parquet: does the pipeline keep up, and how long from ack to Parquet row?

For each store (file, and S3 on moto with etcd metadata) a fresh broker gets a topic of
`--partitions` partitions (default 6); a producer process sends `--records` records (default
2,000,000, ~100 bytes) at `--rate` records/s (default 15,000) with acks=all and notes when
each one is acknowledged, while the Parquet pipeline (`kafscale pipeline parquet` as a
library call, processing-time trigger `--trigger`) streams the topic from the object store.
Printed per store, nothing asserted:

- keeping up: records acknowledged but not yet in a committed micro-batch (lag), at the
  commit of each micro-batch: max over the run and max over its last third;
- micro-batches: how many, rows each, Parquet files each vs the tasks Spark ran for them;
- end to end: p50 / p95 / max from a record's acknowledgement (the producer's delivery
  report) to the commit of the micro-batch that wrote it (Spark's progress: trigger start +
  trigger execution time).

    .venv/bin/python bench/bench_pipeline_stream.py [--records 2000000] [--rate 15000] [--stores file,s3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ACK = struct.Struct("<iqq")  # partition, offset, ack time (ns since the epoch)
WARMUP_RECORDS = 1000


def produce_child(bootstrap: str, topic: str, records: int, rate: int, out: str) -> None:
    """Runs in its own process: send `records` at `rate`/s, write each ack as ACK to `out`."""
    from confluent_kafka import Producer

    acks = bytearray()
    failed = [0]

    def delivered(err, msg) -> None:
        if err is not None:
            failed[0] += 1
        else:
            acks.extend(ACK.pack(msg.partition(), msg.offset(), time.time_ns()))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "queue.buffering.max.messages": 1_000_000})
    pad = b"x" * 79
    start = time.monotonic()
    sent = 0
    while sent < records:
        due = min(records, int((time.monotonic() - start) * rate) + 1)
        while sent < due:
            try:
                p.produce(topic, b"%010d|" % sent + pad, key=b"k%07d" % (sent % 100_000), on_delivery=delivered)
                sent += 1
            except BufferError:
                p.poll(0.01)
        p.poll(0)
        time.sleep(0.001)
    p.flush(120)
    Path(out).write_bytes(bytes(acks))
    print(json.dumps({"sent": sent, "acked": len(acks) // ACK.size, "failed": failed[0], "seconds": time.monotonic() - start}), flush=True)


def _commit_ns(progress: dict) -> int:
    started = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return int(started.timestamp() * 1e9) + int(progress["durationMs"].get("triggerExecution", 0)) * 1_000_000


def _files_in_batch(output: str, batch_id: int) -> int:
    entry = Path(output) / "_spark_metadata" / str(batch_id)
    if not entry.exists():
        return 0
    return sum(1 for line in entry.read_text().splitlines()[1:] if line.strip())


def _median_durations(batches: list[dict]) -> dict:
    """Spark's durationMs breakdown (latestOffset, queryPlanning, addBatch, commits...), the
    median of each phase over the micro-batches that read rows."""
    keys = sorted({k for b in batches for k in b["duration_ms"]})
    out = {}
    for k in keys:
        vals = sorted(b["duration_ms"].get(k, 0) for b in batches)
        out[k] = vals[len(vals) // 2]
    return out


def run_store(name: str, args) -> dict:
    """One store, in a process of its own: Spark's Python workers take the S3 settings from
    the environment the JVM started with, so the broker (and its moto) must come first."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from bench.brokers import KafscaleBroker, Shared
    from kafscale.pipeline import jobs

    shared = Shared()
    broker = KafscaleBroker(shared, f"stream{int(time.time())}", s3=(name == "s3"))
    spark = None
    work = Path(tempfile.mkdtemp(prefix="kafscale-bench-stream-"))
    env_backup = dict(os.environ)
    try:
        broker.start()
        if name == "s3":
            storage = f"s3://bench/{broker.case_id}"
            os.environ.update(broker.moto.env)  # the Spark source's S3 endpoint and keys
            options = {"metadata": "none"}  # the broker keeps its etcd keys under a bench prefix: log starts from the objects
        else:
            storage = f"file://{broker.workdir / 'objects'}"
            options = {}
        spark = jobs.local_spark("bench-stream", cores=args.cores, **dict(c.split("=", 1) for c in args.conf))
        if args.log_level:
            spark.sparkContext.setLogLevel(args.log_level)
        topic = "stream"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
            f.result(30)
        output = str(work / "out")
        acks_file = str(work / "acks.bin")
        # Warm-up records, streamed before the measured ones: the first micro-batch of a
        # query pays for Spark's Python workers starting (seconds), not for the pipeline.
        from confluent_kafka import Producer

        warm = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(WARMUP_RECORDS):
            warm.produce(topic, b"warm-up %d" % i, key=b"w%d" % i)
        assert warm.flush(30) == 0
        del warm, admin
        df = jobs._stream(spark, storage, topic, None, "default", "earliest", None, options)
        query = (
            df.writeStream.format("parquet").queryName(f"bench_{name}").option("path", output)
            .option("checkpointLocation", str(work / "checkpoint")).partitionBy("topic", "date")
            .outputMode("append").trigger(processingTime=args.trigger).start()
        )
        tracker = spark.sparkContext.statusTracker()
        group = str(query.runId)
        batches, seen_jobs, seen = [], set(), set()
        warm_deadline = time.monotonic() + 120
        while sum(int(p.get("numInputRows") or 0) for p in query.recentProgress) < WARMUP_RECORDS and time.monotonic() < warm_deadline:
            query.awaitTermination(0.5)
        seen = {p["batchId"] for p in query.recentProgress}
        seen_jobs = set(tracker.getJobIdsForGroup(group) or [])
        producer = subprocess.Popen(
            [sys.executable, __file__, "--produce-child", broker.bootstrap, topic, str(args.records), str(args.rate), acks_file],
            stdout=subprocess.PIPE, text=True, cwd=REPO,
        )
        rows = 0
        deadline = time.monotonic() + args.records / args.rate + args.grace
        while time.monotonic() < deadline and rows < args.records and query.isActive:
            query.awaitTermination(0.5)
            for p in query.recentProgress:
                if p["batchId"] in seen:
                    continue
                seen.add(p["batchId"])
                n = int(p.get("numInputRows") or 0)
                if n == 0:
                    continue
                jobs_now = set(tracker.getJobIdsForGroup(group) or [])
                new_jobs, seen_jobs = jobs_now - seen_jobs, seen_jobs | jobs_now
                tasks = 0
                for j in new_jobs:
                    info = tracker.getJobInfo(j)
                    for s in (info.stageIds if info else []):
                        st = tracker.getStageInfo(s)
                        tasks += st.numTasks if st else 0
                src = p["sources"][0]
                batches.append({
                    "id": p["batchId"], "rows": n, "commit_ns": _commit_ns(p), "files": _files_in_batch(output, p["batchId"]),
                    "tasks": tasks, "start": jobs._offsets(src.get("startOffset")), "end": jobs._offsets(src.get("endOffset")),
                    "duration_ms": {k: int(v) for k, v in (p.get("durationMs") or {}).items()},
                })
                rows += n
        query.stop()
        out, _ = producer.communicate(timeout=300)
        summary = json.loads(out.strip().splitlines()[-1])
        raw = Path(acks_file).read_bytes()
        ack_ns = {}
        all_acks = []
        for part, off, ns in ACK.iter_unpack(raw):
            ack_ns[(part, off)] = ns
            all_acks.append(ns)
        all_acks.sort()
        latencies, lags = [], []
        committed = 0
        import bisect

        for b in batches:
            for t, parts in b["end"].items():
                for p, end in parts.items():
                    start = b["start"].get(t, {}).get(p, 0) if b["start"] else 0
                    for off in range(int(start), int(end)):
                        ns = ack_ns.get((int(p), off))
                        if ns is not None:
                            latencies.append((b["commit_ns"] - ns) / 1e6)
            committed += b["rows"]
            lags.append(bisect.bisect_right(all_acks, b["commit_ns"]) - committed)
        latencies.sort()

        def pct(q: float) -> float:
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

        third = lags[len(lags) * 2 // 3 :] or [0]
        return {
            "store": name, "produced": summary, "rows": rows, "batches": len(batches),
            "rows_per_batch_p50": sorted(b["rows"] for b in batches)[len(batches) // 2] if batches else 0,
            "files_per_batch_max": max((b["files"] for b in batches), default=0),
            "tasks_per_batch_max": max((b["tasks"] for b in batches), default=0),
            "batches_files_over_tasks": sum(1 for b in batches if b["tasks"] and b["files"] > b["tasks"]),
            "lag_max": max(lags, default=0), "lag_max_last_third": max(third),
            "duration_ms_p50": _median_durations(batches),
            "e2e_ms_p50": round(pct(0.50)), "e2e_ms_p95": round(pct(0.95)), "e2e_ms_max": round(latencies[-1]) if latencies else None,
        }
    finally:
        if spark is not None:
            spark.stop()
        os.environ.clear()
        os.environ.update(env_backup)
        broker.cleanup()
        shared.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--produce-child":
        bootstrap, topic, records, rate, out = sys.argv[2:7]
        produce_child(bootstrap, topic, int(records), int(rate), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--rate", type=int, default=15_000, help="records per second")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--stores", default="file,s3")
    ap.add_argument("--trigger", default="500 milliseconds", help="the processing-time trigger")
    ap.add_argument("--grace", type=float, default=120.0, help="seconds allowed after the producer's nominal end")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], help="a Spark setting key=value for the session (repeatable)")
    ap.add_argument("--log-level", help="Spark's log level (e.g. INFO to see where a micro-batch's time goes)")
    ap.add_argument("--one-store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_store:
        print(json.dumps(run_store(args.one_store, args)), flush=True)
        return
    for name in args.stores.split(","):
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--one-store", name.strip()], stdout=subprocess.PIPE, text=True, cwd=REPO,
        )
        lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
        if child.returncode != 0 or not lines:
            print(f"{name}: failed (exit {child.returncode})", flush=True)
            continue
        result = json.loads(lines[-1])
        print(json.dumps(result), flush=True)
        print(
            f"{result['store']}: {result['rows']:,} rows in {result['batches']} micro-batches "
            f"(p50 {result['rows_per_batch_p50']:,} rows); lag max {result['lag_max']:,}, "
            f"max over the last third {result['lag_max_last_third']:,}; files/batch max {result['files_per_batch_max']} "
            f"(tasks/batch max {result['tasks_per_batch_max']}, batches with more files than tasks: {result['batches_files_over_tasks']}); "
            f"ack -> Parquet commit p50 {result['e2e_ms_p50']} ms, p95 {result['e2e_ms_p95']} ms, max {result['e2e_ms_max']} ms",
            flush=True,
        )
        print(f"{result['store']}: micro-batch phases, median ms: " + ", ".join(f"{k} {v}" for k, v in result["duration_ms_p50"].items()), flush=True)


if __name__ == "__main__":
    main()
