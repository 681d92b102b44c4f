"""Broker CPU per GiB in bench/run.py's saturated phase, and what it is spent on (#33).

    .venv/bin/python bench/bench_saturated.py                          # 100 B, none, 3 rounds
    .venv/bin/python bench/bench_saturated.py --compression lz4 --tree base=/tmp/base/src --tree this=src

The load of run.py's saturated phase: `--producers` librdkafka producers (acks=all, linger
5 ms, 1 GiB / 100,000-message queues) as fast as they go into `--partitions` partitions,
and one consumer tailing the topic, against a fresh embedded `kafscale broker` (SQLite, file
store) per round. After `--warmup` seconds, a steady window of `--seconds`: the broker's CPU
(user and system, its event-loop thread apart), and from its /metrics what it did in that
window: records, Produce requests, Fetch answers, flushes. Printed per round and as medians:
CPU s per GiB of record values (run.py's figure), CPU per record, and the counts per second
with CPU per Produce request and per flush (each all-in: the broker's whole CPU divided by
that count, so they are not additive; they say which count the cost follows when it
changes). With `--tree`s each round runs every tree in turn (A/B/A/B), the broker started
with that tree's src first on PYTHONPATH and the broker flags given after it:

    .venv/bin/python bench/bench_saturated.py --tree "base=$PWD/src" --tree "mfi20=$PWD/src --min-flush-interval-ms=20"

The window's counts are the broker's own (kafscale_requests_total, kafscale_flushes_total,
kafscale_produce_records_total), so it needs the metrics listener bench/brokers.py starts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from profile_produce import produce_proc, tail_proc  # noqa: E402  (the load of the children, "spawn" context)

GIB = 1 << 30

LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def scrape(url: str) -> dict[str, float]:
    """name{api=...} -> value, for the counters counted here."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name, labels = m.group("name"), m.group("labels") or ""
        if name == "kafscale_requests_total":
            api = re.search(r'api="([^"]*)"', labels).group(1)
            key = f"requests:{api}"
        elif name in ("kafscale_produce_records_total", "kafscale_produce_bytes_total", "kafscale_flushes_total"):
            key = name.removesuffix("_total").removeprefix("kafscale_")
        else:
            continue
        out[key] = out.get(key, 0.0) + float(m.group("value"))
    return out


def thread_cpu(pid: int) -> tuple[float, float, float]:
    """(user, system, event-loop thread) seconds of a process (every thread)."""
    import brokers as B

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        main = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / B.CLK_TCK, int(fields[12]) / B.CLK_TCK, (int(main[11]) + int(main[12])) / B.CLK_TCK


def one_round(args, src: str | None, flags: list[str]) -> dict:
    import brokers as B
    from run import create_topic

    shared = B.Shared()
    broker = B.BROKERS["kafscale-file"](shared, f"sat-{int(time.time())}")
    if src:
        broker.extra_env = {"PYTHONPATH": src}
    broker.extra_args += args.broker_arg + flags
    ctx = mp.get_context("spawn")
    procs = []
    try:
        broker.start()
        topic = "sat"
        create_topic(broker.bootstrap, topic, args.partitions)
        cfg = {"bootstrap": broker.bootstrap, "topic": topic, "size": args.size, "compression": args.compression, "partitions": args.partitions,
               "seconds": args.warmup + args.seconds + 5, "queue_kbytes": 1024 * 1024}  # fmt: skip  (run.py's 1 GiB queues)
        q = ctx.Queue()
        procs.append(ctx.Process(target=tail_proc, args=(cfg,), daemon=True))
        procs += [ctx.Process(target=produce_proc, args=(i, cfg, q), daemon=True) for i in range(args.producers)]
        for p in procs:
            p.start()
        time.sleep(args.warmup)
        m0, c0, t0 = scrape(broker.metrics_url), thread_cpu(broker.pid), time.perf_counter()
        time.sleep(args.seconds)
        m1, c1, t1 = scrape(broker.metrics_url), thread_cpu(broker.pid), time.perf_counter()
    finally:
        for p in procs:  # the window is over: no need for the rest of their run
            p.terminate()
            p.join(5)
        broker.cleanup()
        shared.close()
    d = {k: m1.get(k, 0.0) - m0.get(k, 0.0) for k in set(m0) | set(m1)}
    wall = t1 - t0
    user, system, loop = (c1[i] - c0[i] for i in range(3))
    cpu = user + system
    recs = d.get("produce_records", 0.0)
    produce_n, fetch_n, flushes = d.get("requests:Produce", 0.0), d.get("requests:Fetch", 0.0), d.get("flushes", 0.0)
    return {
        "msgs_per_s": recs / wall,
        "cpu_s_per_gib": cpu / (recs * args.size / GIB) if recs else float("nan"),
        "cpu_pct": 100 * cpu / wall,
        "sys_share": system / cpu if cpu else float("nan"),
        "loop_share": loop / cpu if cpu else float("nan"),
        "us_per_record": 1e6 * cpu / recs if recs else float("nan"),
        "produce_per_s": produce_n / wall,
        "records_per_produce": recs / produce_n if produce_n else float("nan"),
        "fetch_per_s": fetch_n / wall,
        "flushes_per_s": flushes / wall,
        "flush_kb": d.get("produce_bytes", 0.0) / flushes / 1000 if flushes else float("nan"),
        "us_per_produce": 1e6 * cpu / produce_n if produce_n else float("nan"),
        "us_per_flush": 1e6 * cpu / flushes if flushes else float("nan"),
        "other_per_s": sum(v for k, v in d.items() if k.startswith("requests:") and k not in ("requests:Produce", "requests:Fetch")) / wall,
    }


COLUMNS = [
    ("msgs_per_s", "msgs/s", "{:,.0f}"), ("cpu_s_per_gib", "CPU s/GiB", "{:.1f}"), ("cpu_pct", "CPU %", "{:.0f}"),
    ("sys_share", "sys", "{:.2f}"), ("loop_share", "loop thr", "{:.2f}"), ("us_per_record", "us/rec", "{:.2f}"),
    ("produce_per_s", "Produce/s", "{:,.0f}"), ("records_per_produce", "rec/Produce", "{:,.0f}"), ("fetch_per_s", "Fetch/s", "{:,.0f}"),
    ("flushes_per_s", "flushes/s", "{:,.0f}"), ("flush_kb", "KB/flush", "{:.0f}"), ("us_per_produce", "us/Produce", "{:,.0f}"),
    ("us_per_flush", "us/flush", "{:,.0f}"), ("other_per_s", "other req/s", "{:.1f}"),
]


def row(name: str, r: dict) -> str:
    return f"| {name} | " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds of load before the window")
    ap.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=SRC [FLAG ...]",
                    help="a source tree to run the broker from (a PYTHONPATH: several dirs joined by ':' are taken as they are), "
                    "and broker flags of this arm after it (repeatable: alternated)")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra flag for the broker (repeatable)")
    args = ap.parse_args(argv)
    trees = []
    for spec in args.tree or [f"this={os.environ.get('PYTHONPATH', '')}"]:
        name, _, rest = spec.partition("=")
        src, *flags = rest.split() or [""]
        trees.append((name, (src if ":" in src else str(Path(src).resolve())) if src else None, flags))
    print(f"saturated: {args.producers} producers, {args.size} B, {args.compression}, {args.partitions} partitions, a tailing consumer; "
          f"window {args.seconds:g} s after {args.warmup:g} s", flush=True)
    print("| tree | " + " | ".join(label for _, label, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|", flush=True)
    got: dict[str, list[dict]] = {name: [] for name, _, _ in trees}
    for i in range(args.rounds):
        order = trees if i % 2 == 0 else trees[::-1]
        for name, src, flags in order:
            r = one_round(args, src, flags)
            got[name].append(r)
            print(row(f"{name} {i + 1} (load {os.getloadavg()[0]:.1f})", r), flush=True)
    for name, rs in got.items():
        med = {k: statistics.median(r[k] for r in rs) for k, _, _ in COLUMNS}
        print(row(f"{name} median", med))
    return 0


if __name__ == "__main__":
    sys.exit(main())
