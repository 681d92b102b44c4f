"""GROUP config resources (ConfigResource type 32), as Apache Kafka 4.1 has them (#27, #28):
DescribeConfigs, IncrementalAlterConfigs and AlterConfigs through confluent-kafka's
AdminClient and raw frames, Kafka's validation messages, defaults from the broker's
settings, persistence across a restart, and a consumer group's session timeout and
heartbeat interval taken from its configs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.request
import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic, ResourceType

from kafscale.errors import ErrorCode
from kafscale.metadata import group_config, keys
from kafscale.metadata.group_config import GroupLimits, InvalidConfigError
from tests.support.broker import BrokerProcess, free_port
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

GROUP = 32
DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL = 32, 33, 44
HEARTBEAT, CG_DESCRIBE = 68, 69
DEFAULT, GROUP_SOURCE = ConfigSource.DEFAULT_CONFIG.value, ConfigSource.GROUP_CONFIG.value
SET, DELETE, APPEND = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND

# Apache Kafka 4.1's group configs (kafka.apache.org/41/configuration/group-configs) with
# the defaults of a broker left at Kafka's settings: name -> (default, type)
KAFKA_GROUP_CONFIGS = {
    "consumer.heartbeat.interval.ms": ("5000", "int"),
    "consumer.session.timeout.ms": ("45000", "int"),
    "share.auto.offset.reset": ("latest", "string"),
    "share.heartbeat.interval.ms": ("5000", "int"),
    "share.isolation.level": ("read_uncommitted", "string"),
    "share.record.lock.duration.ms": ("30000", "int"),
    "share.session.timeout.ms": ("45000", "int"),
    "streams.heartbeat.interval.ms": ("5000", "int"),
    "streams.num.standby.replicas": ("0", "int"),
    "streams.session.timeout.ms": ("45000", "int"),
}
TYPES = {"string": 2, "int": 3}


def group_id() -> str:
    return f"gcfg-{uuid.uuid4().hex[:8]}"


def incremental(admin: AdminClient, group: str, *ops, validate_only: bool = False) -> None:
    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops])
    for fut in admin.incremental_alter_configs([r], validate_only=validate_only).values():
        fut.result(15)


def refused(admin: AdminClient, group: str, *ops) -> tuple[int, str]:
    with pytest.raises(KafkaException) as e:
        incremental(admin, group, *ops)
    err = e.value.args[0]
    return err.code(), err.str()


def describe(admin: AdminClient, group: str) -> dict:
    [fut] = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)]).values()
    return fut.result(15)


def describe_raw(bootstrap: str, name: str, keys=None, version: int = 4):
    with RawClient(bootstrap) as c:
        r = req(DESCRIBE_CONFIGS, version, "DescribeConfigsResource", resource_type=GROUP, resource_name=name, configuration_keys=keys)
        resp = c.request(DESCRIBE_CONFIGS, version, req(DESCRIBE_CONFIGS, version, resources=(r,), include_synonyms=True, include_documentation=True))
    [res] = resp.results
    return res


def alter_raw(bootstrap: str, name: str, configs: dict, version: int = 2):
    """Legacy AlterConfigs: the configs replace the group's."""
    with RawClient(bootstrap) as c:
        entries = tuple(req(ALTER_CONFIGS, version, "AlterableConfig", name=k, value=v) for k, v in configs.items())
        r = req(ALTER_CONFIGS, version, "AlterConfigsResource", resource_type=GROUP, resource_name=name, configs=entries)
        resp = c.request(ALTER_CONFIGS, version, req(ALTER_CONFIGS, version, resources=(r,), validate_only=False))
    [res] = resp.responses
    return error_code(res.error_code), res.error_message


def incremental_raw(bootstrap: str, name: str, ops, version: int = 1):
    with RawClient(bootstrap) as c:
        entries = tuple(req(INCREMENTAL, version, "AlterableConfig", name=k, config_operation=op, value=v) for k, op, v in ops)
        r = req(INCREMENTAL, version, "AlterConfigsResource", resource_type=GROUP, resource_name=name, configs=entries)
        resp = c.request(INCREMENTAL, version, req(INCREMENTAL, version, resources=(r,), validate_only=False))
    [res] = resp.responses
    return error_code(res.error_code), res.error_message


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


# -- the table ---------------------------------------------------------------------------------


def test_the_table_is_kafkas():
    limits = GroupLimits()
    assert set(group_config.GROUP_CONFIGS) == set(KAFKA_GROUP_CONFIGS)
    for name, (default, kind) in KAFKA_GROUP_CONFIGS.items():
        d = group_config.GROUP_CONFIGS[name]
        assert (d.default_value(limits), d.kind) == (default, TYPES[kind]), name
        assert d.doc, name


@pytest.mark.parametrize("overrides, message", [
    ({"no.such.config": "1"}, "Unknown group config name: no.such.config"),
    ({"consumer.session.timeout.ms": "abc"}, "Invalid value abc for configuration consumer.session.timeout.ms: Not a number of type INT"),
    ({"consumer.session.timeout.ms": "2147483648"}, "Invalid value 2147483648 for configuration consumer.session.timeout.ms: Not a number of type INT"),
    ({"consumer.session.timeout.ms": "0"}, "Invalid value 0 for configuration consumer.session.timeout.ms: Value must be at least 1"),
    ({"share.record.lock.duration.ms": "999"}, "Invalid value 999 for configuration share.record.lock.duration.ms: Value must be at least 1000"),
    ({"share.isolation.level": "READ_COMMITTED"},
     "Invalid value READ_COMMITTED for configuration share.isolation.level: String must be one of: read_committed, read_uncommitted"),
    ({"share.auto.offset.reset": "none"},
     "Invalid value none for configuration share.auto.offset.reset: Invalid value `none` for configuration share.auto.offset.reset. "
     "The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'."),
    ({"share.auto.offset.reset": "by_duration:-PT1H"}, None),
    ({"share.auto.offset.reset": "by_duration:1h"}, None),
    ({"consumer.session.timeout.ms": "44999"}, "consumer.session.timeout.ms must be greater than or equal to group.consumer.min.session.timeout.ms"),
    ({"consumer.session.timeout.ms": "60001"}, "consumer.session.timeout.ms must be less than or equal to group.consumer.max.session.timeout.ms"),
    ({"consumer.heartbeat.interval.ms": "4999"}, "consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat.interval.ms"),
    ({"consumer.heartbeat.interval.ms": "15001"}, "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
    ({"share.record.lock.duration.ms": "14999"}, "share.record.lock.duration.ms must be greater than or equal to group.share.min.record.lock.duration.ms"),
    ({"share.session.timeout.ms": "70000"}, "share.session.timeout.ms must be less than or equal to group.share.max.session.timeout.ms"),
    ({"streams.num.standby.replicas": "3"}, "streams.num.standby.replicas must be less than or equal to group.streams.max.standby.replicas"),
])
def test_kafkas_validation_messages(overrides, message):
    with pytest.raises(InvalidConfigError) as e:
        group_config.validate(overrides, GroupLimits())
    if message is not None:
        assert str(e.value) == message
    else:
        assert str(e.value).endswith("The value must be either 'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.")


def test_session_must_exceed_heartbeat_over_the_broker_values():
    limits = GroupLimits(group_consumer_min_session_timeout_ms=1000, group_consumer_max_heartbeat_interval_ms=60_000)
    # merged over the broker's 45 s session timeout: a 45 s heartbeat is refused, 44 s is not
    with pytest.raises(InvalidConfigError, match="^consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms$"):
        group_config.validate({"consumer.heartbeat.interval.ms": "45000"}, limits)
    assert group_config.validate({"consumer.heartbeat.interval.ms": "44000"}, limits) == {"consumer.heartbeat.interval.ms": "44000"}
    with pytest.raises(InvalidConfigError, match="greater than consumer.heartbeat"):
        group_config.validate({"consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "6000"}, limits)


def test_values_are_normalized_and_durations_parsed_as_java_does():
    got = group_config.validate({"consumer.session.timeout.ms": " +50000 ", "share.auto.offset.reset": " by_duration:P1DT1H30M0.5S "}, GroupLimits())
    assert got == {"consumer.session.timeout.ms": "50000", "share.auto.offset.reset": "by_duration:P1DT1H30M0.5S"}
    assert group_config.auto_offset_reset_by_duration_ms("by_duration:P1DT1H30M0.5S") == (86_400 + 5_400) * 1000 + 500
    assert group_config.auto_offset_reset_by_duration_ms("by_duration:pt10m") == 600_000
    assert group_config.auto_offset_reset_by_duration_ms("earliest") is None
    for bad in ("P", "PT", "PT1", "P1H", "1H"):
        assert group_config.parse_duration_ms(bad) is None, bad


def test_effective_values_are_clamped_to_the_brokers_current_bounds():
    limits = GroupLimits()
    assert group_config.effective_int("consumer.session.timeout.ms", {}, limits) == 45_000
    assert group_config.effective_int("consumer.session.timeout.ms", {"consumer.session.timeout.ms": "50000"}, limits) == 50_000
    # set under wider bounds, then the broker's bounds narrowed: Kafka caps the value
    narrow = GroupLimits(group_consumer_max_session_timeout_ms=48_000)
    assert group_config.effective_int("consumer.session.timeout.ms", {"consumer.session.timeout.ms": "50000"}, narrow) == 48_000
    assert group_config.effective("share.isolation.level", {}, limits) == "read_uncommitted"


def test_a_groups_key_covers_no_other_groups():
    for name in ("orders", "orders/eu", "..", "%41", "\u00e9t\u00e9"):
        key = keys.group_config(name)
        assert key.startswith(keys.GROUP_CONFIGS) and "/" not in key[len(keys.GROUP_CONFIGS):]
        assert keys.group_config_id_of(key) == name


def test_broker_settings_kafka_refuses_at_start():
    with pytest.raises(ValueError, match="group.consumer.heartbeat.interval.ms must be greater than or equal to group.consumer.min.heartbeat.interval.ms"):
        GroupLimits(group_consumer_heartbeat_interval_ms=300).check()
    GroupLimits(group_consumer_heartbeat_interval_ms=300, group_consumer_min_heartbeat_interval_ms=300).check()
    with pytest.raises(ValueError, match="must be less than group.share.session.timeout.ms"):
        GroupLimits(group_share_heartbeat_interval_ms=45_000, group_share_max_heartbeat_interval_ms=50_000).check()


# -- through the broker ----------------------------------------------------------------------------


def test_describe_any_group_gives_kafkas_defaults_field_by_field(broker):
    # a group that does not exist: Kafka answers its defaults, no error
    res = describe_raw(broker.bootstrap, group_id())
    assert error_code(res.error_code) == 0
    got = {e.name: e for e in res.configs}
    assert set(got) == set(KAFKA_GROUP_CONFIGS)
    for name, (default, kind) in KAFKA_GROUP_CONFIGS.items():
        e = got[name]
        assert (e.value, e.config_source, e.read_only, e.is_sensitive, e.config_type) == (default, DEFAULT, False, False, TYPES[kind]), name
        assert [(s.name, s.value, s.source) for s in e.synonyms] == [(name, default, DEFAULT)], name
        assert e.documentation, name
    # asking for some keys gives those; an empty group name is Kafka's INVALID_REQUEST
    assert [e.name for e in describe_raw(broker.bootstrap, group_id(), keys=("share.isolation.level",)).configs] == ["share.isolation.level"]
    empty = describe_raw(broker.bootstrap, "")
    assert (error_code(empty.error_code), empty.error_message) == (ErrorCode.invalid_request.value, "Group name must not be empty")


def test_incremental_alter_round_trip_with_admin_client(broker, admin):
    group = group_id()
    # the failure: share.auto.offset.reset on a group (resource type 32)
    incremental(admin, group, ("share.auto.offset.reset", "earliest", SET), ("consumer.session.timeout.ms", "50000", SET))
    got = describe(admin, group)
    assert (got["share.auto.offset.reset"].value, got["share.auto.offset.reset"].source) == ("earliest", GROUP_SOURCE)
    assert (got["consumer.session.timeout.ms"].value, got["consumer.session.timeout.ms"].source) == ("50000", GROUP_SOURCE)
    assert (got["share.isolation.level"].value, got["share.isolation.level"].source) == ("read_uncommitted", DEFAULT)
    assert not got["share.auto.offset.reset"].is_read_only
    # SET again and DELETE; deleting a key that is not set is accepted, as in Kafka
    incremental(admin, group, ("share.auto.offset.reset", "by_duration:PT1H", SET), ("consumer.session.timeout.ms", None, DELETE),
                ("share.isolation.level", None, DELETE))
    got = describe(admin, group)
    assert got["share.auto.offset.reset"].value == "by_duration:PT1H"
    assert (got["consumer.session.timeout.ms"].value, got["consumer.session.timeout.ms"].source) == ("45000", DEFAULT)
    # validate_only checks and changes nothing
    incremental(admin, group, ("share.isolation.level", "read_committed", SET), validate_only=True)
    assert describe(admin, group)["share.isolation.level"].value == "read_uncommitted"
    with pytest.raises(KafkaException):
        incremental(admin, group, ("share.isolation.level", "serializable", SET), validate_only=True)


def test_kafkas_refusals_through_the_admin_client(broker, admin):
    group = group_id()
    incremental(admin, group, ("share.auto.offset.reset", "earliest", SET))
    invalid_config = ErrorCode.invalid_config.value
    assert refused(admin, group, ("consumer.session.timeout.ms", "1000", SET)) == (
        invalid_config, "consumer.session.timeout.ms must be greater than or equal to group.consumer.min.session.timeout.ms")
    assert refused(admin, group, ("consumer.heartbeat.interval.ms", "20000", SET)) == (
        invalid_config, "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms")
    assert refused(admin, group, ("share.isolation.level", "dirty", SET)) == (
        invalid_config, "Invalid value dirty for configuration share.isolation.level: String must be one of: read_committed, read_uncommitted")
    assert refused(admin, group, ("no.such.config", "1", SET)) == (invalid_config, "Unknown group config name: no.such.config")
    assert refused(admin, group, ("share.auto.offset.reset", "latest", APPEND)) == (
        invalid_config, "Can't APPEND to key share.auto.offset.reset because its type is not LIST.")
    # a refused change changes nothing, not even its valid parts
    assert refused(admin, group, ("share.isolation.level", "read_committed", SET), ("share.session.timeout.ms", "5", SET))[0] == invalid_config
    got = describe(admin, group)
    assert (got["share.auto.offset.reset"].value, got["share.isolation.level"].value) == ("earliest", "read_uncommitted")


def test_raw_refusals_and_legacy_alter_configs_replacing_the_set(broker):
    group = group_id()
    b = broker.bootstrap
    assert incremental_raw(b, group, [("share.auto.offset.reset", 0, "earliest"), ("share.isolation.level", 0, "read_committed")]) == (0, None)
    # Kafka's broker-side checks: duplicate keys, a null value, the empty (default) group
    assert incremental_raw(b, group, [("share.isolation.level", 0, "read_committed"), ("share.isolation.level", 1, None)]) == (
        ErrorCode.invalid_request.value, "Error due to duplicate config keys")
    assert incremental_raw(b, group, [("share.isolation.level", 0, None)]) == (
        ErrorCode.invalid_request.value, "Null value not supported for : share.isolation.level")
    assert incremental_raw(b, "", [("share.isolation.level", 0, "read_committed")]) == (
        ErrorCode.invalid_request.value, "Default group resources are not allowed.")
    # legacy AlterConfigs (Kafka accepts it for groups): the given configs become the whole set
    assert alter_raw(b, group, {"share.record.lock.duration.ms": "20000"}) == (0, None)
    got = {e.name: (e.value, e.config_source) for e in describe_raw(b, group).configs}
    assert got["share.record.lock.duration.ms"] == ("20000", GROUP_SOURCE)
    assert got["share.auto.offset.reset"] == ("latest", DEFAULT) and got["share.isolation.level"] == ("read_uncommitted", DEFAULT)
    assert alter_raw(b, group, {"share.record.lock.duration.ms": "70000"}) == (
        ErrorCode.invalid_config.value, "share.record.lock.duration.ms must be less than or equal to group.share.max.record.lock.duration.ms")


def test_configs_persist_across_a_restart_and_bounds_follow_the_brokers_settings(tmp_path):
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--group-consumer-max-session-timeout-ms", "120000"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        # allowed by this broker's max (Kafka's default max, 60 s, would refuse it)
        incremental(admin, "persisted", ("consumer.session.timeout.ms", "90000", SET), ("share.auto.offset.reset", "earliest", SET))
        b.stop()
        b.start()
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        got = describe(admin, "persisted")
        assert [(got[n].value, got[n].source) for n in ("consumer.session.timeout.ms", "share.auto.offset.reset")] == [
            ("90000", GROUP_SOURCE), ("earliest", GROUP_SOURCE)]
        # the broker-level settings are reported with the broker
        [fut] = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
        broker_configs = fut.result(15)
        assert (broker_configs["group.consumer.max.session.timeout.ms"].value,
                broker_configs["group.consumer.max.session.timeout.ms"].source) == ("120000", ConfigSource.STATIC_BROKER_CONFIG.value)
        assert broker_configs["group.share.delivery.count.limit"].value == "5"
        assert broker_configs["group.share.record.lock.duration.ms"].value == "30000"
    finally:
        b.stop()


# -- the consumer group coordinator uses them --------------------------------------------------------


CONSUMER = textwrap.dedent("""
    import sys
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer"})
    c.subscribe([sys.argv[3]])
    while True:
        c.poll(0.2)
""")


def cg_members(bootstrap: str, group: str) -> list:
    with RawClient(bootstrap) as c:
        resp = c.request(CG_DESCRIBE, 0, req(CG_DESCRIBE, 0, group_ids=(group,), include_authorized_operations=False))
    [g] = resp.groups
    return list(g.members) if error_code(g.error_code) == 0 else []


def heartbeats_handled(http_port: int) -> float:
    """ConsumerGroupHeartbeat requests the broker handled (its /metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("kafscale_requests_total{") and 'api="ConsumerGroupHeartbeat"' in line)


def test_a_consumer_groups_session_timeout_and_heartbeat_interval_come_from_its_configs():
    # Bounds lowered so a short override is allowed; the broker's own values stay Kafka's
    # (45 s session timeout, 5 s heartbeat interval).
    http = free_port()
    b = BrokerProcess(extra_args=["--group-consumer-min-session-timeout-ms", "1000", "--group-consumer-min-heartbeat-interval-ms", "100",
                                  "--http", f"127.0.0.1:{http}"]).start()
    proc = None
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topic, group, other = f"gcfg-{uuid.uuid4().hex[:6]}", group_id(), group_id()
        for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
            fut.result(15)
        incremental(admin, group, ("consumer.session.timeout.ms", "3000", SET), ("consumer.heartbeat.interval.ms", "700", SET))
        with RawClient(b.bootstrap) as c:
            def join(g):
                return c.request(HEARTBEAT, 0, req(HEARTBEAT, 0, group_id=g, member_id=uuid.uuid4().hex, member_epoch=0,
                                                   rebalance_timeout=30_000, subscribed_topic_names=(topic,), topic_partitions=()))
            joined = join(group)
            assert error_code(joined.error_code) == 0
            assert joined.heartbeat_interval.total_seconds() * 1000 == 700  # the group's, not the broker's 5 s
            assert join(other).heartbeat_interval.total_seconds() * 1000 == 5000  # a group without configs
            # the raw member stops heartbeating: gone after the group's 3 s, not 45 s
            wait_until(lambda: not cg_members(b.bootstrap, group), 25, "the silent member removed after the group's session timeout")
        # a real KIP-848 consumer, killed without leaving: removed after the group's session timeout too
        proc = subprocess.Popen([sys.executable, "-c", CONSUMER, b.bootstrap, group, topic])
        wait_until(lambda: len(cg_members(b.bootstrap, group)) == 1, 30, "the confluent-kafka consumer in the group")
        # it heartbeats at the group's 700 ms: 8 heartbeats come within 15 s (at the broker's
        # 5 s there would be 3)
        before = heartbeats_handled(http)
        wait_until(lambda: heartbeats_handled(http) - before >= 8, 15, "the consumer heartbeating at the group's interval")
        proc.kill()
        proc.wait(10)
        wait_until(lambda: not cg_members(b.bootstrap, group), 25, "the killed consumer removed after the group's session timeout")
        # without its heartbeat override the broker's 5 s would outlast the group's 3 s session
        assert refused(admin, group, ("consumer.heartbeat.interval.ms", None, DELETE)) == (
            ErrorCode.invalid_config.value, "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms")
        # a change applies to the next heartbeats (this broker: at once)
        incremental(admin, group, ("consumer.heartbeat.interval.ms", None, DELETE), ("consumer.session.timeout.ms", None, DELETE))
        with RawClient(b.bootstrap) as c:
            resp = c.request(HEARTBEAT, 0, req(HEARTBEAT, 0, group_id=group, member_id=uuid.uuid4().hex, member_epoch=0,
                                               rebalance_timeout=30_000, subscribed_topic_names=(topic,), topic_partitions=()))
            assert resp.heartbeat_interval.total_seconds() * 1000 == 5000
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        b.stop()


def test_a_share_groups_heartbeat_interval_comes_from_its_configs(broker, admin):
    """The share groups' settings seam (share/settings.py) reads the group's configs."""
    topic, group = f"gcfg-share-{uuid.uuid4().hex[:6]}", group_id()
    for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        fut.result(15)
    incremental(admin, group, ("share.heartbeat.interval.ms", "7000", SET))
    with RawClient(broker.bootstrap) as c:
        def join(g):
            return c.request(76, 1, req(76, 1, group_id=g, member_id=uuid.uuid4().hex, member_epoch=0, subscribed_topic_names=(topic,)))
        resp = join(group)
        assert error_code(resp.error_code) == 0
        assert resp.heartbeat_interval.total_seconds() * 1000 == 7000
        assert join(group_id()).heartbeat_interval.total_seconds() * 1000 == 5000


async def test_the_coordinators_view_reads_the_store_at_most_every_refresh(tmp_path):
    """GroupConfigs: overrides at most refresh_s old, changes through this broker at once,
    and a bounded cache."""
    from kafscale.groups import group_configs
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import MetadataStore

    store = MetadataStore(SqliteKV(str(tmp_path / "m.sqlite")))
    now = [0.0]
    view = group_configs.GroupConfigs(store, GroupLimits(), refresh_s=1.0, clock=lambda: now[0])
    assert await view.overrides("g") == {}
    await store.alter_group_config("g", lambda old: {"share.isolation.level": "read_committed"})  # another broker
    assert await view.overrides("g") == {}  # not yet re-read
    now[0] = 1.0
    assert await view.overrides("g") == {"share.isolation.level": "read_committed"}
    with pytest.raises(InvalidConfigError):
        await view.alter("g", lambda old: {**old, "consumer.session.timeout.ms": "90000"}, validate_only=False)
    await view.alter("g", lambda old: {**old, "consumer.session.timeout.ms": "50000"}, validate_only=False)
    assert await view.overrides("g") == {"share.isolation.level": "read_committed", "consumer.session.timeout.ms": "50000"}  # at once
    assert await view.effective_overrides("g") == {"share.isolation.level": "read_committed", "consumer.session.timeout.ms": "50000"}
    for i in range(group_configs.CACHE_SWEEP_AT + 5):
        await view.overrides(f"other-{i}")
        now[0] += 0.001
    assert len(view._cache) <= group_configs.CACHE_SWEEP_AT
    await store.close()


def test_the_broker_refuses_group_settings_kafka_refuses(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kafscale", "broker", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path),
                           "--http", "", "--group-share-heartbeat-interval-ms", "300"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "refusing to start: group.share.heartbeat.interval.ms must be greater than or equal to group.share.min.heartbeat.interval.ms" in proc.stderr + proc.stdout


def test_every_version_of_the_config_apis_serves_groups(broker):
    group = group_id()
    for v in (0, 1):
        assert incremental_raw(broker.bootstrap, group, [("share.auto.offset.reset", 0, "earliest")], version=v) == (0, None)
    for v in (0, 1, 2):
        assert alter_raw(broker.bootstrap, group, {"share.isolation.level": "read_committed"}, version=v) == (0, None)
    for v in range(1, 5):  # (v0 is converted from kafka-python's encoding, tests/test_old_versions.py)
        res = describe_raw(broker.bootstrap, group, version=v)
        got = {e.name: e.value for e in res.configs}
        assert error_code(res.error_code) == 0 and got["share.isolation.level"] == "read_committed" and len(got) == len(KAFKA_GROUP_CONFIGS), v
