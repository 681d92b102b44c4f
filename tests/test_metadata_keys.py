"""Metadata keys: every name is escaped so no group, topic or other name can read, overwrite
or delete another's keys (group `orders` vs `orders/eu`), and stores written in the layout
before escaping keep their groups and offsets.

Unit tests of `kafscale.metadata.keys`; the MetadataStore on SQLite and on a real etcd;
real brokers (embedded, and `--metadata etcd://`) driven by confluent-kafka.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.structs import OffsetAndMetadata

from kafscale.metadata import keys
from kafscale.metadata.etcd import EtcdKV
from kafscale.metadata.kv import Txn
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import CommittedOffset, MetadataStore

HOSTILE_NAMES = [
    "a",
    "a/b",
    "a%2Fb",
    "a%252Fb",
    "a/",
    "/a",
    "/",
    "//",
    "%",
    "%2",
    ".",
    "..",
    "...",
    "../a",
    "a/../b",
    "",
    " ",
    "\t\n",
    "\u00a0",
    "orders",
    "orders/eu",
    "orders.eu",
    "orders_eu",
    "Ωμέγα/東京",
    "emoji-\U0001f600",
    "\ud800",  # a lone surrogate: must not crash
    "x" * 249,
    "/" * 249,
    "\U0001f600" * 249,
]


# ---------------------------------------------------------------------------------------
# keys.py


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_escape_round_trips_and_never_holds_a_slash(name):
    component = keys.escape(name)
    assert "/" not in component
    assert component not in (".", "..")
    assert component.isascii()
    assert keys.unescape(component) == name


def test_escape_is_injective_and_no_key_covers_another_names_keys():
    components = [keys.escape(n) for n in HOSTILE_NAMES]
    assert len(set(components)) == len(HOSTILE_NAMES)
    for a in HOSTILE_NAMES:
        for b in HOSTILE_NAMES:
            if a == b:
                continue
            # Another group's offsets are never under this group's prefix, nor its group key.
            assert not keys.offset(b, "t", 0).startswith(keys.group_offsets_prefix(a))
            assert keys.group(a) != keys.group(b)
            # Likewise per topic (for partitions, segments, owners).
            assert not keys.partition(b, 0).startswith(keys.topic_partitions_prefix(a))
            assert not keys.segment(b, 0, 0).startswith(keys.topic_segments_prefix(a))
            assert not keys.segment(b, 0, 0).startswith(keys.segments_prefix(a, 0))
            assert keys.topic(a) != keys.topic(b)


def test_kafka_topic_names_keep_their_keys():
    # Legal topic names escape to themselves, so topic keys written before escaping still match.
    for name in ("orders", "my.topic_v2-x", "A" * 249, "__consumer_offsets"):
        assert keys.escape(name) == name
        assert keys.topic(name) == f"/topics/{name}"
        assert keys.partition(name, 3) == f"/partitions/{name}/3"
        assert keys.segment(name, 3, 42) == f"/segments/{name}/3/{42:020d}"
        assert keys.owner(name, 3) == f"/owners/{name}/3"


def test_examples_of_escaped_keys():
    assert keys.group("orders/eu") == "/consumer-groups/orders%2Feu"
    assert keys.group("a%2Fb") == "/consumer-groups/a%252Fb"
    assert keys.group("..") == "/consumer-groups/%2E%2E"
    assert keys.group(" ") == "/consumer-groups/%20"
    assert keys.offset("orders", "eu/t", 0) == "/committed-offsets/orders/eu%2Ft/0"
    assert keys.offset("orders/eu", "t", 0) == "/committed-offsets/orders%2Feu/t/0"
    assert keys.group("é") == "/consumer-groups/%C3%A9"


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_parsers_invert_builders(name):
    assert keys.group_id_of(keys.group(name)) == name
    assert keys.offset_partition_of(keys.offset("g", name, 7)) == (name, 7)
    assert keys.offset_partition_of(keys.offset(name, "t", 7)) == ("t", 7)
    assert keys.owner_partition_of(keys.owner(name, 12)) == (name, 12)
    assert keys.transactional_id_of(keys.transaction(name)) == name
    assert keys.pending_offset_of(keys.pending_offset(name, 42, name, 3)) == (42, name, 3)
    assert keys.pending_offset(name, 42, "t", 3).startswith(keys.producer_pending_offsets_prefix(name, 42))


def test_parsers_reject_foreign_keys():
    for bad in ("/consumer-groups/a/b", "/consumer-groups/a b", "/consumer-groups/%2", "/consumer-groups/%zz", "/topics/x"):
        with pytest.raises(keys.MalformedKey):
            keys.group_id_of(bad)
    for bad in ("/committed-offsets/g/t", "/committed-offsets/g/t/x", "/committed-offsets/g/t/0/1", "/committed-offsets/g/t/-1"):
        with pytest.raises(keys.MalformedKey):
            keys.offset_partition_of(bad)
    with pytest.raises(keys.MalformedKey):
        keys.broker_id_of("/brokers/x")
    assert keys.broker_id_of(keys.broker(12)) == 12


def test_legacy_parsers_read_raw_group_ids():
    assert keys.legacy_group_id_of("/groups/orders/eu") == "orders/eu"
    assert keys.legacy_offset_of("/offsets/orders/eu/t.x_y/3") == ("orders/eu", "t.x_y", 3)
    assert keys.legacy_offset_of("/offsets/orders/t/0") == ("orders", "t", 0)
    assert keys.legacy_offset_of("/offsets//t/0") == ("", "t", 0)
    for bad in ("/offsets/t/0", "/offsets/g/t/x"):
        with pytest.raises(keys.MalformedKey):
            keys.legacy_offset_of(bad)


# ---------------------------------------------------------------------------------------
# MetadataStore on SQLite and etcd


@pytest.fixture(params=["sqlite", "etcd"])
def store(request, tmp_path):
    if request.param == "sqlite":
        kv = SqliteKV(tmp_path / "meta.sqlite")
    else:
        etcd = request.getfixturevalue("etcd_server")
        kv = EtcdKV.from_url(etcd.url, prefix=f"/keys-{uuid.uuid4().hex[:8]}")
    s = MetadataStore(kv)
    yield s
    asyncio.run(s.close())


def _off(n: int) -> CommittedOffset:
    return CommittedOffset(offset=n, leader_epoch=-1, metadata="", commit_ms=n)


def test_transactions_and_pending_offsets_per_group_and_producer(store):
    async def go():
        from kafscale.metadata.store import ConflictError

        v = await store.put_transaction("tx/1", {"state": "Ongoing"}, 0)
        with pytest.raises(ConflictError):
            await store.put_transaction("tx/1", {"state": "Ongoing"}, 0)  # a stale coordinator
        assert await store.get_transaction("tx/1") == ({"state": "Ongoing"}, v)
        assert await store.get_transaction("tx") is None
        for g in ("orders", "orders/eu"):
            await store.put_pending_offsets(g, 7, {("t", 0): _off(5)})
            await store.put_pending_offsets(g, 8, {("t", 1): _off(6)})
        assert await store.pending_offset_partitions("orders") == {("t", 0), ("t", 1)}
        # Commit producer 7's offsets of "orders" only; "orders/eu" and producer 8 stay pending.
        v = await store.complete_transaction("tx/1", {"state": "CompleteCommit"}, v, 7, ["orders"], True, 99)
        assert (await store.fetch_offsets("orders"))[("t", 0)].offset == 5
        assert (await store.fetch_offsets("orders"))[("t", 0)].commit_ms == 99
        assert await store.pending_offset_partitions("orders") == {("t", 1)}
        assert await store.pending_offset_partitions("orders/eu") == {("t", 0), ("t", 1)}
        await store.complete_transaction("tx/1", {"state": "CompleteAbort"}, v, 7, ["orders/eu"], False, 100)
        assert await store.fetch_offsets("orders/eu") == {}
        assert await store.pending_offset_partitions("orders/eu") == {("t", 1)}
        assert list(await store.list_transactions()) == ["tx/1"]
        # OffsetDelete drops the partition's pending offsets too; DeleteGroups all of the
        # group's, and only that group's.
        await store.put_pending_offsets("orders", 9, {("t", 1): _off(7), ("t", 2): _off(8)})
        await store.delete_offsets("orders", [("t", 1)])
        assert await store.pending_offset_partitions("orders") == {("t", 2)}
        await store.delete_group("orders")
        assert await store.pending_offset_partitions("orders") == set()
        assert await store.pending_offset_partitions("orders/eu") == {("t", 1)}

    asyncio.run(go())


def test_store_keeps_hostile_groups_apart(store):
    async def go():
        for i, g in enumerate(HOSTILE_NAMES):
            await store.put_group(g, {"i": i})
            await store.commit_offsets(g, {("t.x_y", 0): _off(i), ("t", 1): _off(1000 + i)})
        assert await store.list_groups() == {g: {"i": i} for i, g in enumerate(HOSTILE_NAMES)}
        for i, g in enumerate(HOSTILE_NAMES):
            assert await store.get_group(g) == {"i": i}
            assert await store.fetch_offsets(g) == {("t.x_y", 0): _off(i), ("t", 1): _off(1000 + i)}
        # Deleting `a` (and `orders`) leaves `a/b`, `a%2Fb` (and `orders/eu`) alone.
        await store.delete_group("a")
        await store.delete_group("orders")
        await store.delete_offsets("a/b", [("t", 1)])
        for i, g in enumerate(HOSTILE_NAMES):
            if g in ("a", "orders"):
                assert await store.get_group(g) is None and await store.fetch_offsets(g) == {}
            elif g == "a/b":
                assert await store.fetch_offsets(g) == {("t.x_y", 0): _off(i)}
            else:
                assert await store.get_group(g) == {"i": i}
                assert await store.fetch_offsets(g) == {("t.x_y", 0): _off(i), ("t", 1): _off(1000 + i)}

    asyncio.run(go())


async def _write_legacy_layout(kv) -> None:
    """Keys exactly as the store wrote them before names were escaped."""

    def doc(n: int) -> bytes:
        return json.dumps({"offset": n, "leader_epoch": -1, "metadata": "", "commit_ms": n}).encode()

    await kv.commit(
        Txn(
            puts=[
                ("/groups/orders", b'{"protocol_type":"consumer","g":"orders"}'),
                ("/groups/orders/eu", b'{"protocol_type":"consumer","g":"orders/eu"}'),
                ("/offsets/orders/t.x_y/0", doc(5)),
                ("/offsets/orders/t.x_y/1", doc(6)),
                ("/offsets/orders/eu/t.x_y/0", doc(7)),
                ("/offsets/simple/t/0", doc(8)),
            ]
        )
    )


def test_migration_moves_the_old_layout_once(store):
    async def go():
        await _write_legacy_layout(store.kv)
        # A not-yet-upgraded broker already rewrote one offset in the new layout (later),
        # and the new layout holds a later commit for another: the later commit wins.
        await store.commit_offsets("orders", {("t.x_y", 1): _off(60)})
        await store.kv.commit(Txn(puts=[("/offsets/simple/t/0", json.dumps({"offset": 80, "commit_ms": 80}).encode())]))
        await store.commit_offsets("simple", {("t", 0): _off(9)})

        # Two brokers starting at once: both migrate, each key moves exactly once.
        other = MetadataStore(store.kv)
        moved = await asyncio.gather(store.migrate_legacy_keys(), other.migrate_legacy_keys())
        assert sum(moved) == 6  # every old key, by exactly one of the two
        assert await store.kv.range(keys.LEGACY_GROUPS) == [] and await store.kv.range(keys.LEGACY_OFFSETS) == []
        assert await store.migrate_legacy_keys() == 0

        assert set(await store.list_groups()) == {"orders", "orders/eu"}
        assert (await store.get_group("orders/eu"))["g"] == "orders/eu"
        assert {tp: o.offset for tp, o in (await store.fetch_offsets("orders")).items()} == {("t.x_y", 0): 5, ("t.x_y", 1): 60}
        assert {tp: o.offset for tp, o in (await store.fetch_offsets("orders/eu")).items()} == {("t.x_y", 0): 7}
        assert {tp: o.offset for tp, o in (await store.fetch_offsets("simple")).items()} == {("t", 0): 80}

    asyncio.run(go())


# ---------------------------------------------------------------------------------------
# real brokers, confluent-kafka

OFFSET_NONE = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset


def _create_topic(admin: AdminClient, topic: str, partitions: int = 2) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=15)[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(n):
        for part in (0, 1):
            p.produce(topic, value=f"v{i}".encode(), partition=part)
    assert p.flush(30) == 0


def _consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    c = _consumer(bootstrap, group)
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    c = _consumer(bootstrap, group)
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=20)}
    finally:
        c.close()


def _groups(admin: AdminClient) -> set[str]:
    result = admin.list_consumer_groups(request_timeout=15).result(timeout=30)
    return {g.group_id for g in result.valid}


def _delete_group(admin: AdminClient, group: str) -> None:
    admin.delete_consumer_groups([group], request_timeout=15)[group].result(timeout=30)


def _fetched_topics(admin: AdminClient, group: str) -> set[str]:
    """Topics in the group's OffsetFetch answer for all its offsets."""
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=15)[group].result(timeout=30)
    return {tp.topic for tp in result.topic_partitions}


HOSTILE_GROUPS = ["a", "a/b", "a%2Fb", "..", "\u00a0", "a b", "東京/é"]


def _check_groups_are_independent(bootstrap: str) -> str:
    """Returns the topic; afterwards `orders`, " " and HOSTILE_GROUPS but `a` have offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"t.x_y-{uuid.uuid4().hex[:6]}"
    _create_topic(admin, topic)
    _produce(bootstrap, topic, 10)

    _commit(bootstrap, "orders", topic, {0: 3, 1: 4})
    _commit(bootstrap, "orders/eu", topic, {0: 7, 1: 8})
    assert _committed(bootstrap, "orders", topic) == {0: 3, 1: 4}
    assert _committed(bootstrap, "orders/eu", topic) == {0: 7, 1: 8}
    # `orders`'s OffsetFetch (all topics) does not see `orders/eu`'s offsets as topic `eu/...`.
    assert _fetched_topics(admin, "orders") == {topic}
    assert _fetched_topics(admin, "orders/eu") == {topic}
    assert {"orders", "orders/eu"} <= _groups(admin)

    _delete_group(admin, "orders")
    assert _committed(bootstrap, "orders", topic) == {0: OFFSET_NONE, 1: OFFSET_NONE}
    assert _committed(bootstrap, "orders/eu", topic) == {0: 7, 1: 8}
    groups = _groups(admin)
    assert "orders/eu" in groups and "orders" not in groups

    # And the other way round: deleting `orders/eu` leaves a new `orders` alone.
    _commit(bootstrap, "orders", topic, {0: 5, 1: 6})
    _delete_group(admin, "orders/eu")
    assert _committed(bootstrap, "orders/eu", topic) == {0: OFFSET_NONE, 1: OFFSET_NONE}
    assert _committed(bootstrap, "orders", topic) == {0: 5, 1: 6}

    # More hostile group ids, each with its own offsets. (librdkafka refuses a group.id of
    # only ASCII whitespace, so " " goes through kafka-python.)
    hostile = HOSTILE_GROUPS
    for i, group in enumerate(hostile):
        _commit(bootstrap, group, topic, {0: i, 1: 10 + i})
    blank = KafkaConsumer(bootstrap_servers=bootstrap, group_id=" ", enable_auto_commit=False)
    try:
        blank.commit({KafkaTopicPartition(topic, 0): OffsetAndMetadata(99, "", -1)})
    finally:
        blank.close()
    _delete_group(admin, "a")
    assert {g: _committed(bootstrap, g, topic) for g in hostile} == {
        g: ({0: OFFSET_NONE, 1: OFFSET_NONE} if g == "a" else {0: i, 1: 10 + i}) for i, g in enumerate(hostile)
    }
    blank = KafkaConsumer(bootstrap_servers=bootstrap, group_id=" ", enable_auto_commit=False)
    try:
        assert blank.committed(KafkaTopicPartition(topic, 0)) == 99
        assert blank.committed(KafkaTopicPartition(topic, 1)) is None
    finally:
        blank.close()
    return topic


@pytest.mark.timeout(120)
def test_groups_with_slashes_are_independent_embedded(broker_factory):
    b = broker_factory(extra_args=["--group-initial-rebalance-delay-ms", "0"])
    _check_groups_are_independent(b.bootstrap)


@pytest.mark.timeout(120)
def test_groups_with_slashes_are_independent_on_etcd(broker_factory, etcd_server):
    prefix = f"/keys-{uuid.uuid4().hex[:8]}"
    b = broker_factory(extra_args=["--metadata", etcd_server.url, "--metadata-prefix", prefix, "--lease-ttl-s", "5", "--group-initial-rebalance-delay-ms", "0"])
    topic = _check_groups_are_independent(b.bootstrap)

    async def layout():
        kv = EtcdKV.from_url(etcd_server.url, prefix=prefix)
        try:
            return [x.key for x in await kv.range(keys.OFFSETS)]
        finally:
            await kv.close()

    # What etcd holds is exactly the escaped layout.
    expected = [keys.offset(g, topic, p) for g in ["orders", *HOSTILE_GROUPS[1:]] for p in (0, 1)] + [keys.offset(" ", topic, 0)]
    assert asyncio.run(layout()) == sorted(expected)


@pytest.mark.timeout(120)
def test_broker_migrates_a_store_written_in_the_old_layout(broker_factory, tmp_path):
    data_dir = tmp_path / "data"

    async def write_old():
        kv = SqliteKV(data_dir / "metadata.sqlite")
        await _write_legacy_layout(kv)
        await kv.close()

    asyncio.run(write_old())
    b = broker_factory(data_dir=str(data_dir), extra_args=["--group-initial-rebalance-delay-ms", "0"])
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    _create_topic(admin, "t.x_y")
    assert _committed(b.bootstrap, "orders", "t.x_y") == {0: 5, 1: 6}
    assert _committed(b.bootstrap, "orders/eu", "t.x_y") == {0: 7, 1: OFFSET_NONE}
    _delete_group(admin, "orders")
    assert _committed(b.bootstrap, "orders", "t.x_y") == {0: OFFSET_NONE, 1: OFFSET_NONE}
    assert _committed(b.bootstrap, "orders/eu", "t.x_y") == {0: 7, 1: OFFSET_NONE}
    assert "moved 6 group and offset keys" in b.log_text()


@pytest.mark.timeout(120)
def test_old_layout_keys_written_during_a_rolling_upgrade_are_migrated(broker_factory, etcd_server):
    """An old broker sharing etcd keeps writing the old layout after this one started: its
    commits become visible at the next retention pass, not only at the next restart."""
    prefix = f"/keys-{uuid.uuid4().hex[:8]}"
    b = broker_factory(
        extra_args=["--metadata", etcd_server.url, "--metadata-prefix", prefix, "--lease-ttl-s", "5", "--offsets-retention-check-interval-ms", "300"]
    )
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    _create_topic(admin, "t.x_y")

    async def old_broker_commits():
        kv = EtcdKV.from_url(etcd_server.url, prefix=prefix)
        try:
            await _write_legacy_layout(kv)
        finally:
            await kv.close()

    asyncio.run(old_broker_commits())
    deadline = time.monotonic() + 30
    while _committed(b.bootstrap, "orders/eu", "t.x_y") != {0: 7, 1: OFFSET_NONE}:
        assert time.monotonic() < deadline, f"old-layout offsets never became visible; broker log:\n{b.log_text()[-3000:]}"
        time.sleep(0.2)
    assert _committed(b.bootstrap, "orders", "t.x_y") == {0: 5, 1: 6}
