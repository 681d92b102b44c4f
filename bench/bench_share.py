"""Share groups (KIP-932): records/s acknowledged by 1, 2 and 4 confluent-kafka
ShareConsumers on one partition, against a classic consumer reading the same topic, and
what the acknowledgements cost the stores: metadata writes and object-store PUTs per 1,000
acknowledged records, and the broker's CPU time per 1,000 (from the broker's /metrics: a
figure the load of a shared machine moves less than records/s).

    .venv/bin/python bench/bench_share.py [--records 20000] [--size 100] [--s3]

Implicit acknowledgement (each poll accepts the previous one's records); the consumers
are threads of this process (librdkafka does the work outside the GIL). Prints figures,
asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support.broker import BrokerProcess, free_port  # noqa: E402


def store_calls(http_port: int) -> dict[str, float]:
    """Calls so far: metadata commits and gets, object-store puts and gets; and the broker
    process's CPU seconds."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {"metadata commit": 0.0, "metadata get": 0.0, "object put": 0.0, "object get": 0.0, "cpu": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "kafscale_metadata_request_duration_seconds_count" and s.labels.get("op") in ("commit", "get"):
                out[f"metadata {s.labels['op']}"] += s.value
            elif s.name == "kafscale_object_store_request_duration_seconds_count" and s.labels.get("op") in ("put", "get"):
                out[f"object {s.labels['op']}"] += s.value
            elif s.name == "kafscale_process_cpu_seconds_total":
                out["cpu"] = s.value
    return out


def produce(bootstrap: str, topic: str, n: int, size: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 1000})
    value = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value)
                break
            except BufferError:
                p.poll(0.1)
    assert p.flush(60) == 0


def set_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.incremental_alter_configs([r]).values():
        fut.result(15)


def share_run(bootstrap: str, topic: str, n: int, consumers: int) -> tuple[float, list[int]]:
    """Seconds from the first record read until `n` records were read and accepted by
    `consumers` share consumers (each poll accepting the previous), and how many each read."""
    from confluent_kafka import ShareConsumer

    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    set_earliest(bootstrap, group)
    counts = [0] * consumers
    done = threading.Event()
    lock = threading.Lock()
    first: list[float] = []

    def run(i: int) -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
        c.subscribe([topic])
        try:
            while not done.is_set():
                got = sum(1 for m in c.poll(0.2) if m.error() is None)
                with lock:
                    if got and not first:
                        first.append(time.perf_counter())
                    counts[i] += got
                    if sum(counts) >= n:
                        done.set()
            c.commit_sync(10)  # the last poll's records (librdkafka 2.16's close() leaves them acquired)
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - first[0], counts


def classic_run(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-classic-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    started = None
    read = 0
    try:
        while read < n:
            got = sum(1 for m in c.consume(1000, 0.2) if m.error() is None)
            if got and started is None:
                started = time.perf_counter()  # (after the group's join)
            read += got
        return time.perf_counter() - started
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--s3", action="store_true", help="etcd + S3 on moto instead of the embedded stores")
    args = ap.parse_args()
    http = free_port()
    extra = ["--http", f"127.0.0.1:{http}"]
    servers = []
    env = {}
    if args.s3:
        from tests.support.servers import start_etcd, start_moto

        etcd, moto = start_etcd(), start_moto()
        servers = [etcd, moto]
        extra += ["--metadata", etcd.url, "--storage", f"s3://bench-share-{uuid.uuid4().hex[:6]}/b"]
        env = {**moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true"}
    b = BrokerProcess(extra_args=extra, env=env).start()
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-share-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            fut.result(15)
        produce(b.bootstrap, topic, args.records, args.size)
        mode = "etcd + S3 (moto)" if args.s3 else "embedded (SQLite + local directory)"
        print(f"{args.records} records of {args.size} B on one partition, {mode}", flush=True)
        seconds = classic_run(b.bootstrap, topic, args.records)
        print(f"{'classic consumer':<22} {args.records / seconds:9.0f} records/s", flush=True)
        for consumers in (1, 2, 4):
            before = store_calls(http)
            seconds, counts = share_run(b.bootstrap, topic, args.records, consumers)
            time.sleep(0.5)  # the closing acknowledgements
            after = store_calls(http)
            per_k = {k: (after[k] - before[k]) * 1000 / args.records for k in after}
            print(f"{f'{consumers} share consumer(s)':<22} {args.records / seconds:9.0f} records/s acknowledged"
                  f"  (read {counts});  per 1,000 acknowledgements: {per_k['metadata commit']:.1f} metadata writes,"
                  f" {per_k['metadata get']:.1f} metadata reads, {per_k['object put']:.1f} object PUTs,"
                  f" {per_k['object get']:.1f} object GETs, {per_k['cpu'] * 1000:.0f} ms broker CPU", flush=True)
    finally:
        b.stop()
        for s in servers:
            s.cleanup()


if __name__ == "__main__":
    main()
