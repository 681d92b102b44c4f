"""Where the produce latency of the embedded default goes under a steady load (#33).

    .venv/bin/python bench/bench_flush_latency.py [--size 1024] [--compression lz4] [--rate-mb 2] [--seconds 8]

The paced phase of bench/run.py (librdkafka producers, acks=all, linger 5 ms, 4 partitions,
2 MB/s in total, one consumer tailing the topic) against one embedded broker (SQLite,
file:// store) run by bench/flush_spans.py, which records perf_counter_ns spans of each
flush's life. Prints the producers' latency (librdkafka's delivery reports) and, per
acknowledged Produce request, where its time went: the median, p90 and p99 of each step
from the request's handler start to the response handed to the socket, for the partition
whose answer came last. The machine's load (`uptime`) is printed before and after: the
figures of a shared machine only compare within one window.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import loadgen  # noqa: E402

MB = 1_000_000

# (label, from, to) over the merged record of a request's last-answered append and its flush
STEPS = [
    ("request read -> append", "start", "append"),
    ("append -> flush picked up", "append", "picked"),
    ("  of which: previous upload of the log in flight", None, None),
    ("picked -> upload starts (lock, take)", "picked", "upload"),
    ("segment + index encode", "upload", "encoded"),
    ("encoded -> worker thread runs", "encoded", "thread"),
    ("write (open, writev)", "thread", "written"),
    ("fsync file", "written", "file_synced"),
    ("link (+ index object)", "file_synced", "linked"),
    ("fsync directory", "linked", "dir_synced"),
    ("thread -> back on the event loop", "dir_synced", "stored"),
    ("stored -> commit starts (the previous flush's commit)", "stored", "commit_start"),
    ("metadata commit (SQLite, fsync WAL)", "commit_start", "committed"),
    ("  of which: the KV commit itself", None, None),
    ("committed -> futures answered", "committed", "answered"),
    ("answered -> response built", "answered", "built"),
    ("built -> handed to the socket", "built", "sent"),
    ("total: request read -> sent", "start", "sent"),
]


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def breakdown(spans: dict) -> tuple[list[tuple], dict]:
    flushes = {f["id"]: f for f in spans["flushes"]}
    by_log: dict[str, list[dict]] = {}
    for f in spans["flushes"]:
        for name in f.get("logs", [f["log"]]):  # a write-ahead cycle: each partition it took
            by_log.setdefault(name, []).append(f)
    rows: dict[str, list[float]] = {label: [] for label, _, _ in STEPS}
    used = 0
    for rec in spans["requests"]:
        answered = [a for a in rec["appends"] if a.get("answered") is not None and a.get("flush") is not None]
        if not answered or "sent" not in rec or len(answered) != len(rec["appends"]):
            continue
        last = max(answered, key=lambda a: a["answered"])
        f = flushes[last["flush"]]
        if any(k not in f for k in ("encoded", "thread", "written", "file_synced", "linked", "stored", "committed")):
            continue
        m = dict(f)
        m.setdefault("dir_synced", m["linked"])  # a tree without directory fsyncs
        m.setdefault("commit_start", m["stored"])  # a tree without pipelined flushes
        m.update(start=rec["start"], append=last["at"], answered=last["answered"], built=rec["built"], sent=rec["sent"])
        if m.get("picked") is None:
            m["picked"] = m["upload"]
        used += 1
        for label, a, b in STEPS:
            if a is not None:
                rows[label].append((m[b] - m[a]) / 1e6)
        # The next flush of a log starts when the previous one's upload is stored (pipelined
        # flushes) or when it has ended (a tree without them). A write-ahead cycle lets its
        # partitions go when its commit starts (pipelined cycles), or when it has answered.
        def busy_until(p):
            if p["log"] == "write-ahead":
                return p.get("commit_start", p.get("end", 0)) if p.get("pipelined") else p.get("end", 0)
            return p.get("stored", p.get("end", 0)) if "commit_start" in p else p.get("end", 0)

        prev = [p for p in by_log[last["log"]] if p["id"] < f["id"] and p["upload"] <= last["at"] < busy_until(p)]
        rows[STEPS[2][0]].append((busy_until(prev[-1]) - last["at"]) / 1e6 if prev else 0.0)
        rows[STEPS[13][0]].append(f.get("kv_commit_ns", 0) / 1e6)
    table = [(label, len(v), pct(v, 50), pct(v, 90), pct(v, 99), sum(v) / len(v) if v else None) for label, v in rows.items()]
    info = {"requests": len(spans["requests"]), "used": used, "flushes": len(spans["flushes"])}
    if spans["flushes"]:
        info["batches_per_flush"] = sum(f["batches"] for f in spans["flushes"]) / len(spans["flushes"])
        info["bytes_per_flush"] = sum(f["bytes"] for f in spans["flushes"]) / len(spans["flushes"])
        info["partitions_per_flush"] = sum(f.get("partitions", 1) for f in spans["flushes"]) / len(spans["flushes"])
    return table, info


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    import run

    run.create_topic(bootstrap, topic, partitions)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_cpu(pid: int) -> float:
    """utime + stime of the broker process so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_once(args) -> dict:
    from tests.support.broker import wait_port

    workdir = Path(tempfile.mkdtemp(prefix="kafscale-bench-spans-"))
    out = workdir / "spans.json"
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": f"{args.src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, str(HERE / "flush_spans.py"), str(out), "broker", "--listen", bootstrap, "--advertise", bootstrap,
           "--data-dir", str(workdir), "--http", "", *args.broker_args]
    log = open(workdir / "broker.log", "wb")
    broker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    ctx = mp.get_context("spawn")
    procs = []
    try:
        wait_port(port, 120, broker)
        topic = f"spans-{args.size}-{args.compression}"
        create_topic(bootstrap, topic, args.partitions)
        n_prod = args.producers or (2 if args.size <= 1024 else 1)
        cfg = {
            "bootstrap": bootstrap, "topic": topic, "partitions": args.partitions, "size": args.size,
            "compression": args.compression, "seconds": 0, "messages": 0, "paced_seconds": args.seconds,
            "rate": args.rate_mb * MB / args.size / n_prod, "drain_seconds": 30, "queue_kbytes": 1024 * 1024,
            "queue_messages": 100_000, "linger_ms": args.linger_ms,
        }
        q = ctx.Queue()
        ready, done = ctx.Event(), ctx.Event()
        starts = [ctx.Event(), ctx.Event()]
        total, progress, lat_from = ctx.Value("q", 1 << 62), ctx.Value("q", 0), ctx.Value("q", 0)
        if args.tail:
            e2e = ctx.Process(target=loadgen.e2e_consumer_proc, args=(cfg, ready, done, total, progress, lat_from, q), daemon=True)
            e2e.start()
            procs.append(e2e)
            ready.wait(60)
        for i in range(n_prod):
            p = ctx.Process(target=loadgen.producer_proc, args=(i, cfg, starts, q), daemon=True)
            p.start()
            procs.append(p)
        msgs = [q.get(timeout=60) for _ in range(n_prod)]
        assert all(m["kind"] == "producer-ready" for m in msgs), msgs
        starts[0].set()
        got = [q.get(timeout=60) for _ in range(n_prod)]  # phase 1: nothing to send
        lat_from.value = time.time_ns()
        cpu_from = broker_cpu(broker.pid)
        starts[1].set()
        got = []
        while len(got) < n_prod:
            m = q.get(timeout=args.seconds + 120)
            if m["kind"] == "producer" and m["phase"] == 2:
                got.append(m)
        cpu = broker_cpu(broker.pid) - cpu_from
        done.set()
        total.value = 0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
        log.close()
    import numpy as np

    lat = np.concatenate([np.frombuffer(m["lat_ms"], dtype=np.float32) for m in got])
    spans = json.loads(out.read_text())
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    delivered = sum(m["delivered"] for m in got)
    return {
        "delivered": delivered,
        "errors": sum(m["errors"] for m in got),
        "overloaded": any(m.get("overloaded") for m in got),
        "mb_per_s": delivered * args.size / MB / max(m["elapsed"] for m in got),
        "produce_p50_ms": float(np.percentile(lat, 50)),
        "produce_p99_ms": float(np.percentile(lat, 99)),
        "broker_cpu_s": cpu,
        "spans": spans,
    }


def fmt(v) -> str:
    return "-" if v is None else f"{v:8.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--compression", default="lz4")
    ap.add_argument("--rate-mb", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=8.0, help="paced phase length")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=0, help="default: 2 up to 1 KiB records, else 1 (as bench/run.py)")
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--no-tail", dest="tail", action="store_false", help="no consumer tailing the topic")
    ap.add_argument("--src", default=str(REPO / "src"), help="the broker's source tree (another checkout's src: before/after in one window)")
    ap.add_argument("--json", help="write the spans and figures here")
    ap.add_argument("broker_args", nargs="*", help="extra kafscale broker flags (after --)")
    args = ap.parse_args(argv)
    print(f"uptime before: {uptime()}")
    res = run_once(args)
    print(f"uptime after:  {uptime()}")
    print(
        f"{args.size} B {args.compression}, {args.rate_mb:g} MB/s paced for {args.seconds:g} s over {args.partitions} partitions: "
        f"{res['delivered']} records ({res['mb_per_s']:.2f} MB/s), {res['errors']} errors"
        + (", OVERLOADED" if res["overloaded"] else "")
    )
    print(f"producers (librdkafka delivery reports): p50 {res['produce_p50_ms']:.2f} ms, p99 {res['produce_p99_ms']:.2f} ms")
    table, info = breakdown(res["spans"])
    print(f"broker CPU over the paced phase (span recording included): {res['broker_cpu_s']:.2f} s, "
          f"{res['broker_cpu_s'] * 1e6 / max(1, info['requests']):.0f} us per acked Produce request")
    pauses = res["spans"].get("gc", [])
    if pauses:
        ms = sorted(p[1] / 1e6 for p in pauses)
        print(f"cyclic GC over the broker's life: {len(ms)} collections ({sum(1 for p in pauses if p[0] == 2)} full), "
              f"{sum(ms):.0f} ms in all, p50 {pct(ms, 50):.2f} ms, p99 {pct(ms, 99):.2f} ms, max {ms[-1]:.2f} ms")
        reqs = res["spans"]["requests"]
        if reqs:
            first, last = min(r["start"] for r in reqs), max(r.get("sent", r["start"]) for r in reqs)
            during = [p for p in pauses if first <= p[2] <= last]
            print(f"  while Produce requests were served: {len(during)} collections, {sum(p[1] for p in during) / 1e6:.0f} ms, "
                  f"full ones: {[round(p[1] / 1e6, 1) for p in during if p[0] == 2]} ms")
    print(
        f"broker: {info['requests']} acked Produce requests ({info['used']} traced whole), {info['flushes']} flushes, "
        f"{info.get('batches_per_flush', 0):.1f} batches, {info.get('partitions_per_flush', 0):.1f} partitions and "
        f"{info.get('bytes_per_flush', 0) / 1024:.1f} KiB per flush"
    )
    print(f"\n{'step (ms, per request: its partition answered last)':58} {'n':>6} {'p50':>8} {'p90':>8} {'p99':>8} {'mean':>8}")
    for label, n, p50, p90, p99, mean in table:
        print(f"{label:58} {n:6d} {fmt(p50)} {fmt(p90)} {fmt(p99)} {fmt(mean)}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in res.items()} | {"table": table, "info": info}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
