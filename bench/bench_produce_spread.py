"""The broker's CPU per partition entry of a Produce request spread over many partitions
(#32: 10 MB/s of 1 KiB records over 1,024 partitions is ~50 one-record batches in each
request librdkafka sends every linger.ms).

    .venv/bin/python bench/bench_produce_spread.py [--partitions 1024] [--spread 64] [--rounds 6]
    .venv/bin/python bench/bench_produce_spread.py --tree base=/path/to/base/src --tree this=src   # A/B in one window

Starts `kafscale broker` (embedded metadata, file store; write-ahead objects per
`--write-ahead`, passed as KAFSCALE_WRITE_AHEAD_OBJECTS), creates a topic of `--partitions`
partitions and sends raw Produce v9 requests (acks=-1), each with `--spread` partitions of
one batch of `--records` records of `--size` bytes, cycling through the partitions,
pipelined `--window` at a time. Prints the broker's CPU (utime + stime of the process)
per partition entry and per request, round by round. With several `--tree`s, every round
runs each tree's broker in turn (A/B/A/B: a busy machine spreads its noise over all).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_request_path import run_kind  # noqa: E402
from brokers import cpu_seconds  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.raw import RawClient, req  # noqa: E402

from kafscale.protocol.api_keys import ApiKey  # noqa: E402
from kafscale.protocol.records import build_batch  # noqa: E402

TOPIC = "bench-produce-spread"


def produce_bodies(partitions: int, spread: int, records: int, size: int) -> list:
    """Requests that together cover every partition once (spread partitions each)."""
    batch = build_batch([(None, b"v" * size) for _ in range(records)], timestamp=int(time.time() * 1000))
    out = []
    for first in range(0, partitions, spread):
        pds = tuple(req(ApiKey.PRODUCE, 9, "PartitionProduceData", index=i, records=batch) for i in range(first, min(first + spread, partitions)))
        out.append(req(ApiKey.PRODUCE, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
                       topic_data=(req(ApiKey.PRODUCE, 9, "TopicProduceData", name=TOPIC, partition_data=pds),)))
    return out


def run_tree(src: str, args, bodies: list) -> tuple[float, float]:
    """(broker CPU us per partition entry, client wall us per partition entry)."""
    env = {"PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "KAFSCALE_WRITE_AHEAD_OBJECTS": args.write_ahead}
    broker = BrokerProcess(env=env).start()
    try:
        with RawClient(broker.bootstrap, timeout=60) as client:
            topic = req(ApiKey.CREATE_TOPICS, 5, "CreatableTopic", name=TOPIC, num_partitions=args.partitions, replication_factor=1, assignments=(), configs=())
            client.request(ApiKey.CREATE_TOPICS, 5, req(ApiKey.CREATE_TOPICS, 5, topics=(topic,), timeout_ms=30000, validate_only=False))
            for body in bodies:  # warm-up: every partition's log loaded
                run_kind(client, ApiKey.PRODUCE, 9, body, 1, 1)
            print(f"measuring broker pid {broker.proc.pid}", flush=True)  # (for a profiler to attach to)
            entries = 0
            before = cpu_seconds(broker.proc.pid)
            started = time.perf_counter()
            done = 0
            while done < args.requests:
                for body in bodies:
                    n = min(args.window, args.requests - done)
                    if n <= 0:
                        break
                    run_kind(client, ApiKey.PRODUCE, 9, body, n, n)
                    entries += n * len(body.topic_data[0].partition_data)
                    done += n
            wall = time.perf_counter() - started
            cpu = cpu_seconds(broker.proc.pid) - before
        return cpu / entries * 1e6, wall / entries * 1e6
    finally:
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=1024)
    ap.add_argument("--spread", type=int, default=64, help="partitions in each request")
    ap.add_argument("--records", type=int, default=1, help="records in each partition's batch")
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ap.add_argument("--requests", type=int, default=1500, help="requests per round")
    ap.add_argument("--window", type=int, default=4, help="requests in flight (each answer waits for a flush)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--write-ahead", choices=["true", "false"], default="true")
    ap.add_argument("--tree", action="append", default=[], help="NAME=SRC: a broker source tree to run (repeat for A/B; default this checkout's src)")
    args = ap.parse_args()
    bodies = produce_bodies(args.partitions, args.spread, args.records, args.size)
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(REPO / "src")}
    per: dict[str, list[float]] = {k: [] for k in trees}
    print(f"{args.requests} Produce v9 requests a round, {args.spread} of {args.partitions} partitions each, "
          f"{args.records} x {args.size} B a batch, write-ahead objects {args.write_ahead}; load {os.getloadavg()[0]:.1f}")
    for r in range(args.rounds):
        for name, src in trees.items():
            cpu, wall = run_tree(src, args, bodies)
            per[name].append(cpu)
            print(f"round {r + 1} {name}: {cpu:.1f} us broker CPU per partition entry ({cpu * args.spread / 1000:.2f} ms per request), "
                  f"wall {wall:.1f} us; load {os.getloadavg()[0]:.1f}", flush=True)
    for name, values in per.items():
        print(f"{name}: median {statistics.median(values):.1f} us broker CPU per partition entry (rounds {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
