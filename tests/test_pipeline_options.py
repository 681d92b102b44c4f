"""Spark Kafka source options on the `kafscale` source, against a topic produced by a real
client (confluent-kafka through the shared broker), compared with the rows Spark's Kafka
source documentation defines for each option.

The topic `opts` has 3 partitions of 100 records each, produced in 4 rounds (so several
segments per partition); record i of a partition has timestamp T0 + i seconds, and the odd
ones carry a header.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

pytest.importorskip("pyspark")
confluent_kafka = pytest.importorskip("confluent_kafka")

from kafscale.pipeline import segments as seg  # noqa: E402
from kafscale.pipeline.offsets import listing_and_bounds  # noqa: E402
from kafscale.pipeline.source import parse_options  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

T0 = (int(time.time()) - 3600) * 1000  # recent: the broker's retention (7 days) must not delete the records
PARTS = 3
PER_PART = 100


class Topic:
    def __init__(self, storage: str, name: str, rows: list[tuple]):
        self.storage, self.name, self.rows = storage, name, rows  # rows: (partition, offset, key, value, ts_ms, headers)

    def want(self, pred=lambda p, o: True) -> list[tuple]:
        return sorted(r for r in self.rows if pred(r[0], r[1]))


def produce_topic(broker, parts: int, per_part: int, rounds: int = 4) -> Topic:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"opts-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, parts, 1)], operation_timeout=10)[name].result(timeout=30)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    rows = []
    sent_headers = {}  # by key: delivery reports do not carry the headers

    def delivered(err, msg):
        assert err is None, err
        rows.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.timestamp()[1], sent_headers[msg.key()]))

    step = per_part // rounds
    for r in range(rounds):
        for p in range(parts):
            for i in range(r * step, per_part if r == rounds - 1 else (r + 1) * step):
                headers = [("i", str(i).encode())] if i % 2 else None
                sent_headers[f"k{p}-{i}".encode()] = tuple(headers) if headers else None
                producer.produce(name, key=f"k{p}-{i}".encode(), value=f"v{p}-{i}".encode(), partition=p, timestamp=T0 + i * 1000, headers=headers, on_delivery=delivered)
        producer.flush(30)
    assert len(rows) == parts * per_part
    storage = "file://" + os.path.join(os.path.abspath(broker.data_dir), "objects")

    # as the readers below see it: the objects and the broker's metadata store (its segment
    # list names the pieces still in write-ahead objects)
    cfg = parse_options({"storage": storage, "subscribe": name}, streaming=False)

    def flushed() -> bool:
        async def go(store):
            _listing, bounds, _gone = await listing_and_bounds(store, cfg, require_all=False)
            return bounds

        bounds = seg.run_with_store(storage, go)
        return len(bounds) == parts and all(b.end == per_part for b in bounds.values())

    wait_until(flushed, 30, f"the broker to flush {name}")
    return Topic(storage, name, rows)


@pytest.fixture(scope="module")
def topic(broker) -> Topic:
    return produce_topic(broker, PARTS, PER_PART)


def reader(spark, topic: Topic, **options):
    r = spark.read.format("kafscale").option("storage", topic.storage)
    if "assign" not in options and "subscribePattern" not in options:
        r = r.option("subscribe", topic.name)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    return r


def rows_of(df) -> list[tuple]:
    out = []
    for r in df.toArrow().to_pylist():
        headers = tuple((h["key"], h["value"]) for h in r["headers"]) if r.get("headers") else None
        out.append((r["partition"], r["offset"], r["key"], r["value"], int(r["timestamp"].timestamp() * 1000), headers))
    return sorted(out)


def without_headers(rows):
    return [r[:5] + (None,) for r in rows]


def per_partition(topic: Topic, values: dict[int, int]) -> dict:
    return {topic.name: {str(p): v for p, v in values.items()}}


# ---------------------------------------------------------------------------------------
# Options that select records


def test_include_headers_is_off_by_default_as_in_spark(spark, topic):
    df = reader(spark, topic).load()
    assert "headers" not in df.columns
    assert rows_of(df) == without_headers(topic.want())
    df = reader(spark, topic, includeHeaders="true").load()
    assert df.columns[-1] == "headers" and rows_of(df) == topic.want()


def test_starting_and_ending_by_timestamp(spark, topic):
    # per partition: p0 from the record at T0+50s, p1 from the first, p2 has none that late
    start = per_partition(topic, {0: T0 + 49_500, 1: T0 - 5_000, 2: T0 + 500_000})
    got = rows_of(reader(spark, topic, includeHeaders="true", startingOffsetsByTimestamp=start, startingOffsetsByTimestampStrategy="latest").load())
    assert got == topic.want(lambda p, o: (p == 0 and o >= 50) or p == 1)
    with pytest.raises(Exception) as e:  # strategy error (the default): a partition without a match fails
        reader(spark, topic, startingOffsetsByTimestamp=start).load().count()
    assert "startingOffsetsByTimestamp" in str(e.value) and f"{topic.name}/2" in str(e.value)
    # the ending offset is the first offset at or after the timestamp (exclusive); none: latest
    end = per_partition(topic, {0: T0 + 10_000, 1: T0 + 500_000, 2: T0})
    got = rows_of(reader(spark, topic, includeHeaders="true", endingOffsetsByTimestamp=end).load())
    assert got == topic.want(lambda p, o: (p == 0 and o < 10) or p == 1)
    # one global ending timestamp for every partition, with a global start
    got = rows_of(reader(spark, topic, includeHeaders="true", startingTimestamp=str(T0 + 20_000), endingTimestamp=str(T0 + 29_500)).load())
    assert got == topic.want(lambda p, o: 20 <= o < 30)
    # startingTimestamp wins over startingOffsetsByTimestamp, which wins over startingOffsets
    got = rows_of(reader(spark, topic, startingOffsets=per_partition(topic, {0: 1, 1: 1, 2: 1}), startingOffsetsByTimestamp=per_partition(topic, {0: T0 + 90_000, 1: T0 + 90_000, 2: T0 + 90_000})).load())
    assert got == without_headers(topic.want(lambda p, o: o >= 90))


def test_assign_reads_only_the_assigned_partitions(spark, topic):
    got = rows_of(reader(spark, topic, assign={topic.name: [0, 2]}, includeHeaders="true").load())
    assert got == topic.want(lambda p, o: p in (0, 2))
    got = rows_of(reader(spark, topic, assign={topic.name: [1]}, startingOffsets=per_partition(topic, {1: 95})).load())
    assert got == without_headers(topic.want(lambda p, o: p == 1 and o >= 95))


def test_min_partitions_and_max_records_per_partition_split_by_offsets(spark, topic):
    df = reader(spark, topic, minPartitions="6", includeHeaders="true").load()
    assert df.rdd.getNumPartitions() == 6  # as Spark: each partition's share of 6, here 2 pieces of 50
    assert rows_of(df) == topic.want()
    df = reader(spark, topic, maxRecordsPerPartition="30", includeHeaders="true").load()
    assert df.rdd.getNumPartitions() == 12  # each partition of 100 in 4 pieces of 25
    assert rows_of(df) == topic.want()
    df = reader(spark, topic, maxRecordsPerPartition="60", minPartitions="10").load()
    assert df.rdd.getNumPartitions() >= 10 and rows_of(df) == without_headers(topic.want())


def test_small_segments_are_packed_by_bytes(spark, topic):
    # 12 segments (4 per partition), a few KiB: one task by default, one per segment without packing
    assert reader(spark, topic).load().rdd.getNumPartitions() == 1
    assert reader(spark, topic, packSegments="false").load().rdd.getNumPartitions() >= 12


# ---------------------------------------------------------------------------------------
# Validation, as Spark's


def test_bad_options_and_a_custom_schema_fail_at_load(spark, topic):
    for options, msg in [
        ({"minPartitions": "abc"}, "minPartitions"),
        ({"minPartitions": "0"}, "minPartitions"),
        ({"maxRecordsPerPartition": "-3"}, "maxRecordsPerPartition"),
        ({"includeHeaders": "perhaps"}, "includeHeaders"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger"),
        ({"assign": "[0, 1]"}, "assign"),
        ({"startingOffsets": per_partition(topic, {0: 50, 1: 0, 2: 0}), "endingOffsets": per_partition(topic, {0: 10, 1: 5, 2: 5})}, "after the end"),
        ({"startingOffsets": per_partition(topic, {0: 1, 1: 0, 2: 0}), "endingOffsets": per_partition(topic, {0: 10})}, "same partitions"),
    ]:
        with pytest.raises(Exception) as e:
            reader(spark, topic, **options).load()  # no action: load() alone fails
        assert msg in str(e.value), (options, str(e.value)[-500:])
    # a user schema: pyspark creates a Python data source given one only when the query is
    # planned (load() takes the schema as it is), so that is where it is rejected
    df = reader(spark, topic).schema("value string").load()
    with pytest.raises(Exception) as e:
        df.count()
    assert "fixed schema" in str(e.value)


def test_batch_only_rules(spark, topic):
    for options, msg in [
        ({"startingOffsets": "latest"}, "startingOffsets=latest"),
        ({"startingOffsets": per_partition(topic, {0: -1, 1: 0, 2: 0})}, "-1 (latest)"),
        ({"endingOffsets": "earliest"}, "endingOffsets=earliest"),
        # a partition left out of the JSON: Spark requires every partition of the topics read
        ({"startingOffsets": per_partition(topic, {0: 5, 1: 0})}, f"missing: {topic.name}/2"),
        ({"endingOffsets": per_partition(topic, {0: 5, 1: 5, 2: 5, 3: 5})}, f"not found in the storage: {topic.name}/3"),
        # resolved start after end: a timestamp start past an offset end
        ({"startingTimestamp": str(T0 + 50_000), "endingOffsets": per_partition(topic, {0: 10, 1: 100, 2: 100})}, "is after the ending offset"),
    ]:
        with pytest.raises(Exception) as e:
            reader(spark, topic, **options).load().count()
        assert msg in str(e.value), (options, str(e.value)[-500:])


# ---------------------------------------------------------------------------------------
# Streaming


def test_stream_starting_offsets_by_timestamp(spark, topic, tmp_path):
    start = per_partition(topic, {0: T0 + 90_000, 1: T0 + 99_000, 2: T0 + 500_000})
    q = (
        spark.readStream.format("kafscale").option("storage", topic.storage).option("subscribe", topic.name)
        .option("startingOffsetsByTimestamp", json.dumps(start)).option("startingOffsetsByTimestampStrategy", "latest")
        .load()
        .writeStream.format("memory").queryName("bytimestamp").option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True).start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = sorted((r.partition, r.offset) for r in spark.table("bytimestamp").select("partition", "offset").collect())
    assert got == [(0, o) for o in range(90, 100)] + [(1, 99)]


def test_min_offsets_per_trigger_holds_back_until_enough_or_the_delay(spark, topic):
    """The stream reader's trigger decisions, called as Spark's engine calls them."""
    from kafscale.pipeline.source import KafScaleStreamReader, ReadAllAvailable, parse_options

    def make(delay):
        cfg = parse_options({"storage": topic.storage, "subscribe": topic.name, "minOffsetsPerTrigger": "50", "maxTriggerDelay": delay}, streaming=True)
        return KafScaleStreamReader(cfg)

    behind = {topic.name: {"0": 90, "1": 95, "2": 100}}  # 15 offsets available
    latest = {topic.name: {"0": 100, "1": 100, "2": 100}}
    r = make("1h")
    assert r.latestOffset(behind, ReadAllAvailable()) == latest  # the first trigger always runs
    assert r.latestOffset(behind, ReadAllAvailable()) == behind  # 15 < 50 and the hour has not passed
    assert r.latestOffset({topic.name: {"0": 0, "1": 100, "2": 100}}, ReadAllAvailable()) == latest  # 100 >= 50
    r = make("0ms")  # the delay is over at once: every trigger runs
    r.latestOffset(behind, ReadAllAvailable())
    assert r.latestOffset(behind, ReadAllAvailable()) == latest


# ---------------------------------------------------------------------------------------
# Planning by bytes


def test_thousands_of_tiny_segments_make_a_handful_of_tasks(tmp_path):
    """3,000 one-batch segments (as a broker flushing small batches often leaves them): the
    plan packs them by bytes, for a batch read and for a micro-batch alike."""
    from kafscale.pipeline.source import KafScaleBatchReader, KafScaleStreamReader, parse_options
    from kafscale.protocol import records as R
    from kafscale.storage import segment as S

    root = tmp_path / "objects"
    total = 0
    for p in range(6):
        for i in range(500):
            batch = R.build_batch([(f"k{i}".encode(), b"v" * 50)], base_offset=i, timestamp=T0)
            enc = S.encode([batch], i)
            path = root / "default" / "tiny" / str(p) / os.path.basename(S.segment_key("default", "tiny", p, i))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"".join(bytes(x) for x in enc.parts))
            total += enc.info.size
    base = {"storage": f"file://{root}", "subscribe": "tiny", "metadata": "none"}

    def tasks(streaming: bool, **extra):
        cfg = parse_options({**base, **{k: str(v) for k, v in extra.items()}}, streaming=streaming)
        if not streaming:
            return KafScaleBatchReader(cfg).partitions()
        r = KafScaleStreamReader(cfg)
        return r.partitions({}, r.latestOffset({}, None))

    assert len(tasks(False)) == 1 and len(tasks(True)) == 1  # ~0.5 MB: one task of the 64 MiB target
    target = 100_000
    got = tasks(True, maxPartitionBytes=target)
    assert -(-total // target) <= len(got) <= -(-total // target) + 1
    planned = [s for part in got for s in (part.value if isinstance(part.value, tuple) else (part.value,))]
    assert len(planned) == 3000 and sum(s.end_offset - s.start_offset for s in planned) == 3000
    assert len(tasks(False, packSegments="false")) == 3000


# ---------------------------------------------------------------------------------------
# Data loss: DeleteRecords, deleted topics, topics that do not exist yet


def test_delete_records_log_start_is_honoured_inside_a_segment(spark, broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    t = produce_topic(broker, 1, 60, rounds=2)  # segments 0..29 and 30..59
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_records([TopicPartition(t.name, 0, 45)])[TopicPartition(t.name, 0, 45)].result(timeout=30)
    # the broker keeps the segment 30..59 (45 falls inside it); the metadata store says 45
    got = rows_of(reader(spark, t, includeHeaders="true").load())
    assert got == t.want(lambda p, o: o >= 45)
    with pytest.raises(Exception) as e:
        reader(spark, t, startingOffsets=per_partition(t, {0: 10})).load().count()
    assert "failOnDataLoss" in str(e.value) and "45" in str(e.value)
    got = rows_of(reader(spark, t, startingOffsets=per_partition(t, {0: 10}), failOnDataLoss="false").load())
    assert [r[1] for r in got] == list(range(45, 60))
    # a stream that had read up to 40 before the deletion: the same rule
    from kafscale.pipeline.source import KafScaleStreamReader, parse_options

    for fail in ("true", "false"):
        r = KafScaleStreamReader(parse_options({"storage": t.storage, "subscribe": t.name, "failOnDataLoss": fail}, streaming=True))
        start = {t.name: {"0": 40}}
        end = r.latestOffset(start, None)
        assert end == {t.name: {"0": 60}}
        if fail == "true":
            with pytest.raises(Exception, match="40..44 were deleted"):
                r.partitions(start, end)
        else:
            (part,) = r.partitions(start, end)
            assert [s.start_offset for s in (part.value if isinstance(part.value, tuple) else (part.value,))][0] == 45


def test_deleted_topic_mid_stream_follows_fail_on_data_loss(broker):
    from confluent_kafka.admin import AdminClient

    from kafscale.pipeline.source import KafScaleStreamReader, parse_options

    t = produce_topic(broker, 2, 20, rounds=1)
    readers = {fail: KafScaleStreamReader(parse_options({"storage": t.storage, "subscribe": t.name, "failOnDataLoss": fail, "startingOffsets": "earliest"}, streaming=True)) for fail in ("true", "false")}
    start = {t.name: {"0": 5, "1": 20}}  # partition 0 not fully read when the topic goes
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([t.name], operation_timeout=10)[t.name].result(timeout=30)
    for fail, r in readers.items():
        # the deleted partitions leave the offsets
        wait_until(lambda: r.latestOffset(start, None) == {}, 30, "the deletion to be seen")
        end = {}
        if fail == "true":
            with pytest.raises(Exception, match="gone"):
                r.partitions(start, end)
        else:
            assert r.partitions(start, end) == []  # the query goes on
            assert r.latestOffset(end, None) == {}


def test_stream_waits_for_a_topic_that_does_not_exist_yet(tmp_path):
    from kafscale.pipeline.source import KafScaleStreamReader, parse_options
    from kafscale.protocol import records as R
    from kafscale.storage import segment as S

    url = f"file://{tmp_path}"
    r = KafScaleStreamReader(parse_options({"storage": url, "subscribe": "later", "startingOffsets": "latest", "metadata": "none"}, streaming=True))
    start = r.initialOffset()
    assert start == {} and r.latestOffset(start, None) == {}  # no topic: no batch, no error
    enc = S.encode([R.build_batch([(b"k", b"v%d" % i) for i in range(5)], timestamp=T0)], 0)

    async def put(store):
        await store.put(S.segment_key("default", "later", 0, 0), enc.parts)

    seg.run_with_store(url, put)
    end = r.latestOffset(start, None)
    assert end == {"later": {"0": 5}}  # a partition that appears later starts at its earliest
    (part,) = r.partitions(start, end)
    assert (part.value.start_offset, part.value.end_offset) == (0, 5)
