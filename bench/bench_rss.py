"""The broker's resident memory under steady produce+consume, and after the load stops.

    .venv/bin/python bench/bench_rss.py                  # 5 minutes of load, 60 s idle
    .venv/bin/python bench/bench_rss.py --minutes 1 --idle-seconds 30
    .venv/bin/python bench/bench_rss.py --broker-arg=--cache-bytes=67108864

Starts `kafscale broker` (embedded metadata, file:// store), creates a topic, and runs
librdkafka producers (acks=all, a fixed rate: steady, not flat out) and a consumer group
reading everything, each in its own process. Every `--sample-seconds` it prints the
broker's RSS (VmRSS of /proc/PID/status) with the throughput of that interval; at the end
RSS after the load and after `--idle-seconds` with no clients at all, then the same as
one JSON line (for comparing runs).

Measured (2 cores, defaults: 10 MB/s, 256 MiB cache, 3 minutes, 60 s idle): before the
read buffers, cache accounting and malloc trimming of #20.7, RSS 411-427 MiB under load
and 420 MiB idle; after, 313-322 MiB (354-381 MiB at moments while the merger rewrites
segments) and 315 MiB idle: 37 MiB of interpreter plus the full cache plus 20-30 MiB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.broker import BrokerProcess  # noqa: E402

MiB = 1024 * 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def producer_proc(bootstrap: str, topic: str, rate_bytes: float, size: int, stop, counter) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True})
    value = os.urandom(size)
    sent, started = 0, time.monotonic()
    while not stop.is_set():
        # Pace to the rate: sleep while ahead of schedule.
        ahead = sent * size / rate_bytes - (time.monotonic() - started)
        if ahead > 0:
            p.poll(min(ahead, 0.05))
            continue
        try:
            p.produce(topic, value, key=str(sent % 1000).encode())
            sent += 1
        except BufferError:
            p.poll(0.01)
        if sent % 500 == 0:
            p.poll(0)
            with counter.get_lock():
                counter.value += 500 * size
    p.flush(30)


def consumer_proc(bootstrap: str, topic: str, stop, counter) -> None:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-readers", "auto.offset.reset": "earliest",
                  "enable.auto.commit": True, "auto.commit.interval.ms": 1000})
    c.subscribe([topic])
    while not stop.is_set():
        for m in c.consume(500, 0.5):
            if m.error() is None:
                with counter.get_lock():
                    counter.value += len(m.value() or b"")
    c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0, help="length of the steady load")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="how long to watch the broker with no clients")
    ap.add_argument("--rate-mb", type=float, default=10.0, help="produce rate in MB/s (all producers together)")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2, help="members of one consumer group")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ap.add_argument("--sample-seconds", type=float, default=15.0)
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag (repeatable), e.g. --broker-arg=--cache-bytes=67108864")
    args = ap.parse_args()

    extra = [a for arg in args.broker_arg for a in arg.split("=", 1)]
    broker = BrokerProcess(extra_args=["--default-partitions", str(args.partitions), "--group-initial-rebalance-delay-ms", "0", *extra]).start()
    pid = broker.proc.pid
    topic = f"rss-{int(time.time())}"
    stop = mp.Event()
    produced, consumed = mp.Value("q", 0), mp.Value("q", 0)
    try:
        time.sleep(1.0)
        start_rss = rss_mib(pid)
        print(f"broker pid {pid}, RSS at start {start_rss:.0f} MiB; load {args.rate_mb:g} MB/s of {args.size} B records, "
              f"{args.producers} producers, {args.consumers} consumers, {args.partitions} partitions, {args.minutes:g} min", flush=True)
        procs = [mp.Process(target=producer_proc, args=(broker.bootstrap, topic, args.rate_mb * 1e6 / args.producers, args.size, stop, produced))
                 for _ in range(args.producers)]
        procs += [mp.Process(target=consumer_proc, args=(broker.bootstrap, topic, stop, consumed)) for _ in range(args.consumers)]
        for p in procs:
            p.start()
        began = time.monotonic()
        end = began + args.minutes * 60
        last_p = last_c = 0
        last_t = began
        samples = []
        while time.monotonic() < end:
            time.sleep(min(args.sample_seconds, max(0.0, end - time.monotonic())))
            now, p_now, c_now = time.monotonic(), produced.value, consumed.value
            rss = rss_mib(pid)
            samples.append((round(now - began), round(rss, 1)))
            print(f"  t={now - began:5.0f}s  RSS {rss:6.0f} MiB  produce {(p_now - last_p) / (now - last_t) / 1e6:5.1f} MB/s  "
                  f"consume {(c_now - last_c) / (now - last_t) / 1e6:5.1f} MB/s", flush=True)
            last_p, last_c, last_t = p_now, c_now, now
        loaded_rss = rss_mib(pid)
        stop.set()
        for p in procs:
            p.join(60)
        idle_started = time.monotonic()
        print(f"load stopped after {args.minutes:g} min: RSS {loaded_rss:.0f} MiB; clients gone, idling {args.idle_seconds:g} s", flush=True)
        time.sleep(args.idle_seconds)
        idle_rss = rss_mib(pid)
        print(f"RSS after {time.monotonic() - idle_started:.0f} s idle: {idle_rss:.0f} MiB", flush=True)
        print(json.dumps({"minutes": args.minutes, "rate_mb": args.rate_mb, "produced_mb": round(produced.value / 1e6),
                          "consumed_mb": round(consumed.value / 1e6), "rss_start_mib": round(start_rss, 1),
                          "rss_loaded_mib": round(loaded_rss, 1), "rss_idle_mib": round(idle_rss, 1),
                          "broker_args": extra, "samples": samples}))
    finally:
        stop.set()
        broker.stop()


if __name__ == "__main__":
    main()
