"""`kafscale pipeline parquet|iceberg`: ready-made Spark jobs from topics to tables."""

from __future__ import annotations

import argparse
import os
import sys


def _default_storage() -> str:
    return os.environ.get("KAFSCALE_STORAGE") or "file://" + os.path.abspath(os.path.join(os.environ.get("KAFSCALE_DATA_DIR", "./data"), "objects"))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("topics", nargs="?", help="comma-separated topics (or use --pattern)")
    p.add_argument("--pattern", help="regex of topics to read")
    p.add_argument("--storage", default=_default_storage(), help="the broker's object store URL (default: KAFSCALE_STORAGE or file://./data/objects)")
    p.add_argument("--namespace", default=os.environ.get("KAFSCALE_NAMESPACE", "default"))
    p.add_argument("--checkpoint", help="streaming checkpoint directory (continues exactly where the last run stopped)")
    p.add_argument("--once", action="store_true", help="process what is flushed now and exit (Trigger.AvailableNow)")
    p.add_argument("--starting-offsets", default="earliest", help="earliest, latest or Spark-Kafka JSON")
    p.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch at most")
    p.add_argument("--trigger-interval", default="10 seconds", help="micro-batch interval when streaming")
    p.add_argument("--timeout", type=float, help="stop streaming after this many seconds")
    p.add_argument("--master", help="Spark master URL (e.g. local[4], spark://host:7077); default: Spark's own (PYSPARK_SUBMIT_ARGS, spark-defaults)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting, as spark-submit --conf (repeatable)")


def _check(args) -> None:
    if not args.topics and not args.pattern:
        sys.exit("kafscale pipeline: give topics or --pattern")
    for kv in args.conf:
        key, sep, _ = kv.partition("=")
        if not sep or not key.strip():
            sys.exit(f"kafscale pipeline: --conf takes KEY=VALUE, not {kv!r}")


def _session(args):
    """A SparkSession from --master and --conf (None: the jobs' default session)."""
    if not args.master and not args.conf:
        return None
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import this kafscale
    builder = SparkSession.builder.appName(f"kafscale-pipeline-{args.job}")
    if args.master:
        builder = builder.master(args.master)
    for kv in args.conf:
        key, _, value = kv.partition("=")
        builder = builder.config(key.strip(), value)
    return builder.getOrCreate()


def _parquet(args) -> int:
    _check(args)
    from kafscale.pipeline import jobs

    result = jobs.parquet(
        args.storage, args.output, topics=args.topics, pattern=args.pattern, namespace=args.namespace,
        checkpoint=args.checkpoint, once=args.once, starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger, trigger_interval=args.trigger_interval, timeout=args.timeout,
        spark=_session(args),
    )
    print(f"done: {result.rows} rows in {result.batches} batches", file=sys.stderr)
    return 0


def _iceberg(args) -> int:
    _check(args)
    from kafscale.pipeline import jobs

    result = jobs.iceberg(
        args.storage, args.table, topics=args.topics, pattern=args.pattern, namespace=args.namespace,
        warehouse=args.warehouse, checkpoint=args.checkpoint, once=args.once, starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger, trigger_interval=args.trigger_interval, timeout=args.timeout,
        spark=_session(args),
    )
    print(f"done: {result.rows} rows in {result.batches} batches", file=sys.stderr)
    return 0


def add_commands(subparsers) -> None:
    pipe = subparsers.add_parser("pipeline", help="Spark jobs that copy topics straight from the segments into tables")
    ps = pipe.add_subparsers(dest="job", required=True, metavar="JOB")
    p = ps.add_parser("parquet", help="topics to Parquet, partitioned by topic and date")
    _common(p)
    p.add_argument("--output", required=True, help="output directory (local path or any Hadoop URL)")
    p.set_defaults(func=_parquet)
    p = ps.add_parser("iceberg", help="topics to an Apache Iceberg table (pyiceberg SQL catalog), idempotent per batch")
    _common(p)
    p.add_argument("--table", default="default.kafscale", help="namespace.table (created if missing)")
    p.add_argument("--warehouse", default="./warehouse", help="warehouse directory of the SQL catalog")
    p.set_defaults(func=_iceberg)
