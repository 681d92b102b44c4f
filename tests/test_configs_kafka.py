"""Configs exactly as Kafka reports them (#18): every topic config with Kafka's defaults,
types, sources and synonyms, documentation on request, broker configs with
STATIC_BROKER_CONFIG for what the operator gave, configs without meaning here accepted and
stored, and message.timestamp.*.max.ms enforced at produce with INVALID_TIMESTAMP.

Checked with confluent-kafka's and kafka-python's admin clients and raw DescribeConfigs v4."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from kafscale.errors import ErrorCode
from kafscale.metadata import topic_config
from kafscale.protocol.records import COMPRESSION_LZ4, build_batch
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req

# Apache Kafka 3.9's documented topic configs (kafka.apache.org/documentation/#topicconfigs):
# name -> (default, type, server default property). Typed in from the documentation and
# checked against LogConfig/ServerTopicConfigSynonyms; the broker must report each of them.
KAFKA_TOPIC_CONFIGS = {
    "cleanup.policy": ("delete", "list", "log.cleanup.policy"),
    "compression.gzip.level": ("-1", "int", "compression.gzip.level"),
    "compression.lz4.level": ("9", "int", "compression.lz4.level"),
    "compression.type": ("producer", "string", "compression.type"),
    "compression.zstd.level": ("3", "int", "compression.zstd.level"),
    "delete.retention.ms": ("86400000", "long", "log.cleaner.delete.retention.ms"),
    "file.delete.delay.ms": ("60000", "long", "log.segment.delete.delay.ms"),
    "flush.messages": ("9223372036854775807", "long", "log.flush.interval.messages"),
    "flush.ms": ("9223372036854775807", "long", "log.flush.interval.ms"),
    "follower.replication.throttled.replicas": ("", "list", None),
    "index.interval.bytes": ("4096", "int", "log.index.interval.bytes"),
    "leader.replication.throttled.replicas": ("", "list", None),
    "local.retention.bytes": ("-2", "long", "log.local.retention.bytes"),
    "local.retention.ms": ("-2", "long", "log.local.retention.ms"),
    "max.compaction.lag.ms": ("9223372036854775807", "long", "log.cleaner.max.compaction.lag.ms"),
    "max.message.bytes": ("1048588", "int", "message.max.bytes"),
    "message.downconversion.enable": ("true", "boolean", "log.message.downconversion.enable"),
    "message.format.version": ("3.0-IV1", "string", "log.message.format.version"),
    "message.timestamp.after.max.ms": ("9223372036854775807", "long", "log.message.timestamp.after.max.ms"),
    "message.timestamp.before.max.ms": ("9223372036854775807", "long", "log.message.timestamp.before.max.ms"),
    "message.timestamp.difference.max.ms": ("9223372036854775807", "long", "log.message.timestamp.difference.max.ms"),
    "message.timestamp.type": ("CreateTime", "string", "log.message.timestamp.type"),
    "min.cleanable.dirty.ratio": ("0.5", "double", "log.cleaner.min.cleanable.ratio"),
    "min.compaction.lag.ms": ("0", "long", "log.cleaner.min.compaction.lag.ms"),
    "min.insync.replicas": ("1", "int", "min.insync.replicas"),
    "preallocate": ("false", "boolean", "log.preallocate"),
    "remote.log.copy.disable": ("false", "boolean", None),
    "remote.log.delete.on.disable": ("false", "boolean", None),
    "remote.storage.enable": ("false", "boolean", None),
    "retention.bytes": ("-1", "long", "log.retention.bytes"),
    "retention.ms": ("604800000", "long", "log.retention.ms"),
    "segment.bytes": ("1073741824", "int", "log.segment.bytes"),
    "segment.index.bytes": ("10485760", "int", "log.index.size.max.bytes"),
    "segment.jitter.ms": ("0", "long", "log.roll.jitter.ms"),
    "segment.ms": ("604800000", "long", "log.roll.ms"),
    "unclean.leader.election.enable": ("false", "boolean", "unclean.leader.election.enable"),
}
# What a KafScale broker reports differently, on purpose: segments are sealed at 4 MiB by
# default (objects in a store, not files on a disk; --segment-bytes sets log.segment.bytes).
KAFSCALE_DEVIATIONS = {"segment.bytes": "4194304"}
TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
DEFAULT, STATIC, DYNAMIC_TOPIC = ConfigSource.DEFAULT_CONFIG.value, ConfigSource.STATIC_BROKER_CONFIG.value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value
LONG_MAX = str((1 << 63) - 1)


@pytest.fixture(scope="module")
def seg_broker():
    """A broker given --segment-bytes (a Kafka setting, log.segment.bytes) by the operator."""
    b = BrokerProcess(extra_args=["--segment-bytes", "2000000"]).start()
    yield b
    b.stop()


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create(admin: AdminClient, topic: str, config: dict | None = None) -> None:
    admin.create_topics([NewTopic(topic, 1, 1, config=config or {})])[topic].result(15)


def describe_raw(bootstrap: str, resource_type: int, name: str, keys=None, synonyms=True, docs=True, version=4):
    with RawClient(bootstrap) as c:
        r = req(32, version, "DescribeConfigsResource", resource_type=resource_type, resource_name=name, configuration_keys=keys)
        resp = c.request(32, version, req(32, version, resources=(r,), include_synonyms=synonyms, include_documentation=docs))
    [res] = resp.results
    return res

# Beyond Kafka's: the schema validation configs Confluent Server and Redpanda have (#29),
# listed only where a topic sets them or a request names them.
EXTENSION_TOPIC_CONFIGS = {
    "confluent.key.schema.validation": ("false", "boolean", None),
    "confluent.value.schema.validation": ("false", "boolean", None),
}


def by_name(res) -> dict:
    return {e.name: e for e in res.configs}


def test_the_table_has_every_kafka_topic_config_with_kafkas_defaults():
    assert set(topic_config.TOPIC_CONFIGS) == set(KAFKA_TOPIC_CONFIGS) | set(EXTENSION_TOPIC_CONFIGS)
    for name, (default, kind, server) in {**KAFKA_TOPIC_CONFIGS, **EXTENSION_TOPIC_CONFIGS}.items():
        d = topic_config.TOPIC_CONFIGS[name]
        assert (d.default, d.kind, d.synonyms[0] if d.synonyms else None) == (default, TYPES[kind], server), name
        assert d.doc, name


def test_describe_every_topic_config_field_by_field_with_kafkas_defaults(broker, admin, topic_name):
    create(admin, topic_name)
    # an empty key list and a null one both mean every config, as in Kafka
    for keys in ((), None):
        res = describe_raw(broker.bootstrap, 2, topic_name, keys=keys)
        assert error_code(res.error_code) == 0
        assert set(by_name(res)) == set(KAFKA_TOPIC_CONFIGS), keys
    got = by_name(res)
    for name, (default, kind, server) in KAFKA_TOPIC_CONFIGS.items():
        e = got[name]
        expected = KAFSCALE_DEVIATIONS.get(name, default)
        assert (e.value, e.config_type, e.config_source, e.is_sensitive, e.read_only) == (expected, TYPES[kind], DEFAULT, False, False), name
        assert e.documentation, name
    # synonyms as Kafka lists them: the broker default under its server name, except where
    # Kafka's first synonym has no default (log.retention.ms, log.roll.ms, log.flush.interval.ms)
    syn = {n: [(s.name, s.value, s.source) for s in e.synonyms] for n, e in got.items()}
    assert syn["cleanup.policy"] == [("log.cleanup.policy", "delete", DEFAULT)]
    assert syn["compression.type"] == [("compression.type", "producer", DEFAULT)]
    assert syn["max.message.bytes"] == [("message.max.bytes", "1048588", DEFAULT)]
    assert syn["min.insync.replicas"] == [("min.insync.replicas", "1", DEFAULT)]
    assert syn["segment.bytes"] == [("log.segment.bytes", "4194304", DEFAULT)]
    assert syn["message.timestamp.difference.max.ms"] == [("log.message.timestamp.difference.max.ms", LONG_MAX, DEFAULT)]
    for name in ("retention.ms", "segment.ms", "segment.jitter.ms", "flush.ms", "remote.storage.enable", "leader.replication.throttled.replicas"):
        assert syn[name] == [], name
    # without include_synonyms / include_documentation: none
    plain = by_name(describe_raw(broker.bootstrap, 2, topic_name, keys=("cleanup.policy",), synonyms=False, docs=False))
    assert list(plain) == ["cleanup.policy"] and plain["cleanup.policy"].synonyms == () and plain["cleanup.policy"].documentation is None


def test_extension_configs_listed_only_where_set_or_named(broker, admin, topic_name):
    """A topic's full listing is Kafka's set of names; confluent.*.schema.validation appears
    once set on the topic (a dynamic topic config) or when a request names it."""
    name = "confluent.value.schema.validation"
    create(admin, topic_name, {name: "true"})
    got = by_name(describe_raw(broker.bootstrap, 2, topic_name))
    assert set(got) == set(KAFKA_TOPIC_CONFIGS) | {name}
    assert (got[name].value, got[name].config_source) == ("true", DYNAMIC_TOPIC)
    named = by_name(describe_raw(broker.bootstrap, 2, topic_name, keys=["confluent.key.schema.validation"]))
    assert [(e.name, e.value, e.config_source) for e in named.values()] == [("confluent.key.schema.validation", "false", DEFAULT)]


def test_confluent_kafka_describe_configs(admin, topic_name):
    create(admin, topic_name, {"retention.ms": "3600000", "compression.type": "zstd"})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    cfg = admin.describe_configs([res])[res].result(15)
    assert set(cfg) == set(KAFKA_TOPIC_CONFIGS)
    r = cfg["retention.ms"]
    assert (r.value, r.source, r.is_default, r.is_read_only, r.is_sensitive) == ("3600000", DYNAMIC_TOPIC, False, False, False)
    assert [(s.name, s.value, s.source) for s in r.synonyms.values()] == [("retention.ms", "3600000", DYNAMIC_TOPIC)]
    c = cfg["compression.type"]
    assert (c.value, c.source) == ("zstd", DYNAMIC_TOPIC)
    # the broker sends [(compression.type, zstd, DYNAMIC_TOPIC), (compression.type, producer, DEFAULT)];
    # librdkafka keys synonyms by name, so the last one stands (kafka-python below sees both)
    assert [(s.name, s.value, s.source) for s in c.synonyms.values()] == [("compression.type", "producer", DEFAULT)]
    p = cfg["cleanup.policy"]
    assert (p.value, p.source, [(s.name, s.value, s.source) for s in p.synonyms.values()]) == ("delete", DEFAULT, [("log.cleanup.policy", "delete", DEFAULT)])


def test_kafka_python_describe_configs(broker, admin, topic_name):
    from kafka.admin import ConfigResource as KPResource, ConfigResourceType, KafkaAdminClient

    create(admin, topic_name, {"min.insync.replicas": "2"})
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        out = kp.describe_configs([KPResource(ConfigResourceType.TOPIC, topic_name)], include_synonyms=True, config_filter="all")
    finally:
        kp.close()
    cfg = out["topic"][topic_name]
    assert set(cfg) == set(KAFKA_TOPIC_CONFIGS)
    assert cfg["min.insync.replicas"] == {
        "value": "2", "read_only": False, "config_source": "DYNAMIC_TOPIC_CONFIG", "is_sensitive": False, "config_type": "INT", "documentation": None,
        "synonyms": [{"name": "min.insync.replicas", "value": "2", "source": "DYNAMIC_TOPIC_CONFIG"}, {"name": "min.insync.replicas", "value": "1", "source": "DEFAULT_CONFIG"}],
    }
    assert cfg["message.timestamp.after.max.ms"]["value"] == LONG_MAX and cfg["message.timestamp.after.max.ms"]["config_type"] == "LONG"
    assert cfg["retention.ms"]["synonyms"] == [] and cfg["retention.ms"]["config_source"] == "DEFAULT_CONFIG"


def test_configs_without_meaning_here_are_accepted_stored_and_normalised(broker, admin, topic_name):
    given = {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "TRUE",
        "preallocate": "true",
        "leader.replication.throttled.replicas": "0:0, 1:0",
        "follower.replication.throttled.replicas": "*",
        "min.cleanable.dirty.ratio": "1",
        "message.format.version": "2.8",
        "compression.type": "gzip",
        "compression.gzip.level": "9",
        "segment.ms": "0100",
        "remote.storage.enable": "false",
    }
    create(admin, topic_name, given)
    got = by_name(describe_raw(broker.bootstrap, 2, topic_name))
    expected = dict(given, **{"unclean.leader.election.enable": "true", "leader.replication.throttled.replicas": "0:0,1:0", "min.cleanable.dirty.ratio": "1.0", "segment.ms": "100"})
    for name, value in expected.items():
        assert (got[name].value, got[name].config_source) == (value, DYNAMIC_TOPIC), name
    for bad in ({"min.insync.replicas": "0"}, {"unclean.leader.election.enable": "maybe"}, {"compression.type": "brotli"}, {"compression.lz4.level": "18"},
                {"min.cleanable.dirty.ratio": "1.5"}, {"leader.replication.throttled.replicas": "x:y"}, {"segment.bytes": "13"}, {"local.retention.ms": "-3"},
                {"max.message.bytes": "4294967296"}, {"message.format.version": "banana"}, {"cleanup.policy": "compact,"}, {"cleanup.policy": "Compact"}):
        fut = admin.create_topics([NewTopic(topic_name + "-bad", 1, 1, config=bad)])[topic_name + "-bad"]
        with pytest.raises(KafkaException) as info:
            fut.result(15)
        assert info.value.args[0].code() == ErrorCode.invalid_config.value, bad


def test_broker_configs_default_and_static_as_kafka(broker, seg_broker):
    res = describe_raw(broker.bootstrap, 4, "0")
    assert error_code(res.error_code) == 0
    got = by_name(res)
    for name in ("default.replication.factor", "num.partitions", "auto.create.topics.enable", "log.retention.ms", "log.retention.hours",
                 "log.segment.bytes", "message.max.bytes", "log.cleanup.policy", "min.insync.replicas", "broker.id", "advertised.listeners"):
        assert name in got, name
    src = {n: (e.value, e.config_source) for n, e in got.items()}
    assert src["default.replication.factor"] == ("1", DEFAULT)
    assert src["num.partitions"] == ("1", DEFAULT)
    assert src["auto.create.topics.enable"] == ("true", DEFAULT)
    assert src["log.retention.ms"] == (None, DEFAULT)  # Kafka: no default; log.retention.hours gives it
    assert src["log.retention.hours"] == ("168", DEFAULT)
    assert src["log.segment.bytes"] == ("4194304", DEFAULT)
    assert src["advertised.listeners"] == (f"PLAINTEXT://{broker.bootstrap}", STATIC)
    # read-only; sensitive (value null) exactly the PASSWORD configs (ssl.key.password, ...), as Kafka
    assert all(e.read_only and e.is_sensitive == (e.config_type == 9) and (e.value is None or not e.is_sensitive) for e in got.values())
    assert got["ssl.key.password"].is_sensitive and got["ssl.key.password"].value is None
    assert [(s.name, s.value, s.source) for s in got["log.retention.hours"].synonyms] == [("log.retention.hours", "168", DEFAULT)]
    # given by the operator: STATIC_BROKER_CONFIG, with the default as the next synonym, and
    # the topic config it stands for follows it
    seg = by_name(describe_raw(seg_broker.bootstrap, 4, "0", keys=("log.segment.bytes",)))["log.segment.bytes"]
    assert (seg.value, seg.config_source) == ("2000000", STATIC)
    assert [(s.name, s.value, s.source) for s in seg.synonyms] == [("log.segment.bytes", "2000000", STATIC), ("log.segment.bytes", "4194304", DEFAULT)]
    admin = AdminClient({"bootstrap.servers": seg_broker.bootstrap})
    create(admin, "seg-static")
    t = by_name(describe_raw(seg_broker.bootstrap, 2, "seg-static", keys=("segment.bytes",)))["segment.bytes"]
    assert (t.value, t.config_source) == ("2000000", STATIC)
    assert [(s.name, s.value, s.source) for s in t.synonyms] == [("log.segment.bytes", "2000000", STATIC), ("log.segment.bytes", "4194304", DEFAULT)]
    # the empty broker name: Kafka's cluster-wide dynamic defaults, none here; another id: INVALID_REQUEST
    assert describe_raw(broker.bootstrap, 4, "").configs == ()
    assert error_code(describe_raw(broker.bootstrap, 4, "7").error_code) == ErrorCode.invalid_request.value


def test_invalid_topic_name_is_invalid_topic_exception(broker):
    assert error_code(describe_raw(broker.bootstrap, 2, "bad name!").error_code) == ErrorCode.invalid_topic_exception.value


# ---------------------------------------------------------------------------------------
# message.timestamp.*.max.ms at produce


def now_ms() -> int:
    return int(time.time() * 1000)


def produce_at(bootstrap: str, topic: str, ts: int, codec: int = 0) -> int:
    with RawClient(bootstrap) as c:
        return error_code(c.produce(topic, 0, build_batch([(None, b"a"), (None, b"b")], timestamp=ts, codec=codec)).error_code)


def test_timestamp_bounds_refuse_out_of_range_records_with_invalid_timestamp(broker, admin, topic_name):
    hour = 3_600_000
    create(admin, topic_name + "-before", {"message.timestamp.before.max.ms": str(hour)})
    create(admin, topic_name + "-after", {"message.timestamp.after.max.ms": str(hour)})
    create(admin, topic_name + "-diff", {"message.timestamp.difference.max.ms": str(hour)})
    create(admin, topic_name + "-append", {"message.timestamp.difference.max.ms": str(hour), "message.timestamp.type": "LogAppendTime"})
    bad, ok = ErrorCode.invalid_timestamp.value, 0
    b = broker.bootstrap
    for codec in (0, COMPRESSION_LZ4):
        assert produce_at(b, topic_name + "-before", now_ms() - 2 * hour, codec) == bad
        assert produce_at(b, topic_name + "-before", now_ms() + 2 * hour, codec) == ok  # after is unlimited
        assert produce_at(b, topic_name + "-after", now_ms() + 2 * hour, codec) == bad
        assert produce_at(b, topic_name + "-after", now_ms() - 2 * hour, codec) == ok
        # the deprecated difference bounds both sides where before/after keep their default
        assert produce_at(b, topic_name + "-diff", now_ms() - 2 * hour, codec) == bad
        assert produce_at(b, topic_name + "-diff", now_ms() + 2 * hour, codec) == bad
        assert produce_at(b, topic_name + "-diff", now_ms(), codec) == ok
        # LogAppendTime: the broker's clock stamps the batch, producer timestamps are not checked
        assert produce_at(b, topic_name + "-append", now_ms() - 2 * hour, codec) == ok
    # a client sees Kafka's error: confluent-kafka reports INVALID_TIMESTAMP for the message
    errors = []
    p = Producer({"bootstrap.servers": b, "retries": 0})
    p.produce(topic_name + "-diff", b"old", timestamp=now_ms() - 2 * hour, on_delivery=lambda e, m: errors.append(e))
    assert p.flush(20) == 0  # alone: a batch with both is refused as a whole, as in Kafka
    p.produce(topic_name + "-diff", b"now", timestamp=now_ms(), on_delivery=lambda e, m: errors.append(e))
    assert p.flush(20) == 0
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_TIMESTAMP, None]


def test_log_settings_timestamp_bounds():
    s = topic_config.LogSettings.from_configs({"message.timestamp.difference.max.ms": "10", "message.timestamp.after.max.ms": "5"})
    assert (s.timestamp_before_max_ms, s.timestamp_after_max_ms) == (10, 5)
    s = topic_config.LogSettings.from_configs({})
    assert (s.timestamp_before_max_ms, s.timestamp_after_max_ms) == (int(LONG_MAX), int(LONG_MAX))
    # log.retention.hours given to a broker: retention.ms follows it (value, not source: as Kafka)
    r = topic_config.resolve("retention.ms", {}, {"log.retention.hours": "2"})
    assert (r.value, r.source, r.synonyms) == ("7200000", DEFAULT, ())


# ---------------------------------------------------------------------------------------
# BROKER_LOGGER: logger levels, as `kafka-configs --entity-type broker-loggers` sees them


def alter_loggers(bootstrap: str, name: str, ops, validate_only: bool = False, version: int = 1):
    with RawClient(bootstrap) as c:
        cfgs = tuple(req(44, version, "AlterableConfig", name=n, config_operation=op, value=v) for n, op, v in ops)
        r = req(44, version, "AlterConfigsResource", resource_type=8, resource_name=name, configs=cfgs)
        [res] = c.request(44, version, req(44, version, resources=(r,), validate_only=validate_only)).responses
    return error_code(res.error_code)


def test_broker_loggers_describe_and_set(seg_broker):
    b = seg_broker.bootstrap  # a private broker: levels change process-wide
    got = by_name(describe_raw(b, 8, "0"))
    assert got["root"].value == "INFO" and got["kafscale.admin"].value == "INFO"
    assert all((e.config_source, e.read_only, e.synonyms) == (6, False, ()) for e in got.values())
    assert alter_loggers(b, "0", [("kafscale.admin", 0, "DEBUG")]) == 0
    assert alter_loggers(b, "0", [("kafscale.produce", 0, "WARN")], validate_only=True) == 0
    got = by_name(describe_raw(b, 8, "0", keys=("kafscale.admin", "kafscale.produce")))
    assert {n: e.value for n, e in got.items()} == {"kafscale.admin": "DEBUG", "kafscale.produce": "INFO"}
    # Kafka's refusals: unknown level or logger, deleting root, APPEND, another broker id
    assert alter_loggers(b, "0", [("kafscale.admin", 0, "LOUD")]) == ErrorCode.invalid_config.value
    assert alter_loggers(b, "0", [("no.such.logger", 0, "INFO")]) == ErrorCode.invalid_config.value
    assert alter_loggers(b, "0", [("root", 1, None)]) == ErrorCode.invalid_request.value
    assert alter_loggers(b, "0", [("kafscale.admin", 2, "INFO")]) == ErrorCode.invalid_request.value
    assert alter_loggers(b, "3", [("kafscale.admin", 0, "INFO")]) == ErrorCode.invalid_request.value
    # DELETE: the logger inherits again
    assert alter_loggers(b, "0", [("kafscale.admin", 1, None)]) == 0
    assert by_name(describe_raw(b, 8, "0", keys=("kafscale.admin",)))["kafscale.admin"].value == "INFO"
    assert error_code(describe_raw(b, 8, "5").error_code) == ErrorCode.invalid_request.value


# Apache Kafka 3.9's documented broker defaults (kafka.apache.org/documentation/#brokerconfigs)
# of the broker configs a KafScale broker reports, with KafScale's own where it differs on
# purpose (each one a flag: the defaults suit brokers without local disks).
KAFKA_BROKER_DEFAULTS = {
    "auto.create.topics.enable": "true",
    "broker.id": "-1",
    "connections.max.idle.ms": "600000",
    "default.replication.factor": "1",
    "group.initial.rebalance.delay.ms": "3000",
    "group.max.session.timeout.ms": "1800000",
    "group.consumer.session.timeout.ms": "45000",
    "group.consumer.heartbeat.interval.ms": "5000",
    "group.consumer.max.size": "2147483647",
    "group.min.session.timeout.ms": "6000",
    "log.cleanup.policy": "delete",
    "log.retention.bytes": "-1",
    "log.retention.check.interval.ms": "300000",
    "log.retention.hours": "168",
    "log.retention.minutes": None,
    "log.retention.ms": None,
    "log.segment.bytes": "1073741824",
    "max.connections": "2147483647",
    "max.connections.per.ip": "2147483647",
    "message.max.bytes": "1048588",
    "min.insync.replicas": "1",
    "num.partitions": "1",
    "offsets.retention.check.interval.ms": "600000",
    "offsets.retention.minutes": "10080",
    "offsets.topic.num.partitions": "50",
    "offsets.topic.segment.bytes": "104857600",
    "producer.id.expiration.ms": "86400000",
    "queued.max.request.bytes": "-1",
    "socket.request.max.bytes": "104857600",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    "transaction.max.timeout.ms": "900000",
    "transactional.id.expiration.ms": "604800000",
    "unclean.leader.election.enable": "false",
    "compression.type": "producer",
}
KAFSCALE_BROKER_DEVIATIONS = {
    "broker.id": "0",                              # --broker-id defaults to 0 (Kafka: -1, assigned)
    "log.retention.check.interval.ms": "30000",    # --retention-check-interval-ms: deleting objects is cheap
    "log.segment.bytes": "4194304",                # --segment-bytes: 4 MiB objects, not 1 GiB files
    "max.connections": "10000",                    # --max-connections: a bound by default
    "max.connections.per.ip": "0",                 # --max-connections-per-ip: 0 is "no limit"
    "queued.max.request.bytes": str(256 * 1024 * 1024),  # --max-request-memory: bounded by default
}


def test_broker_defaults_field_by_field_with_kafkas():
    b = BrokerProcess().start()  # given no setting but its addresses and data dir
    try:
        got = by_name(describe_raw(b.bootstrap, 4, "0"))
    finally:
        b.stop()
    for name, default in KAFKA_BROKER_DEFAULTS.items():
        e = got[name]
        assert (e.value, e.config_source) == (KAFSCALE_BROKER_DEVIATIONS.get(name, default), DEFAULT), name
