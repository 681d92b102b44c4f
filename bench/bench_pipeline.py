"""Throughput of the `kafscale` Spark source: Arrow batches vs row tuples.

Writes N small records (default one million) as segments into a file:// store, then reads
them all with Spark (local[cores]) into the `noop` sink, which consumes every column of every
row: with Arrow record batches and with the tuple path (`arrow=false`), each with the default
planning (one Spark task per segment) and with `packSegments=true` (segments packed into
tasks of up to maxPartitionBytes). Also reports the single-process decoder alone, without
Spark. Modes are measured round-robin after `--warmup` rounds (the JVM keeps compiling for
several queries), so machine load and JIT state hit them alike.

    .venv/bin/python bench/bench_pipeline.py [--records 1000000] [--cores 2] [--codec none]

With --bootstrap host:port it also consumes the same records through a broker with
confluent-kafka for comparison (the records are produced there first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from kafscale.pipeline import segments as seg
from kafscale.protocol import records as R
from kafscale.storage import segment as S

CODECS = {"none": R.COMPRESSION_NONE, "gzip": R.COMPRESSION_GZIP, "snappy": R.COMPRESSION_SNAPPY, "lz4": R.COMPRESSION_LZ4, "zstd": R.COMPRESSION_ZSTD}


def write_segments(url: str, topic: str, records: int, partitions: int, batch_records: int, segment_bytes: int, codec: int) -> tuple[int, int, int]:
    """Records of ~100 bytes (key 8, value ~90, one header on every 10th); returns (segments, object bytes, payload bytes)."""
    per_part = records // partitions
    n_segments = object_bytes = payload = 0
    uploads = []
    for p in range(partitions):
        offset = 0
        batches: list[bytes] = []
        size = 0
        base = 0
        while offset < per_part:
            n = min(batch_records, per_part - offset)
            recs = []
            for i in range(offset, offset + n):
                key = b"k%07d" % i
                value = b"%010d|" % i + b"x" * 79
                payload += len(key) + len(value)
                recs.append((key, value, [("seq", b"%d" % i)]) if i % 10 == 0 else (key, value))
            b = R.build_batch(recs, base_offset=offset, timestamp=1_700_000_000_000 + offset, codec=codec)
            batches.append(b)
            size += len(b)
            offset += n
            if size >= segment_bytes or offset >= per_part:
                enc = S.encode(batches, base)
                uploads.append((S.segment_key("default", topic, p, base), enc.parts, S.index_key("default", topic, p, base), enc.index))
                n_segments += 1
                object_bytes += enc.info.size
                batches, size, base = [], 0, offset

    async def put_all(store):
        for key, parts, ikey, index in uploads:
            await store.put(key, parts)
            await store.put(ikey, [index])

    seg.run_with_store(url, put_all)
    return n_segments, object_bytes, payload


def time_decoder_only(url: str, topic: str) -> tuple[float, int]:
    """Plan in-process and decode every slice to Arrow, one process, no Spark."""

    async def plan(store):
        listing = await seg.list_topics(store, "default", topics=[topic])
        bounds = await seg.partition_bounds(store, listing)
        return await seg.plan_slices(store, listing, bounds)

    start = time.perf_counter()
    slices = seg.run_with_store(url, plan)
    opts = seg.ReadOptions(url)
    schema = seg.arrow_schema()
    rows = 0
    for s in slices:
        for cols in seg.read_slice(opts, s):
            rows += seg.columns_to_arrow(cols, s.topic, s.partition, schema).num_rows
    return time.perf_counter() - start, rows


MODES = [  # (label, arrow, packSegments)
    ("Arrow batches", True, False),
    ("row tuples (arrow=false)", False, False),
    ("Arrow, packSegments", True, True),
    ("row tuples, packSegments", False, True),
]


def spark_df(spark, url: str, topic: str, arrow: bool, pack: bool):
    return (
        spark.read.format("kafscale").option("storage", url).option("subscribe", topic)
        .option("arrow", str(arrow).lower()).option("packSegments", str(pack).lower()).load()
    )


def time_spark(spark, url: str, topic: str, arrow: bool, pack: bool) -> float:
    df = spark_df(spark, url, topic, arrow, pack)
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def time_consumer(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """Produce the same kind of records through a broker, then time a confluent-kafka consumer."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 500})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=b"k%07d" % i, value=b"%010d|" % i + b"x" * 79, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    # The fastest way to read with librdkafka: partitions assigned (no group join to wait
    # for) and a short fetch.queue.backoff.ms (the 1 s default idles a consumer whose broker
    # answers fast, see loadgen.py).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False, "fetch.queue.backoff.ms": 20})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = 0
    start = time.perf_counter()
    while got < records:
        # At most what is left: consume(n, timeout) waits for n messages or the whole timeout.
        msgs = consumer.consume(min(10_000, records - got), 1.0)
        got += sum(1 for m in msgs if not m.error())
        if time.perf_counter() - start > 300:
            break
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch-records", type=int, default=500, help="records per producer batch")
    ap.add_argument("--segment-bytes", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--codec", choices=sorted(CODECS), default="none")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per mode")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds over all modes first")
    ap.add_argument("--bootstrap", help="also time a confluent-kafka consumer through this broker")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="kafscale-bench-")
    url = f"file://{root}"
    topic = "bench"
    try:
        t = time.perf_counter()
        n_seg, obj_bytes, payload = write_segments(url, topic, args.records, args.partitions, args.batch_records, args.segment_bytes, CODECS[args.codec])
        print(f"wrote {args.records:,} records ({payload / 1e6:.1f} MB key+value, {obj_bytes / 1e6:.1f} MB of segments, "
              f"{n_seg} segments, {args.partitions} partitions, codec {args.codec}) in {time.perf_counter() - t:.1f}s")

        secs, rows = min(time_decoder_only(url, topic) for _ in range(3))
        assert rows == args.records, rows
        print(f"{'decoder only (1 process, no Spark)':44s} {secs:7.2f}s  {rows / secs:12,.0f} rows/s  {obj_bytes / secs / 1e6:7.1f} MB/s   (best of 3)")

        from kafscale.pipeline import jobs

        spark = jobs.local_spark("kafscale-bench", cores=args.cores)
        spark.sparkContext.setLogLevel("ERROR")
        tasks = {m: spark_df(spark, url, topic, m[1], m[2]).rdd.getNumPartitions() for m in MODES}
        for _ in range(args.warmup):  # JVM JIT and Python workers
            for m in MODES:
                time_spark(spark, url, topic, m[1], m[2])
        results: dict = {m: [] for m in MODES}
        for _ in range(args.runs):
            for m in MODES:
                results[m].append(time_spark(spark, url, topic, m[1], m[2]))
        med = {}
        for m in MODES:
            times = results[m]
            med[m] = statistics.median(times)
            label = f"spark local[{args.cores}], {m[0]}"
            print(f"{label:44s} {med[m]:7.2f}s  {args.records / med[m]:12,.0f} rows/s  {obj_bytes / med[m] / 1e6:7.1f} MB/s   "
                  f"({tasks[m]} tasks; median of {len(times)}, best {min(times):.2f}s)")
        print(f"Arrow vs tuples: {med[MODES[1]] / med[MODES[0]]:.2f}x (one task per segment), "
              f"{med[MODES[3]] / med[MODES[2]]:.2f}x (packSegments)")
        spark.stop()

        if args.bootstrap:
            secs = time_consumer(args.bootstrap, f"bench-{int(time.time())}", args.records, args.partitions)
            print(f"{'confluent-kafka consumer via broker':44s} {secs:7.2f}s  {args.records / secs:12,.0f} rows/s")
            print(f"Arrow vs consumer: {secs / med[MODES[0]]:.2f}x (one task per segment), {secs / med[MODES[2]]:.2f}x (packSegments)")
        else:
            print("consumer comparison: skipped (pass --bootstrap host:port of a running broker)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"store kept at {url}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
