"""Compacted topics, the configs and the produce rule (issue #16): cleanup.policy compact /
compact,delete and the compaction configs through confluent-kafka's AdminClient and
kafka-python's KafkaAdminClient (CreateTopics, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs with APPEND/SUBTRACT), Kafka's INVALID_CONFIG cases, the change
reaching the live partition log, and INVALID_RECORD for a record without a key sent to a
compacted topic (confluent-kafka's delivery report; a raw Produce with uncompressed and
compressed batches, with Kafka's record_errors)."""

from __future__ import annotations

import time
import kafka.errors
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import ConfigResource as KpConfigResource

from kafscale.errors import ErrorCode
from kafscale.metadata import topic_config
from kafscale.metadata.segments import SegmentInfo
from kafscale.protocol import records
from kafscale.storage.retention import segments_past_retention
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

INVALID_CONFIG = ErrorCode.invalid_config.value
INVALID_RECORD = ErrorCode.invalid_record.value
CODECS = {
    "none": records.COMPRESSION_NONE,
    "gzip": records.COMPRESSION_GZIP,
    "snappy": records.COMPRESSION_SNAPPY,
    "lz4": records.COMPRESSION_LZ4,
    "zstd": records.COMPRESSION_ZSTD,
}
NO_KEY = "Compacted topic cannot accept message without key in topic partition"
pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture(scope="module")
def kp_admin(broker):
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield a
    a.close()


def create(admin: AdminClient, topic: str, configs: dict[str, str] | None = None, partitions: int = 1) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1, config=configs or {})])[topic].result(15)


def describe(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(15)


def kafka_error(fut) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        fut.result(15)
    return info.value.args[0]


def alter(admin: AdminClient, topic: str, configs: dict[str, str]):
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config=configs)
    return admin.alter_configs([res])[res]


def incremental(admin: AdminClient, topic: str, *entries: tuple[str, str | None, AlterConfigOpType]):
    res = ConfigResource(ConfigResource.Type.TOPIC, topic,
                         incremental_configs=[ConfigEntry(n, v, incremental_operation=op) for n, v, op in entries])
    return admin.incremental_alter_configs([res])[res]


def policy(admin: AdminClient, topic: str) -> str:
    return describe(admin, topic)["cleanup.policy"].value


def produce_raw(bootstrap: str, topic: str, batch: bytes, version: int = 9):
    with RawClient(bootstrap) as c:
        return c.produce(topic, 0, batch, version=version)


def end_offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    """(log start offset, high watermark) of partition 0 by ListOffsets."""
    with RawClient(bootstrap) as c:
        start = c.list_offsets(topic, 0, -2)
        end = c.list_offsets(topic, 0, -1)
    assert error_code(start.error_code) == 0 and error_code(end.error_code) == 0
    return start.offset, end.offset


def deliveries(bootstrap: str, topic: str, msgs: list[tuple[bytes | None, bytes | None]], **conf) -> list[int]:
    """Error code of each message's delivery report (0: delivered), through confluent-kafka."""
    got: list[int] = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "retries": 0, **conf})
    for k, v in msgs:
        p.produce(topic, key=k, value=v, partition=0, on_delivery=lambda err, _m: got.append(err.code() if err else 0))
    assert p.flush(20) == 0
    return got


# -- the pure parts ----------------------------------------------------------------------


@pytest.mark.parametrize("value, policies", [
    ("delete", {"delete"}), ("compact", {"compact"}), ("compact,delete", {"compact", "delete"}),
    ("delete, compact", {"compact", "delete"}), ("", set()), ("compact,compact", {"compact"}),
])
def test_cleanup_policy_values_kafka_accepts(value, policies):
    configs = topic_config.normalize({"cleanup.policy": value})
    s = topic_config.LogSettings.from_configs(configs)
    assert (s.cleanup_compact, s.cleanup_delete) == ("compact" in policies, "delete" in policies)


@pytest.mark.parametrize("configs, message", [
    ({"cleanup.policy": "archive"}, "Invalid value archive for configuration cleanup.policy: String must be one of: compact, delete"),
    ({"cleanup.policy": "compact,archive"}, "String must be one of: compact, delete"),
    ({"cleanup.policy": "Compact"}, "String must be one of: compact, delete"),  # case-sensitive, as Kafka's ValidList
    ({"cleanup.policy": "compact,"}, "String must be one of: compact, delete"),  # an empty item
    ({"min.cleanable.dirty.ratio": "1.5"}, "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no more than 1"),
    ({"min.cleanable.dirty.ratio": "-0.1"}, "Value must be at least 0"),
    ({"min.cleanable.dirty.ratio": "half"}, "not a number"),
    ({"max.compaction.lag.ms": "0"}, "Invalid value 0 for configuration max.compaction.lag.ms: Value must be at least 1"),
    ({"min.compaction.lag.ms": "-1"}, "Value must be at least 0"),
    ({"delete.retention.ms": "-1"}, "Value must be at least 0"),
    ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "9"}, "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (9)"),
])
def test_invalid_compaction_configs_unit(configs, message):
    with pytest.raises(topic_config.InvalidConfigError) as info:
        topic_config.normalize(configs)
    assert message in str(info.value)


def test_compaction_lag_cross_check_sees_broker_defaults():
    assert topic_config.normalize({"min.compaction.lag.ms": "10"}) == {"min.compaction.lag.ms": "10"}
    with pytest.raises(topic_config.InvalidConfigError, match=r"min.compaction.lag.ms \(10\) > max.compaction.lag.ms \(5\)"):
        topic_config.normalize({"min.compaction.lag.ms": "10"}, {"log.cleaner.max.compaction.lag.ms": "5"})


def test_retention_applies_only_under_delete():
    old = SegmentInfo(base_offset=0, last_offset=9, size=100, record_count=10, max_timestamp=1, created_ms=1)
    for value, doomed in (("delete", [old]), ("compact,delete", [old]), ("compact", []), ("", [])):
        s = topic_config.LogSettings.from_configs({"cleanup.policy": value, "retention.ms": "1", "retention.bytes": "1"})
        assert segments_past_retention([old], s, now_ms=10_000) == doomed, value


def test_check_keys_counts_its_own_decompressions():
    before, before_key = records.decompressions, records.key_check_decompressions
    for name, codec in CODECS.items():
        batch = records.build_batch([(b"k", b"v"), (None, b"x"), (b"", None), (None, None)], codec=codec)
        with pytest.raises(records.InvalidRecordError) as info:
            records.check_keys(batch, records.validate_record_set(memoryview(bytearray(batch))), "t-0")
        assert info.value.error_code == ErrorCode.invalid_record, name
        assert [i for i, _m in info.value.record_errors] == [1, 3], name  # an empty key is a key
        keyed = records.build_batch([(b"k", b"v"), (b"", None)], codec=codec)
        records.check_keys(keyed, records.validate_record_set(memoryview(bytearray(keyed))), "t-0")
    assert records.decompressions == before  # the metric whose zero under load is asserted
    assert records.key_check_decompressions == before_key + 2 * (len(CODECS) - 1)


def test_check_keys_refuses_a_malformed_record_as_corrupt():
    batch = bytearray(records.build_batch([(b"k", b"v")]))
    # the record's length varint claims more bytes than the batch has; CRC made valid again
    batch[records.HEADER_SIZE] = 0x7E
    batch[records.CRC : records.CRC + 4] = records.crc32c(bytes(batch[records.CRC_START :])).to_bytes(4, "big")
    headers = records.validate_record_set(memoryview(batch))
    with pytest.raises(records.InvalidRecordError) as info:
        records.check_keys(batch, headers, "t-0")
    assert info.value.error_code == ErrorCode.corrupt_message


# -- through the admin clients ----------------------------------------------------------


def test_changelog_topic_created_compacted_with_confluent_kafka(broker, admin, topic_name):
    # what Quix Streams asks for its state changelog topics (and Kafka Streams, Connect)
    create(admin, topic_name, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "delete.retention.ms": "3600000",
                               "min.cleanable.dirty.ratio": "0.1", "max.compaction.lag.ms": "86400000"}, partitions=3)
    cfg = describe(admin, topic_name)
    for name, value in (("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.1"), ("delete.retention.ms", "3600000"),
                        ("max.compaction.lag.ms", "86400000"), ("min.compaction.lag.ms", "0")):
        assert (cfg[name].value, cfg[name].source) == (value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value), name
    # both policies, in either order, any whitespace around the comma
    create(admin, topic_name + "-both", {"cleanup.policy": "delete, compact"})
    assert policy(admin, topic_name + "-both") == "delete,compact"


def test_changelog_topic_created_compacted_with_kafka_python(broker, kp_admin, admin, topic_name):
    kp_admin.create_topics({topic_name: {"num_partitions": 2, "replication_factor": 1, "configs": {"cleanup.policy": "compact"}}})
    got = kp_admin.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, topic_name, ["cleanup.policy", "min.cleanable.dirty.ratio"])],
                                    config_filter="all")
    cfg = got["topic"][topic_name]
    assert cfg["cleanup.policy"]["value"] == "compact"
    assert cfg["min.cleanable.dirty.ratio"]["value"] == "0.5"
    # AlterConfigs (kafka-python, not incremental) to compact,delete and back
    for value in ("compact,delete", "delete", "compact"):
        res = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, topic_name, {"cleanup.policy": value})], incremental=False)
        assert res["topic"][topic_name] == "OK", value
        assert policy(admin, topic_name) == value
    # IncrementalAlterConfigs through kafka-python: APPEND delete
    res = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, topic_name, {"cleanup.policy": ("APPEND", "delete")})], incremental=True)
    assert res["topic"][topic_name] == "OK"
    assert policy(admin, topic_name) == "compact,delete"
    # an invalid value is Kafka's InvalidConfigurationError
    bad = kp_admin.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, topic_name, {"min.cleanable.dirty.ratio": "2"})], incremental=False)
    assert "InvalidConfigurationError" in bad["topic"][topic_name] and "no more than 1" in bad["topic"][topic_name]
    with pytest.raises(kafka.errors.InvalidConfigurationError):
        kp_admin.create_topics({topic_name + "-bad": {"num_partitions": 1, "replication_factor": 1, "configs": {"cleanup.policy": "compacted"}}})


def test_alter_configs_between_delete_and_compact(broker, admin, topic_name):
    create(admin, topic_name)
    assert policy(admin, topic_name) == "delete"
    for value in ("compact", "compact,delete", "delete", "delete,compact"):
        assert alter(admin, topic_name, {"cleanup.policy": value}).result(15) is None
        assert policy(admin, topic_name) == value
    # AlterConfigs replaces the whole set: without cleanup.policy it is back to the default
    assert alter(admin, topic_name, {"retention.ms": "3600000"}).result(15) is None
    cfg = describe(admin, topic_name)
    assert (cfg["cleanup.policy"].value, cfg["cleanup.policy"].source) == ("delete", ConfigSource.DEFAULT_CONFIG.value)


def test_incremental_alter_configs_set_append_subtract(broker, admin, topic_name):
    create(admin, topic_name)
    A, S, D, SET = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT, AlterConfigOpType.DELETE, AlterConfigOpType.SET
    steps = [
        (("cleanup.policy", "compact", A), "delete,compact"),  # APPEND to the default
        (("cleanup.policy", "delete", S), "compact"),
        (("cleanup.policy", "compact", A), "compact"),  # already there: unchanged
        (("cleanup.policy", "delete", A), "compact,delete"),
        (("cleanup.policy", "compact,delete", S), ""),  # the empty list: Kafka's "neither" (keep everything)
        (("cleanup.policy", "compact", A), "compact"),  # APPEND to an empty override starts from it
        (("cleanup.policy", None, D), "delete"),
        (("cleanup.policy", "compact", SET), "compact"),
    ]
    for entry, expected in steps:
        assert incremental(admin, topic_name, entry).result(15) is None, entry
        assert policy(admin, topic_name) == expected, entry
    err = kafka_error(incremental(admin, topic_name, ("cleanup.policy", "archive", A)))
    assert err.code() == INVALID_CONFIG and "String must be one of: compact, delete" in err.str()
    err = kafka_error(incremental(admin, topic_name, ("min.compaction.lag.ms", "5", A)))
    assert err.code() == INVALID_CONFIG and "Can't APPEND to key min.compaction.lag.ms because its type is not LIST." in err.str()
    assert policy(admin, topic_name) == "compact"


def test_invalid_configs_get_invalid_config(broker, admin, topic_name):
    bad = [
        {"cleanup.policy": "archive"}, {"cleanup.policy": "compact,archive"}, {"cleanup.policy": "COMPACT"}, {"cleanup.policy": "compact,"},
        {"min.cleanable.dirty.ratio": "1.01"}, {"min.cleanable.dirty.ratio": "-1"}, {"max.compaction.lag.ms": "0"},
        {"min.compaction.lag.ms": "-5"}, {"delete.retention.ms": "-2"}, {"min.compaction.lag.ms": "100", "max.compaction.lag.ms": "50"},
    ]
    for configs in bad:
        err = kafka_error(admin.create_topics([NewTopic(topic_name, 1, 1, config=configs)])[topic_name])
        assert err.code() == INVALID_CONFIG, configs
    assert topic_name not in admin.list_topics(timeout=10).topics
    create(admin, topic_name, {"cleanup.policy": "compact", "min.compaction.lag.ms": "100"})
    for configs in bad:
        assert kafka_error(alter(admin, topic_name, {"cleanup.policy": "compact", **configs})).code() == INVALID_CONFIG, configs
    # the cross-check sees the existing overrides: max below the stored min
    err = kafka_error(incremental(admin, topic_name, ("max.compaction.lag.ms", "50", AlterConfigOpType.SET)))
    assert err.code() == INVALID_CONFIG and "conflict topic config setting min.compaction.lag.ms (100) > max.compaction.lag.ms (50)" in err.str()
    cfg = describe(admin, topic_name)
    assert (cfg["cleanup.policy"].value, cfg["min.compaction.lag.ms"].value, cfg["max.compaction.lag.ms"].value) == ("compact", "100", str(topic_config.LONG_MAX))


def test_describe_configs_documents_compaction(broker, topic_name, admin):
    create(admin, topic_name, {"cleanup.policy": "compact"})
    with RawClient(broker.bootstrap) as c:
        r = req(32, 4, "DescribeConfigsResource", resource_type=2, resource_name=topic_name, configuration_keys=None)
        resp = c.request(32, 4, req(32, 4, resources=(r,), include_synonyms=False, include_documentation=True))
    docs = {e.name: e.documentation for e in resp.results[0].configs}
    for name in ("cleanup.policy", "delete.retention.ms", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms"):
        assert "no log compaction" not in docs[name] and "no effect here" not in docs[name], name
    assert "latest record" in docs["cleanup.policy"] and "INVALID_RECORD" in docs["cleanup.policy"]
    assert "tombstone" in docs["delete.retention.ms"]


# -- the produce rule, and config changes reaching the live log ------------------------------


def test_null_key_refused_by_compacted_topic_confluent_kafka(broker, admin, topic_name):
    create(admin, topic_name, {"cleanup.policy": "compact"})
    create(admin, topic_name + "-del")
    assert deliveries(broker.bootstrap, topic_name, [(b"k1", b"v1"), (b"k2", None)]) == [0, 0]  # keyed records and a tombstone
    assert deliveries(broker.bootstrap, topic_name, [(None, b"no key")]) == [INVALID_RECORD]
    # one batch with a keyless record: the whole batch is refused, nothing appended. The
    # producer sends when it holds batch.num.messages records; the long linger keeps a test
    # process paused between produce() calls (a busy machine) from splitting the batch.
    one_batch = {"linger.ms": 10_000, "batch.num.messages": 3}
    assert deliveries(broker.bootstrap, topic_name, [(b"k3", b"v3"), (None, b"x"), (b"k4", b"v4")], **one_batch) == [INVALID_RECORD] * 3
    assert end_offsets(broker.bootstrap, topic_name) == (0, 2)
    # compressed batches are checked too
    assert deliveries(broker.bootstrap, topic_name, [(b"k5", b"v5"), (None, b"x")], **{**one_batch, "batch.num.messages": 2, "compression.type": "zstd"}) == [INVALID_RECORD] * 2
    assert deliveries(broker.bootstrap, topic_name, [(b"k6", b"v6")] * 3, **{"compression.type": "lz4"}) == [0, 0, 0]
    assert end_offsets(broker.bootstrap, topic_name) == (0, 5)
    # a delete-policy topic still takes records without a key
    assert deliveries(broker.bootstrap, topic_name + "-del", [(None, b"a"), (None, b"b")]) == [0, 0]


@pytest.mark.parametrize("codec", list(CODECS))
def test_null_key_refused_raw_produce(broker, admin, topic_name, codec):
    create(admin, topic_name, {"cleanup.policy": "compact,delete"})
    batch = records.build_batch([(b"a", b"1"), (None, b"2"), (b"c", b"3"), (None, None)], codec=CODECS[codec], timestamp=0)
    with RawClient(broker.bootstrap) as c:
        r = c.produce(topic_name, 0, batch, timeout_ms=30000)
        assert (error_code(r.error_code), r.base_offset) == (INVALID_RECORD, -1), r
        assert [(e.batch_index, e.batch_index_error_message) for e in r.record_errors] == [
            (1, f"{NO_KEY} {topic_name}-0"), (3, f"{NO_KEY} {topic_name}-0")]
        assert r.error_message.startswith("One or more records have been rejected due to 2 record errors in total")
        # the connection is kept: a keyed batch on it is appended (timestamped now: a batch
        # from 1970 would be retention's to delete under compact,delete before the fetch)
        now_ms = int(time.time() * 1000)
        ok = c.produce(topic_name, 0, records.build_batch([(b"a", b"1"), (b"b", None)], codec=CODECS[codec], timestamp=now_ms), timeout_ms=30000)
        assert (error_code(ok.error_code), ok.base_offset, ok.record_errors) == (0, 0, ()), ok
        fetched = c.fetch(topic_name, 0, 0, max_wait_ms=1000)
    assert error_code(fetched.error_code) == 0, fetched
    got = [(rec.offset, rec.key, rec.value) for pos, h in records.iter_batches(fetched.records or b"") for rec in records.decode_records(fetched.records, pos, h)]
    assert got == [(0, b"a", b"1"), (1, b"b", None)]


def test_null_key_refused_old_produce_versions(broker, admin, topic_name):
    create(admin, topic_name, {"cleanup.policy": "compact"})
    batch = records.build_batch([(None, b"v")])
    for version in (3, 7):  # before record_errors / error_message (v8): the error code alone
        assert error_code(produce_raw(broker.bootstrap, topic_name, batch, version).error_code) == INVALID_RECORD, version
    assert end_offsets(broker.bootstrap, topic_name) == (0, 0)


def test_policy_change_reaches_the_live_log(broker, admin, topic_name):
    """The partition log is loaded (records were appended) when the policy changes; its
    settings follow each change: the null-key rule comes and goes with compact, retention
    with delete."""
    create(admin, topic_name, {"retention.ms": "1"})
    keyless = records.build_batch([(None, b"x")])
    assert error_code(produce_raw(broker.bootstrap, topic_name, keyless).error_code) == 0
    wait_until(lambda: end_offsets(broker.bootstrap, topic_name)[0] == 1, 15, "retention.ms=1 to delete the first segment")
    assert incremental(admin, topic_name, ("cleanup.policy", "compact", AlterConfigOpType.SET)).result(15) is None
    assert error_code(produce_raw(broker.bootstrap, topic_name, keyless).error_code) == INVALID_RECORD
    assert error_code(produce_raw(broker.bootstrap, topic_name, records.build_batch([(b"k", b"v")])).error_code) == 0  # offset 1
    # compact only: retention does not apply. A delete-policy topic written after this one
    # losing its segment to retention means a retention round has passed over this log too.
    control = topic_name + "-ctl"
    create(admin, control, {"retention.ms": "1"})
    assert error_code(produce_raw(broker.bootstrap, control, keyless).error_code) == 0
    wait_until(lambda: end_offsets(broker.bootstrap, control)[0] == 1, 15, "retention of the delete-policy control topic")
    assert end_offsets(broker.bootstrap, topic_name) == (1, 2)
    # compact,delete: retention applies again, and keys are still required
    assert incremental(admin, topic_name, ("cleanup.policy", "delete", AlterConfigOpType.APPEND)).result(15) is None
    wait_until(lambda: end_offsets(broker.bootstrap, topic_name)[0] == 2, 15, "retention under compact,delete")
    assert error_code(produce_raw(broker.bootstrap, topic_name, keyless).error_code) == INVALID_RECORD
    # back to delete: records without a key are taken again
    assert incremental(admin, topic_name, ("cleanup.policy", "compact", AlterConfigOpType.SUBTRACT)).result(15) is None
    assert error_code(produce_raw(broker.bootstrap, topic_name, keyless).error_code) == 0



@pytest.mark.parametrize("api_version", [(0, 10, 0), (0, 9)])
def test_null_key_refused_in_an_old_message_format(broker, admin, topic_name, api_version):
    """kafka-python speaking Produce v2 (message format v1) / v1 (format v0), up-converted by
    the broker to one batch: the same rule, Kafka's InvalidRecordError."""
    from kafka import KafkaProducer

    create(admin, topic_name, {"cleanup.policy": "compact"})
    # the two records one batch under load too: a linger no busy machine outlasts, then flush()
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=api_version, retries=0, linger_ms=10_000)

    def sent(*futures):
        p.flush(15)
        return futures

    try:
        for f in sent(p.send(topic_name, key=b"k", value=b"v", partition=0), p.send(topic_name, key=None, value=b"v", partition=0)):
            with pytest.raises(kafka.errors.InvalidRecordError):
                f.get(15)
        assert end_offsets(broker.bootstrap, topic_name) == (0, 0)
        [k] = sent(p.send(topic_name, key=b"k", value=b"v", partition=0))
        assert k.get(15).offset == 0
        [j] = sent(p.send(topic_name, key=b"j", value=None, partition=0))
        assert j.get(15).offset == 1
    finally:
        p.close()


def test_key_check_decompressions_have_their_own_metric(broker_factory, topic_name):
    """/metrics: a compressed batch sent to a compacted topic moves
    kafscale_key_check_decompressions_total, never kafscale_decompressions_total (whose 0
    under produce/fetch load is the hot path's promise); uncompressed batches move neither."""
    import urllib.request

    from tests.support.broker import free_port

    http = free_port()
    b = broker_factory(extra_args=["--http", f"127.0.0.1:{http}", "--merge-interval-ms", "0"])

    def metric(name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read().decode()
        return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))

    create(AdminClient({"bootstrap.servers": b.bootstrap}), topic_name, {"cleanup.policy": "compact"})
    before = (metric("kafscale_key_check_decompressions_total"), metric("kafscale_decompressions_total"))
    for codec, code in ((records.COMPRESSION_NONE, 0), (records.COMPRESSION_LZ4, 0), (records.COMPRESSION_ZSTD, INVALID_RECORD)):
        recs = [(b"k", b"v"), (b"j", b"w")] if code == 0 else [(b"k", b"v"), (None, b"w")]
        assert error_code(produce_raw(b.bootstrap, topic_name, records.build_batch(recs, codec=codec)).error_code) == code
    assert (metric("kafscale_key_check_decompressions_total"), metric("kafscale_decompressions_total")) == (before[0] + 2, before[1])
