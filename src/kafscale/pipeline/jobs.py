"""Ready-made pipelines from KafScale topics (read from segment objects, no broker needed).

* `parquet(...)`: topic(s) -> Parquet files partitioned by topic and (UTC) date, through
  Spark's file sink (exactly once with its checkpoint).
* `iceberg(...)`: topic(s) -> an Iceberg table written with pyiceberg (SQL catalog on
  sqlite by default); each micro-batch skips rows whose (topic, partition, offset) the table
  already holds, so a retried or replayed batch never duplicates rows.

Both stream with a checkpoint: `once=True` processes what is flushed now and returns
(Trigger.AvailableNow, so the next run continues where this one stopped); `once=False` keeps
running, one micro-batch per `trigger_interval`. Progress (rows and offsets per batch) is
printed as batches complete.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

DEFAULT_TRIGGER_INTERVAL = "10 seconds"


@dataclass
class JobResult:
    batches: int = 0
    rows: int = 0
    end_offsets: dict = field(default_factory=dict)  # {topic: {partition: next offset}} after the last batch


def local_spark(app_name: str = "kafscale-pipeline", cores: int = 2, **conf: str):
    """A local SparkSession for tests, benchmarks and laptops, with the kafscale source registered.

    Workers run this interpreter (so they import this kafscale), the UI is off and shuffles
    are small; `conf` adds or overrides Spark settings (dots as in Spark: pass a dict).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in conf.items():
        builder = builder.config(k, v)
    return spark_session(app_name, builder.getOrCreate())


def spark_session(app_name: str = "kafscale-pipeline", spark=None):
    """The given or active SparkSession (a local one if none), with the kafscale source registered."""
    from pyspark.sql import SparkSession

    from kafscale.pipeline import register

    # Python workers must import this kafscale: default them to this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark or SparkSession.builder.appName(app_name).getOrCreate()
    register(spark)
    return spark


def _stream(spark, storage: str, topics, pattern, namespace: str, starting_offsets: str, max_offsets_per_trigger, options: dict | None):
    # the jobs keep record headers (Spark's includeHeaders, off by default in the source)
    reader = spark.readStream.format("kafscale").option("storage", storage).option("namespace", namespace).option("includeHeaders", "true")
    if (topics is None) == (pattern is None):
        raise ValueError("give exactly one of topics or pattern")
    if topics is not None:
        reader = reader.option("subscribe", topics if isinstance(topics, str) else ",".join(topics))
    else:
        reader = reader.option("subscribePattern", pattern)
    reader = reader.option("startingOffsets", starting_offsets if isinstance(starting_offsets, str) else json.dumps(starting_offsets))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    return with_date(reader.load())


def with_date(df):
    """Add `date`: the record's UTC calendar date, whatever the session time zone."""
    from pyspark.sql import functions as F

    return df.withColumn("date", F.date_from_unix_date(F.floor(F.unix_micros("timestamp") / 86_400_000_000).cast("int")))


def _trigger(writer, once: bool, trigger_interval: str):
    return writer.trigger(availableNow=True) if once else writer.trigger(processingTime=trigger_interval)


def _offsets(o: Any) -> dict:
    if isinstance(o, str):
        try:
            o = json.loads(o)
        except ValueError:
            return {}
    return o if isinstance(o, dict) else {}


def describe_offsets(start: Any, end: Any) -> str:
    """'orders/0 100->350, orders/1 7->9' for the partitions that moved."""
    s, e = _offsets(start), _offsets(end)
    parts = []
    for topic in sorted(e):
        for p in sorted(e[topic], key=int):
            a = s.get(topic, {}).get(p)
            b = e[topic][p]
            if a != b:
                parts.append(f"{topic}/{p} {a if a is not None else 'earliest'}->{b}")
    return ", ".join(parts) or "no new offsets"


def offsets_behind_latest(end: Any, latest: Any) -> dict | None:
    """Spark's Kafka source metrics `minOffsetsBehindLatest` / `maxOffsetsBehindLatest` /
    `avgOffsetsBehindLatest` from a progress' `endOffset` and `latestOffset` (a Python
    source cannot report source metrics to Spark, so the jobs compute them here), or None
    without a latestOffset."""
    e, lat = _offsets(end), _offsets(latest)
    if not lat:
        return None
    behind = [max(0, int(off) - int(e.get(t, {}).get(p, off))) for t, parts in lat.items() for p, off in parts.items()]
    if not behind:
        return None
    return {"minOffsetsBehindLatest": min(behind), "maxOffsetsBehindLatest": max(behind), "avgOffsetsBehindLatest": sum(behind) / len(behind)}


def _follow(query, result: JobResult, timeout: float | None, out=None, on_progress: Callable[[dict], None] | None = None) -> JobResult:
    """Wait for the query, printing each completed micro-batch once."""
    out = out or sys.stdout
    seen: set[int] = set()
    deadline = None if timeout is None else time.monotonic() + timeout

    def report() -> None:
        for p in query.recentProgress:
            bid = p["batchId"]
            if bid in seen:
                continue
            seen.add(bid)
            rows = int(p.get("numInputRows") or 0)
            src = (p.get("sources") or [{}])[0]
            if rows == 0 and _offsets(src.get("startOffset")) == _offsets(src.get("endOffset")):
                continue  # idle trigger
            result.batches += 1
            result.rows += rows
            result.end_offsets = _offsets(src.get("endOffset")) or result.end_offsets
            if on_progress is not None:
                on_progress(p)
            behind = offsets_behind_latest(src.get("endOffset"), src.get("latestOffset"))
            lag = (
                f"; offsets behind latest: max {behind['maxOffsetsBehindLatest']}, avg {behind['avgOffsetsBehindLatest']:.1f}, min {behind['minOffsetsBehindLatest']}"
                if behind is not None
                else ""
            )
            print(f"[kafscale {query.name or 'pipeline'}] batch {bid}: {rows} rows, {describe_offsets(src.get('startOffset'), src.get('endOffset'))}{lag}", file=out, flush=True)

    try:
        while query.isActive:
            wait = 2.0 if deadline is None else max(0.0, min(2.0, deadline - time.monotonic()))
            query.awaitTermination(wait)
            report()
            if deadline is not None and time.monotonic() >= deadline:
                query.stop()
                break
    except KeyboardInterrupt:
        query.stop()
    if query.exception() is not None:
        raise query.exception()
    report()
    return result


def _refuse_orphaned_output(output: str, checkpoint: str) -> None:
    """Fail, instead of silently writing nothing, when `output` holds the file sink log of an
    earlier query but the checkpoint is gone (a local `output` only).

    Spark's file sink numbers micro-batches from 0 in a new query and skips every batch its
    `<output>/_spark_metadata` log already has, so such a run would read records and drop
    them. Only local directories are checked (other file systems: Spark's own behaviour).
    """
    if "://" in output and not output.startswith("file://"):
        return
    out = output[len("file://") :] if output.startswith("file://") else output
    log_dir = os.path.join(out, "_spark_metadata")
    ck = checkpoint[len("file://") :] if checkpoint.startswith("file://") else checkpoint
    has_progress = os.path.isdir(os.path.join(ck, "offsets")) and any(n.isdigit() for n in os.listdir(os.path.join(ck, "offsets")))
    batches = [n for n in os.listdir(log_dir) if n.split(".")[0].isdigit()] if os.path.isdir(log_dir) else []
    if batches and not has_progress:
        raise ValueError(
            f"{out} already holds Parquet files committed by a streaming query ({len(batches)} entries in "
            f"{log_dir}) but the checkpoint {ck} is gone: Spark's file sink would skip this run's first "
            "micro-batches and write nothing. Restore the checkpoint, write to a new output directory, or "
            f"remove {log_dir} (then readers see every file in {out}, and this run adds its rows to them)"
        )


def parquet(
    storage: str,
    output: str,
    *,
    topics: str | list[str] | None = None,
    pattern: str | None = None,
    namespace: str = "default",
    checkpoint: str | None = None,
    once: bool = True,
    starting_offsets: str | dict = "earliest",
    max_offsets_per_trigger: int | None = None,
    trigger_interval: str = DEFAULT_TRIGGER_INTERVAL,
    options: dict | None = None,
    spark=None,
    timeout: float | None = None,
) -> JobResult:
    """Copy topic(s) to Parquet under `output`, partitioned by topic and date (UTC).

    Columns are those of the Kafka source (the topic becomes the `topic=` directory) plus
    `date`. The checkpoint (default `<output>/_checkpoint`, which Parquet readers skip) makes
    each run continue after the last batch written; Spark's file sink records the committed
    files in `<output>/_spark_metadata`, so read the result with Spark, or with any Parquet
    reader after the run has finished.
    """
    checkpoint = checkpoint or os.path.join(output, "_checkpoint")
    _refuse_orphaned_output(output, checkpoint)
    spark = spark_session("kafscale-parquet", spark)
    df = _stream(spark, storage, topics, pattern, namespace, starting_offsets, max_offsets_per_trigger, options)
    writer = (
        df.writeStream.format("parquet")
        .queryName("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
        .partitionBy("topic", "date")
        .outputMode("append")
    )
    query = _trigger(writer, once, trigger_interval).start()
    print(f"[kafscale parquet] {storage} -> {output} (checkpoint {checkpoint})", flush=True)
    return _follow(query, JobResult(), timeout)


# ---------------------------------------------------------------------------------------
# Iceberg


def _iceberg_schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        DateType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    return Schema(
        NestedField(1, "key", BinaryType(), required=False),
        NestedField(2, "value", BinaryType(), required=False),
        NestedField(3, "topic", StringType(), required=False),
        NestedField(4, "partition", IntegerType(), required=False),
        NestedField(5, "offset", LongType(), required=False),
        NestedField(6, "timestamp", TimestamptzType(), required=False),
        NestedField(7, "timestampType", IntegerType(), required=False),
        NestedField(
            8,
            "headers",
            ListType(9, StructType(NestedField(10, "key", StringType(), required=False), NestedField(11, "value", BinaryType(), required=False)), element_required=False),
            required=False,
        ),
        NestedField(12, "date", DateType(), required=False),
    )


def _iceberg_spec():
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    # identity on `date` rather than day(timestamp): time transforms need the optional
    # pyiceberg-core package for writes
    return PartitionSpec(
        PartitionField(source_id=3, field_id=1000, transform=IdentityTransform(), name="topic"),
        PartitionField(source_id=12, field_id=1001, transform=IdentityTransform(), name="date"),
    )


def sql_catalog_properties(warehouse: str) -> dict:
    """SqlCatalog on a sqlite file inside the warehouse directory."""
    warehouse = os.path.abspath(warehouse)
    os.makedirs(warehouse, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{os.path.join(warehouse, 'catalog.db')}", "warehouse": f"file://{warehouse}"}


class IcebergAppender:
    """Appends Kafka-schema rows to an Iceberg table, skipping (topic, partition, offset)
    keys the table already holds: replaying a micro-batch is harmless.

    Also usable directly as a foreachBatch function: `appender(batch_df, batch_id)`.
    """

    def __init__(self, table: str, catalog_name: str = "kafscale", catalog_properties: dict | None = None, out=None):
        if "." not in table:
            table = f"default.{table}"
        self.table_name = table
        self.catalog_name = catalog_name
        self.catalog_properties = dict(catalog_properties or sql_catalog_properties("./warehouse"))
        self.out = out
        self._table = None

    def table(self):
        if self._table is None:
            from pyiceberg.catalog import load_catalog

            catalog = load_catalog(self.catalog_name, **self.catalog_properties)
            namespace = self.table_name.rsplit(".", 1)[0]
            catalog.create_namespace_if_not_exists(namespace)
            self._table = catalog.create_table_if_not_exists(self.table_name, schema=_iceberg_schema(), partition_spec=_iceberg_spec())
        return self._table

    @staticmethod
    def _conform(batch):
        """Spark's Arrow output -> the table's Arrow types (UTC timestamps, date32)."""
        import pyarrow as pa

        cols = {}
        for name in ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers", "date"):
            col = batch.column(name)
            if name == "timestamp":
                col = col.cast(pa.timestamp("us", tz="UTC"))
            cols[name] = col
        return pa.table(cols)

    def append(self, batch, batch_id: int | None = None) -> tuple[int, int]:
        """Append a pyarrow Table of Kafka rows; returns (rows appended, rows already present)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThanOrEqual, Or

        data = self._conform(batch)
        if data.num_rows == 0:
            return 0, 0
        table = self.table()
        groups = data.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")]).to_pylist()
        clauses = [
            And(EqualTo("topic", g["topic"]), EqualTo("partition", g["partition"]), GreaterThanOrEqual("offset", g["offset_min"]), LessThanOrEqual("offset", g["offset_max"]))
            for g in groups
        ]
        row_filter = clauses[0]
        for c in clauses[1:]:
            row_filter = Or(row_filter, c)
        table.refresh()
        existing = table.scan(row_filter=row_filter, selected_fields=("topic", "partition", "offset")).to_arrow()
        duplicate = pa.array([False] * data.num_rows)
        if existing.num_rows:
            for g in groups:
                in_tp = pc.and_(pc.equal(data["topic"], g["topic"]), pc.equal(data["partition"], g["partition"]))
                ex_tp = existing.filter(pc.and_(pc.equal(existing["topic"], g["topic"]), pc.equal(existing["partition"], g["partition"])))
                if ex_tp.num_rows:
                    duplicate = pc.or_(duplicate, pc.and_(in_tp, pc.is_in(data["offset"], value_set=ex_tp["offset"].combine_chunks())))
        new = data.filter(pc.invert(duplicate))
        if new.num_rows:
            offsets = {f"{g['topic']}/{g['partition']}": [g["offset_min"], g["offset_max"]] for g in groups}
            props = {"kafscale.offsets": json.dumps(offsets)}
            if batch_id is not None:
                props["kafscale.batch-id"] = str(batch_id)
            table.append(new, snapshot_properties=props)
        return new.num_rows, data.num_rows - new.num_rows

    def __call__(self, batch_df, batch_id: int) -> None:
        data = batch_df.toArrow()  # one pass over the micro-batch; stats come from the Arrow table
        appended, present = self.append(data, batch_id)
        ranges = ""
        if data.num_rows:
            groups = data.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")]).to_pylist()
            ranges = ", ".join(f"{g['topic']}/{g['partition']} {g['offset_min']}..{g['offset_max']}" for g in sorted(groups, key=lambda g: (g["topic"], g["partition"])))
        print(
            f"[kafscale iceberg] batch {batch_id}: {appended} rows appended to {self.table_name}"
            + (f", {present} already present" if present else "")
            + (f" (offsets {ranges})" if ranges else ""),
            file=self.out or sys.stdout,
            flush=True,
        )


def iceberg(
    storage: str,
    table: str = "default.kafscale",
    *,
    topics: str | list[str] | None = None,
    pattern: str | None = None,
    namespace: str = "default",
    warehouse: str = "./warehouse",
    catalog_name: str = "kafscale",
    catalog_properties: dict | None = None,
    checkpoint: str | None = None,
    once: bool = True,
    starting_offsets: str | dict = "earliest",
    max_offsets_per_trigger: int | None = None,
    trigger_interval: str = DEFAULT_TRIGGER_INTERVAL,
    options: dict | None = None,
    spark=None,
    timeout: float | None = None,
) -> JobResult:
    """Copy topic(s) into the Iceberg table `table` ("namespace.name"), created if missing.

    The catalog is a SqlCatalog on `<warehouse>/catalog.db` unless `catalog_properties`
    (pyiceberg `load_catalog` properties, e.g. a REST catalog) are given. Columns: the Kafka
    source's plus `date` (UTC), partitioned by topic and date. Each micro-batch is collected
    on the driver (bound its size with max_offsets_per_trigger) and appended in one snapshot,
    without the rows the table already has; the checkpoint (default
    `<warehouse>/_checkpoints/<table>`) only saves re-reading.
    """
    spark = spark_session("kafscale-iceberg", spark)
    props = catalog_properties or sql_catalog_properties(warehouse)
    checkpoint = checkpoint or os.path.join(os.path.abspath(warehouse), "_checkpoints", table)
    appender = IcebergAppender(table, catalog_name, props)
    appender.table()  # fail early on catalog problems, before the stream starts
    df = _stream(spark, storage, topics, pattern, namespace, starting_offsets, max_offsets_per_trigger, options)
    writer = df.writeStream.queryName("iceberg").option("checkpointLocation", checkpoint).foreachBatch(appender)
    query = _trigger(writer, once, trigger_interval).start()
    print(f"[kafscale iceberg] {storage} -> {table} (checkpoint {checkpoint})", flush=True)
    return _follow(query, JobResult(), timeout)
