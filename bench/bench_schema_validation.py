"""What schema validation on produce (confluent.value.schema.validation, issue 29) costs,
and that topics without it pay nothing.

    .venv/bin/python bench/bench_schema_validation.py [--mb 64] [--rounds 3]

One embedded broker with --schema-registry; three topics, produced alternately with the
same confluent-kafka load (1 KiB values carrying a registered schema id, acks=all):
`plain` (no validation), `checked` (value validation, uncompressed) and `checked-lz4`
(value validation, lz4 batches, which the check must decompress). Prints the broker's CPU
seconds per GiB produced and the producer's MB/s per topic (medians over the rounds),
then the in-process cost of the check per 1,000-record batch. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.support.broker import BrokerProcess, free_port, wait_port  # noqa: E402

VALUE_BYTES = 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(bootstrap: str, topic: str, value: bytes, total_bytes: int, compression: str) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": compression})
    failed = []
    n = total_bytes // len(value)
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, on_delivery=lambda err, _m: err and failed.append(err))
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(120)
    elapsed = time.perf_counter() - start
    if failed:
        raise SystemExit(f"{topic}: {len(failed)} records failed, first: {failed[0]}")
    return total_bytes / elapsed / 1e6


def in_process_check_cost() -> None:
    """The check alone (best of 30, the machine is shared): a 1,000-record batch,
    uncompressed and lz4, and the produce path's question for a topic without validation."""
    import timeit

    from kafscale.metadata.topic_config import LogSettings
    from kafscale.protocol import records
    from kafscale.registry.validation import schema_ids

    value = b"\x00\x00\x00\x00\x01" + b"x" * (VALUE_BYTES - 5)
    for codec, name in ((records.COMPRESSION_NONE, "none"), (records.COMPRESSION_LZ4, "lz4")):
        batch = memoryview(bytearray(records.build_batch([(None, value)] * 1000, timestamp=0, codec=codec)))
        headers = records.validate_record_set(batch, None)
        per = min(timeit.repeat(lambda: schema_ids(batch, headers, False, True), number=1, repeat=30))
        print(f"check of a 1,000-record batch ({name:4s}): {per * 1e3:6.3f} ms ({per / 1000 * 1e9:5.0f} ns a record)")
    settings = LogSettings.from_configs({})
    n = 100_000
    asked = min(timeit.repeat(lambda: settings.schema_validation, number=n, repeat=10)) / n
    nothing = min(timeit.repeat(lambda: None, number=n, repeat=10)) / n
    print(f"produce path, topic without validation: {max(asked - nothing, 0) * 1e9:.0f} ns a partition (one settings property, nothing decoded)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="MB produced per topic and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    port = free_port()
    b = BrokerProcess(extra_args=["--schema-registry", f"127.0.0.1:{port}"]).start()
    try:
        wait_port(port, proc=b.proc)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        on = {"confluent.value.schema.validation": "true"}
        topics = {"plain": ({}, "none"), "checked": (on, "none"), "checked-lz4": (on, "lz4")}
        for name, (configs, _c) in topics.items():
            admin.create_topics([NewTopic(name, 1, config=configs)])[name].result(15)
        client = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}"})
        schema = Schema('{"type": "record", "name": "Blob", "fields": [{"name": "data", "type": "bytes"}]}', "AVRO")
        ids = {name: client.register_schema(f"{name}-value", schema) for name in topics}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in topics}
        total = args.mb * 1_000_000
        for r in range(args.rounds):
            for name, (_configs, compression) in topics.items():
                value = b"\x00" + ids[name].to_bytes(4, "big") + os.urandom(VALUE_BYTES // 2).hex().encode()[: VALUE_BYTES - 5]
                before = cpu_seconds(b.proc.pid)
                mbs = produce(b.bootstrap, name, value, total, compression)
                cpu = cpu_seconds(b.proc.pid) - before
                results[name].append((cpu / (total / 2**30), mbs))
                print(f"round {r + 1} {name:12s} broker CPU {cpu / (total / 2**30):6.2f} s/GiB  producer {mbs:6.1f} MB/s", flush=True)
        print(f"\nmedians over {args.rounds} rounds of {args.mb} MB, 1 KiB values:")
        for name in topics:
            cpus, rates = zip(*results[name])
            print(f"  {name:12s} broker CPU {statistics.median(cpus):6.2f} s/GiB (range {min(cpus):.2f}-{max(cpus):.2f})  producer {statistics.median(rates):6.1f} MB/s")
    finally:
        b.stop()
    print()
    in_process_check_cost()


if __name__ == "__main__":
    main()
