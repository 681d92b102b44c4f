"""The Spark source on topics a real broker compacts (issue #16): a batch read of a
compacted topic returns exactly the surviving records, at their offsets; a streaming query
across a compaction (the compactor rewriting segments under it) goes on without failing and
without reading any offset twice."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource  # noqa: E402

from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.compaction import Model, broker_args, create_topic, metrics, produce, read_all  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
SENTINEL = [(b"sentinel", b"seals the updates into cleanable segments")]  # the newest segment is never cleaned


@pytest.fixture(scope="module")
def compacting():
    args, port = broker_args()
    b = BrokerProcess(extra_args=args).start()
    yield b, port
    b.stop()


def updates(keys: int, rounds: int, tag: bytes = b"v") -> list[tuple[bytes, bytes]]:
    return [(b"key-%03d" % k, tag + b"-%d-%d" % (k, r)) for r in range(rounds) for k in range(keys)]


def _url(b: BrokerProcess) -> str:
    return f"file://{b.data_dir}/objects"


def _rows(df) -> list[tuple]:
    return sorted((r["offset"], r["key"], r["value"]) for r in df.select("offset", "key", "value").toArrow().to_pylist())


def test_batch_read_of_a_compacted_topic_returns_exactly_the_survivors(spark, compacting, topic_name):
    b, _port = compacting
    create_topic(b.bootstrap, topic_name, **COMPACT, **{"delete.retention.ms": "100"})
    model = Model()
    items = updates(30, 8) + [(b"key-%03d" % k, None) for k in range(0, 30, 3)]  # a third deleted
    produce(b.bootstrap, topic_name, items, model, flush_every=20)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    want = model.compacted()  # the tombstones' horizon passes quickly: their keys are gone
    wait_until(lambda: read_all(b.bootstrap, topic_name) == want, 60, "compaction to leave the latest value per live key", interval=0.3)
    load = spark.read.format("kafscale").option("storage", _url(b)).option("subscribe", topic_name)
    assert _rows(load.load()) == want
    # byte ranges and offset ranges cut through the compacted segments' gaps
    assert _rows(load.option("maxPartitionBytes", "300").option("minPartitions", "5").load()) == want


def _alter(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([res])[res].result(15)


def _end_offset(q, topic: str) -> int:
    p = q.lastProgress
    if not p or not p["sources"]:
        return -1
    end = p["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    return int((end or {}).get(topic, {}).get("0", -1))


def test_streaming_query_across_a_compaction_neither_fails_nor_duplicates(spark, compacting, topic_name):
    """The query starts on an uncompacted log and reads it 15 offsets a micro-batch; the topic
    turns compacted under it (the compactor rewrites the segments it is reading), then more
    updates come and are compacted too. Every row is the record produced at its offset,
    each offset once, every key's latest record among them."""
    b, port = compacting
    create_topic(b.bootstrap, topic_name, **{"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.01"})
    model = Model()
    produce(b.bootstrap, topic_name, updates(20, 15), model, flush_every=20)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    name = "compacting_" + "".join(c if c.isalnum() else "_" for c in topic_name)
    q = (
        spark.readStream.format("kafscale").option("storage", _url(b)).option("subscribe", topic_name)
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "15").load()
        .writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start()
    )
    try:
        wait_until(lambda: _end_offset(q, topic_name) >= 45, 120, "the query to read its first micro-batches", interval=0.1)
        runs = metrics(port)["kafscale_compaction_runs_total"]
        _alter(b.bootstrap, topic_name, **{"cleanup.policy": "compact"})
        wait_until(lambda: metrics(port)["kafscale_compaction_runs_total"] > runs, 60, "the compactor to rewrite the log", interval=0.1)
        assert _end_offset(q, topic_name) < len(model.records) - 1, "the query read everything before the compaction: nothing crossed"
        produce(b.bootstrap, topic_name, updates(20, 3, tag=b"w"), model, flush_every=20)
        produce(b.bootstrap, topic_name, SENTINEL, model)
        end = max(model.records) + 1
        wait_until(lambda: _end_offset(q, topic_name) == end, 180, "the query to reach the end of the log", interval=0.2)
        assert q.exception() is None and q.isActive
        got = sorted((r["offset"], r["key"], r["value"]) for r in spark.sql(f"select offset, key, value from {name}").toArrow().to_pylist())
    finally:
        q.stop()
    model.check_read(got)  # each offset once, the record produced there, latest per key present
    assert len(got) < len(model.records)  # some were compacted away before the query came to them
