"""Log compaction (issue #16): what a pass costs. Figures, not assertions.

    .venv/bin/python bench/bench_compaction.py                      # 1M keys x 10 updates, 100 B values
    .venv/bin/python bench/bench_compaction.py --store file         # ... and through a broker's compactor
    .venv/bin/python bench/bench_compaction.py --keys 100000 --codec lz4 --store s3

Part 1, the cleaner alone (storage/cleaner.py, the pure part of the compactor) over a
generated log of `--keys` keys each written `--updates` times (every round writes every key
once, in a scrambled order), in producer-sized batches (`--batch-records`) and segments of
`--segment-bytes` (the broker default, 4 MiB, as the merger leaves them). One pass as the
compactor runs it: plan, fill the key map over the dirty segments, clean every segment in
offset order. Printed: MB/s of log rewritten (input bytes of the cleaned range / time of the
pass), the key-map and cleaning phases apart, records/s; the key map's entries, its budget
accounting (KEY_MAP_ENTRY_BYTES an entry) and what the process's RSS grew by while it was
filled (with --trace-memory also the peak tracemalloc sees in a second, untimed fill); bytes
before and after. Segment generation is not timed (a segment's bytes are made again each
time it is read, so the log is never held in memory whole).

Part 2 (`--store file|s3`): a broker in this process (embedded metadata; the file store, or
S3 on a private moto server), the same log produced by confluent-kafka (acks=all, another
process) to a topic with cleanup.policy=compact, the merger run until it has nothing left to
merge, then `compactor.compact(log)` until the partition is no longer due. Printed: pass
time and MB/s of log rewritten, bytes read and written, segments and bytes in the store
before and after (replaced objects deleted at once instead of after the grace period), and
the object-store requests of the passes, counted on the store itself: GETs (segment-cache
misses, plus the conditional replace's read of each group's first object), PUTs (segments
and indexes), objects deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO / "src", REPO):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from kafscale.metadata.segments import SegmentInfo  # noqa: E402
from kafscale.metadata.topic_config import LogSettings  # noqa: E402
from kafscale.protocol import records  # noqa: E402
from kafscale.protocol.varint import encode_varlong  # noqa: E402
from kafscale.storage import cleaner  # noqa: E402

MB = 1_000_000
MiB = 1 << 20
CODECS = {"none": records.COMPRESSION_NONE, "gzip": records.COMPRESSION_GZIP, "snappy": records.COMPRESSION_SNAPPY,
          "lz4": records.COMPRESSION_LZ4, "zstd": records.COMPRESSION_ZSTD}


class GeneratedLog:
    """A compacted partition's log: `updates` rounds over `keys` keys, record i of round r
    holding key (A * i + r * keys // updates) mod keys (a scrambled permutation per round),
    cut into batches of `batch_records` and segments of about `segment_bytes`."""

    def __init__(self, keys: int, updates: int, value_bytes: int, batch_records: int, segment_bytes: int, codec: int, t0_ms: int):
        self.keys, self.updates, self.batch_records, self.codec, self.t0_ms = keys, updates, batch_records, codec, t0_ms
        self.total = keys * updates
        self.mult = next(a for a in range(2_654_435_761 % keys or 1, 10 * keys + 2) if math.gcd(a, keys) == 1)
        self.key_width = len(str(keys - 1))
        self.value = b"v" * value_bytes
        self._value_part = encode_varlong(value_bytes) + self.value + b"\x00"  # value, no headers
        self._offset_parts = [encode_varlong(i) for i in range(batch_records)]
        # batches per segment, from the size of one (uncompressed sizes for compressed logs too)
        one = len(self._batch(0))
        self.batches_per_segment = max(1, segment_bytes // one)
        self.records_per_segment = self.batches_per_segment * batch_records
        self.segments = math.ceil(self.total / self.records_per_segment)

    def key_of(self, i: int) -> bytes:
        r, j = divmod(i, self.keys)
        k = (self.mult * j + r * (self.keys // self.updates + 1)) % self.keys
        return b"key-%0*d" % (self.key_width, k)

    def _batch(self, first: int) -> bytes:
        n = min(self.batch_records, self.total - first)
        parts = []
        for d in range(n):
            key = self.key_of(first + d)
            body = b"\x00\x00" + self._offset_parts[d] + encode_varlong(len(key)) + key + self._value_part  # attributes, ts delta 0
            parts.append(encode_varlong(len(body)) + body)
        recs = b"".join(parts)
        attrs = self.codec
        if self.codec:
            recs = records.compress(self.codec, recs)
        ts = self.t0_ms + first // self.keys  # a millisecond per round
        after_crc = struct.pack(">hiqqqhii", attrs, n - 1, ts, ts, -1, -1, -1, n) + recs
        head = struct.pack(">qiib", first, 4 + 1 + 4 + len(after_crc), 0, 2)
        return head + struct.pack(">I", records.crc32c(after_crc)) + after_crc

    def segment(self, s: int) -> bytes:
        first = s * self.records_per_segment
        last = min(first + self.records_per_segment, self.total)
        return b"".join(self._batch(i) for i in range(first, last, self.batch_records))

    def info(self, s: int, size: int) -> SegmentInfo:
        first = s * self.records_per_segment
        last = min(first + self.records_per_segment, self.total) - 1
        return SegmentInfo(base_offset=first, last_offset=last, size=size, record_count=last - first + 1,
                           max_timestamp=self.t0_ms + last // self.keys, created_ms=self.t0_ms)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_pass(log: GeneratedLog, budget: int, segment_bytes: int, now_ms: int) -> dict:
    # sizes of the segments (made once, not kept) for the plan
    sizes = [len(log.segment(s)) for s in range(log.segments)]
    segs = [log.info(s, sizes[s]) for s in range(log.segments)]
    settings = LogSettings.from_configs({"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
    plan = cleaner.plan(segs, last_stable_offset=log.total, now_ms=now_ms, settings=settings)
    if plan is None:
        raise SystemExit("nothing to compact: the log is one segment (the newest is never cleaned); use more --keys or a smaller --segment-bytes")
    km = cleaner.KeyMap(budget)
    gen_s = map_s = clean_s = 0.0
    mapped: list[SegmentInfo] = []
    rss_before = rss_bytes()
    for seg in plan.dirty:
        if not km.fits(seg.record_count):
            break
        t = time.perf_counter()
        data = log.segment(seg.base_offset // log.records_per_segment)
        t1 = time.perf_counter()
        km.add(data, plan.aborted)
        map_s += time.perf_counter() - t1
        gen_s += t1 - t
        mapped.append(seg)
    rss_mapped = rss_bytes()
    bc = cleaner.BatchCleaner(km, now_ms=now_ms, delete_retention_ms=settings.delete_retention_ms, aborted=plan.aborted)
    groups = cleaner.group_segments(plan.segments[: len(mapped)], segment_bytes)
    bytes_in = bytes_out = 0
    for group in groups:
        for seg in group:
            t = time.perf_counter()
            data = log.segment(seg.base_offset // log.records_per_segment)
            t1 = time.perf_counter()
            out = bc.clean(data)
            clean_s += time.perf_counter() - t1
            gen_s += t1 - t
            bytes_in += len(data)
            bytes_out += len(out.body)
    untouched = sum(s.size for s in segs[len(mapped):])  # the newest (active) segment, and any not mapped
    return {
        "segments": len(segs), "segments_cleaned": len(mapped), "groups_written": len(groups),
        "records_in": bc.records_in, "records_out": bc.records_out, "recompressions": bc.recompressions,
        "key_map_entries": len(km), "key_map_peak_entries": km.peak_entries, "key_map_accounted_bytes": km.peak_entries * cleaner.KEY_MAP_ENTRY_BYTES,
        "bytes_in": bytes_in, "bytes_out": bytes_out, "log_bytes_before": sum(sizes), "log_bytes_after": bytes_out + untouched,
        "key_map_rss_growth_bytes": rss_mapped - rss_before,
        "map_s": map_s, "clean_s": clean_s, "generate_s": gen_s,
    }


def key_map_memory(log: GeneratedLog, budget: int, segments: int) -> int:
    """Peak bytes traced (tracemalloc) while filling a key map over the first `segments`
    segments: the map, plus one segment's bytes and its parse garbage at a time (as the
    compactor holds one segment while mapping it)."""
    km = cleaner.KeyMap(budget)
    tracemalloc.start()
    for s in range(segments):
        data = log.segment(s)
        km.add(data)
        del data
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


# ---------------------------------------------------------------------------------------
# --store: a broker in this process, its compactor over a real object store


def produce_log(bootstrap: str, topic: str, keys: int, updates: int, value_bytes: int, codec: str) -> None:
    """The same log through confluent-kafka (acks=all), in a process of its own."""
    from confluent_kafka import Producer

    log = GeneratedLog(keys, updates, value_bytes, 100, 4 * MiB, records.COMPRESSION_NONE, 0)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1_000_000,
                  "compression.type": codec, "queue.buffering.max.kbytes": 262144})
    value = log.value
    for i in range(log.total):
        while True:
            try:
                p.produce(topic, key=log.key_of(i), value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(300) == 0


class StoreRequests:
    """Counts the object-store requests of a LogManager's store (wrapping its methods on the
    instance): GETs (get, get_with_version, get_tail), PUTs (objects written by put, create,
    replace and their _many forms), DELETEd objects. A call made inside another counted
    call (put_many delegating to put) is not counted again."""

    GETS = ("get", "get_with_version", "get_tail")
    PUTS = ("put", "create", "replace")
    MANY = ("put_many", "create_many")

    def __init__(self, store):
        import contextvars
        from collections import Counter

        self.counts: Counter = Counter()
        self._inside = contextvars.ContextVar("inside", default=False)
        for op in (*self.GETS, *self.PUTS, *self.MANY, "delete"):
            setattr(store, op, self._wrap(op, getattr(store, op)))

    def _wrap(self, op: str, orig):
        async def counted(*args, **kwargs):
            if self._inside.get():
                return await orig(*args, **kwargs)
            kind = "get" if op in self.GETS else "delete" if op == "delete" else "put"
            self.counts[kind] += len(args[0]) if op in (*self.MANY, "delete") else 1
            token = self._inside.set(True)
            try:
                return await orig(*args, **kwargs)
            finally:
                self._inside.reset(token)

        return counted

    def snapshot(self) -> dict:
        return dict(self.counts)


def _counters(mgr) -> dict:
    """The log manager's object reads and its compactor's counters, by their /metrics names."""
    import dataclasses

    return {"gets": mgr.metrics.gets, **{f"compaction_{k}": v for k, v in dataclasses.asdict(mgr.compactor.counters).items()}}


def _objects_bytes(data_dir: str, moto, topic: str) -> tuple[int, int]:
    """(segment objects, their bytes) of the topic in the store, listed outside the broker."""
    if moto is None:
        files = [f for f in Path(data_dir, "objects").rglob("*.kfs") if f"/{topic}/" in str(f)]
        return len(files), sum(f.stat().st_size for f in files)
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name=moto.env.get("AWS_DEFAULT_REGION", "us-east-1"),
                      aws_access_key_id=moto.env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=moto.env["AWS_SECRET_ACCESS_KEY"])
    n = total = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="bench-compaction", Prefix=f"data/default/{topic}/"):
        for o in page.get("Contents", []):
            if o["Key"].endswith(".kfs"):
                n, total = n + 1, total + o["Size"]
    return n, total


async def store_pass(args, budget: int) -> dict:
    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig
    from tests.support.broker import free_port

    moto = None
    data_dir = tempfile.mkdtemp(prefix="kafscale-bench-compaction-")
    settings = {"listen": f"127.0.0.1:{free_port()}", "data_dir": data_dir, "group_initial_rebalance_delay_ms": 0,
                "merge_interval_ms": 0, "compaction_interval_ms": 0, "compaction_key_map_bytes": budget, "http": "127.0.0.1:0"}
    if args.store == "s3":
        from tests.support.servers import start_moto

        moto = start_moto()
        os.environ.update(moto.env)
        os.environ["KAFSCALE_S3_CREATE_BUCKET"] = "true"
        settings["storage"] = "s3://bench-compaction/data"
    broker = Broker(BrokerConfig(**settings))
    await broker.start()
    mgr = broker.logs
    requests = StoreRequests(mgr.store)
    topic = "compacted"
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        bootstrap = "%s:%d" % broker.listen_address
        admin = AdminClient({"bootstrap.servers": bootstrap})
        fut = admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact", "segment.bytes": str(args.segment_bytes)})])[topic]
        await asyncio.to_thread(fut.result, 30)
        t = time.perf_counter()
        proc = mp.get_context("spawn").Process(target=produce_log, args=(bootstrap, topic, args.keys, args.updates, args.value_bytes, args.codec))
        proc.start()
        await asyncio.to_thread(proc.join)
        assert proc.exitcode == 0, "the producer failed"
        produce_s = time.perf_counter() - t
        lg = await mgr.get_log(topic, 0)
        flushed_segments = len(lg.state.segments)
        # the merger's work first (it runs in the same loop as the compactor in a broker)
        while await mgr.merger.run_once():
            pass
        await mgr.merger.delete_expired(force=True)
        before_segs = list(lg.state.segments)
        before = {"segments": len(lg.state.segments), "log_bytes": sum(x.size for x in lg.state.segments),
                  "records": sum(x.record_count for x in lg.state.segments), "objects": _objects_bytes(data_dir, moto, topic)}
        stats0, req0 = _counters(mgr), requests.snapshot()
        passes, times = 0, []
        while True:
            t = time.perf_counter()
            if not await mgr.compactor.compact(lg):
                break
            times.append(time.perf_counter() - t)
            passes += 1
        stats1, req1 = _counters(mgr), requests.snapshot()
        await mgr.merger.delete_expired(force=True)  # the replaced objects, without waiting for the grace period
        req2 = requests.snapshot()
        after = {"segments": len(lg.state.segments), "log_bytes": sum(x.size for x in lg.state.segments),
                 "records": sum(x.record_count for x in lg.state.segments), "objects": _objects_bytes(data_dir, moto, topic)}
        d = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1 if isinstance(stats1.get(k), (int, float))}
        cleaned_to = max((x.last_offset for x in lg.state.segments if x.cleaned), default=-1)
        rewritten = sum(x.size for x in before_segs if x.last_offset <= cleaned_to)
        return {"store": args.store, "produce_s": produce_s, "flushed_segments": flushed_segments, "before": before, "after": after,
                "passes": passes, "pass_s": times, "rewritten_bytes": rewritten,
                "gets": req1.get("get", 0) - req0.get("get", 0), "puts": req1.get("put", 0) - req0.get("put", 0),
                "deleted": req2.get("delete", 0) - req0.get("delete", 0), "cache_misses_gets": d.get("gets", 0),
                "bytes_read": d.get("compaction_bytes_read", 0), "bytes_written": d.get("compaction_bytes_written", 0),
                "segments_written": d.get("compaction_segments_written", 0), "records_removed": d.get("compaction_records_removed", 0),
                "key_map_peak_entries": stats1.get("compaction_key_map_peak_entries", 0)}
    finally:
        await broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
        if moto is not None:
            moto.cleanup()


def print_store(r: dict) -> None:
    b, a = r["before"], r["after"]
    total_s = sum(r["pass_s"])
    print(f"store {r['store']}: produced in {r['produce_s']:.1f} s ({r['flushed_segments']} segments flushed, merged to {b['segments']})")
    print(f"  before: {b['segments']} segments, {b['records']:,} records, {b['log_bytes'] / MB:,.1f} MB "
          f"({b['objects'][0]} segment objects, {b['objects'][1] / MB:,.1f} MB in the store)")
    print(f"  after:  {a['segments']} segments, {a['records']:,} records, {a['log_bytes'] / MB:,.1f} MB "
          f"({a['objects'][0]} segment objects, {a['objects'][1] / MB:,.1f} MB in the store once the replaced ones are deleted)")
    if total_s:
        print(f"  {r['passes']} pass(es) in {total_s:.1f} s: {r['rewritten_bytes'] / MB / total_s:.1f} MB/s of log rewritten "
              f"({r['rewritten_bytes'] / MB:,.1f} MB); read {r['bytes_read'] / MB:,.1f} MB, wrote {r['bytes_written'] / MB:,.1f} MB "
              f"in {r['segments_written']} segments; {r['records_removed']:,} records removed")
    print(f"  object store: {r['gets']} GETs ({r['cache_misses_gets']} of them segment-cache misses, the rest the conditional "
          f"replace's read of each group's first object), {r['puts']} PUTs (segments and their indexes), "
          f"{r['deleted']} objects deleted after the grace period; key map peak {r['key_map_peak_entries']:,} entries")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--batch-records", type=int, default=100)
    ap.add_argument("--segment-bytes", type=int, default=4 * MiB)
    ap.add_argument("--codec", choices=list(CODECS), default="none")
    ap.add_argument("--key-map-mib", type=int, default=0, help="key map budget (default: enough for every key plus one segment)")
    ap.add_argument("--store", choices=["none", "file", "s3"], default="none",
                    help="also produce the log to a broker in this process (file store, or moto S3) and time its compactor over it")
    ap.add_argument("--store-only", action="store_true", help="skip part 1 (the cleaner alone)")
    ap.add_argument("--trace-memory", action="store_true", help="fill the key map again under tracemalloc (slow: minutes for 1M keys)")
    args = ap.parse_args()

    now_ms = int(time.time() * 1000)
    log = GeneratedLog(args.keys, args.updates, args.value_bytes, args.batch_records, args.segment_bytes, CODECS[args.codec], now_ms - 3_600_000)
    budget = args.key_map_mib * MiB or (args.keys + 2 * log.records_per_segment) * cleaner.KEY_MAP_ENTRY_BYTES
    print(f"log: {args.keys:,} keys x {args.updates} updates = {log.total:,} records of {args.value_bytes} B values, codec {args.codec}, "
          f"{log.segments} segments of ~{args.segment_bytes / MiB:.0f} MiB; key map budget {budget / MiB:.0f} MiB", flush=True)
    if args.store_only:
        sr = asyncio.run(store_pass(args, budget))
        print_store(sr)
        print(json.dumps(sr, default=str))
        return
    r = run_pass(log, budget, args.segment_bytes, now_ms)
    pass_s = r["map_s"] + r["clean_s"]
    r["mb_per_s"] = r["bytes_in"] / MB / pass_s
    r["map_mb_per_s"] = r["bytes_in"] / MB / r["map_s"]
    r["clean_mb_per_s"] = r["bytes_in"] / MB / r["clean_s"]
    r["records_per_s"] = r["records_in"] / pass_s
    # object-store requests of this pass, as the compactor makes them
    r["gets"] = 2 * r["segments_cleaned"]
    r["puts"] = r["groups_written"]
    print(f"pass: {r['bytes_in'] / MB:,.1f} MB rewritten in {pass_s:.1f} s = {r['mb_per_s']:.1f} MB/s "
          f"({r['records_per_s']:,.0f} records/s; key map {r['map_mb_per_s']:.1f} MB/s, cleaning {r['clean_mb_per_s']:.1f} MB/s"
          f"{', ' + str(r['recompressions']) + ' batches recompressed' if r['recompressions'] else ''})")
    print(f"records: {r['records_in']:,} in, {r['records_out']:,} out; log bytes {r['log_bytes_before'] / MB:,.1f} MB before, "
          f"{r['log_bytes_after'] / MB:,.1f} MB after ({r['log_bytes_after'] / r['log_bytes_before']:.1%}; the newest segment is never cleaned)")
    print(f"segments: {r['segments']} before, {r['groups_written'] + r['segments'] - r['segments_cleaned']} after; the pass reads "
          f"{r['gets']} segment bodies (each dirty one for the key map and again for cleaning) and writes {r['puts']} (--store measures the requests)")
    print(f"key map: {r['key_map_peak_entries']:,} entries, {r['key_map_accounted_bytes'] / MiB:.1f} MiB by the budget's accounting "
          f"({cleaner.KEY_MAP_ENTRY_BYTES} B an entry)")
    print(f"key map: the process grew by {r['key_map_rss_growth_bytes'] / MiB:.1f} MiB of RSS while it was filled "
          f"({r['key_map_rss_growth_bytes'] / max(r['key_map_peak_entries'], 1):.0f} B an entry)")
    if args.trace_memory:
        peak = key_map_memory(log, budget, r["segments_cleaned"])
        r["key_map_traced_peak_bytes"] = peak
        print(f"key map: {peak / MiB:.1f} MiB peak traced while filling it ({peak / max(r['key_map_peak_entries'], 1):.0f} B an entry)")
    r["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    if args.store != "none":
        sr = asyncio.run(store_pass(args, budget))
        print_store(sr)
        print(json.dumps(sr, default=str))


if __name__ == "__main__":
    main()
