"""Security overhead (#17): produce and consume throughput of the same librdkafka load over
PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512) listeners of one broker, and the rate of new
connections that complete a SCRAM-SHA-512 authentication.

    .venv/bin/python bench/bench_security.py [--mb 200] [--record-bytes 1024] [--connections 50]

Prints MB/s per listener and its ratio to plaintext; figures, not assertions.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import BrokerProcess, free_port  # noqa: E402


def produce(conf: dict, topic: str, total: int, size: int) -> float:
    from confluent_kafka import Producer

    p = Producer({**conf, "linger.ms": 5, "batch.size": 1 << 20, "acks": "all", "queue.buffering.max.kbytes": 1 << 20})
    value = b"x" * size
    n = total // size
    t0 = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    return n * size / (time.perf_counter() - t0) / 1e6


def consume(conf: dict, topic: str, total: int) -> float:
    from confluent_kafka import Consumer

    c = Consumer({**conf, "group.id": f"{topic}-bench", "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.max.bytes": 50 << 20})
    c.subscribe([topic])
    got, t0 = 0, None
    deadline = time.monotonic() + 120
    while got < total and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                t0 = t0 or time.perf_counter()
                got += len(m.value())
    c.close()
    return got / (time.perf_counter() - t0) / 1e6 if t0 else 0.0


def scram_connections(conf: dict, n: int) -> float:
    from confluent_kafka.admin import AdminClient

    t0 = time.perf_counter()
    for _ in range(n):
        a = AdminClient(conf)
        a.list_topics(timeout=10)  # connect, handshake, authenticate, one request
        del a
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--connections", type=int, default=50)
    args = ap.parse_args()
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    from kafscale.security import certs

    d = tempfile.mkdtemp(prefix="kafscale-bench-sec-")
    paths = certs.write_self_signed(d)
    plain, tls, sasl = free_port(), free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls},SASL_SSL://127.0.0.1:{sasl}",
        "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--sasl-mechanisms", "SCRAM-SHA-512"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("bench", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"bench-pw")])["bench"].result(10)
        confs = {
            "PLAINTEXT": {"bootstrap.servers": b.bootstrap},
            "SSL": {"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL", "ssl.ca.location": paths["ca"]},
            "SASL_SSL SCRAM-SHA-512": {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_SSL", "ssl.ca.location": paths["ca"],
                                       "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench", "sasl.password": "bench-pw"},
        }
        total = args.mb * 1_000_000
        base = None
        print(f"{args.mb} MB of {args.record_bytes} B records, acks=all, one producer then one consumer per listener")
        for name, conf in confs.items():
            topic = "bench-sec-" + name.split()[0].lower().replace("_", "-")
            p_mb = produce(conf, topic, total, args.record_bytes)
            c_mb = consume(conf, topic, total // args.record_bytes * args.record_bytes)
            base = base or (p_mb, c_mb)
            print(f"{name:<24} produce {p_mb:7.1f} MB/s ({p_mb / base[0]:4.2f}x)   consume {c_mb:7.1f} MB/s ({c_mb / base[1]:4.2f}x)", flush=True)
        for name in ("PLAINTEXT", "SASL_SSL SCRAM-SHA-512"):
            rate = scram_connections(confs[name], args.connections)
            print(f"{name:<24} new connections with one Metadata request: {rate:6.1f}/s ({args.connections} in a row)", flush=True)
    finally:
        b.stop()


if __name__ == "__main__":
    main()
