"""Where does our broker spend its time under a produce load? py-spy, from the outside.

    .venv/bin/python bench/profile_produce.py                    # file store, 1 KiB, 15 s
    .venv/bin/python bench/profile_produce.py --storage s3 --size 100 --compression lz4

Starts `kafscale broker` (embedded, or etcd + S3 on moto with `--storage s3`), creates a
topic, runs librdkafka producers (acks=all, no consumer) as fast as they go, and after a
warm-up samples the broker with py-spy twice, `--seconds` each:

* cpu: `--gil --native`: only the thread holding the GIL, with C frames. This is where the
  broker's Python CPU goes (the event loop, handlers, and the C code they call); a sample in
  libc or another native library without symbols is charged to the Python line calling it
  ("memcpy-like libc code called from logs.py:217").
* wall: all threads that are not idle (non-blocking sampling): shows what the worker
  threads of `asyncio.to_thread` are blocked on (fsync, rename, S3 requests).

For each it prints the top functions by self samples (top of the stack) and the kafscale
functions by inclusive samples, and self samples by module. The collapsed stacks are kept
next to `--out` (`*.cpu.collapsed`, `*.wall.collapsed`) for a flame graph
(https://www.speedscope.app reads them), with the printed report in `*.txt`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402


def produce_proc(idx: int, cfg: dict, out_q) -> None:
    from confluent_kafka import Producer

    size = cfg["size"]
    body_len = max(0, size - loadgen.TS.size)
    pool = loadgen.payload_pool(idx + 1)
    span = len(pool) - body_len - 1
    delivered = [0]

    def cb(err, msg):
        if err is None:
            delivered[0] += 1

    p = Producer(
        {
            "bootstrap.servers": cfg["bootstrap"],
            "acks": "all",
            "compression.type": cfg["compression"],
            "linger.ms": 5,
            "queue.buffering.max.kbytes": cfg.get("queue_kbytes", 16384),
            "log_level": 3,
        }
    )
    p.list_topics(cfg["topic"], timeout=15)
    t0 = time.perf_counter()
    deadline = t0 + cfg["seconds"]
    i = 0
    rate = cfg.get("rate")  # records/s for this producer, None: as fast as it goes
    while time.perf_counter() < deadline:
        if rate and i >= (time.perf_counter() - t0) * rate:
            p.poll(0.001)
            continue
        off = (i * 7919) % span
        try:
            p.produce(cfg["topic"], loadgen.TS.pack(time.time_ns()) + pool[off : off + body_len], on_delivery=cb)
        except BufferError:
            p.poll(0.002)
            continue
        i += 1
        if not i & 255:
            p.poll(0)
    p.flush(30)
    out_q.put({"delivered": delivered[0], "elapsed": time.perf_counter() - t0})


def tail_proc(cfg: dict) -> None:
    """A consumer tailing the topic as it is produced (what bench/run.py's saturated phase runs)."""
    c = loadgen._consumer(cfg["bootstrap"], cfg["topic"])
    loadgen._assign_all(c, cfg["topic"], cfg["partitions"])
    deadline = time.perf_counter() + cfg["seconds"] + 5
    while time.perf_counter() < deadline:
        c.consume(10_000, 0.1)
    c.close()


FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short_file(path: str) -> str:
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            return rest.split("/", 1)[1] if marker == "/lib/python3" and "/" in rest else rest
    return path


def module_of(path: str) -> str:
    f = short_file(path)
    parts = f.split("/")
    if parts[0] == "kafscale" and len(parts) > 2:
        return "/".join(parts[:2])  # kafscale/storage, kafscale/broker, ...
    return parts[0].removesuffix(".py")


def _frame(fr: str) -> tuple[str, str, str | None]:
    m = FRAME.match(fr)
    if not m:
        return fr, "", None
    return m.group("func"), short_file(m.group("file")), m.group("line")


def _is_anonymous_native(func: str, file: str) -> bool:
    return func.startswith("0x") or file.startswith("libc.so") or file.startswith("libpthread")


def parse_raw(text: str):
    """py-spy raw output: 'frame;frame;...;leaf count' per line, root first."""
    self_t, incl, by_module, threads = Counter(), Counter(), Counter(), Counter()
    total = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, n = line.rpartition(" ")
        try:
            n = int(n)
        except ValueError:
            continue
        frames = stack.split(";")
        head = [f for f in frames if f.startswith("thread ") or f.startswith("process ")]
        frames = [f for f in frames if not (f.startswith("thread ") or f.startswith("process "))]
        if head:
            threads[head[-1]] += n
        if not frames:
            continue
        total += n
        parsed = [_frame(fr) for fr in frames]
        func, file, _line = parsed[-1]
        by_module[module_of(file) if file else "?"] += n
        if _is_anonymous_native(func, file):
            # Charge libc (memcpy, write, futex ...) to the nearest caller with a name.
            caller = next(((f, fl, ln) for f, fl, ln in reversed(parsed[:-1]) if not _is_anonymous_native(f, fl)), None)
            lib = file or "native"
            if caller:
                where = f"{caller[1]}:{caller[2]}" if caller[2] else caller[1]
                self_t[(f"{'' if func.startswith('0x') else func + ' '}[{lib}] called from {caller[0]}", where)] += n
            else:
                self_t[(func, lib)] += n
        else:
            self_t[(func, file)] += n
        for k in {(f, fl) for f, fl, _ in parsed}:
            incl[k] += n
    return total, self_t, incl, by_module, threads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=12, help="length of each of the two sampling windows (after a 3 s warm-up)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--storage", choices=["file", "s3"], default="file")
    ap.add_argument("--mb-per-s", type=float, default=0, help="pace the producers at this many MB/s in total (0: as fast as they go)")
    ap.add_argument("--tail", action="store_true", help="also run a consumer tailing the topic (as bench/run.py does)")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=str(HERE / "results" / "profile-produce"), help="prefix for .txt and .{cpu,wall}.collapsed")
    args = ap.parse_args(argv)

    import brokers as B
    from run import create_topic

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        print("py-spy not found: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    shared = B.Shared()
    broker = B.BROKERS["kafscale-s3" if args.storage == "s3" else "kafscale-file"](shared, f"profile-{int(time.time())}")
    ctx = mp.get_context("spawn")
    procs = []
    report = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        report.append(line)

    try:
        broker.start()
        topic = "profile"
        create_topic(broker.bootstrap, topic, args.partitions)
        warmup = 3.0
        cfg = {"bootstrap": broker.bootstrap, "topic": topic, "size": args.size, "compression": args.compression,
               "seconds": warmup + 2 * (args.seconds + 2), "partitions": args.partitions,
               "rate": args.mb_per_s * 1e6 / args.size / args.producers if args.mb_per_s else None}  # fmt: skip
        q = ctx.Queue()
        for i in range(args.producers):
            p = ctx.Process(target=produce_proc, args=(i, cfg, q), daemon=True)
            p.start()
            procs.append(p)
        if args.tail:
            procs.append(ctx.Process(target=tail_proc, args=(cfg,), daemon=True))
            procs[-1].start()
        time.sleep(warmup + 1.0)  # spawn + connect + warm-up
        say(f"kafscale broker ({args.storage} store), {args.producers} producer(s), {args.size} B records, "
            f"compression {args.compression}, acks=all, {args.partitions} partitions, linger.ms=5"
            + (f", paced at {args.mb_per_s:g} MB/s" if args.mb_per_s else "")
            + (", one consumer tailing the topic" if args.tail else ""))  # fmt: skip
        tmp = Path(tempfile.mkdtemp(prefix="kafscale-pyspy-"))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        windows = [
            ("cpu", ["--gil", "--native"], "samples of the thread holding the GIL, C frames included"),
            ("wall", ["--nonblocking"], "samples of every non-idle thread, blocked ones included"),
        ]
        for name, flags, what in windows:
            raw = tmp / f"{name}.txt"
            cmd = [pyspy, "record", "--pid", str(broker.pid), "--duration", str(int(args.seconds)), "--rate", str(args.rate),
                   "--format", "raw", "--threads", "--output", str(raw), *flags]  # fmt: skip
            cpu0 = B.cpu_seconds(broker.pid)
            t0 = time.perf_counter()
            spy = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            cpu = B.cpu_seconds(broker.pid) - cpu0
            if spy.returncode != 0 or not raw.exists():
                print(f"py-spy failed ({spy.returncode}):\n{spy.stderr}", file=sys.stderr)
                return 1
            total, self_t, incl, by_module, threads = parse_raw(raw.read_text())
            shutil.copy(raw, out.with_suffix(f".{name}.collapsed"))
            say()
            say(f"== {name}: py-spy {' '.join(flags)}: {total} {what}, at {args.rate}/s for {wall:.1f} s")
            say(f"broker CPU meanwhile: {cpu:.1f} s ({100 * cpu / wall:.0f}% of one core)")
            say("samples by thread:")
            for t, n in threads.most_common(4):
                say(f"  {100 * n / total:5.1f}%  {t}")
            if len(threads) > 4:
                rest = sum(n for _, n in threads.most_common()[4:])
                say(f"  {100 * rest / total:5.1f}%  {len(threads) - 4} other threads")
            say(f"top {args.top} by self samples (top of the stack):")
            for (func, f), n in self_t.most_common(args.top):
                say(f"  {100 * n / total:5.1f}%  {func}  [{f}]")
            say(f"top {args.top} kafscale functions by inclusive samples (anywhere in the stack):")
            ours = [(k, n) for k, n in incl.most_common() if k[1].startswith("kafscale/") and k[0] not in ("<module>", "main", "_run_broker")]
            for (func, f), n in ours[: args.top]:
                say(f"  {100 * n / total:5.1f}%  {func}  [{f}]")
            say("self samples by module:")
            for mod, n in by_module.most_common(12):
                say(f"  {100 * n / total:5.1f}%  {mod}")
        results = [q.get(timeout=120) for _ in range(args.producers)]
        delivered = sum(r["delivered"] for r in results)
        elapsed = max(r["elapsed"] for r in results)
        say()
        say(f"load over the whole run: {delivered / elapsed:,.0f} msgs/s, {delivered * args.size / elapsed / 1e6:.1f} MB/s over {elapsed:.1f} s")
        out.with_suffix(".txt").write_text("\n".join(report) + "\n")
        print(f"\nwrote {out.with_suffix('.txt')} and {out}.{{cpu,wall}}.collapsed", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
        broker.cleanup()
        shared.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
