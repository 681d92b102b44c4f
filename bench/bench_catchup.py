"""Catch-up read alone: one producer fills a topic, then one consumer reads it all.

Outside bench/run.py's three-phase harness (no tailing consumer, no paced phase), so the
read path of each broker is measured on its own. The consumer uses `consume(10000)` to keep
Python's per-message cost low, and librdkafka's statistics give the Fetch requests sent.

    .venv/bin/python bench/bench_catchup.py --size 16384 --records 30000 [--brokers kafscale-file,tansu-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as B  # noqa: E402


def fill(bootstrap: str, topic: str, size: int, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 3})
    value = os.urandom(size)
    for i in range(records):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.001)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0, "records left undelivered"


def read_all(bootstrap: str, topic: str, partitions: int, records: int, pid: int) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    stats: dict = {}
    c = Consumer(
        {
            "bootstrap.servers": bootstrap, "group.id": "catchup", "enable.auto.commit": False, "log_level": 3,
            "fetch.queue.backoff.ms": 20,  # as in loadgen.py: the 1 s default measures the client's queue
            "statistics.interval.ms": 500, "stats_cb": lambda s: stats.update(last=json.loads(s)),
        }
    )  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = nbytes = 0
    cpu0 = B.cpu_seconds(pid)
    t0 = time.perf_counter()
    while got < records and time.perf_counter() - t0 < 120:
        for m in c.consume(min(10_000, records - got), 0.5):  # at most what is left (see loadgen.py)
            if not m.error():
                got += 1
                nbytes += len(m)
    elapsed = time.perf_counter() - t0
    cpu = B.cpu_seconds(pid) - cpu0
    c.poll(0.6)  # one more statistics callback, after the last fetch
    fetches = sum(b.get("req", {}).get("Fetch", 0) for b in stats.get("last", {}).get("brokers", {}).values())
    c.close()
    return {"records": got, "seconds": elapsed, "msgs_per_s": got / elapsed, "mb_per_s": nbytes / elapsed / 1e6, "broker_cpu_s": cpu, "fetch_requests": fetches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--records", type=int, default=30_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--brokers", default="kafscale-file,tansu-memory")
    ap.add_argument("--runs", type=int, default=2, help="runs per broker, alternating")
    args = ap.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    shared = B.Shared()
    try:
        for run in range(args.runs):
            for name in args.brokers.split(","):
                broker = {"kafscale-file": lambda: B.KafscaleBroker(shared, f"c{run}", False),
                          "tansu-memory": lambda: B.TansuBroker(shared, f"c{run}", False)}[name]()  # fmt: skip
                broker.start()
                try:
                    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept alive until the result
                    admin.create_topics([NewTopic("t", args.partitions, 1)])["t"].result()
                    fill(broker.bootstrap, "t", args.size, args.records)
                    time.sleep(1)
                    r = read_all(broker.bootstrap, "t", args.partitions, args.records, broker.pid)
                    print(f"{name:14s} {r['msgs_per_s']:10,.0f} msgs/s {r['mb_per_s']:7.0f} MB/s  broker CPU {r['broker_cpu_s']:.2f} s  "
                          f"{r['fetch_requests']} Fetch requests  ({r['records']:,} records in {r['seconds']:.2f} s)")
                finally:
                    broker.cleanup()
    finally:
        shared.close()


if __name__ == "__main__":
    main()
