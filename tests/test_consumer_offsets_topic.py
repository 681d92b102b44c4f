"""`__consumer_offsets` (#16): groups and committed offsets, kept in the metadata store, are
also written by each group's coordinator to the internal compacted topic, in Kafka's record
format, for lag monitors and tools that read that topic.

The records are decoded here by hand from Kafka's message specs (OffsetCommitKey v1,
OffsetCommitValue v3, GroupMetadataKey v2, GroupMetadataValue v3: int16 version first,
int16-length strings, int32-length bytes), with `struct` only, so the broker's encoder
(`kafscale.groups.offsets_topic`) is checked against a second implementation; no PyPI
package that decodes `__consumer_offsets` is installable. The group -> partition mapping is
Kafka's `Utils.abs(groupId.hashCode()) % partitions`, computed here independently too.
"""

from __future__ import annotations

import base64
import os
import struct
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from kafscale.errors import ErrorCode
from kafscale.groups import offsets_topic
from kafscale.metadata.internal_topics import OFFSETS_TOPIC, offsets_partition_for
from kafscale.metadata.store import CommittedOffset
from kafscale.protocol import records
from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_cluster import backends, cluster_factory  # noqa: F401  (fixtures)

PARTITIONS = 50  # Kafka's offsets.topic.num.partitions, the broker default


# -- an independent reading of Kafka's specs ------------------------------------------------------


def java_hash(s: str) -> int:
    h = 0
    for ch in s:  # BMP only: the tests' group ids are ASCII
        h = (h * 31 + ord(ch)) % (1 << 32)
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_partition_for(group: str, n: int = PARTITIONS) -> int:
    h = java_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % n


class Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take(">h")
        if n < 0:
            return None
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def bytes_(self):
        n = self.take(">i")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def done(self) -> bool:
        return self.pos == len(self.data)


# Consumer groups' (KIP-848) record types: key version -> name (Kafka 4.0's CoordinatorRecordType)
CONSUMER_GROUP_KEYS = {3: "consumer-group", 4: "partition-metadata", 5: "member-metadata", 6: "target-epoch",
                       7: "target-member", 8: "current-member"}


def decode_key(key: bytes):
    """('offset', group, topic, partition), ('group', group), or a consumer group's record:
    (its name in CONSUMER_GROUP_KEYS, group[, member])."""
    r = Reader(key)
    version = r.take(">h")
    if version in (0, 1):
        out = ("offset", r.string(), r.string(), r.take(">i"))
    elif version == 2:
        out = ("group", r.string())
    elif version in (3, 4, 6):
        out = (CONSUMER_GROUP_KEYS[version], r.string())
    elif version in (5, 7, 8):
        out = (CONSUMER_GROUP_KEYS[version], r.string(), r.string())
    else:
        raise AssertionError(f"unknown key version {version}")
    assert r.done()
    return out


class FlexReader(Reader):
    """Kafka's flexible versions: unsigned varint lengths + 1, uuids, tagged fields."""

    def uvarint(self) -> int:
        shift = n = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def cstring(self):
        n = self.uvarint() - 1
        if n < 0:
            return None
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def cbytes(self) -> bytes:
        n = self.uvarint() - 1
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def array(self, item) -> list:
        return [item() for _ in range(self.uvarint() - 1)]

    def uuid(self) -> str:
        import uuid as _uuid

        u = str(_uuid.UUID(bytes=bytes(self.data[self.pos:self.pos + 16])))
        self.pos += 16
        return u

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.data[self.pos:self.pos + size]
            self.pos += size
        return out

    def topic_partitions(self) -> dict[str, list[int]]:
        def one():
            t, ps = self.uuid(), self.array(lambda: self.take(">i"))
            assert self.tags() == {}
            return t, ps

        return dict(self.array(one))


def decode_consumer_value(kind: str, value: bytes) -> dict:
    """A consumer group record's value (version 0, flexible), from Kafka's message specs."""
    r = FlexReader(value)
    assert r.take(">h") == 0
    if kind in ("consumer-group", "target-epoch"):
        out = {"epoch": r.take(">i")}
    elif kind == "partition-metadata":
        def topic():
            t = {"id": r.uuid(), "name": r.cstring(), "partitions": r.take(">i")}
            t["racks"] = r.array(lambda: (r.take(">i"), r.array(r.cstring), r.tags())[:2])
            assert r.tags() == {}
            return t

        out = {"topics": r.array(topic)}
    elif kind == "member-metadata":
        out = {"instance_id": r.cstring(), "rack_id": r.cstring(), "client_id": r.cstring(), "client_host": r.cstring(),
               "topics": r.array(r.cstring), "regex": r.cstring(), "rebalance_timeout": r.take(">i"),
               "assignor": r.cstring(), "classic": None}
        tags = r.tags()
        if 0 in tags:  # ClassicMemberMetadata: a nullable struct (presence byte first)
            c = FlexReader(tags.pop(0))
            assert c.uvarint() == 1
            timeout = c.take(">i")
            protocols = c.array(lambda: (c.cstring(), c.cbytes(), c.tags())[:2])
            assert c.tags() == {} and c.done()
            out["classic"] = {"session_timeout": timeout, "protocols": protocols}
        assert tags == {}
        assert r.done()
        return out
    elif kind == "target-member":
        out = {"partitions": r.topic_partitions()}
    elif kind == "current-member":
        out = {"epoch": r.take(">i"), "previous_epoch": r.take(">i"), "state": r.take(">b"),
               "assigned": r.topic_partitions(), "revoking": r.topic_partitions()}
    else:
        raise AssertionError(kind)
    assert r.tags() == {} and r.done()
    return out


def decode_offset_value(value: bytes) -> dict:
    r = Reader(value)
    version = r.take(">h")
    assert version == 3, version  # what Kafka 3.x writes
    out = {"offset": r.take(">q"), "leader_epoch": r.take(">i"), "metadata": r.string(), "commit_timestamp": r.take(">q")}
    assert r.done()
    return out


def decode_group_value(value: bytes) -> dict:
    r = Reader(value)
    version = r.take(">h")
    assert version == 3, version
    out = {"protocol_type": r.string(), "generation": r.take(">i"), "protocol": r.string(), "leader": r.string(),
           "current_state_timestamp": r.take(">q"), "members": []}
    for _ in range(r.take(">i")):
        out["members"].append({
            "member_id": r.string(), "group_instance_id": r.string(), "client_id": r.string(), "client_host": r.string(),
            "rebalance_timeout": r.take(">i"), "session_timeout": r.take(">i"), "subscription": r.bytes_(), "assignment": r.bytes_(),
        })  # fmt: skip
    assert r.done()
    return out


# -- unit: the encoder and the mapping against the above ---------------------------------------


def test_partition_for_is_kafkas():
    assert offsets_partition_for("hello", 1 << 30) == 99162322  # "hello".hashCode()
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: Kafka's Utils.abs makes it 0.
    assert java_hash("polygenelubricants") == -(1 << 31)
    assert offsets_partition_for("polygenelubricants", PARTITIONS) == 0
    for g in ["my-group", "g", "", "console-consumer-12345", "Ω-group", "a" * 300]:
        assert offsets_partition_for(g, PARTITIONS) == kafka_partition_for(g), g
        assert offsets_partition_for(g, 7) == kafka_partition_for(g, 7), g
    # Outside the BMP, Java hashes the UTF-16 surrogate pair (0xD83D, 0xDE00).
    assert offsets_partition_for("\U0001F600", 1 << 30) == 0xD83D * 31 + 0xDE00


def test_groups_map_onto_the_topics_real_partition_count():
    from kafscale.cluster.membership import BrokerNode, SingleNodeCluster

    cluster = SingleNodeCluster(BrokerNode(3, "127.0.0.1", 1), offsets_topic_partitions=50)
    assert cluster.offsets_partition("my-group") == kafka_partition_for("my-group", 50)
    cluster.offsets_topic_seen(7)  # the topic was made with 7 before the flag changed
    assert cluster.offsets_partition("my-group") == kafka_partition_for("my-group", 7)
    assert cluster.group_coordinator("my-group").node_id == 3 and cluster.is_group_coordinator("my-group")


def test_offset_commit_record_bytes():
    [(key, value)] = offsets_topic.offset_commit_records(
        "grp", {("orders", 3): CommittedOffset(offset=42, leader_epoch=7, metadata="meta", commit_ms=1_700_000_000_123)}
    )
    assert key == struct.pack(">hh3sh6si", 1, 3, b"grp", 6, b"orders", 3)
    assert decode_key(key) == ("offset", "grp", "orders", 3)
    assert decode_offset_value(value) == {"offset": 42, "leader_epoch": 7, "metadata": "meta", "commit_timestamp": 1_700_000_000_123}
    [(tkey, tvalue)] = offsets_topic.offset_tombstones("grp", [("orders", 3)])
    assert (tkey, tvalue) == (key, None)


def test_group_metadata_record_bytes():
    doc = {
        "protocol_type": "consumer", "protocol": "range", "generation": 5, "leader": "m-1", "state_ts": 1234,
        "members": [{"member_id": "m-1", "group_instance_id": None, "client_id": "c", "client_host": "/127.0.0.1",
                     "session_timeout": 45000, "rebalance_timeout": 300000,
                     "subscription": base64.b64encode(b"\x00\x01sub").decode(), "assignment": base64.b64encode(b"asg").decode()}],
    }  # fmt: skip
    key, value = offsets_topic.group_metadata_record("grp", doc)
    assert key == struct.pack(">hh3s", 2, 3, b"grp") and decode_key(key) == ("group", "grp")
    assert decode_group_value(value) == {
        "protocol_type": "consumer", "generation": 5, "protocol": "range", "leader": "m-1", "current_state_timestamp": 1234,
        "members": [{"member_id": "m-1", "group_instance_id": None, "client_id": "c", "client_host": "/127.0.0.1",
                     "rebalance_timeout": 300000, "session_timeout": 45000, "subscription": b"\x00\x01sub", "assignment": b"asg"}],
    }  # fmt: skip
    empty_key, empty = offsets_topic.group_metadata_record("grp", {"protocol_type": None, "protocol": None, "generation": 0, "leader": None, "state_ts": 9, "members": []})
    assert decode_group_value(empty) == {"protocol_type": "", "generation": 0, "protocol": None, "leader": None, "current_state_timestamp": 9, "members": []}
    assert offsets_topic.group_tombstone("grp") == (key, None)


# -- a broker ----------------------------------------------------------------------------------


def read_partition(bootstrap: str, partition: int, timeout: float = 3.0) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record in __consumer_offsets-`partition` (kafka-python,
    assigned explicitly: internal topics are left out of subscriptions by default)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=int(timeout * 1000),
                      auto_offset_reset="earliest")  # fmt: skip
    try:
        tp = KTopicPartition(OFFSETS_TOPIC, partition)
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        out = []
        deadline = time.monotonic() + timeout
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            for batch in c.poll(timeout_ms=500).values():
                out += [(m.offset, m.key, m.value) for m in batch]
        return out
    finally:
        c.close()


def group_records(bootstrap: str, group: str) -> tuple[dict, dict | None, list]:
    """The latest decoded value per key of `group` in its partition: ({(topic, p): offset
    value or None}, group value or None (None also for a tombstone), every key seen in order)."""
    offsets: dict = {}
    meta = None
    seen = []
    for _off, key, value in read_partition(bootstrap, kafka_partition_for(group)):
        k = decode_key(key)
        if k[1] != group or k[0] not in ("offset", "group"):
            continue
        seen.append((k, value is None))
        if k[0] == "offset":
            offsets[(k[2], k[3])] = None if value is None else decode_offset_value(value)
        else:
            meta = None if value is None else decode_group_value(value)
    return offsets, meta, seen


def commit_with_group(bootstrap: str, topic: str, group: str, n: int, protocol: str = "classic") -> None:
    """A confluent-kafka consumer in `group` (of that group.protocol) reads `n` records of
    `topic` and commits them."""
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "offsets-topic-test", "group.protocol": protocol})  # fmt: skip
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < n and time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None and m.error() is None:
                got += 1
        assert got == n
        c.commit(asynchronous=False)
        # With commit metadata (librdkafka sends the C string's terminating NUL with it).
        c.commit(offsets=[TopicPartition(topic, 0, n // 2 + n % 2, "tool-metadata")], asynchronous=False)
    finally:
        c.close()


def test_commits_and_group_metadata_readable_from_consumer_offsets(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    group = f"g-{topic_name}"
    before = int(time.time() * 1000)
    commit_with_group(broker.bootstrap, topic_name, group, 6)

    def committed():
        offsets, meta, _ = group_records(broker.bootstrap, group)
        want = {(topic_name, 0): 3, (topic_name, 1): 3}
        got = {tp: v["offset"] for tp, v in offsets.items() if v is not None}
        return (offsets, meta) if got == want and offsets[(topic_name, 0)]["metadata"].startswith("tool-metadata") else None

    offsets, meta = wait_until(committed, 20, f"the commits of {group} in {OFFSETS_TOPIC}")
    for v in offsets.values():
        assert before <= v["commit_timestamp"] <= int(time.time() * 1000)
        assert v["leader_epoch"] >= -1
    # The group's metadata: after the consumer left, the last record is the Empty group.
    assert meta is not None and meta["protocol_type"] == "consumer" and meta["generation"] >= 1
    _, _, seen = group_records(broker.bootstrap, group)
    with_members = [k for k, tomb in seen if k[0] == "group"]
    assert with_members, seen

    # A record of the stable group had the member with its subscription and assignment.
    full = []
    for _off, key, value in read_partition(broker.bootstrap, kafka_partition_for(group)):
        k = decode_key(key)
        if k == ("group", group) and value is not None:
            full.append(decode_group_value(value))
    stable = [g for g in full if g["members"]]
    assert stable, full
    m = stable[-1]["members"][0]
    assert m["client_id"] == "offsets-topic-test" and m["member_id"] == stable[-1]["leader"]
    assert topic_name.encode() in m["subscription"] and topic_name.encode() in m["assignment"]
    assert stable[-1]["protocol"] in ("range", "roundrobin", "cooperative-sticky")


def test_deleting_a_group_writes_tombstones(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    group = f"gdel-{topic_name}"
    commit_with_group(broker.bootstrap, topic_name, group, 2)
    wait_until(lambda: group_records(broker.bootstrap, group)[0], 20, "the commits")
    admin.delete_consumer_groups([group])[group].result(15)

    def tombstoned():
        offsets, meta, seen = group_records(broker.bootstrap, group)
        return seen and seen[-1] == (("group", group), True) and all(v is None for v in offsets.values())

    wait_until(tombstoned, 20, f"tombstones for {group}")


def consumer_group_records(bootstrap: str, group: str) -> list[tuple[tuple, dict | None]]:
    """Every consumer group record of `group` in its partition, in order: (key, value or None)."""
    out = []
    for _off, key, value in read_partition(bootstrap, kafka_partition_for(group)):
        k = decode_key(key)
        if k[1] == group and k[0] in CONSUMER_GROUP_KEYS.values():
            out.append((k, None if value is None else decode_consumer_value(k[0], value)))
    return out


def test_consumer_group_record_bytes():
    """The records of a KIP-848 group as Kafka 4.0 writes them, read back with the decoder
    above; a classic member carries its ClassicMemberMetadata (tag 0)."""
    from kafscale.groups import consumer_records
    from kafscale.groups.consumer_group import ConsumerGroup, ConsumerGroupConfig, HeartbeatRequest
    from kafscale.groups.consumer_protocol import encode_subscription

    tid = "00000000-0000-0000-0000-00000000000a"
    topics = {"orders": (tid, 3)}
    assert consumer_records.group_metadata_value(5) == struct.pack(">hib", 0, 5, 0)
    assert consumer_records.group_key(3, "grp") == struct.pack(">hh3s", 3, 3, b"grp")
    g = ConsumerGroup("grp", ConsumerGroupConfig())
    g.heartbeat(0.0, HeartbeatRequest(member_id="m1", member_epoch=0, rebalance_timeout_ms=30_000, client_id="cli",
                                      client_host="/h", subscribed_topic_names=("orders",), owned=frozenset()), topics)
    m2_id = g.classic_join(0.0, member_id="", group_instance_id="i2", client_id="cli2", client_host="/h2", session_timeout_ms=10_000,
                   rebalance_timeout_ms=20_000, protocol_type="consumer",
                   protocols=[("range", encode_subscription(["orders"]))], require_known_member_id=False,
                   topics=topics).member_id
    doc = g.to_doc()
    recs = [(decode_key(k), None if v is None else decode_consumer_value(decode_key(k)[0], v))
            for k, v in consumer_records.changes("grp", None, doc)]
    kinds = [k[0] for k, _v in recs]
    assert kinds == ["member-metadata", "member-metadata", "partition-metadata", "consumer-group", "target-member",
                     "target-member", "target-epoch", "current-member", "current-member"]
    by = {k: v for k, v in recs}
    m1, m2 = by[("member-metadata", "grp", "m1")], by[("member-metadata", "grp", m2_id)]
    assert (m1["client_id"], m1["topics"], m1["rebalance_timeout"], m1["classic"]) == ("cli", ["orders"], 30_000, None)
    assert (m2["instance_id"], m2["client_host"], m2["classic"]["session_timeout"]) == ("i2", "/h2", 10_000)
    assert m2["classic"]["protocols"] == [("range", encode_subscription(["orders"]))]
    assert by[("partition-metadata", "grp")]["topics"] == [{"id": tid, "name": "orders", "partitions": 3, "racks": []}]
    assert by[("consumer-group", "grp")]["epoch"] == by[("target-epoch", "grp")]["epoch"] == g.group_epoch
    targets = [by[("target-member", "grp", m)]["partitions"] for m in ("m1", m2_id)]
    assert sorted(p for t in targets for p in t.get(tid, [])) == [0, 1, 2]
    assert by[("current-member", "grp", "m1")]["state"] in (0, 1, 2)
    # Nothing changed, nothing written; a member leaving: its three tombstones first.
    assert consumer_records.changes("grp", doc, g.to_doc()) == []
    g.remove_member(m2_id)
    keys = [(decode_key(k), v is None) for k, v in consumer_records.changes("grp", doc, g.to_doc())]
    assert keys[:3] == [(("current-member", "grp", m2_id), True), (("target-member", "grp", m2_id), True),
                        (("member-metadata", "grp", m2_id), True)]
    assert (("consumer-group", "grp"), False) in keys
    # The group deleted: every record tombstoned, the group epoch last.
    gone = [(decode_key(k), v) for k, v in consumer_records.changes("grp", g.to_doc(), None)]
    assert all(v is None for _k, v in gone) and gone[-1][0] == ("consumer-group", "grp") and len(gone) == 6


def test_consumer_group_records_readable_from_consumer_offsets(broker, topic_name):
    """A group.protocol=consumer member's group in __consumer_offsets: its epoch, its member,
    target and current assignment; tombstones when the member leaves and when the group is deleted."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    group = f"gkip848-{topic_name}"
    commit_with_group(broker.bootstrap, topic_name, group, 4, protocol="consumer")

    def left():
        recs = consumer_group_records(broker.bootstrap, group)
        return recs if recs and recs[-1][0][0] == "consumer-group" and recs[-2][0][0] == "member-metadata" else None

    recs = wait_until(left, 20, f"the records of {group} up to its member leaving")
    member = next(k[2] for k, v in recs if k[0] == "member-metadata" and v is not None)
    values = {k: v for k, v in recs if v is not None}
    assert values[("member-metadata", group, member)]["client_id"] == "offsets-topic-test"
    assert values[("member-metadata", group, member)]["topics"] == [topic_name]
    assert sorted(p for ps in values[("target-member", group, member)]["partitions"].values() for p in ps) == [0, 1]
    assert values[("current-member", group, member)]["epoch"] >= 1
    assert [n["name"] for n in values[("partition-metadata", group)]["topics"]] == [topic_name]
    # The member left: its records tombstoned, then the group epoch moved.
    assert [(k[0], v is None) for k, v in recs[-4:]] == [
        ("current-member", True), ("target-member", True), ("member-metadata", True), ("consumer-group", False)]
    admin.delete_consumer_groups([group])[group].result(15)

    def deleted():
        recs = consumer_group_records(broker.bootstrap, group)
        return recs[-1] == (("consumer-group", group), None) and recs[-2] == (("partition-metadata", group), None)

    wait_until(deleted, 20, f"tombstones for {group}")
    offsets, _meta, _seen = group_records(broker.bootstrap, group)
    assert offsets and all(v is None for v in offsets.values())


def test_transactional_offsets_written_when_the_transaction_commits(broker, topic_name):
    """send_offsets_to_transaction: the offsets reach __consumer_offsets once the transaction
    commits (the marker on the group's partition), never for an aborted one."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    group = f"gtx-{topic_name}"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic_name}"})
    try:
        p.init_transactions(30)
        for offset, commit in ((7, True), (9, False), (11, True)):
            p.begin_transaction()
            p.produce(topic_name, b"x")
            p.send_offsets_to_transaction([TopicPartition(topic_name, 0, offset)], c.consumer_group_metadata(), 30)
            (p.commit_transaction if commit else p.abort_transaction)(30)
    finally:
        c.close()

    def values():
        out = []
        for _off, key, value in read_partition(broker.bootstrap, kafka_partition_for(group)):
            if decode_key(key) == ("offset", group, topic_name, 0) and value is not None:
                out.append(decode_offset_value(value)["offset"])
        return out if out and out[-1] == 11 else None

    assert wait_until(values, 20, f"the transactional commits of {group}") == [7, 11]


def test_metadata_marks_it_internal(broker):
    with RawClient(broker.bootstrap) as c:
        [t] = c.metadata([OFFSETS_TOPIC], allow_auto=False).topics
        assert error_code(t.error_code) == 0 and t.is_internal is True and len(t.partitions) == PARTITIONS
        everything = {x.name: x.is_internal for x in c.metadata(None).topics}
        assert everything[OFFSETS_TOPIC] is True and not any(v for k, v in everything.items() if k != OFFSETS_TOPIC)
        # DescribeTopicPartitions (75) says so too.
        body = req(75, 0, topics=(req(75, 0, "TopicRequest", name=OFFSETS_TOPIC),), response_partition_limit=2000, cursor=None)
        [dt] = c.request(75, 0, body).topics
        assert dt.is_internal is True and len(dt.partitions) == PARTITIONS
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    desc = admin.describe_topics(TopicCollection([OFFSETS_TOPIC]))[OFFSETS_TOPIC].result(15)
    assert desc.is_internal is True and len(desc.partitions) == PARTITIONS
    assert OFFSETS_TOPIC in admin.list_topics(timeout=10).topics
    cfg = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, OFFSETS_TOPIC)])
    configs = list(cfg.values())[0].result(15)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.bytes"].value == "104857600"
    # kafka-python leaves internal topics out of what it lists, by the Metadata flag.
    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert OFFSETS_TOPIC not in kc.topics()
        assert OFFSETS_TOPIC in kc._client.cluster.topics(exclude_internal_topics=False)
        assert OFFSETS_TOPIC in kc._client.cluster.internal_topics
    finally:
        kc.close()


def test_auto_creation_never_makes_a_plain_topic(broker):
    with RawClient(broker.bootstrap) as c:
        for _ in range(2):
            [t] = c.metadata([OFFSETS_TOPIC], allow_auto=True).topics
            assert error_code(t.error_code) == 0 and t.is_internal is True and len(t.partitions) == PARTITIONS
        assert [x.name for x in c.metadata(None).topics].count(OFFSETS_TOPIC) == 1


def test_auto_creation_of_a_missing_topic_makes_the_internal_one(tmp_path):
    """The broker's start could not create the topic (a store outage): a Metadata request
    with auto-creation then makes the internal topic with its configs, not a plain one."""
    import asyncio

    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig
    from kafscale.storage.topic_marker import marker_key

    async def go():
        broker = Broker(BrokerConfig(listen="127.0.0.1:0", data_dir=str(tmp_path), http="", merge_interval_ms=0,
                                     offsets_topic_num_partitions=5, default_partitions=1))  # fmt: skip
        await broker.start()
        try:
            await broker.metadata.delete_topic(OFFSETS_TOPIC)  # as if it had never been made:
            await broker.store.delete([marker_key(broker.config.namespace, OFFSETS_TOPIC)])  # nor its marker
            await broker.logs.stop_topic(OFFSETS_TOPIC)
            host, port = broker.listen_address

            def ask():
                with RawClient(f"{host}:{port}") as c:
                    assert error_code(c.metadata([OFFSETS_TOPIC], allow_auto=False).topics[0].error_code) == ErrorCode.unknown_topic_or_partition
                    c.metadata([OFFSETS_TOPIC], allow_auto=True)
                    return c.metadata([OFFSETS_TOPIC], allow_auto=False).topics[0]

            t = await asyncio.to_thread(ask)
            assert error_code(t.error_code) == 0 and t.is_internal is True and len(t.partitions) == 5
            meta = await broker.metadata.get_topic(OFFSETS_TOPIC)
            assert meta.partitions == 5 and meta.configs["cleanup.policy"] == "compact" and meta.configs["segment.bytes"] == "104857600"
        finally:
            await broker.stop()

    asyncio.run(go())


def test_producers_cannot_write_it(broker):
    batch = records.build_batch([(b"k", b"v")])
    with RawClient(broker.bootstrap) as c:
        for version in (3, 9):
            r = c.produce(OFFSETS_TOPIC, 0, batch, version=version)
            assert error_code(r.error_code) == ErrorCode.invalid_topic_exception
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000})
    errors = []
    p.produce(OFFSETS_TOPIC, key=b"k", value=b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_EXCEPTION]


def test_admin_changes_refused(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(Exception) as e:
        admin.delete_topics([OFFSETS_TOPIC], operation_timeout=10)[OFFSETS_TOPIC].result(15)
    assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    with pytest.raises(Exception) as e:
        admin.create_partitions([NewPartitions(OFFSETS_TOPIC, PARTITIONS + 1)])[OFFSETS_TOPIC].result(15)
    assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    with RawClient(broker.bootstrap) as c:
        assert len(c.metadata([OFFSETS_TOPIC], allow_auto=False).topics[0].partitions) == PARTITIONS
        # DeleteRecords: Kafka's "Cannot delete records of internal topic".
        part = req(21, 2, "DeleteRecordsPartition", partition_index=0, offset=-1)
        body = req(21, 2, topics=(req(21, 2, "DeleteRecordsTopic", name=OFFSETS_TOPIC, partitions=(part,)),), timeout=5000)
        [t] = c.request(21, 2, body).topics
        assert error_code(t.partitions[0].error_code) == ErrorCode.invalid_topic_exception


# -- a cluster: the coordinator is the owner of the group's partition ----------------------------


def find_coordinator(bootstrap: str, group: str) -> int:
    with RawClient(bootstrap, timeout=5) as c:
        r = c.request(10, 3, req(10, 3, key=group, key_type=0))
    assert error_code(r.error_code) == 0, r
    return r.node_id


def txn_coordinator(bootstrap: str, tid: str) -> int:
    with RawClient(bootstrap, timeout=5) as c:
        r = c.request(10, 3, req(10, 3, key=tid, key_type=1))
    assert error_code(r.error_code) == 0, r
    return r.node_id


def _groups_owned_by(owners: dict, tag: str) -> dict[int, str]:
    """A group id for each owner node: one whose __consumer_offsets partition it owns."""
    out: dict[int, str] = {}
    for i in range(1000):
        g = f"g{i}-{tag}"
        node = owners[kafka_partition_for(g)][0]
        out.setdefault(node, g)
        if len(out) == len({n for n, _ in owners.values()}):
            break
    return out


def simple_commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """An offsets-only commit (no group membership), as tools and lag exporters' tests do."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


@pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")
@pytest.mark.timeout(150)
def test_cluster_coordinator_is_the_partition_owner(cluster_factory):  # noqa: F811
    cl = cluster_factory("offs", n=2)
    owners = cl.wait_owned(OFFSETS_TOPIC, PARTITIONS, timeout=30)
    assert {n for n, _ in owners.values()} == {0, 1}  # both brokers own a share
    by_owner = _groups_owned_by(owners, cl.tag)
    assert sorted(by_owner) == [0, 1]
    for node, group in sorted(by_owner.items()):
        topic = f"t{node}-{cl.tag}"
        cl.create_topic(topic, 2)
        cl.wait_owned(topic, 2)
        for b in cl.brokers.values():  # every broker names the partition's owner
            assert find_coordinator(b.bootstrap, group) == node, (group, b.bootstrap)
        commit_with_group(cl.bootstrap, topic, group, 4)

        seen: list = []

        def landed(group=group):
            offsets, meta, _ = group_records(cl.bootstrap, group)
            got = {tp: v["offset"] for tp, v in offsets.items() if v is not None}
            seen[:] = [got, meta]
            return got == {(topic, 0): 2, (topic, 1): 2} and meta is not None

        try:
            wait_until(landed, 30, f"the commits of {group} in {OFFSETS_TOPIC}-{kafka_partition_for(group)}")
        except AssertionError:
            raise AssertionError(f"last read {seen}, all: {read_partition(cl.bootstrap, kafka_partition_for(group))}")
        assert cl.owners(OFFSETS_TOPIC)[kafka_partition_for(group)][0] == node

    # Offsets-only groups, then a third broker joins and takes a share of the topic: the
    # groups whose partitions it took move to it with their offsets (the store has them),
    # and their next commits land in the same partitions, written by the new owner.
    simple = [f"s{i}-{cl.tag}" for i in range(20)]
    for i, g in enumerate(simple):
        simple_commit(cl.bootstrap, g, topic, 100 + i)
    cl.start_broker(2)
    wait_until(lambda: len([n for n, _ in cl.owners(OFFSETS_TOPIC).values() if n == 2]) >= PARTITIONS // 3
               and len(cl.owners(OFFSETS_TOPIC)) == PARTITIONS, 30, "broker 2 to own its share of the topic")  # fmt: skip
    owners = cl.owners(OFFSETS_TOPIC)
    moved = [(i, g) for i, g in enumerate(simple) if owners[kafka_partition_for(g)][0] == 2]
    assert moved, owners
    i, group = moved[0]
    wait_until(lambda: all(find_coordinator(b.bootstrap, group) == 2 for b in cl.live().values()), 30,
               f"every broker to name broker 2 as the coordinator of {group}")  # fmt: skip
    c = Consumer({"bootstrap.servers": cl.brokers[2].bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=15)
        assert tp.offset == 100 + i  # carried over: the new coordinator read it from the store
    finally:
        c.close()
    simple_commit(cl.bootstrap, group, topic, 500)

    def rewritten():
        offsets, _, _ = group_records(cl.bootstrap, group)
        v = offsets.get((topic, 0))
        return v is not None and v["offset"] == 500

    wait_until(rewritten, 30, f"the new commit of {group}, by broker 2")

    # A transaction coordinated by another broker than the group's: its marker reaches the
    # group's partition through WriteTxnMarkers to the partition's owner, which then writes
    # the transaction's offsets there.
    gtx = f"gtx-{cl.tag}"
    one = cl.brokers[0].bootstrap
    gnode = find_coordinator(one, gtx)
    tid = next(t for t in (f"tx{i}-{cl.tag}" for i in range(200)) if txn_coordinator(one, t) != gnode)
    c = Consumer({"bootstrap.servers": cl.bootstrap, "group.id": gtx})
    p = Producer({"bootstrap.servers": cl.bootstrap, "transactional.id": tid})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, b"x", partition=0)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 77)], c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
    finally:
        c.close()

    def txn_landed():
        v = group_records(cl.bootstrap, gtx)[0].get((topic, 0))
        return v is not None and v["offset"] == 77

    wait_until(txn_landed, 30, f"the transactional commit of {gtx} (group coordinator {gnode}, transaction's elsewhere)")


def test_the_compactor_keeps_the_latest_commit_per_key(broker_factory):
    """The topic is compacted like any compacted topic: after many commits of one group and
    partition, a reader from the beginning finds the latest commit (at its original offset)
    and none of the superseded ones."""
    from tests.support.compaction import FAST_COMPACTION

    b = broker_factory(extra_args=[*FAST_COMPACTION, "--merge-interval-ms", "0", "--offsets-topic-num-partitions", "3"])
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, OFFSETS_TOPIC, incremental_configs=[
        ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET)])
    list(admin.incremental_alter_configs([res]).values())[0].result(15)
    admin.create_topics([NewTopic("src", 1, 1)])["src"].result(15)
    group = "compacted-group"
    partition = kafka_partition_for(group, 3)
    for offset in range(1, 21):
        simple_commit(b.bootstrap, group, "src", offset)  # each commit flushes its own segment
    # Another group in the same partition commits last, once the last commit is durable (or
    # both may share one flush): its segment is the newest, which is never cleaned.
    wait_until(lambda: any(off == 20 for off, _k, _v in read_partition(b.bootstrap, partition)), 15, "the last commit")
    other = next(g for g in (f"other-{i}" for i in range(100)) if kafka_partition_for(g, 3) == partition)
    simple_commit(b.bootstrap, other, "src", 1)
    # The partition's log, as appended: the first commit (offset 0), the new offsets-only
    # group's record (1), the other 19 commits (2-20), then the other group's (21, 22). The
    # compactor may already be at work (it checks every 100 ms).

    def compacted():
        got = [(off, decode_offset_value(v)["offset"]) for off, k, v in read_partition(b.bootstrap, partition)
               if v is not None and decode_key(k) == ("offset", group, "src", 0)]
        return got if len(got) == 1 else None

    try:
        assert wait_until(compacted, 30, f"the compaction of {OFFSETS_TOPIC}-{partition}") == [(20, 20)]
    except AssertionError:
        log = [ln for ln in b.log_text().splitlines() if "compact" in ln or "WARNING" in ln or "ERROR" in ln]
        raise AssertionError(f"{[(o, decode_key(k)) for o, k, _v in read_partition(b.bootstrap, partition)]}\n" + "\n".join(log[-30:]))
    survivors = [(off, decode_key(k)) for off, k, v in read_partition(b.bootstrap, partition)]
    assert survivors[0] == (1, ("group", group)) and (20, ("offset", group, "src", 0)) in survivors


@pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")
@pytest.mark.timeout(60)
async def test_groups_let_go_when_their_partition_moves(backends):  # noqa: F811
    """In-process: two EtcdClusters; when the second takes its share of __consumer_offsets
    (no change of coordinator by membership alone would tell), the first one's group
    coordinator is told and lets go of the groups whose partitions moved, and keeps the others."""
    import uuid
    from types import SimpleNamespace

    from kafscale.cluster.etcd_cluster import EtcdCluster
    from kafscale.cluster.membership import BrokerNode
    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.metadata.etcd import EtcdKV
    from kafscale.metadata.store import MetadataStore, TopicMeta
    from tests.support.wait import wait_until_async

    etcd, _moto = backends
    prefix = f"/moves-{uuid.uuid4().hex[:8]}"
    kvs = [EtcdKV.from_url(etcd.url, prefix=prefix) for _ in range(2)]
    stores = [MetadataStore(kv) for kv in kvs]
    await stores[0].create_topic(TopicMeta(OFFSETS_TOPIC, 8))
    first = EtcdCluster(BrokerNode(0, "127.0.0.1", 1), kvs[0], stores[0], 5, offsets_topic_partitions=8)
    second = EtcdCluster(BrokerNode(1, "127.0.0.1", 2), kvs[1], stores[1], 5, offsets_topic_partitions=8)
    calls = []
    first.group_listeners.append(lambda c: calls.append(c))
    groups = GroupCoordinator(stores[0], SimpleNamespace(), first)
    await first.start()
    try:
        names = [f"g{i}" for i in range(40)]
        assert all(first.is_group_coordinator(g) for g in names)  # alone, it coordinates all
        for g in names:  # each becomes a loaded (offsets-only) group on the first broker
            assert await groups.commit_offsets(g, member_id="", group_instance_id=None, generation_id=-1,
                                               offsets={("t", 0): CommittedOffset(1)}, api_version=8) == ErrorCode.none
        assert set(groups.groups) == set(names)
        await second.start()
        def seconds():
            return {p for p in range(8) if first.owner_of(OFFSETS_TOPIC, p) == 1 and second.owns(OFFSETS_TOPIC, p)}

        await wait_until_async(lambda: len(seconds()) == 4, 20, "the second broker to own its half of the topic, as the first sees it")
        moved = {g for g in names if kafka_partition_for(g, 8) in seconds()}
        assert moved and moved != set(names)
        assert calls, "the group listeners were not told of the ownership change"
        await wait_until_async(lambda: set(groups.groups) == set(names) - moved, 10, "the moved groups to be let go")
        assert all(second.is_group_coordinator(g) == (g in moved) for g in names)
        assert all(first.is_group_coordinator(g) == (g not in moved) for g in names)
    finally:
        await groups.stop()
        await second.stop()
        await first.stop()
        for s in stores:
            await s.close()


async def test_expiry_and_offset_delete_write_tombstones(tmp_path):
    """The coordinator's records for removals (in-process, the append captured): an offset
    expired by offsets.retention.minutes and then its empty offsets-only group go as
    tombstones, offset by offset and then the group; OffsetDelete's too."""
    import asyncio
    from types import SimpleNamespace

    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import MetadataStore

    store = MetadataStore(SqliteKV(tmp_path / "m.sqlite"))
    clock = SimpleNamespace(now=1_000_000.0)
    appended = []

    async def append(topic, partition, recs):
        appended.append((topic, partition, [(decode_key(k), v is None) for k, v in recs]))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    groups = GroupCoordinator(store, SimpleNamespace(offsets_retention_minutes=1), clock=lambda: clock.now, append_records=append)
    try:
        commit = dict(member_id="", group_instance_id=None, generation_id=-1, api_version=8)
        for g in ("gexp", "gdel"):
            assert await groups.commit_offsets(g, offsets={("t", 0): CommittedOffset(5), ("t", 1): CommittedOffset(6)}, **commit) == ErrorCode.none
        assert appended[0] == (OFFSETS_TOPIC, kafka_partition_for("gexp"), [(("offset", "gexp", "t", 0), False), (("offset", "gexp", "t", 1), False)])
        appended.clear()
        error, per_partition = await groups.delete_offsets("gdel", [("t", 1)])
        assert error == ErrorCode.none and per_partition == {("t", 1): ErrorCode.none}
        assert appended == [(OFFSETS_TOPIC, kafka_partition_for("gdel"), [(("offset", "gdel", "t", 1), True)])]
        appended.clear()
        clock.now += 30_000
        await groups.commit_offsets("gdel", offsets={("t", 0): CommittedOffset(9)}, **commit)  # a fresh commit: not expired
        appended.clear()
        clock.now += 30_000
        assert await groups.expire_offsets() == 2  # gexp's two offsets; gdel's t-0 is younger
        assert appended == [
            (OFFSETS_TOPIC, kafka_partition_for("gexp"), [(("offset", "gexp", "t", 0), True), (("offset", "gexp", "t", 1), True)]),
            (OFFSETS_TOPIC, kafka_partition_for("gexp"), [(("group", "gexp"), True)]),
        ]
    finally:
        await groups.stop()
        await store.close()


async def test_pipeline_patterns_leave_the_internal_topic_out(tmp_path):
    """The Spark source's subscribePattern matches no internal topic (a Kafka consumer's
    pattern subscription leaves them out); subscribe names it explicitly."""
    from kafscale.pipeline.segments import list_topics
    from kafscale.storage import segment
    from kafscale.storage.backends import open_store

    store = open_store(f"file://{tmp_path}/objects")
    try:
        for topic in ("orders", OFFSETS_TOPIC):
            await store.put(segment.segment_key("default", topic, 0, 0), [b"x"])
        assert (await list_topics(store, "default", pattern=".*")).topics() == ["orders"]
        assert (await list_topics(store, "default", topics=[OFFSETS_TOPIC])).topics() == [OFFSETS_TOPIC]
    finally:
        await store.close()
