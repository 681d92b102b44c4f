"""Acknowledgement latency of one-record-at-a-time producers (issue 8), and S3 PUTs per GiB
under sustained load with the default flush settings.

    .venv/bin/python bench/bench_acks.py [--records 500] [--s3]

Prints p50/p99 per client; figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import BrokerProcess  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(name: str, lat: list[float]) -> None:
    ms = [x * 1000 for x in lat]
    print(f"{name:<44} n={len(ms):5d}  p50 {statistics.median(ms):7.2f} ms  p99 {pct(ms, 0.99):7.2f} ms  total {sum(lat):6.2f} s", flush=True)


def confluent_flush_each(bootstrap: str, topic: str, n: int) -> list[float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    p.produce(topic, b"warm-up")
    p.flush(10)
    out = []
    for i in range(n):
        t = time.perf_counter()
        p.produce(topic, b"r-%d" % i)
        p.flush(10)
        out.append(time.perf_counter() - t)
    return out


def kafka_python_get(bootstrap: str, topic: str, n: int) -> list[float]:
    import kafka

    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    p.send(topic, b"warm-up").get(10)
    out = []
    for i in range(n):
        t = time.perf_counter()
        p.send(topic, b"r-%d" % i).get(10)
        out.append(time.perf_counter() - t)
    p.close()
    return out


def aiokafka_send_and_wait(bootstrap: str, topic: str, n: int) -> list[float]:
    import aiokafka

    async def run():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        await p.send_and_wait(topic, b"warm-up")
        out = []
        for i in range(n):
            t = time.perf_counter()
            await p.send_and_wait(topic, b"r-%d" % i)
            out.append(time.perf_counter() - t)
        await p.stop()
        return out

    return asyncio.run(run())


def s3_puts_per_gib(seconds: float) -> None:
    """Sustained produce to one partition on S3 (moto) with default flush settings."""
    import re

    from confluent_kafka import Producer

    from tests.support.servers import start_etcd, start_moto

    etcd, moto = start_etcd(), start_moto()
    b = BrokerProcess(extra_args=["--metadata", etcd.url, "--storage", "s3://acks/bench"], env={**moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true"}).start()
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "acks": "all", "queue.buffering.max.kbytes": 65536})
        value = b"x" * 1024
        p.produce("s3-sustained", value)
        p.flush(30)
        before = sum(1 for line in moto.log_tail(10**9).splitlines() if re.search(r'"PUT /acks/bench/', line))
        sent, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            try:
                p.produce("s3-sustained", value)
                sent += len(value)
            except BufferError:
                p.poll(0.01)
        p.flush(60)
        time.sleep(0.2)
        puts = sum(1 for line in moto.log_tail(10**9).splitlines() if re.search(r'"PUT /acks/bench/', line)) - before
        gib = sent / 2**30
        print(f"S3 sustained produce: {sent / 1e6:.0f} MB in {seconds:.0f} s, {puts} PUTs -> {puts / gib:.0f} PUTs/GiB "
              f"(spec profile: 4 MiB segments + index = 512 PUTs/GiB)", flush=True)
    finally:
        b.stop()
        etcd.cleanup()
        moto.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--s3", action="store_true", help="also measure PUTs/GiB on S3 (moto) under sustained load")
    ap.add_argument("--s3-seconds", type=float, default=15)
    args = ap.parse_args()
    b = BrokerProcess().start()
    try:
        print(f"embedded broker (file store, default min flush interval 0): {args.records} records each")
        report("confluent-kafka produce()+flush() per record", confluent_flush_each(b.bootstrap, "acks-ck", args.records))
        report("kafka-python send().get() per record", kafka_python_get(b.bootstrap, "acks-kp", args.records))
        report("aiokafka send_and_wait() per record", aiokafka_send_and_wait(b.bootstrap, "acks-aio", args.records))
    finally:
        b.stop()
    if args.s3:
        s3_puts_per_gib(args.s3_seconds)


if __name__ == "__main__":
    main()
