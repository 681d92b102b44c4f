"""CPU per flush of one partition log on the per-partition path (#33): the broker's own work
around a flush, apart from the network and the Produce request.

    PYTHONPATH=src .venv/bin/python bench/bench_flush_cpu.py [--flushes 2000] [--partitions 1]
    .venv/bin/python bench/bench_flush_cpu.py --tree base=/path/to/base/src --tree this=src --repeat 3   # A/B in one window
    PYTHONPATH=src .venv/bin/python bench/bench_flush_cpu.py --profile 30   # cProfile of the timed loop (event-loop thread)

Runs a `Broker` in process (embedded SQLite metadata, a file store under `--dir`, /dev/shm by
default, so the disk is out of the figures; write-ahead objects off, no timed flushes, no
min flush interval, no merges), creates a topic of `--partitions` partitions, then `--flushes`
times appends one batch of `--records` x `--size` B records to each partition with
PartitionLog.append and awaits its acknowledgement: each round is one flush a partition
(encode, segment file written and fsynced by the store's threads, SQLite commit, answers).
Prints per flush: the process's CPU (utime + stime, every thread), the event-loop thread's
CPU (time.thread_time of the main thread: what saturates the broker under load), the wall
time per round and its p50/p99. With `--tree`s every repeat runs each tree in a child
process in turn (A/B/A/B: a busy machine spreads its noise over all), then the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

TS = 1_700_000_000_000


async def measure(args) -> dict:
    import asyncio
    import resource
    import tempfile

    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig
    from kafscale.metadata.store import TopicMeta
    from kafscale.protocol import records

    data_dir = tempfile.mkdtemp(prefix="bench-flush-cpu-", dir=args.dir)
    sys.setswitchinterval(0.0005)  # as the broker's __main__ sets it
    broker = Broker(BrokerConfig(
        listen="127.0.0.1:0", data_dir=data_dir, http="", flush_interval_ms=600_000, merge_interval_ms=0,
        min_flush_interval_ms=0, write_ahead_objects=False,
    ))
    await broker.start()
    try:
        await broker.metadata.create_topic(TopicMeta("t", args.partitions))
        logs = [await broker.logs.get_log("t", p) for p in range(args.partitions)]
        body = records.build_batch([(None, b"x" * args.size)] * args.records, timestamp=TS)

        async def one(lg):
            buf = memoryview(bytearray(body))  # append patches offsets in place
            _, _, fut = lg.append(buf, records.validate_record_set(buf), True)
            await fut

        async def round_():
            if len(logs) == 1:
                await one(logs[0])
            else:
                await asyncio.gather(*(one(lg) for lg in logs))

        for _ in range(args.warmup):
            await round_()
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        lat = []
        t0 = _main_ticks()
        m0, r0, w0 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _ in range(args.flushes):
            t = time.perf_counter()
            await round_()
            lat.append(time.perf_counter() - t)
        m1, r1, w1 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        t1 = _main_ticks()
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
    finally:
        await broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)  # /dev/shm is memory
    flushes = args.flushes * args.partitions
    lat.sort()
    return {
        "cpu_us": ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / flushes * 1e6,
        "main_us": (m1 - m0) / flushes * 1e6,
        "main_sys_us": (t1[1] - t0[1]) / os.sysconf("SC_CLK_TCK") / flushes * 1e6,
        "sys_us": (r1.ru_stime - r0.ru_stime) / flushes * 1e6,
        "wall_ms": (w1 - w0) / args.flushes * 1e3,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
        "ctx_vol": r1.ru_nvcsw - r0.ru_nvcsw,
        "ctx_invol": r1.ru_nivcsw - r0.ru_nivcsw,
    }


def _main_ticks() -> tuple[int, int]:
    """(utime, stime) clock ticks of the calling thread (Linux)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def line(name: str, r: dict) -> str:
    return (f"{name:>8}: cpu {r['cpu_us']:6.0f} us/flush, main thread {r['main_us']:6.0f} us/flush (system {r['main_sys_us']:.0f}; all threads {r['sys_us']:.0f}), "
            f"wall {r['wall_ms']:.3f} ms/round (p50 {r['p50_ms']:.3f}, p99 {r['p99_ms']:.3f}), "
            f"ctx switches vol {r['ctx_vol']} invol {r['ctx_invol']}")


def child_args(args) -> list[str]:
    return [
        "--flushes", str(args.flushes), "--partitions", str(args.partitions), "--records", str(args.records),
        "--size", str(args.size), "--warmup", str(args.warmup), "--dir", args.dir,
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("flushes_pos", nargs="?", type=int, help=argparse.SUPPRESS)  # the first draft's `N PARTS`
    p.add_argument("partitions_pos", nargs="?", type=int, help=argparse.SUPPRESS)
    p.add_argument("--flushes", type=int, default=2000, help="rounds timed: one flush per partition each (default 2000)")
    p.add_argument("--partitions", type=int, default=1, help="partitions flushed each round, at once (default 1)")
    p.add_argument("--records", type=int, default=50, help="records per batch (default 50)")
    p.add_argument("--size", type=int, default=100, help="bytes per record value (default 100)")
    p.add_argument("--warmup", type=int, default=50, help="untimed rounds first (default 50)")
    p.add_argument("--dir", default=os.environ.get("BENCH_DIR", "/dev/shm"), help="where the data dir goes (default /dev/shm)")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile the timed loop; print the top N by own time to stderr")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=SRC", help="run this checkout's src in a child process (repeatable: A/B)")
    p.add_argument("--repeat", type=int, default=3, help="with --tree: rounds of every tree (default 3)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's answer to its parent
    args = p.parse_args()
    if args.flushes_pos:
        args.flushes = args.flushes_pos
    if args.partitions_pos:
        args.partitions = args.partitions_pos

    if not args.tree:
        import uvloop

        result = uvloop.run(measure(args))
        print(json.dumps(result) if args.json else line("flush", result), flush=True)
        return

    load = os.getloadavg()
    print(f"{args.flushes} rounds x {args.partitions} partitions, {args.records} x {args.size} B a batch, "
          f"data in {args.dir}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    results: dict[str, list[dict]] = {}
    for rnd in range(args.repeat):
        for spec in args.tree:
            name, src = spec.split("=", 1)
            env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
            out = subprocess.run([sys.executable, __file__, "--json", *child_args(args)], env=env, check=True, capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault(name, []).append(r)
            print(f"round {rnd + 1} " + line(name, r), flush=True)
    load = os.getloadavg()
    print(f"medians over {args.repeat} rounds (load average now {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}):")
    for name, rs in results.items():
        print(line(name, {k: statistics.median(r[k] for r in rs) for k in rs[0]}))


if __name__ == "__main__":
    main()
