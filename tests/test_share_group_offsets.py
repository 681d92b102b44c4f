"""A share group's offsets (KIP-932) over TCP: DescribeShareGroupOffsets (90),
AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92) as raw frames against a real
broker read by confluent-kafka's ShareConsumer (librdkafka 2.16 has no admin calls for
them): describe shows where the group is, alter (empty group only) moves it and a new
consumer reads from there, delete makes the group start afresh; Kafka's error codes."""

from __future__ import annotations

import json

import pytest
from kio.schema.errors import ErrorCode

from tests.support.raw import RawClient, error_code, req
from tests.test_admin_cli import cli, ok
from tests.support.wait import wait_until
from tests.test_share_consumer import consumer, create_topic, names, sbroker, set_group_configs  # noqa: F401

pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402

DESCRIBE, ALTER, DELETE = 90, 91, 92


def describe(c: RawClient, group: str, topics: dict[str, list[int]] | None):
    wanted = None if topics is None else tuple(
        req(DESCRIBE, 1, "DescribeShareGroupOffsetsRequestTopic", topic_name=t, partitions=tuple(ps)) for t, ps in topics.items())
    [g] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, groups=(
        req(DESCRIBE, 1, "DescribeShareGroupOffsetsRequestGroup", group_id=group, topics=wanted),))).groups
    return g


def starts(g) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (start offset, error code)"""
    return {(t.topic_name, p.partition_index): (p.start_offset, error_code(p.error_code)) for t in g.topics for p in t.partitions}


def lags(g) -> dict[tuple[str, int], int]:
    return {(t.topic_name, p.partition_index): p.lag for t in g.topics for p in t.partitions}


def alter(c: RawClient, group: str, topic: str, offsets: dict[int, int]):
    parts = tuple(req(ALTER, 0, "AlterShareGroupOffsetsRequestPartition", partition_index=p, start_offset=o) for p, o in offsets.items())
    return c.request(ALTER, 0, req(ALTER, 0, group_id=group, topics=(
        req(ALTER, 0, "AlterShareGroupOffsetsRequestTopic", topic_name=topic, partitions=parts),)))


def delete(c: RawClient, group: str, *topics: str):
    return c.request(DELETE, 0, req(DELETE, 0, group_id=group, topics=tuple(
        req(DELETE, 0, "DeleteShareGroupOffsetsRequestTopic", topic_name=t) for t in topics)))


def read_values(bootstrap: str, group: str, topic: str, n: int) -> list[bytes]:
    """A share consumer reading and accepting until it has `n` records; closed after."""
    got: list[bytes] = []
    c = consumer(bootstrap, group, topic, explicit=True)
    try:
        def more() -> bool:
            for m in c.poll(0.3):
                assert m.error() is None, m.error()
                got.append(m.value())
                c.acknowledge(m)
            c.commit_sync(10)
            return len(got) >= n
        wait_until(more, 60, f"{n} records read")
    finally:
        c.close()
    return got


def test_describe_alter_and_delete_share_group_offsets(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = names("shareoff")
    create_topic(bootstrap, topic, 2)
    set_group_configs(bootstrap, group, share_auto_offset_reset="earliest")
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        p.produce(topic, value=f"v-{i}".encode(), partition=i % 2)
    assert p.flush(20) == 0
    with RawClient(bootstrap) as c:
        # a group that does not exist (yet)
        assert error_code(describe(c, group, None).error_code) == ErrorCode.group_id_not_found.value
        assert error_code(alter(c, group, topic, {0: 0}).error_code) == ErrorCode.group_id_not_found.value
        assert error_code(delete(c, group, topic).error_code) == ErrorCode.group_id_not_found.value

        # a consumer accepts everything: each partition's start offset is its log end
        live = consumer(bootstrap, group, topic, explicit=True)
        try:
            seen = []

            def all_accepted() -> bool:
                ms = live.poll(0.3)
                for m in ms:
                    seen.append((m.partition(), m.offset()))
                    live.acknowledge(m)
                if ms:
                    live.commit_sync(10)
                return len(seen) >= 100
            wait_until(all_accepted, 60, "100 records accepted")
            ends = {p: 1 + max(o for q, o in seen if q == p) for p, _ in seen}
            assert ends == {0: 50, 1: 50}
            g = describe(c, group, {topic: [0, 1, 2]})
            assert error_code(g.error_code) == 0
            got = starts(g)
            assert got[(topic, 2)] == (-1, ErrorCode.unknown_topic_or_partition.value)
            assert {p: got[(topic, p)] for p in ends} == {p: (end, 0) for p, end in ends.items()}
            assert {p: lags(g)[(topic, p)] for p in ends} == {p: 0 for p in ends}
            assert {(t, p): s for (t, p), s in starts(describe(c, group, None)).items()} == {
                (topic, p): (end, 0) for p, end in ends.items()}
            # `kafscale groups list|describe` show the share group (librdkafka's admin API does not)
            listed = json.loads(ok(cli(sbroker, "groups", "list", "--json")))
            assert {"group": group, "state": "Stable", "type": "share", "protocol": "share"} in listed
            d = json.loads(ok(cli(sbroker, "groups", "describe", group, "--json")))
            assert (d["protocol"], d["state"], d["assignor"], len(d["members"])) == ("share", "Stable", "simple", 1)
            assert sorted(d["members"][0]["assignment"]) == [f"{topic}-0", f"{topic}-1"]
            assert {(r["topic"], r["partition"], r["start_offset"], r["lag"]) for r in d["partitions"]} == {
                (topic, p, end, 0) for p, end in ends.items()}
            text = ok(cli(sbroker, "groups", "describe", group))
            assert "START-OFFSET" in text and f"Group: {group}" in text and "Protocol: share" in text
            # a member is in: neither alter nor delete
            assert error_code(alter(c, group, topic, {0: 0}).error_code) == ErrorCode.non_empty_group.value
            assert error_code(delete(c, group, topic).error_code) == ErrorCode.non_empty_group.value
        finally:
            live.close()

        # empty now: move one partition back to offset 10 of its 'ends' records
        p, end = max(ends.items(), key=lambda kv: kv[1])
        wait_until(lambda: error_code(alter(c, group, topic, {p: 10}).error_code) == 0, 30, "the group empty, offsets altered")
        r = alter(c, group, topic, {p: 10, 7: 0})
        [t] = r.responses
        assert {x.partition_index: error_code(x.error_code) for x in t.partitions} == {p: 0, 7: ErrorCode.unknown_topic_or_partition.value}
        assert starts(describe(c, group, {topic: [p]}))[(topic, p)] == (10, 0)
        assert lags(describe(c, group, {topic: [p]}))[(topic, p)] == end - 10
        assert len(read_values(bootstrap, group, topic, end - 10)) == end - 10
        assert starts(describe(c, group, {topic: [p]}))[(topic, p)] == (end, 0)

        # delete: no state left; a new consumer starts afresh (earliest: all 100 again)
        r = delete(c, group, topic, f"none-{topic}")
        assert error_code(r.error_code) == 0
        assert {x.topic_name: error_code(x.error_code) for x in r.responses} == {
            topic: 0, f"none-{topic}": ErrorCode.unknown_topic_or_partition.value}
        assert starts(describe(c, group, None)) == {}
        assert starts(describe(c, group, {topic: [0, 1]})) == {(topic, 0): (-1, 0), (topic, 1): (-1, 0)}
        assert len(read_values(bootstrap, group, topic, 100)) == 100

        # `kafscale groups reset-offsets` moves an empty share group's start: a dry run first
        dry = ["groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset", "20", "--json"]
        plan = json.loads(ok(wait_until(lambda: (lambda r: r if r.returncode == 0 else None)(cli(sbroker, *dry)), 30, "the group empty again")))
        assert (plan["executed"], [(r["partition"], r["current"], r["new"]) for r in plan["partitions"]]) == (False, [(0, 50, 20)])
        assert starts(describe(c, group, {topic: [0]}))[(topic, 0)] == (50, 0)
        ok(cli(sbroker, *dry, "--execute"))
        assert starts(describe(c, group, {topic: [0]}))[(topic, 0)] == (20, 0)
        # partition 0 holds the even records: offsets 20-49 are v-40, v-42, ... v-98
        assert sorted(read_values(bootstrap, group, topic, 30)) == sorted(f"v-{i}".encode() for i in range(40, 100, 2))


def test_share_offsets_apis_advertised(sbroker):
    with RawClient(sbroker.bootstrap) as c:
        r = c.request(18, 4, req(18, 4, client_software_name="t", client_software_version="1"))
        keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
        assert (keys[DESCRIBE], keys[ALTER], keys[DELETE]) == ((0, 1), (0, 0), (0, 0))


@pytest.fixture(scope="module")
def acl_broker():
    """ACLs on, the PLAINTEXT listener's User:ANONYMOUS (the raw client) granted GROUP READ
    and DESCRIBE on sg-acl and TOPIC DESCRIBE on seen-acl; admin (SASL) a super user."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType

    from tests.support.broker import AclBroker

    b = AclBroker(("admin",), "User:admin").start()
    try:
        admin = AdminClient(b.sasl_conf("admin"))
        allow, lit = AclPermissionType.ALLOW, ResourcePatternType.LITERAL
        for fut in admin.create_acls([
            AclBinding(ResourceType.GROUP, "sg-acl", lit, "User:ANONYMOUS", "*", AclOperation.READ, allow),
            AclBinding(ResourceType.GROUP, "sg-acl", lit, "User:ANONYMOUS", "*", AclOperation.DESCRIBE, allow),
            AclBinding(ResourceType.TOPIC, "seen-acl", lit, "User:ANONYMOUS", "*", AclOperation.DESCRIBE, allow),
        ]).values():
            fut.result(10)
        for fut in admin.create_topics([NewTopic(t, 1, 1) for t in ("seen-acl", "hidden-acl")]).values():
            fut.result(15)
        yield b
    finally:
        b.stop()


def test_share_offsets_authorization(acl_broker):
    with RawClient(acl_broker.bootstrap) as c:
        # the group exists, empty: a member joins and leaves
        r = c.request(76, 1, req(76, 1, group_id="sg-acl", member_id="m-acl-0000000000001", member_epoch=0,
                                 subscribed_topic_names=("seen-acl",)))
        assert error_code(r.error_code) == 0
        c.request(76, 1, req(76, 1, group_id="sg-acl", member_id="m-acl-0000000000001", member_epoch=-1))
        # DESCRIBE on the group and each topic
        g = describe(c, "sg-acl", {"seen-acl": [0], "hidden-acl": [0]})
        assert error_code(g.error_code) == 0
        assert starts(g) == {("seen-acl", 0): (-1, 0), ("hidden-acl", 0): (-1, ErrorCode.topic_authorization_failed.value)}
        assert error_code(describe(c, "other-acl", None).error_code) == ErrorCode.group_authorization_failed.value
        # alter: READ on the group (held) and on each topic (only DESCRIBE on seen-acl)
        r = alter(c, "sg-acl", "seen-acl", {0: 0})
        assert error_code(r.error_code) == 0
        assert [error_code(p.error_code) for t in r.responses for p in t.partitions] == [ErrorCode.topic_authorization_failed.value]
        assert error_code(alter(c, "other-acl", "seen-acl", {0: 0}).error_code) == ErrorCode.group_authorization_failed.value
        # delete: DELETE on the group (not held)
        assert error_code(delete(c, "sg-acl", "seen-acl").error_code) == ErrorCode.group_authorization_failed.value


def test_groups_describe_shows_in_flight_and_acquired_records():
    """`kafscale groups describe` of a share group: per partition the records in flight and
    acquired now, from the /metrics of the partition's owner (only it knows what is acquired)."""
    from tests.support.broker import BrokerProcess, free_port
    from tests.test_share_consumer import ARGS

    http = f"127.0.0.1:{free_port()}"
    b = BrokerProcess(extra_args=[*ARGS, "--http", http]).start()
    c = None
    try:
        topic, group = names("inflight")
        create_topic(b.bootstrap, topic, 1)
        # a lock longer than the test: the held records stay acquired
        set_group_configs(b.bootstrap, group, share_auto_offset_reset="earliest", share_record_lock_duration_ms="60000")
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(20):
            p.produce(topic, value=b"f-%d" % i)
        assert p.flush(20) == 0
        c = consumer(b.bootstrap, group, topic, explicit=True)
        held: list = []
        wait_until(lambda: held.extend(m for m in c.poll(0.3) if m.error() is None) or len(held) >= 20, 30, "20 records")
        for m in held:
            if m.offset() < 5:
                c.acknowledge(m)
        c.commit_sync(10)
        # 0-4 accepted: the start offset is 5, 15 records in flight and all 15 acquired
        d = json.loads(ok(cli(b, "groups", "describe", group, "--json", "--metrics", f"http://{http}")))
        assert [(r["partition"], r["start_offset"], r["lag"], r["in_flight"], r["acquired"]) for r in d["partitions"]] == [
            (0, 5, 15, 15, 15)]
        text = ok(cli(b, "groups", "describe", group, "--metrics", f"http://{http}"))
        header, row = [line.split() for line in text.splitlines() if line.startswith(("TOPIC", topic))]
        assert header[-2:] == ["IN-FLIGHT", "ACQUIRED"] and row[-2:] == ["15", "15"]
        # no /metrics to read: unknown, said so
        blind = cli(b, "groups", "describe", group, "--json", "--metrics-port-offset", "-1")
        assert [(r["in_flight"], r["acquired"]) for r in json.loads(ok(blind))["partitions"]] == [(None, None)]
    finally:
        if c is not None:
            c.close()
        b.stop()
