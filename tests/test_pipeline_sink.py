"""The `kafscale` sink end to end: Spark -> confluent-kafka -> a running KafScale broker.

Needs the `broker` fixture (tests/conftest.py, an object with `.bootstrap` = "host:port");
skipped while that fixture does not exist.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import pytest

pytest.importorskip("pyspark")
confluent_kafka = pytest.importorskip("confluent_kafka")

from kafscale.pipeline import jobs  # noqa: E402
from kafscale.pipeline import segments as seg  # noqa: E402
from kafscale.protocol import records as R  # noqa: E402
from kafscale.storage import segment as S  # noqa: E402


@pytest.fixture
def bootstrap(request) -> str:
    try:
        broker = request.getfixturevalue("broker")
    except pytest.FixtureLookupError:
        pytest.skip("needs the `broker` fixture from tests/conftest.py")
    return broker.bootstrap


def create_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"sink-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)[name].result(timeout=30)
    return name


def consume(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise RuntimeError(msg.error())
            got.append((msg.partition(), msg.key(), msg.value(), tuple(msg.headers() or ()) or None))
    finally:
        consumer.close()
    return got


def test_batch_write_produces_rows_with_keys_values_headers(spark, bootstrap):
    topic = create_topic(bootstrap, 2)
    rows = [(f"k{i}".encode() if i % 3 else None, f"v{i}".encode(), [("i", str(i).encode())] if i % 2 else None, i % 2) for i in range(20)]
    df = spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key: string, value: binary>>, partition int")
    # the Spark guide's form: no .mode() (Spark's Kafka sink appends in the default mode)
    df.write.format("kafscale").option("bootstrap", bootstrap).option("topic", topic).save()
    more = [(b"m", b"appended", None, 0)]
    spark.createDataFrame(more, df.schema).write.format("kafscale").option("bootstrap", bootstrap).option("topic", topic).mode("append").save()
    with pytest.raises(Exception, match="Ignore"):
        df.write.format("kafscale").option("bootstrap", bootstrap).option("topic", topic).mode("ignore").save()
    rows += more
    got = consume(bootstrap, topic, len(rows))
    want = [(p, k, v, tuple(h) if h else None) for k, v, h, p in rows]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def test_stream_write_copies_a_topic_from_segments(spark, bootstrap, tmp_path):
    url = f"file://{tmp_path}"
    batches = [R.build_batch([(f"k{i}".encode(), f"v{i}".encode()) for i in range(b * 5, b * 5 + 5)], base_offset=b * 5, timestamp=1_700_000_000_000) for b in range(3)]
    enc = S.encode(batches, 0)

    async def put(store):
        await store.put(S.segment_key("default", "src", 0, 0), enc.parts)
        await store.put(S.index_key("default", "src", 0, 0), [enc.index])

    seg.run_with_store(url, put)
    topic = create_topic(bootstrap, 1)
    source = spark.readStream.format("kafscale").option("storage", url).option("subscribe", "src").option("startingOffsets", "earliest").option("includeHeaders", "true").load()
    query = (
        source.select("key", "value", "headers")
        .writeStream.format("kafscale")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = consume(bootstrap, topic, 15)
    assert sorted((k, v) for _, k, v, _ in got) == sorted((f"k{i}".encode(), f"v{i}".encode()) for i in range(15))


def test_source_reads_what_the_broker_flushed(spark, bootstrap, request):
    """Produce through the broker, then read its storage directly: same rows, same offsets."""
    broker = request.getfixturevalue("broker")
    storage = "file://" + os.path.join(os.path.abspath(broker.data_dir), "objects")  # the broker's default --storage
    topic = create_topic(bootstrap, 2)
    delivered = []
    sent_headers = {}  # by value: delivery reports do not carry the headers

    def on_delivery(err, msg):
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value(), sent_headers[msg.value()], msg.timestamp()[1]))

    for codec in ("none", "gzip", "lz4", "zstd", "snappy"):
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
        for i in range(30):
            headers = [("codec", codec.encode()), ("i", str(i).encode())] if i % 2 else None
            sent_headers[f"{codec}-{i}".encode() * (i % 5 + 1)] = tuple(headers) if headers else None
            producer.produce(topic, value=f"{codec}-{i}".encode() * (i % 5 + 1), key=None if i % 7 == 0 else f"k{i}".encode(), headers=headers, partition=i % 2, on_delivery=on_delivery)
        producer.flush(30)
    assert len(delivered) == 150

    want = sorted(delivered)
    ends = {p: max(o for q, o, *_ in delivered if q == p) + 1 for p in (0, 1)}
    reader = (
        spark.read.format("kafscale")
        .option("storage", storage)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
    )
    deadline = time.monotonic() + 30
    while True:  # an ending offset past the flushed segments is an error until the broker flushes
        try:
            table = reader.load().toArrow()
            break
        except Exception as e:  # noqa: BLE001
            assert "beyond" in str(e), str(e)[-2000:]
        assert time.monotonic() < deadline, "broker did not flush the produced records in time"
        time.sleep(0.5)
    got = sorted(
        (r["partition"], r["offset"], r["key"], r["value"], tuple((h["key"], h["value"]) for h in r["headers"]) if r["headers"] else None, int(r["timestamp"].timestamp() * 1000))
        for r in table.to_pylist()
    )
    assert got == want
