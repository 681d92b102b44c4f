"""Topic markers ({namespace}/{topic}/topic.json) and the rule they serve (#25 item 3): a
newly created topic never adopts objects left by an older topic of the same name.

Real brokers (subprocesses) over a file store; the states a lost metadata store or an
interrupted deletion leaves are made with the MetadataStore and the marker module, as the
broker itself would leave them."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from kafscale.errors import ErrorCode
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.pipeline.segments import list_topics
from kafscale.storage import topic_marker
from kafscale.storage.local_store import LocalObjectStore
from tests.support.broker import with_metadata
from tests.support.wait import wait_until

NS = "default"


def _objects(b) -> Path:
    return Path(b.data_dir) / "objects"


def _marker(b, topic: str) -> dict | None:
    path = _objects(b) / NS / topic / "topic.json"
    return json.loads(path.read_bytes()) if path.exists() else None


def _files(b, topic: str) -> dict[str, bytes]:
    root = _objects(b) / NS / topic
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


# Brokers whose flushed data is in the partitions' own segment objects soon (with write-ahead
# objects, rewritten from them at once): these tests are about what a topic leaves under its name.
REWRITTEN = ["--segment-max-age-ms", "0", "--merge-interval-ms", "100"]


def _in_segments(b, topic: str) -> None:
    wait_until(lambda: any(k.startswith("0/segment-") for k in _files(b, topic)), 30, f"{topic}'s data in its segment objects", interval=0.1)


def _create(bootstrap: str, topic: str, partitions: int = 1, configs: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=configs or {})])[topic].result(15)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


def _consume_all(bootstrap: str, topic: str, expect: int, partition: int = 0) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{os.getpid()}-{topic}", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        got: list[tuple[int, bytes]] = []

        def enough() -> bool:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.value()))
            return len(got) >= expect

        if expect:
            wait_until(enough, 30, f"{expect} records of {topic}")
        return got
    finally:
        c.close()


def _high_watermark(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def test_marker_follows_create_partitions_configs_and_delete(broker_factory, topic_name):
    broker = broker_factory(extra_args=REWRITTEN)  # the deletion takes the data's segment objects too
    _create(broker.bootstrap, topic_name, 2, {"retention.ms": "3600000"})
    m = _marker(broker, topic_name)
    assert m is not None and m["name"] == topic_name and m["partitions"] == 2 and m["deleted_ms"] is None
    assert m["configs"] == {"retention.ms": "3600000"}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_topics(TopicCollection([topic_name]))[topic_name].result(15)
    assert base64.urlsafe_b64decode(str(described.topic_id) + "==") == uuid.UUID(m["topic_id"]).bytes  # Kafka's id, as clients see it
    admin.create_partitions([NewPartitions(topic_name, 3)])[topic_name].result(15)
    assert _marker(broker, topic_name)["partitions"] == 3
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"retention.ms": "7200000"})
    admin.alter_configs([res])[res].result(15)
    assert _marker(broker, topic_name)["configs"] == {"retention.ms": "7200000"}
    _produce(broker.bootstrap, topic_name, [b"a", b"b"])
    _in_segments(broker, topic_name)
    admin.delete_topics([topic_name])[topic_name].result(15)
    assert _files(broker, topic_name) == {}  # objects and marker gone
    # The same name again: a new topic id, a new marker.
    _create(broker.bootstrap, topic_name)
    assert _marker(broker, topic_name)["topic_id"] != m["topic_id"]


def test_recreate_after_an_interrupted_delete_starts_empty(broker_factory, topic_name):
    b = broker_factory(extra_args=REWRITTEN)
    _create(b.bootstrap, topic_name)
    _produce(b.bootstrap, topic_name, [b"old-%d" % i for i in range(5)])
    _in_segments(b, topic_name)
    b.stop()

    async def cut_short(md: MetadataStore):
        # What a deletion killed right after its metadata delete leaves: the marker says
        # deleted, the metadata has no topic, every object is still there.
        meta = await md.get_topic(topic_name)
        await topic_marker.mark_deleted(LocalObjectStore(_objects(b)), NS, meta)
        await md.delete_topic(topic_name)
        return meta

    old = with_metadata(b, cut_short)
    assert any(k.startswith("0/segment-") for k in _files(b, topic_name))
    b.start()
    _create(b.bootstrap, topic_name)
    files = _files(b, topic_name)
    assert list(files) == ["topic.json"], files  # the leftovers went before the create was answered
    marker = json.loads(files["topic.json"])
    assert marker["topic_id"] != old.topic_id and marker["deleted_ms"] is None
    assert _high_watermark(b.bootstrap, topic_name) == (0, 0)
    _produce(b.bootstrap, topic_name, [b"new"])
    assert _consume_all(b.bootstrap, topic_name, 1) == [(0, b"new")]


def _refused(bootstrap: str, topic: str) -> KafkaException:
    try:
        _create(bootstrap, topic)
    except KafkaException as e:
        return e
    raise AssertionError("the create was not refused")


def test_create_over_objects_of_a_lost_topic_is_refused_and_leaves_them(broker_factory, topic_name):
    b = broker_factory(extra_args=REWRITTEN)
    _create(b.bootstrap, topic_name)
    _produce(b.bootstrap, topic_name, [b"kept-%d" % i for i in range(3)])
    unmarked = topic_name + "-old"  # a topic of an older version: objects, no marker
    _create(b.bootstrap, unmarked)
    _produce(b.bootstrap, unmarked, [b"x"])
    _in_segments(b, topic_name)
    _in_segments(b, unmarked)  # (an older version wrote segment objects only)
    b.stop()
    os.unlink(_objects(b) / NS / unmarked / "topic.json")

    async def lose(md: MetadataStore):  # the metadata of both topics is lost; the bucket is not
        await md.delete_topic(topic_name)
        await md.delete_topic(unmarked)

    with_metadata(b, lose)
    before = {t: _files(b, t) for t in (topic_name, unmarked)}
    b.start()
    for t in (topic_name, unmarked):
        e = _refused(b.bootstrap, t)
        assert e.args[0].code() == ErrorCode.policy_violation, e
        assert "kafscale metadata restore" in e.args[0].str()
        # Auto-creation (Metadata) is refused the same way, not answered as a new topic.
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 3000})
        p.produce(t, value=b"must not land")
        p.flush(10)
    assert {t: _files(b, t) for t in (topic_name, unmarked)} == before
    assert "refusing to create topic" in b.log_text()
    assert "without a topic marker" in b.log_text()


def test_markers_written_at_start_for_topics_of_older_versions(broker_factory, topic_name):
    b = broker_factory()
    _create(b.bootstrap, topic_name, 2)
    first = _marker(b, topic_name)
    b.stop()
    os.unlink(_objects(b) / NS / topic_name / "topic.json")
    b.start()
    wait_until(lambda: _marker(b, topic_name), 15, "the marker to be written again")
    assert _marker(b, topic_name) == first
    assert _marker(b, "__consumer_offsets")["partitions"] == 50


def test_recovery_never_adopts_segments_of_another_topic_id(broker_factory, topic_name):
    """Metadata that names the topic with a new id (created again through the metadata
    store, the old topic's objects left under its marker): the old segment at offset 0,
    uncommitted for the new topic, is neither adopted nor deleted."""
    b = broker_factory(extra_args=REWRITTEN)
    _create(b.bootstrap, topic_name)
    _produce(b.bootstrap, topic_name, [b"other-topic"])
    _in_segments(b, topic_name)
    b.stop()

    async def recreate(md: MetadataStore):
        await md.delete_topic(topic_name)
        await md.create_topic(TopicMeta(topic_name, 1))

    with_metadata(b, recreate)
    before = _files(b, topic_name)
    b.start()
    assert _high_watermark(b.bootstrap, topic_name) == (0, 0)
    wait_until(lambda: "not adopting or sweeping" in b.log_text(), 15, "recovery to refuse the segments")
    assert _consume_all(b.bootstrap, topic_name, 0) == []
    assert _files(b, topic_name) == before
    assert "its marker names topic id" in b.log_text()


async def test_segment_listing_ignores_markers(tmp_path):
    store = LocalObjectStore(tmp_path)
    meta = TopicMeta("orders", 1)
    await topic_marker.write_marker(store, NS, topic_marker.TopicMarker.of(meta))
    listing = await list_topics(store, NS, pattern=".*", require_all=False)
    assert listing.topics() == []
    assert await topic_marker.read_marker(store, NS, "orders") == topic_marker.TopicMarker.of(meta)
