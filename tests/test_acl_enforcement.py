"""ACLs enforced (#17) with confluent-kafka over SASL: alice may write `orders` but not
read it; bob may read it with group g1 but not g2; a prefixed ACL on `logs-`; deny
overrides allow; a principal without DESCRIBE does not see a topic in Metadata."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType, ResourceType

from tests.support.broker import AclBroker, BrokerProcess, free_port, sasl_conf
from tests.support.servers import etcd_server  # noqa: F401 - fixture
from tests.support.wait import wait_until

USERS = ("admin", "alice", "bob", "carol", "dave", "eve")


@pytest.fixture(scope="module")
def secured():
    b = AclBroker(USERS, "User:admin", ["--group-initial-rebalance-delay-ms", "0"]).start()
    sasl = b.sasl_port
    admin = AdminClient(sasl_conf(sasl, "admin"))
    allow, deny, lit, pre = AclPermissionType.ALLOW, AclPermissionType.DENY, ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    bindings = [
        AclBinding(ResourceType.TOPIC, "orders", lit, "User:alice", "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.TOPIC, "orders", lit, "User:bob", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.GROUP, "g1", lit, "User:bob", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, "logs-", pre, "User:carol", "*", AclOperation.ALL, allow),
        AclBinding(ResourceType.GROUP, "*", lit, "User:carol", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, "public", lit, "User:*", "*", AclOperation.ALL, allow),
        AclBinding(ResourceType.GROUP, "*", lit, "User:eve", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, "public", lit, "User:eve", "*", AclOperation.READ, deny),
    ]
    for fut in admin.create_acls(bindings).values():
        fut.result(10)
    # the topics exist (made by the super user)
    p = Producer(sasl_conf(sasl, "admin"))
    for t in ("orders", "logs-app", "public"):
        p.produce(t, value=f"{t}-seed".encode())
    assert p.flush(20) == 0
    yield b, sasl
    b.stop()


def _produce(port, user, topic) -> KafkaError | None:
    out = []
    p = Producer({**sasl_conf(port, user), "message.timeout.ms": 10000})
    p.produce(topic, value=b"v", on_delivery=lambda err, msg: out.append(err))
    p.flush(15)
    return out[0] if out else KafkaError(KafkaError._TIMED_OUT)


def _consume(port, user, topic, group):
    """('ok', value) or ('error', code) for the first thing the consumer sees."""
    c = Consumer({**sasl_conf(port, user), "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    seen = []
    try:
        def first():
            m = c.poll(0.5)
            if m is None:
                return False
            seen.append(("error", m.error().code()) if m.error() else ("ok", m.value()))
            return True
        wait_until(first, 30, f"{user} consuming {topic}")
    finally:
        c.close()
    return seen[0]


def test_alice_writes_orders_but_may_not_read_it(secured):
    _b, sasl = secured
    assert _produce(sasl, "alice", "orders") is None
    # no group ACL for alice: the consumer group is refused first
    assert _consume(sasl, "alice", "orders", "g1") == ("error", KafkaError.GROUP_AUTHORIZATION_FAILED)


def test_bob_reads_with_g1_but_not_g2(secured):
    _b, sasl = secured
    assert _consume(sasl, "bob", "orders", "g1") == ("ok", b"orders-seed")
    assert _consume(sasl, "bob", "orders", "g2") == ("error", KafkaError.GROUP_AUTHORIZATION_FAILED)
    assert _produce(sasl, "bob", "orders").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_prefixed_acl(secured):
    _b, sasl = secured
    assert _produce(sasl, "carol", "logs-app") is None
    assert _consume(sasl, "carol", "logs-app", "carol-g") == ("ok", b"logs-app-seed")
    assert _produce(sasl, "carol", "orders").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_deny_overrides_allow(secured):
    b, sasl = secured
    assert _consume(sasl, "dave", "public", "dave-g")[0] == "error"  # no group ACL for dave
    assert _produce(sasl, "eve", "public") is None  # ALL for User:* ...
    assert _consume(sasl, "eve", "public", "eve-g") == ("error", KafkaError.TOPIC_AUTHORIZATION_FAILED)  # ... but READ denied
    wait_until(lambda: "denied: User:eve from 127.0.0.1 may not READ TOPIC public" in b.log_text(), 5, "the denial logged")


def test_metadata_hides_topics_without_describe(secured):
    _b, sasl = secured
    admin = AdminClient(sasl_conf(sasl, "dave"))
    md = admin.list_topics(timeout=10)
    assert "orders" not in md.topics and "logs-app" not in md.topics and "public" in md.topics
    alice_topics = AdminClient(sasl_conf(sasl, "alice")).list_topics(timeout=10).topics
    assert "orders" in alice_topics and "public" in alice_topics and "logs-app" not in alice_topics


def test_three_brokers_enforce_the_same_acls_right_after_creation(etcd_server, tmp_path):  # noqa: F811
    """ACLs live in etcd: created through broker 0, they hold on brokers 1 and 2 within
    their --acl-refresh-ms, for allow and for deny."""
    from confluent_kafka.admin import AclBindingFilter, NewTopic

    users = tmp_path / "users.txt"
    users.write_text("alice:alice-secret\n")
    prefix = f"/ks-acl-{free_port()}"
    common = ["--metadata", etcd_server.url, "--metadata-prefix", prefix, "--storage", f"file://{tmp_path}/objects", "--lease-ttl-s", "3",
              "--sasl-users-file", str(users), "--authorizer", "acls", "--super-users", "User:ANONYMOUS", "--acl-refresh-ms", "200"]
    brokers = []
    try:
        for node in range(3):
            plain, sasl = free_port(), free_port()
            b = BrokerProcess(port=plain, data_dir=str(tmp_path / f"b{node}"), extra_args=[
                "--broker-id", str(node), "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}", *common])
            (tmp_path / f"b{node}").mkdir()
            brokers.append((b.start(), sasl))
        admin = AdminClient({"bootstrap.servers": brokers[0][0].bootstrap})
        admin.create_topics([NewTopic("cluster-orders", 3)])["cluster-orders"].result(15)
        for _b, sasl in brokers[1:]:
            assert _produce(sasl, "alice", "cluster-orders").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        allow = AclBinding(ResourceType.TOPIC, "cluster-orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
        list(admin.create_acls([allow]).values())[0].result(10)
        for _b, sasl in brokers[1:]:
            wait_until(lambda sasl=sasl: _produce(sasl, "alice", "cluster-orders") is None, 5, "alice allowed through another broker")
        deny = AclBinding(ResourceType.TOPIC, "cluster-", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.WRITE, AclPermissionType.DENY)
        list(admin.create_acls([deny]).values())[0].result(10)
        for _b, sasl in brokers[1:]:
            wait_until(lambda sasl=sasl: (e := _produce(sasl, "alice", "cluster-orders")) is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED,
                       5, "alice denied through another broker")
        everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
        third = AdminClient({"bootstrap.servers": brokers[2][0].bootstrap})
        assert len(third.describe_acls(everything).result(10)) == 2
    finally:
        for b, _sasl in brokers:
            b.stop()


def test_authorized_operations_bit_fields(secured, broker):
    """include_*_authorized_operations: the ACLs' answer with an authorizer, every
    operation without one (an unknown group: 3400, as Kafka 3.8+, whose groups have configs)."""
    from kafscale.errors import ErrorCode
    from kafscale.security.acl import Operation as Op
    from tests.support import raw

    with raw.RawClient(broker.bootstrap) as c:  # no authorizer
        r = c.request(15, 5, raw.req(15, 5, groups=["no-such-group"], include_authorized_operations=True))
        assert r.groups[0].authorized_operations == 3400
        md = c.request(3, 10, raw.req(3, 10, topics=None, allow_auto_topic_creation=False, include_cluster_authorized_operations=True,
                                       include_topic_authorized_operations=True))
        assert md.cluster_authorized_operations == sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
    admin = AdminClient(sasl_conf(secured[1], "alice"))
    desc = admin.describe_topics(__import__("confluent_kafka").TopicCollection(["orders"]), include_authorized_operations=True)["orders"].result(10)
    assert {op.name for op in desc.authorized_operations} == {"WRITE", "DESCRIBE"}
    assert ErrorCode.none == 0 and Op.WRITE == 4


def test_list_groups_shows_only_describable_groups(secured):
    _b, sasl = secured
    # bob has READ (so DESCRIBE) on g1 only; the super user sees every group
    assert _consume(sasl, "bob", "orders", "g1")[0] == "ok"
    bob = AdminClient(sasl_conf(sasl, "bob"))
    wait_until(lambda: {g.group_id for g in bob.list_consumer_groups().result(10).valid} == {"g1"}, 10, "bob to list g1 only")
    admin = AdminClient(sasl_conf(sasl, "admin"))
    assert "g1" in {g.group_id for g in admin.list_consumer_groups().result(10).valid}


def _raw_as(port: int, user: str):
    from tests.support import raw

    c = raw.RawClient(f"127.0.0.1:{port}")
    assert raw.error_code(c.request(17, 1, raw.req(17, 1, mechanism="PLAIN")).error_code) == 0
    auth = c.request(36, 2, raw.req(36, 2, auth_bytes=f"\0{user}\0{user}-secret".encode()))
    assert raw.error_code(auth.error_code) == 0
    return c


def test_denied_topics_refused_one_by_one_and_the_rest_served(secured):
    """Kafka authorizes Produce, Fetch, ListOffsets ... topic by topic: carol (ALL on logs-*)
    naming logs-app and orders in one request gets logs-app served and orders refused."""
    import datetime
    import time

    from kafscale.protocol.records import build_batch, decode_records, iter_batches
    from tests.support.raw import error_code, req

    _b, sasl = secured
    denied = KafkaError.TOPIC_AUTHORIZATION_FAILED
    with _raw_as(sasl, "admin") as c:
        orders_end = c.list_offsets("orders", 0, -1).offset
    with _raw_as(sasl, "carol") as c:
        batch = build_batch([(b"k", b"both-topics")], timestamp=int(time.time() * 1000))  # (1970 is retention's to delete before the fetch)
        topics = tuple(req(0, 9, "TopicProduceData", name=t, partition_data=(req(0, 9, "PartitionProduceData", index=0, records=batch),))
                       for t in ("logs-app", "orders"))
        resp = c.request(0, 9, req(0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=topics))
        got = {t.name: (error_code(t.partition_responses[0].error_code), t.partition_responses[0].base_offset) for t in resp.responses}
        assert got["orders"] == (denied, -1)
        assert got["logs-app"][0] == 0 and got["logs-app"][1] >= 1  # after the seed record
        written = got["logs-app"][1]

        lo = c.request(2, 7, req(2, 7, replica_id=-1, isolation_level=0, timeout=5000, topics=tuple(
            req(2, 7, "ListOffsetsTopic", name=t, partitions=(req(2, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1),))
            for t in ("orders", "logs-app"))))
        ends = {t.name: (error_code(t.partitions[0].error_code), t.partitions[0].offset) for t in lo.topics}
        assert ends == {"orders": (denied, -1), "logs-app": (0, written + 1)}

        fetch_topics = tuple(req(1, 12, "FetchTopic", topic=t, partitions=(req(1, 12, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=written,
                                                                                   last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),))
                             for t in ("orders", "logs-app"))
        f = c.request(1, 12, req(1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                                 session_id=0, session_epoch=-1, topics=fetch_topics, forgotten_topics_data=(), rack_id=""))
        parts = {t.topic: t.partitions[0] for t in f.responses}
        assert error_code(parts["orders"].error_code) == denied and not parts["orders"].records
        assert error_code(parts["logs-app"].error_code) == 0
        values = [r.value for pos, h in iter_batches(parts["logs-app"].records) for r in decode_records(parts["logs-app"].records, pos, h)]
        assert values == [b"both-topics"]
    # nothing reached orders
    with _raw_as(sasl, "admin") as c:
        assert c.list_offsets("orders", 0, -1).offset == orders_end


def test_transaction_and_producer_views_follow_describe_acls(secured):
    """DescribeTransactions answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED without DESCRIBE on
    the id and leaves out topics the principal may not DESCRIBE; ListTransactions lists only
    describable ids; DescribeProducers refuses the topics without READ (Kafka's rules)."""
    from tests.support.raw import error_code, req
    from tests.test_txn_coordinator import add_partitions, describe, end, init

    _b, sasl = secured
    tid = f"acl-tx-{free_port()}"
    with _raw_as(sasl, "admin") as c:
        err, pid, epoch = init(c, tid)
        assert err == 0
        assert add_partitions(c, tid, pid, epoch, "logs-app") == {("logs-app", 0): 0}
        assert add_partitions(c, tid, pid, epoch, "orders") == {("orders", 0): 0}

    def listed(c) -> list[str]:
        r = c.request(66, 1, req(66, 1, state_filters=(), producer_id_filters=()))
        return [s.transactional_id for s in r.transaction_states]

    with _raw_as(sasl, "carol") as c:
        assert error_code(describe(c, tid).error_code) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert tid not in listed(c)
        dp = c.request(61, 0, req(61, 0, topics=tuple(req(61, 0, "TopicRequest", name=t, partition_indexes=(0,)) for t in ("logs-app", "orders"))))
        errors = {t.name: error_code(t.partitions[0].error_code) for t in dp.topics}
        assert errors == {"logs-app": 0, "orders": KafkaError.TOPIC_AUTHORIZATION_FAILED}

    admin = AdminClient(sasl_conf(sasl, "admin"))
    binding = AclBinding(ResourceType.TRANSACTIONAL_ID, tid, ResourcePatternType.LITERAL, "User:carol", "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    for f in admin.create_acls([binding]).values():
        f.result(10)
    with _raw_as(sasl, "carol") as c:
        st = describe(c, tid)
        assert (error_code(st.error_code), st.transaction_state) == (0, "Ongoing")
        assert [(t.topic, t.partitions) for t in st.topics] == [("logs-app", [0])]  # orders: no DESCRIBE for carol
        assert tid in listed(c)
    with _raw_as(sasl, "admin") as c:
        assert end(c, tid, pid, epoch, False) == 0


def test_broker_side_transaction_requests_need_cluster_action(secured):
    """AddPartitionsToTxn v4+ comes from brokers only (KIP-890 verification, transactions v2
    adds): CLUSTER_ACTION on the cluster, as Kafka. AddOffsetsToTxn is also how a group's
    broker adds the group of a TxnOffsetCommit v5 (docs/transactions.md): CLUSTER_ACTION
    stands in for WRITE on the id and READ on the group; a client without either gets
    Kafka's TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    from tests.support.raw import error_code, req
    from tests.test_txn_coordinator import add_offsets, init

    _b, sasl = secured
    tid = f"acl-b2b-{free_port()}"
    with _raw_as(sasl, "admin") as c:
        err, pid, epoch = init(c, tid)
        assert err == 0

    def add_v4(c):
        t = req(24, 4, "AddPartitionsToTxnTopic", name="logs-app", partitions=(0,))
        txn = req(24, 4, "AddPartitionsToTxnTransaction", transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                  verify_only=True, topics=(t,))
        r = c.request(24, 4, req(24, 4, transactions=(txn,)))
        return error_code(r.error_code), [error_code(p.partition_error_code) for x in r.results_by_transaction
                                          for t in x.topic_results for p in t.results_by_partition]

    with _raw_as(sasl, "carol") as c:  # ALL on logs-*, READ on every group, nothing on the cluster
        assert add_v4(c)[0] == KafkaError.CLUSTER_AUTHORIZATION_FAILED
        assert add_offsets(c, tid, pid, epoch, "g-any") == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    admin = AdminClient(sasl_conf(sasl, "admin"))
    for fut in admin.create_acls([AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:dave", "*",
                                             AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)]).values():
        fut.result(10)
    with _raw_as(sasl, "dave") as c:
        assert wait_until(lambda: (lambda r: r if r[0] == 0 else None)(add_v4(c)), 10, "dave's CLUSTER_ACTION") == (0, [KafkaError.TRANSACTION_ABORTABLE])
        assert add_offsets(c, tid, pid, epoch, "g-any") == 0


def test_group_configs_need_describe_and_alter_configs_on_the_group(secured):
    """Kafka authorizes GROUP config resources on the group: DESCRIBE_CONFIGS to describe,
    ALTER_CONFIGS to alter; a refusal is GROUP_AUTHORIZATION_FAILED."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    _b, sasl = secured
    allow, lit = AclPermissionType.ALLOW, ResourcePatternType.LITERAL

    clients = {u: AdminClient(sasl_conf(sasl, u)) for u in ("dave", "admin")}

    def describe(user):
        [fut] = clients[user].describe_configs([ConfigResource(ResourceType.GROUP, "cfg-g")]).values()
        return fut.result(15)

    def alter(user):
        r = ConfigResource(ResourceType.GROUP, "cfg-g", incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        [fut] = clients[user].incremental_alter_configs([r]).values()
        return fut.result(15)

    for call in (describe, alter):
        with pytest.raises(KafkaException) as e:
            call("dave")
        assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    for fut in clients["admin"].create_acls([AclBinding(ResourceType.GROUP, "cfg-g", lit, "User:dave", "*", AclOperation.DESCRIBE_CONFIGS, allow)]).values():
        fut.result(10)
    assert wait_until(lambda: describe("dave")["share.auto.offset.reset"].value == "latest", 10, "dave may describe cfg-g's configs")
    with pytest.raises(KafkaException) as e:
        alter("dave")
    assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    alter("admin")
    assert describe("dave")["share.auto.offset.reset"].value == "earliest"


def _share_read(port: int, user: str, topic: str, group: str):
    """('ok', value) or ('error', code) for the first thing a share consumer of `group` sees."""
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(sasl_conf(port, "admin"))
    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([r]).values():
        fut.result(10)
    c = ShareConsumer({**sasl_conf(port, user), "group.id": group})
    c.subscribe([topic])
    seen = []
    try:
        def first():
            try:
                msgs = c.poll(0.5)
            except KafkaException as e:  # librdkafka raises a fetch's error from poll
                seen.append(("error", e.args[0].code()))
                return True
            for m in msgs:
                seen.append(("error", m.error().code()) if m.error() else ("ok", m.value()))
            return bool(seen)
        wait_until(first, 30, f"{user} share-consuming {topic}")
        if seen[0][0] == "ok":
            c.commit_sync(10)
    finally:
        c.close()
    return seen[0]


def test_share_fetch_needs_read_on_the_topic(secured):
    _b, sasl = secured
    # carol: READ on logs-* and every group
    assert _share_read(sasl, "carol", "logs-app", "share-carol") == ("ok", b"logs-app-seed")
    # eve: READ on every group, but READ on `public` denied: the share fetch is refused per topic
    assert _share_read(sasl, "eve", "public", "share-eve") == ("error", KafkaError.TOPIC_AUTHORIZATION_FAILED)
