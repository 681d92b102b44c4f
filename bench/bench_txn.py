"""Transactions (issue 15): produce throughput and commit latency of a transactional producer
against the same load without transactions, embedded and on S3 (moto + etcd), with Tansu
side by side where its transactions work.

    .venv/bin/python bench/bench_txn.py [--batches 200] [--per-batch 100] [--size 1024] [--only kafscale-file,...]

Load: `--batches` groups of `--per-batch` records of `--size` bytes to one partition with
confluent-kafka (acks=all). Idempotent: produce the group, flush. Transactional: begin,
produce the group, flush, commit_transaction (the commit's time is EndTxn: the coordinator
persists PrepareCommit and answers; markers follow). Prints MB/s and the p50/p99 of the
per-group flush and of the commit; figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.brokers import BROKERS, Shared  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"p50 {statistics.median(values) * 1000:7.2f} ms  p99 {pct(values, 0.99) * 1000:7.2f} ms"


def run_load(bootstrap: str, transactional: bool, batches: int, per_batch: int, size: int) -> dict:
    from confluent_kafka import Producer

    topic = f"txn-bench-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True,
            "queue.buffering.max.kbytes": 262144}
    if transactional:
        conf["transactional.id"] = f"bench-{topic}"
    p = Producer(conf)
    if transactional:
        p.init_transactions(60)
    value = b"x" * size
    if transactional:
        p.begin_transaction()
    p.produce(topic, value)  # creates the topic, finds the leader
    p.flush(60)
    if transactional:
        p.commit_transaction(60)
    flushes, commits = [], []
    start = time.perf_counter()
    for _ in range(batches):
        if transactional:
            p.begin_transaction()
        for _ in range(per_batch):
            while True:
                try:
                    p.produce(topic, value, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
        t = time.perf_counter()
        p.flush(60)
        flushes.append(time.perf_counter() - t)
        if transactional:
            t = time.perf_counter()
            p.commit_transaction(60)
            commits.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    return dict(mbps=batches * per_batch * size / elapsed / 1e6, flushes=flushes, commits=commits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--only", default="kafscale-file,kafscale-s3,tansu-memory,tansu-s3")
    args = ap.parse_args()
    shared = Shared()
    print(f"{args.batches} groups of {args.per_batch} x {args.size} B records, acks=all, one partition", flush=True)
    try:
        for name in args.only.split(","):
            broker = BROKERS[name](shared, f"txn-{uuid.uuid4().hex[:6]}")
            try:
                broker.start()
            except Exception as e:  # noqa: BLE001
                print(f"{name:<14} not started: {e}", flush=True)
                broker.cleanup()
                continue
            try:
                for transactional in (False, True):
                    kind = "transactional" if transactional else "idempotent"
                    try:
                        r = run_load(broker.bootstrap, transactional, args.batches, args.per_batch, args.size)
                    except Exception as e:  # noqa: BLE001  (a peer without working transactions)
                        print(f"{name:<14} {kind:<13} failed: {e}", flush=True)
                        continue
                    line = f"{name:<14} {kind:<13} {r['mbps']:7.2f} MB/s  flush {ms(r['flushes'])}"
                    if transactional:
                        line += f"  commit (EndTxn) {ms(r['commits'])}"
                    print(line, flush=True)
            finally:
                broker.cleanup()
    finally:
        shared.close()


if __name__ == "__main__":
    main()
