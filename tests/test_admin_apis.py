"""Admin APIs through confluent_kafka.admin.AdminClient (CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs,
DescribeCluster, Metadata) and ApiVersions over the raw protocol."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.raw import RawClient, decode_response, encode_request, error_code, req
from tests.support.stored import stored_segments
from tests.support.versions import api_range, broker_log_errors, each_version

TOPIC_DEFAULTS = {
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": "4194304",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "cleanup.policy": "delete",
}
UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS = 3, 17, 36
INVALID_PARTITIONS, INVALID_CONFIG, UNSUPPORTED_VERSION = 37, 40, 35


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def kafka_error(fut) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        fut.result(15)
    return info.value.args[0]


def describe_topic(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(15)


def now_ms() -> int:
    return int(time.time() * 1000)


def topic_exists_raw(bootstrap: str, topic: str) -> int:
    """0 if an all-topics Metadata request lists the topic, else UNKNOWN_TOPIC_OR_PARTITION.
    (Asking for the topic by name is covered in test_bad_input.py.)"""
    with RawClient(bootstrap) as c:
        md = c.metadata(None)
        return 0 if topic in {t.name for t in md.topics} else UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------------------------
# CreateTopics


def test_create_topic_with_configs(broker, admin, topic_name):
    fs = admin.create_topics([NewTopic(topic_name, 3, 1, config={"retention.ms": "3600000", "segment.bytes": "1000000"})])
    assert fs[topic_name].result(15) is None
    with RawClient(broker.bootstrap) as c:
        md = c.metadata([topic_name], allow_auto=False)
        t = md.topics[0]
        assert error_code(t.error_code) == 0 and t.name == topic_name
        assert sorted(p.partition_index for p in t.partitions) == [0, 1, 2]
        assert all(p.leader_id == 0 and tuple(p.replica_nodes) == (0,) for p in t.partitions)
    cfg = describe_topic(admin, topic_name)
    assert cfg["retention.ms"].value == "3600000" and cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["segment.bytes"].value == "1000000"
    assert cfg["retention.bytes"].value == "-1" and cfg["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value


def test_create_topic_duplicate(admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    err = kafka_error(admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name])
    assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS == TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize("name", ["bad name!", "slash/topic", "a" * 250, "..", "ünïcode"])
def test_create_topic_invalid_name(broker, admin, name):
    err = kafka_error(admin.create_topics([NewTopic(name, 1, 1)])[name])
    assert err.code() == KafkaError.TOPIC_EXCEPTION == INVALID_TOPIC_EXCEPTION, err
    if "/" not in name and name != "..":
        assert not (Path(broker.data_dir) / "objects" / "default" / name).exists()


def test_create_topic_unknown_cleanup_policy_rejected(broker, admin, topic_name):
    for policy in ("archive", "compact,archive"):
        err = kafka_error(admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": policy})])[topic_name])
        assert err.code() == KafkaError.INVALID_CONFIG == INVALID_CONFIG
        assert "compact, delete" in err.str()
    assert topic_exists_raw(broker.bootstrap, topic_name) == UNKNOWN_TOPIC_OR_PARTITION


def test_create_topic_invalid_configs(broker, admin, topic_name):
    for config in ({"no.such.config": "1"}, {"retention.ms": "soon"}, {"segment.bytes": "0"}, {"message.timestamp.type": "Whenever"}):
        err = kafka_error(admin.create_topics([NewTopic(topic_name, 1, 1, config=config)])[topic_name])
        assert err.code() == INVALID_CONFIG, (config, err)
    assert topic_exists_raw(broker.bootstrap, topic_name) == UNKNOWN_TOPIC_OR_PARTITION


def test_create_topic_validate_only(broker, admin, topic_name):
    assert admin.create_topics([NewTopic(topic_name, 2, 1)], validate_only=True)[topic_name].result(15) is None
    assert topic_exists_raw(broker.bootstrap, topic_name) == UNKNOWN_TOPIC_OR_PARTITION
    err = kafka_error(admin.create_topics([NewTopic(topic_name, 1, 1, config={"cleanup.policy": "archive"})], validate_only=True)[topic_name])
    assert err.code() == INVALID_CONFIG


# ---------------------------------------------------------------------------------------
# DeleteTopics


def test_delete_topic_removes_objects_and_metadata(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(10):
        p.produce(topic_name, value=f"old-{i}".encode(), partition=i % 2)
    assert p.flush(15) == 0
    tdir = Path(broker.data_dir) / "objects" / "default" / topic_name
    assert stored_segments(broker.data_dir, topic_name, 0) and stored_segments(broker.data_dir, topic_name, 1)
    assert admin.delete_topics([topic_name])[topic_name].result(15) is None
    # (pieces in write-ahead objects, shared with other partitions, go with their object
    # once nothing refers to it: the cleanup's tests, test_write_ahead*.py)
    assert [f for f in tdir.rglob("*") if f.is_file()] == [], "segment objects left behind after DeleteTopics"
    assert topic_exists_raw(broker.bootstrap, topic_name) == UNKNOWN_TOPIC_OR_PARTITION
    with RawClient(broker.bootstrap) as c:
        assert error_code(c.list_offsets(topic_name, 0, -1).error_code) == UNKNOWN_TOPIC_OR_PARTITION
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    assert kafka_error(admin.describe_configs([res])[res]).code() == UNKNOWN_TOPIC_OR_PARTITION
    # deleting again: unknown
    assert kafka_error(admin.delete_topics([topic_name])[topic_name]).code() == UNKNOWN_TOPIC_OR_PARTITION
    # re-created under the same name it starts empty, at offset 0
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, -1).offset == 0
        r = c.produce(topic_name, 0, build_batch([(None, b"new")], timestamp=now_ms()))
        assert error_code(r.error_code) == 0 and r.base_offset == 0
        f = c.fetch(topic_name, 0, 0)
        assert [r.value for pos, h in iter_batches(f.records) for r in decode_records(f.records, pos, h)] == [b"new"]


# ---------------------------------------------------------------------------------------
# CreatePartitions


def test_create_partitions(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    with RawClient(broker.bootstrap) as c:
        assert c.produce(topic_name, 0, build_batch([(None, b"p0")], timestamp=now_ms())).base_offset == 0
    assert admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(15) is None
    with RawClient(broker.bootstrap) as c:
        md = c.metadata([topic_name], allow_auto=False)
        assert sorted(p.partition_index for p in md.topics[0].partitions) == [0, 1, 2, 3]
        r = c.produce(topic_name, 3, build_batch([(None, b"p3")], timestamp=now_ms()))
        assert error_code(r.error_code) == 0 and r.base_offset == 0
        assert c.list_offsets(topic_name, 0, -1).offset == 1  # existing data untouched
        assert error_code(c.produce(topic_name, 4, build_batch([(None, b"x")], timestamp=now_ms())).error_code) == UNKNOWN_TOPIC_OR_PARTITION
    # shrinking or keeping the count is refused
    for n in (2, 4):
        assert kafka_error(admin.create_partitions([NewPartitions(topic_name, n)])[topic_name]).code() == INVALID_PARTITIONS
    # validate_only changes nothing
    assert admin.create_partitions([NewPartitions(topic_name, 8)], validate_only=True)[topic_name].result(15) is None
    with RawClient(broker.bootstrap) as c:
        assert len(c.metadata([topic_name], allow_auto=False).topics[0].partitions) == 4
    missing = topic_name + "-missing"
    assert kafka_error(admin.create_partitions([NewPartitions(missing, 3)])[missing]).code() == UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------------------------
# DescribeConfigs / AlterConfigs / IncrementalAlterConfigs


def test_describe_configs_topic_defaults(admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    cfg = describe_topic(admin, topic_name)
    assert {k: cfg[k].value for k in TOPIC_DEFAULTS if k in cfg} == TOPIC_DEFAULTS
    assert all(v.source == ConfigSource.DEFAULT_CONFIG.value and v.is_default and not v.is_read_only for v in cfg.values())


def test_describe_configs_broker(broker, admin):
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    cfg = admin.describe_configs([res])[res].result(15)
    assert cfg["broker.id"].value == "0"
    assert cfg["advertised.listeners"].value == f"PLAINTEXT://{broker.bootstrap}"
    assert cfg["auto.create.topics.enable"].value == "true"
    assert cfg["socket.request.max.bytes"].value == str(100 * 1024 * 1024)
    # read-only (set by flags only); a setting given to the broker is STATIC_BROKER_CONFIG,
    # the rest DEFAULT_CONFIG, as Kafka reports them (test_configs_kafka.py has the details)
    assert all(v.is_read_only for v in cfg.values())
    assert cfg["advertised.listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert cfg["auto.create.topics.enable"].source == ConfigSource.DEFAULT_CONFIG.value
    # another broker id (raw: librdkafka would route the request to a broker 7 that does not exist)
    with RawClient(broker.bootstrap) as c:
        r = req(32, 4, "DescribeConfigsResource", resource_type=4, resource_name="7", configuration_keys=None)
        resp = c.request(32, 4, req(32, 4, resources=(r,), include_synonyms=False, include_documentation=False))
        assert error_code(resp.results[0].error_code) != 0 and resp.results[0].configs == ()


def test_alter_configs_round_trip(admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.bytes": "123456"})])[topic_name].result(15)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"retention.ms": "7200000", "max.message.bytes": "2000000"})
    assert admin.alter_configs([res])[res].result(15) is None
    cfg = describe_topic(admin, topic_name)
    assert cfg["retention.ms"].value == "7200000" and cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["max.message.bytes"].value == "2000000"
    # AlterConfigs replaces the whole set: retention.bytes (set at creation) is back to default
    assert cfg["retention.bytes"].value == "-1" and cfg["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    # an invalid value is refused and changes nothing
    bad = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"retention.ms": "-7"})
    assert kafka_error(admin.alter_configs([bad])[bad]).code() == INVALID_CONFIG
    compact = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"cleanup.policy": "compact,archive"})
    assert kafka_error(admin.alter_configs([compact])[compact]).code() == INVALID_CONFIG
    assert describe_topic(admin, topic_name)["retention.ms"].value == "7200000"
    # validate_only changes nothing
    vo = ConfigResource(ConfigResource.Type.TOPIC, topic_name, set_config={"retention.ms": "1"})
    assert admin.alter_configs([vo], validate_only=True)[vo].result(15) is None
    assert describe_topic(admin, topic_name)["retention.ms"].value == "7200000"


def test_incremental_alter_configs_round_trip(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"retention.bytes": "123456"})])[topic_name].result(15)

    def inc(*entries):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=list(entries))
        return admin.incremental_alter_configs([res])[res]

    assert inc(ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
               ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)).result(15) is None
    cfg = describe_topic(admin, topic_name)
    assert cfg["retention.ms"].value == "60000"
    assert cfg["message.timestamp.type"].value == "LogAppendTime"
    assert cfg["retention.bytes"].value == "123456"  # incremental: the rest is kept
    assert inc(ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE)).result(15) is None
    cfg = describe_topic(admin, topic_name)
    assert cfg["retention.bytes"].value == "-1" and cfg["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert cfg["retention.ms"].value == "60000"
    # APPEND to a list config that already holds the value: unchanged, still valid
    assert inc(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND)).result(15) is None
    assert describe_topic(admin, topic_name)["cleanup.policy"].value == "delete"
    # invalid: a bad number, a policy Kafka does not have, APPEND on a non-list config
    assert kafka_error(inc(ConfigEntry("retention.ms", "abc", incremental_operation=AlterConfigOpType.SET))).code() == INVALID_CONFIG
    assert kafka_error(inc(ConfigEntry("cleanup.policy", "archive", incremental_operation=AlterConfigOpType.APPEND))).code() == INVALID_CONFIG
    assert kafka_error(inc(ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.APPEND))).code() == INVALID_CONFIG
    assert describe_topic(admin, topic_name)["retention.ms"].value == "60000"
    # the change takes effect on the live log: LogAppendTime stamps new batches
    before = now_ms()
    with RawClient(broker.bootstrap) as c:
        assert c.produce(topic_name, 0, build_batch([(None, b"x")], timestamp=1_000)).base_offset == 0
        f = c.fetch(topic_name, 0, 0)
        [rec] = [r for pos, h in iter_batches(f.records) for r in decode_records(f.records, pos, h)]
        assert rec.timestamp >= before - 1000
    # broker configs are read-only
    bres = ConfigResource(ConfigResource.Type.BROKER, "0", incremental_configs=[ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    assert kafka_error(admin.incremental_alter_configs([bres])[bres]).code() != 0
    missing = ConfigResource(ConfigResource.Type.TOPIC, topic_name + "-missing", incremental_configs=[ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    assert kafka_error(admin.incremental_alter_configs([missing])[missing]).code() == UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------------------------
# DescribeCluster / Metadata


def test_describe_cluster(broker, admin):
    d = admin.describe_cluster().result(15)
    host, port = broker.bootstrap.split(":")
    assert d.cluster_id
    assert [(n.id, n.host, n.port) for n in d.nodes] == [(0, host, int(port))]
    assert d.controller is not None and d.controller.id == 0


def test_list_topics(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 5, 1)])[topic_name].result(15)
    try:
        md = admin.list_topics(timeout=15)  # all topics: librdkafka sends Metadata v12/v13 with a null topic array
    except KafkaException as e:
        raise AssertionError(f"list_topics failed: {e}\nbroker log:\n{broker_log_errors(broker)}") from None
    host, port = broker.bootstrap.split(":")
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {0: (host, int(port))}
    assert md.controller_id == 0 and md.cluster_id
    t = md.topics[topic_name]
    assert t.error is None
    assert sorted(t.partitions) == [0, 1, 2, 3, 4]
    assert all(p.leader == 0 and p.replicas == [0] and p.isrs == [0] for p in t.partitions.values())


def test_list_one_topic(broker, admin, topic_name):
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(15)
    md = admin.list_topics(topic_name, timeout=15)
    assert sorted(md.topics[topic_name].partitions) == [0, 1]


def test_metadata_all_versions(broker, topic_name):
    """Every Metadata version the broker advertises is answered (and decodes)."""
    with RawClient(broker.bootstrap) as c:
        av = c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1"))
        lo, hi = next((a.min_version, a.max_version) for a in av.api_keys if a.api_key == 3)
        c.metadata([topic_name])  # create
        for v in range(lo, hi + 1):
            md = c.metadata([topic_name], version=v)
            [t] = [t for t in md.topics if t.name == topic_name]
            assert error_code(t.error_code) == 0 and len(t.partitions) == 1, v
            assert [b.node_id for b in md.brokers] == [0]


# ---------------------------------------------------------------------------------------
# ApiVersions


def registered_apis() -> list[tuple[int, int, int]]:
    from kafscale.broker.router import build_router

    return sorted((a.key, a.min_version, a.max_version) for a in build_router().apis.values())


def test_api_versions_lists_exactly_registered(broker):
    expected = registered_apis()
    with RawClient(broker.bootstrap) as c:
        for v in (0, 1, 2, 3):
            body = req(18, v, client_software_name="kafscale-tests", client_software_version="1.0")
            r = c.request(18, v, body)
            assert error_code(r.error_code) == 0
            assert sorted((a.api_key, a.min_version, a.max_version) for a in r.api_keys) == expected, f"ApiVersions v{v}"
    keys = {k for k, _lo, _hi in expected}
    assert {0, 1, 2, 3, 18, 19, 20} <= keys  # the core the spec requires


def test_api_versions_unsupported_version_gets_v0_error(broker):
    expected = registered_apis()
    with RawClient(broker.bootstrap) as c:
        # a v99 request: header v2 (the client does not know the body, it sends v3's)
        body = req(18, 3, client_software_name="future", client_software_version="99")
        payload = bytearray(encode_request(18, 3, body, correlation_id=4242))
        struct.pack_into(">h", payload, 2, 99)
        c.send_frame(bytes(payload))
        frame = c.recv_frame()
        # v0 response: correlation id, error code, [api key, min, max]; response header v0
        corr, err, n = struct.unpack_from(">ihi", frame, 0)
        assert corr == 4242 and err == UNSUPPORTED_VERSION
        ranges = [struct.unpack_from(">hhh", frame, 10 + 6 * i) for i in range(n)]
        assert len(frame) == 10 + 6 * n
        assert sorted(ranges) == expected
        _corr, parsed = decode_response(18, 0, frame)
        assert error_code(parsed.error_code) == UNSUPPORTED_VERSION
        # the connection stays usable: the client retries with a version both know
        r = c.request(18, 3, req(18, 3, client_software_name="retry", client_software_version="1"))
        assert error_code(r.error_code) == 0


# ---------------------------------------------------------------------------------------
# error responses in every advertised version (Java clients use the newest ones)


def per_version(api_key: int, check, b=None) -> None:
    lo, hi = api_range(api_key)
    each_version(range(lo, hi + 1), check, b, f"api {api_key}: ")


def _create_topics(bootstrap: str, v: int, name: str, configs: dict | None = None, validate_only: bool = False) -> int:
    with RawClient(bootstrap) as c:
        cfgs = tuple(req(19, v, "CreatableTopicConfig", name=k, value=val) for k, val in (configs or {}).items())
        ct = req(19, v, "CreatableTopic", name=name, num_partitions=1, replication_factor=1, assignments=(), configs=cfgs)
        resp = c.request(19, v, req(19, v, topics=(ct,), timeout=5000, validate_only=validate_only))
        return error_code(resp.topics[0].error_code)


def test_create_topics_errors_every_version(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])  # exists now

    def check(v):
        assert _create_topics(broker.bootstrap, v, topic_name) == TOPIC_ALREADY_EXISTS
        assert _create_topics(broker.bootstrap, v, "bad name!") == INVALID_TOPIC_EXCEPTION
        assert _create_topics(broker.bootstrap, v, f"{topic_name}-c{v}", {"cleanup.policy": "keep"}) == INVALID_CONFIG
        assert _create_topics(broker.bootstrap, v, f"{topic_name}-ok{v}") == 0

    per_version(19, check, broker)
    assert topic_exists_raw(broker.bootstrap, f"{topic_name}-c3") == UNKNOWN_TOPIC_OR_PARTITION


def test_delete_topics_unknown_every_version(broker, topic_name):
    def check(v):
        name = f"{topic_name}-missing"
        with RawClient(broker.bootstrap) as c:
            topics = (req(20, v, "DeleteTopicState", name=name, topic_id=None),) if v >= 6 else None
            resp = c.request(20, v, req(20, v, topic_names=(name,), topics=topics, timeout=5000))
            assert [error_code(r.error_code) for r in resp.responses] == [UNKNOWN_TOPIC_OR_PARTITION]

    per_version(20, check, broker)


def test_create_partitions_errors_every_version(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])

    def check(v):
        with RawClient(broker.bootstrap) as c:
            for name, count, expected in ((topic_name + "-missing", 3, UNKNOWN_TOPIC_OR_PARTITION), (topic_name, 1, INVALID_PARTITIONS)):
                t = req(37, v, "CreatePartitionsTopic", name=name, count=count, assignments=None)
                resp = c.request(37, v, req(37, v, topics=(t,), timeout=5000, validate_only=False))
                assert [error_code(r.error_code) for r in resp.results] == [expected]

    per_version(37, check, broker)


def test_config_apis_unknown_topic_every_version(broker, topic_name):
    missing = topic_name + "-missing"

    def describe(v):
        with RawClient(broker.bootstrap) as c:
            r = req(32, v, "DescribeConfigsResource", resource_type=2, resource_name=missing, configuration_keys=None)
            resp = c.request(32, v, req(32, v, resources=(r,), include_synonyms=False, include_documentation=False))
            assert [error_code(x.error_code) for x in resp.results] == [UNKNOWN_TOPIC_OR_PARTITION]

    def alter(v):
        with RawClient(broker.bootstrap) as c:
            r = req(33, v, "AlterConfigsResource", resource_type=2, resource_name=missing, configs=())
            resp = c.request(33, v, req(33, v, resources=(r,), validate_only=False))
            assert [error_code(x.error_code) for x in resp.responses] == [UNKNOWN_TOPIC_OR_PARTITION]

    def incremental(v):
        with RawClient(broker.bootstrap) as c:
            r = req(44, v, "AlterConfigsResource", resource_type=2, resource_name=missing, configs=())
            resp = c.request(44, v, req(44, v, resources=(r,), validate_only=False))
            assert [error_code(x.error_code) for x in resp.responses] == [UNKNOWN_TOPIC_OR_PARTITION]

    per_version(32, describe, broker)
    per_version(33, alter, broker)
    per_version(44, incremental, broker)


def test_describe_cluster_every_version(broker):
    host, port = broker.bootstrap.split(":")

    def check(v):
        with RawClient(broker.bootstrap) as c:
            resp = c.request(60, v, req(60, v, include_cluster_authorized_operations=False, endpoint_type=1, include_fenced_brokers=False))
            assert error_code(resp.error_code) == 0
            assert [(b.broker_id, b.host, b.port) for b in resp.brokers] == [(0, host, int(port))]

    per_version(60, check, broker)
