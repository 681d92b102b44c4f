"""The consumer group protocol of KIP-848 (ConsumerGroupHeartbeat / ConsumerGroupDescribe)
against a real broker: confluent-kafka consumers with group.protocol=consumer, and raw
frames for the error paths with Apache Kafka's codes."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from tests.support.broker import BrokerProcess
from tests.support.group_members import Ledger, Member
from tests.support.raw import RawClient, error_code, req
from tests.test_groups_unit import subscription
from tests.support.wait import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

HEARTBEAT, DESCRIBE = 68, 69
PARTITIONS = 6
MAX_SIZE = 3


@pytest.fixture(scope="module")
def cgbroker():
    # Heartbeats every 300 ms so reassignments take a second, not Kafka's 5 s (below Kafka's
    # least heartbeat interval, 5 s, which is lowered with it as Kafka requires).
    b = BrokerProcess(extra_args=["--group-consumer-heartbeat-interval-ms", "300", "--group-consumer-min-heartbeat-interval-ms", "300",
                                  "--group-consumer-max-size",
                                  str(MAX_SIZE), "--group-initial-rebalance-delay-ms", "0"]).start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(15)


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int = PARTITIONS) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed = []
    for i in range(start, start + count):
        p.produce(topic, value=str(i).encode(), partition=i % partitions,
                  on_delivery=lambda err, _m: failed.append(err) if err is not None else None)
    assert p.flush(20) == 0 and not failed, failed


def test_members_join_and_leave_every_record_read_once(cgbroker):
    bootstrap = cgbroker.bootstrap
    topic, group = f"kip848-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    ledger = Ledger(PARTITIONS)
    members = {n: Member(n, bootstrap, group, topic, ledger) for n in ("a", "b", "c")}
    total = 0

    def produce_more(n: int = 300) -> None:
        nonlocal total
        produce(bootstrap, topic, total, n)
        total += n

    def read_all() -> bool:
        with ledger.lock:
            return len(ledger.read) >= total

    try:
        produce_more()
        members["a"].start()
        members["b"].start()
        wait_until(lambda: ledger.split() == [3, 3], 60, "a and b holding three partitions each")
        produce_more()
        wait_until(read_all, 60, "the first records read")
        held = {n: ledger.holdings(n) for n in ("a", "b")}
        revoked_before = {n: len(ledger.revoked.get(n, [])) for n in ("a", "b")}

        members["c"].start()  # a third member: each of a and b gives up exactly one partition
        wait_until(lambda: ledger.split() == [2, 2, 2], 60, "a, b and c holding two partitions each")
        for n in ("a", "b"):
            # Members keep what they keep without interruption: only the moved partition is revoked.
            now_held = ledger.holdings(n)
            assert now_held < held[n]
            assert sorted(ledger.revoked.get(n, [])[revoked_before[n]:]) == sorted(held[n] - now_held)
        produce_more()
        wait_until(read_all, 60, "the records after c joined")

        members["a"].leave()  # its partitions go to b and c
        wait_until(lambda: ledger.split() == [3, 3], 60, "b and c holding three partitions each")
        assert set(ledger.owner.values()) == {"b", "c"}
        produce_more()
        wait_until(read_all, 60, "the records after a left")
    finally:
        for m in members.values():
            if m.is_alive():
                m.leave()
    assert not ledger.violations, ledger.violations
    assert not ledger.errors, ledger.errors
    seen: dict[tuple[int, int], list[str]] = {}
    for p, off, name in ledger.read:
        seen.setdefault((p, off), []).append(name)
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"records read more than once: {sorted(twice.items())[:10]}"
    assert len(seen) == total == 1200
    with RawClient(bootstrap) as c:
        # The group is empty again; what it committed is every record.
        r = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False))
        [g] = r.groups
        assert (error_code(g.error_code), g.group_state, g.members) == (0, "Empty", ())
        topics = (req(9, 9, "OffsetFetchRequestTopics", name=topic, partition_indexes=tuple(range(PARTITIONS))),)
        r = c.request(9, 9, req(9, 9, groups=(req(9, 9, "OffsetFetchRequestGroup", group_id=group, topics=topics),),
                                require_stable=False))
        assert sum(p.committed_offset for t in r.groups[0].topics for p in t.partitions) == total
        # An empty consumer group is deleted with its offsets.
        assert error_code(c.request(42, 2, req(42, 2, groups_names=(group,))).results[0].error_code) == 0
        [g] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)).groups
        assert error_code(g.error_code) == ErrorCode.group_id_not_found.value


def test_static_member_restart_keeps_its_partitions(cgbroker):
    """A static member closing leaves with epoch -2: its partitions wait for it (nobody else
    gets them) and its restart under a new member id takes them back, no rebalance."""
    bootstrap = cgbroker.bootstrap
    topic, group = f"kip848-static-{uuid.uuid4().hex[:8]}", f"gs-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    ledger = Ledger(PARTITIONS)
    a = Member("a", bootstrap, group, topic, ledger, instance_id="static-a")
    b = Member("b", bootstrap, group, topic, ledger, instance_id="static-b")
    a2 = Member("a2", bootstrap, group, topic, ledger, instance_id="static-a")
    try:
        a.start()
        b.start()
        wait_until(lambda: ledger.split() == [3, 3], 60, "a and b holding three partitions each")
        held_a, held_b = ledger.holdings("a"), ledger.holdings("b")
        # Whichever of a and b joined first gave half away to the other: only what b gives
        # up from here on counts.
        revoked_b = list(ledger.revoked.get("b", []))
        a.leave()
        with RawClient(bootstrap) as c:
            def a_away():
                [g] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)).groups
                return {m.instance_id: m.member_epoch for m in g.members}.get("static-a") == -2
            wait_until(a_away, 30, "a's static leave")
        a2.start()
        wait_until(lambda: ledger.holdings("a2") == held_a, 60, "a's partitions back with its restart")
        assert ledger.holdings("b") == held_b and ledger.revoked.get("b", []) == revoked_b
    finally:
        for m in (a, b, a2):
            if m.is_alive():
                m.leave()
    assert not ledger.violations and not ledger.errors, (ledger.violations, ledger.errors)


def test_regex_subscription_picks_up_a_topic_created_later(cgbroker):
    bootstrap = cgbroker.bootstrap
    prefix = f"kip848re-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, f"{prefix}-one", 2)
    create_topic(bootstrap, f"other-{prefix}", 2)  # not selected: the regex matches whole names
    produce(bootstrap, f"{prefix}-one", 0, 4, partitions=2)
    produce(bootstrap, f"other-{prefix}", 0, 4, partitions=2)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"re-{prefix}", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500})
    got: list[str] = []

    def read(n: int) -> bool:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.topic())
        return len(got) >= n

    try:
        c.subscribe([f"^{prefix}-.*"])
        wait_until(lambda: read(4), 60, "the records of the first topic")
        create_topic(bootstrap, f"{prefix}-two", 2)
        produce(bootstrap, f"{prefix}-two", 0, 4, partitions=2)
        wait_until(lambda: read(8), 60, "the records of the topic created later")
    finally:
        c.close()
    assert sorted(set(got)) == [f"{prefix}-one", f"{prefix}-two"] and len(got) == 8


# -- raw frames --------------------------------------------------------------------------------


def heartbeat(c: RawClient, group: str, member_id: str, epoch: int, topics=None, owned=None, version: int = 1, **kw):
    fields = dict(group_id=group, member_id=member_id, member_epoch=epoch, rebalance_timeout=kw.pop("rebalance_timeout", -1),
                  subscribed_topic_names=topics, topic_partitions=owned, **kw)
    return c.request(HEARTBEAT, version, req(HEARTBEAT, version, **fields))


def join(c: RawClient, group: str, member_id: str, topic: str, **kw):
    return heartbeat(c, group, member_id, 0, topics=(topic,), owned=(), rebalance_timeout=30_000, **kw)


def owned_of(resp, version: int = 1):
    return tuple(req(HEARTBEAT, version, "TopicPartitions", topic_id=t.topic_id, partitions=t.partitions)
                 for t in resp.assignment.topic_partitions)


def count(resp) -> int:
    return sum(len(t.partitions) for t in resp.assignment.topic_partitions)


def test_heartbeat_errors_with_kafkas_codes(cgbroker):
    bootstrap = cgbroker.bootstrap
    topic, group = f"kip848-raw-{uuid.uuid4().hex[:8]}", f"raw-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    with RawClient(bootstrap) as c:
        r = join(c, group, "m1", topic)
        assert (error_code(r.error_code), r.member_id, r.member_epoch, count(r)) == (0, "m1", 1, PARTITIONS)
        assert r.heartbeat_interval.total_seconds() == 0.3
        owned = owned_of(r)
        r = heartbeat(c, group, "m9", 0, owned=(), rebalance_timeout=1000, subscribed_topic_regex="(?<=a)b")
        assert error_code(r.error_code) == ErrorCode.invalid_regular_expression.value
        # An epoch the member never had, an unknown member, a group that does not exist.
        assert error_code(heartbeat(c, group, "m1", 7, owned=owned).error_code) == ErrorCode.fenced_member_epoch.value
        assert error_code(heartbeat(c, group, "nobody", 1).error_code) == ErrorCode.unknown_member_id.value
        assert error_code(heartbeat(c, f"none-{group}", "m1", 1).error_code) == ErrorCode.group_id_not_found.value
        # Kafka's assignors only; a join without its rebalance timeout is invalid.
        r = join(c, group, "m2", topic, server_assignor="sticky")
        assert error_code(r.error_code) == ErrorCode.unsupported_assignor.value and "uniform" in r.error_message
        r = heartbeat(c, group, "m2", 0, topics=(topic,), owned=())
        assert error_code(r.error_code) == ErrorCode.invalid_request.value
        assert error_code(heartbeat(c, group, "", 0, topics=(topic,), owned=(), rebalance_timeout=1000).error_code) \
            == ErrorCode.invalid_request.value
        # m2 joins: m1 must revoke three partitions before m2 gets them.
        r2 = join(c, group, "m2", topic)
        assert (error_code(r2.error_code), r2.member_epoch, count(r2)) == (0, 2, 0)
        r = heartbeat(c, group, "m1", 1, owned=owned)
        assert (r.member_epoch, count(r)) == (1, 3)
        # OffsetCommit v9 with the member epoch: the current one only (STALE_MEMBER_EPOCH).
        assert commit(c, group, "m1", 2, topic) == ErrorCode.stale_member_epoch.value
        assert commit(c, group, "m1", 1, topic) == 0
        assert commit(c, group, "ghost", 1, topic) == ErrorCode.unknown_member_id.value
        assert fetch(c, group, "m1", 5) == ErrorCode.stale_member_epoch.value
        assert fetch(c, group, "m1", 1) == 0 and fetch(c, group, None, -1) == 0
        r = heartbeat(c, group, "m1", 1, owned=owned_of(r))  # revocation acknowledged
        assert (r.member_epoch, r.assignment) == (2, None)
        r2 = heartbeat(c, group, "m2", 2, owned=())
        assert count(r2) == 3
        # The group at its size limit; a static member's instance id held by a live member.
        assert error_code(join(c, group, "m3", topic, instance_id="i3").error_code) == 0
        r = join(c, group, "m4", topic)
        assert error_code(r.error_code) == ErrorCode.group_max_size_reached.value
        heartbeat(c, group, "m2", -1)  # m2 leaves
        assert error_code(join(c, group, "m5", topic, instance_id="i3").error_code) == ErrorCode.unreleased_instance_id.value
        # Described as a consumer group, listed with its type, and not a classic group.
        r = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group, f"none-{group}"), include_authorized_operations=True))
        g, missing = r.groups
        assert (error_code(g.error_code), g.assignor_name) == (0, "uniform")
        assert sorted((m.member_id, m.instance_id) for m in g.members) == [("m1", None), ("m3", "i3")]
        assert all(m.member_type == 1 for m in g.members) and g.group_epoch >= 4
        assert error_code(missing.error_code) == ErrorCode.group_id_not_found.value
        r = c.request(16, 5, req(16, 5, states_filter=(), types_filter=("consumer",)))
        assert (group, "consumer", "consumer") in [(x.group_id, x.protocol_type, x.group_type) for x in r.groups]
        r = c.request(16, 5, req(16, 5, states_filter=(), types_filter=("classic",)))
        assert group not in [x.group_id for x in r.groups]
        # (DescribeGroups of a consumer group: test_describe_groups_answers_as_kafka)
        # A classic JoinGroup joins the consumer group (KIP-848's migration), of the embedded
        # consumer protocol only, as Kafka.
        r = c.request(11, 9, req(11, 9, group_id=group, session_timeout=10_000, rebalance_timeout=10_000, member_id="",
                                 group_instance_id=None, protocol_type="connect", reason=None,
                                 protocols=(req(11, 9, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
        assert error_code(r.error_code) == ErrorCode.inconsistent_group_protocol.value
        # OffsetDelete: not while the group subscribes to the topic.
        r = c.request(47, 0, req(47, 0, group_id=group, topics=(req(47, 0, "OffsetDeleteRequestTopic", name=topic, partitions=(
            req(47, 0, "OffsetDeleteRequestPartition", partition_index=0),)),)))
        assert (error_code(r.error_code), error_code(r.topics[0].partitions[0].error_code)) == (
            0, ErrorCode.group_subscribed_to_topic.value)
        # Leaving: -1 removes, -2 keeps a static member for its comeback.
        assert heartbeat(c, group, "m3", -2, instance_id="i3").member_epoch == -2
        assert heartbeat(c, group, "m1", -1).member_epoch == -1
        assert error_code(heartbeat(c, group, "m1", 2).error_code) == ErrorCode.unknown_member_id.value
        # Once empty (m3 expires only after its session): DeleteGroups refuses, then OffsetDelete works.
        r = c.request(42, 2, req(42, 2, groups_names=(group,)))
        assert error_code(r.results[0].error_code) == ErrorCode.non_empty_group.value


def describe_groups(c: RawClient, version: int, *groups: str):
    return c.request(15, version, req(15, version, groups=groups, include_authorized_operations=True)).groups


def test_describe_groups_answers_as_kafka(cgbroker):
    """DescribeGroups (API 15) describes classic groups only, as Kafka 4's coordinator: a
    consumer-protocol group, also one with classic members (a mixed group), and an unknown
    group are Dead, from v6 with GROUP_ID_NOT_FOUND and Kafka's message, before v6 with no
    error; authorized operations only for a group answered without error (so before v6 too)."""
    bootstrap = cgbroker.bootstrap
    topic, group = f"kip848-dg-{uuid.uuid4().hex[:8]}", f"dg-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    missing = f"none-{group}"
    with RawClient(bootstrap) as c:
        assert error_code(join(c, group, "m1", topic).error_code) == 0

        def answers(version: int) -> list[tuple]:
            return [(d.group_id, error_code(d.error_code), getattr(d, "error_message", None), d.group_state,
                     d.protocol_type, len(d.members), getattr(d, "authorized_operations", None))
                    for d in describe_groups(c, version, group, missing)]

        unset = -2147483648  # Kafka's "not given" for authorized operations
        assert answers(0) == [(group, 0, None, "Dead", "", 0, None), (missing, 0, None, "Dead", "", 0, None)]
        got = answers(5)  # (no error: the operations are given, as Kafka does)
        assert [g[:6] for g in got] == [(group, 0, None, "Dead", "", 0), (missing, 0, None, "Dead", "", 0)]
        assert unset not in [g[6] for g in got]
        assert answers(6) == [
            (group, ErrorCode.group_id_not_found.value, f"Group {group} is not a classic group.", "Dead", "", 0, unset),
            (missing, ErrorCode.group_id_not_found.value, f"Group {missing} not found.", "Dead", "", 0, unset)]
        # A classic member joins: a mixed group, still not a classic group for DescribeGroups.
        protocols = (req(11, 9, "JoinGroupRequestProtocol", name="range", metadata=subscription(topic)),)
        r = c.request(11, 9, req(11, 9, group_id=group, session_timeout=30_000, rebalance_timeout=30_000, member_id="c1",
                                 group_instance_id=None, protocol_type="consumer", reason=None, protocols=protocols))
        assert error_code(r.error_code) == 0
        [d] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)).groups
        assert sorted(m.member_type for m in d.members) == [0, 1]  # classic and consumer members
        [d5] = describe_groups(c, 5, group)
        [d6] = describe_groups(c, 6, group)
        assert (error_code(d5.error_code), d5.group_state, d5.members) == (0, "Dead", ())
        assert (error_code(d6.error_code), d6.error_message, d6.group_state) == (
            ErrorCode.group_id_not_found.value, f"Group {group} is not a classic group.", "Dead")
        assert d6.authorized_operations == unset
        # A classic group is described, with its operations.
        classic = f"dgc-{uuid.uuid4().hex[:8]}"
        r = c.request(11, 9, req(11, 9, group_id=classic, session_timeout=30_000, rebalance_timeout=30_000, member_id="",
                                 group_instance_id=None, protocol_type="consumer", reason=None, protocols=protocols))
        r = c.request(11, 9, req(11, 9, group_id=classic, session_timeout=30_000, rebalance_timeout=30_000,
                                 member_id=r.member_id, group_instance_id=None, protocol_type="consumer", reason=None,
                                 protocols=protocols))
        assert error_code(r.error_code) == 0
        [d6] = describe_groups(c, 6, classic)
        assert (error_code(d6.error_code), d6.protocol_type, len(d6.members)) == (0, "consumer", 1)
        assert d6.group_state in ("PreparingRebalance", "CompletingRebalance", "Stable") and d6.authorized_operations != unset


def commit(c: RawClient, group: str, member_id: str, epoch: int, topic: str) -> int:
    parts = (req(8, 9, "OffsetCommitRequestPartition", partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                 committed_metadata=""),)
    r = c.request(8, 9, req(8, 9, group_id=group, generation_id_or_member_epoch=epoch, member_id=member_id,
                            group_instance_id=None, topics=(req(8, 9, "OffsetCommitRequestTopic", name=topic, partitions=parts),)))
    return error_code(r.topics[0].partitions[0].error_code)


def fetch(c: RawClient, group: str, member_id: str | None, epoch: int) -> int:
    g = req(9, 9, "OffsetFetchRequestGroup", group_id=group, member_id=member_id, member_epoch=epoch, topics=None)
    return error_code(c.request(9, 9, req(9, 9, groups=(g,), require_stable=False)).groups[0].error_code)


def test_group_survives_a_coordinator_restart(broker_factory, tmp_path):
    """Members, epochs and assignments are in the metadata store: after a kill -9 and a
    restart the members heartbeat on at their epochs."""
    b = broker_factory(data_dir=str(tmp_path), extra_args=["--group-initial-rebalance-delay-ms", "0"])
    topic, group = "kip848-restart", "restart-group"
    create_topic(b.bootstrap, topic)
    with RawClient(b.bootstrap) as c:
        r1 = join(c, group, "m1", topic)
        r2 = join(c, group, "m2", topic)
        r1 = heartbeat(c, group, "m1", 1, owned=owned_of(r1))
        r1 = heartbeat(c, group, "m1", 1, owned=owned_of(r1))
        assert r1.member_epoch == 2
        r2 = heartbeat(c, group, "m2", 2, owned=())
        assert count(r2) == 3
    b.kill9()
    b.start()
    with RawClient(b.bootstrap) as c:
        r = wait_until(lambda: heartbeat(c, group, "m2", 2, owned=owned_of(r2)), 20, "the restarted coordinator")
        assert (error_code(r.error_code), r.member_epoch, r.assignment) == (0, 2, None)
        r = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False))
        [g] = r.groups
        assert (g.group_state, g.group_epoch, g.assignment_epoch) == ("Stable", 2, 2)
        assert sorted(sum(len(t.partitions) for t in m.assignment.topic_partitions) for m in g.members) == [3, 3]


def test_rack_aware_assignment_and_group_configs_across_brokers(etcd_server, tmp_path):
    """Two brokers on racks x and y (--broker-rack) own two partitions each; confluent-kafka
    members with client.rack x and y each get the partitions their rack's broker owns. A
    group config changed through the broker that does not coordinate the group reaches its
    coordinator within --group-config-refresh-ms."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from tests.support.broker import free_port

    prefix = f"/ks-racks-{free_port()}"
    brokers = []
    try:
        for node, rack in ((0, "x"), (1, "y")):
            (tmp_path / f"b{node}").mkdir()
            brokers.append(BrokerProcess(data_dir=str(tmp_path / f"b{node}"), extra_args=[
                "--broker-id", str(node), "--broker-rack", rack, "--metadata", etcd_server.url, "--metadata-prefix", prefix,
                "--storage", f"file://{tmp_path}/objects", "--lease-ttl-s", "3", "--group-initial-rebalance-delay-ms", "0",
                "--group-consumer-heartbeat-interval-ms", "300", "--group-consumer-min-heartbeat-interval-ms", "300",
                "--group-config-refresh-ms", "200"]).start())
        bootstrap = ",".join(b.bootstrap for b in brokers)
        topic, group = f"racks-{uuid.uuid4().hex[:6]}", f"racks-{uuid.uuid4().hex[:6]}"

        def leaders():
            with RawClient(brokers[0].bootstrap) as c:
                md = c.metadata([topic], version=12, allow_auto=False)
                assert {b.node_id: b.rack for b in md.brokers} == {0: "x", 1: "y"}
                return {p.partition_index: p.leader_id for p in md.topics[0].partitions}

        def live():
            with RawClient(brokers[0].bootstrap) as c:
                return len(c.metadata([], version=12).brokers) == 2

        wait_until(live, 20, "both brokers live")
        create_topic(bootstrap, topic, 4)
        def spread():
            lead = leaders()
            return lead if sorted(lead.values()) == [0, 0, 1, 1] else None

        owners = wait_until(spread, 30, "two partitions on each broker")
        by_rack = {"x": {p for p, n in owners.items() if n == 0}, "y": {p for p, n in owners.items() if n == 1}}
        consumers = {rack: Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer", "client.rack": rack})
                     for rack in ("x", "y")}
        try:
            for c in consumers.values():
                c.subscribe([topic])

            def placed():
                for c in consumers.values():
                    c.poll(0.1)
                got = {rack: {tp.partition for tp in c.assignment()} for rack, c in consumers.items()}
                return got == by_rack

            wait_until(placed, 60, f"each member assigned its rack's partitions {by_rack}")
        finally:
            for c in consumers.values():
                c.close()

        # the group's coordinator answers its heartbeats; the other broker says NOT_COORDINATOR
        other = f"cfg-{uuid.uuid4().hex[:6]}"

        def raw_join(b):
            with RawClient(b.bootstrap) as c:
                return join(c, other, uuid.uuid4().hex, topic)

        answers = {i: raw_join(b) for i, b in enumerate(brokers)}
        [coordinator] = [i for i, r in answers.items() if error_code(r.error_code) == 0]
        assert answers[coordinator].heartbeat_interval.total_seconds() * 1000 == 300
        admin = AdminClient({"bootstrap.servers": brokers[1 - coordinator].bootstrap})
        r = ConfigResource(ResourceType.GROUP, other, incremental_configs=[
            ConfigEntry("consumer.heartbeat.interval.ms", "700", incremental_operation=AlterConfigOpType.SET)])
        for fut in admin.incremental_alter_configs([r]).values():
            fut.result(15)
        wait_until(lambda: raw_join(brokers[coordinator]).heartbeat_interval.total_seconds() * 1000 == 700, 10,
                   "the coordinator applying a config changed through the other broker")
    finally:
        for b in brokers:
            b.stop()
