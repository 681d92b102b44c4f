"""The admin APIs tools call (#18), on stateless brokers: DescribeLogDirs (sizes = the bytes
of the partition's segments in the store, its own objects or write-ahead pieces), AlterReplicaLogDirs, ElectLeaders,
List/AlterPartitionReassignments, DescribeTopicPartitions (API 75) and CreatePartitions with
explicit assignments. Through kafka-python's and confluent-kafka's admin clients where they
have the API, raw requests (every version kio has) where they do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import ElectionType, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient

from kafscale.errors import ErrorCode
from kafscale.protocol.codec import kio_versions
from tests.support.raw import RawClient, error_code, req
from tests.support.stored import stored_bytes, stored_segments
from tests.support.wait import wait_until


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


@pytest.fixture
def kp(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    yield client
    client.close()


def create(admin: AdminClient, topic: str, partitions: int = 1) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def produce(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for part, n in per_partition.items():
        for i in range(n):
            p.produce(topic, b"v" * (50 + i), partition=part)
        p.flush(20)  # one flush per partition: segments on both partitions
    assert p.flush(20) == 0


def versions(api_key: int, bootstrap: str) -> range:
    with RawClient(bootstrap) as c:
        [api] = [a for a in c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1")).api_keys if a.api_key == api_key]
    return range(max(api.min_version, kio_versions(api_key)[0]), api.max_version + 1)  # old versions: test_old_versions.py


def test_describe_log_dirs_sizes_match_the_object_store(broker, admin, kp, topic_name):
    create(admin, topic_name, 2)
    produce(broker.bootstrap, topic_name, {0: 7, 1: 3})
    produce(broker.bootstrap, topic_name, {0: 2})  # a second segment on partition 0
    [entry] = kp.describe_log_dirs()
    assert entry["broker"] == 0
    [d] = entry["log_dirs"]
    assert d["error_code"] == 0 and d["log_dir"] == f"file://{broker.data_dir}/objects/default"
    assert (d["total_bytes"], d["usable_bytes"]) == (-1, -1)
    [t] = [t for t in d["topics"] if t["name"] == topic_name]
    sizes = {p["partition_index"]: p["partition_size"] for p in t["partitions"]}
    # the bytes of each partition's segments, its own objects or its pieces in write-ahead objects
    assert sizes == {0: stored_bytes(broker.data_dir, topic_name, 0), 1: stored_bytes(broker.data_dir, topic_name, 1)}
    assert sizes[0] > sizes[1] > 0 and len(stored_segments(broker.data_dir, topic_name, 0)) >= 2
    assert all((p["offset_lag"], p["is_future_key"]) == (0, False) for p in t["partitions"])
    # every version kio has, asking for one partition and an unknown topic (omitted, as Kafka)
    for v in versions(35, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            asked = (req(35, v, "DescribableLogDirTopic", topic=topic_name, partitions=(1,)), req(35, v, "DescribableLogDirTopic", topic=topic_name + "-no", partitions=(0,)))
            [res] = c.request(35, v, req(35, v, topics=asked)).results
        assert error_code(res.error_code) == 0
        assert [(t.name, [(p.partition_index, p.partition_size) for p in t.partitions]) for t in res.topics] == [(topic_name, [(1, sizes[1])])], v


def _log_dir_sizes(bootstrap: str, topic: str) -> dict[int, int]:
    with RawClient(bootstrap) as c:
        [res] = c.request(35, 4, req(35, 4, topics=None)).results
    return {p.partition_index: p.partition_size for t in res.topics if t.name == topic for p in t.partitions}


def test_describe_log_dirs_sizes_in_write_ahead_pieces_and_after_their_rewrite(broker_factory, topic_name):
    """Either default: a partition's size is its log's bytes wherever they live, while they
    are pieces of write-ahead objects and once the merger rewrote them into its own segments."""
    b = broker_factory(extra_args=["--write-ahead-objects", "true"])
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    create(admin, topic_name, 2)
    produce(b.bootstrap, topic_name, {0: 7, 1: 3})
    produce(b.bootstrap, topic_name, {0: 2})
    in_pieces = _log_dir_sizes(b.bootstrap, topic_name)
    assert in_pieces == {p: stored_bytes(b.data_dir, topic_name, p) for p in (0, 1)} and in_pieces[0] > in_pieces[1] > 0
    assert not list((Path(b.data_dir) / "objects" / "default" / topic_name).rglob("*.kfs"))  # all in pieces still
    b.stop()
    # the same store, rewritten at once
    b = broker_factory(data_dir=b.data_dir, extra_args=["--write-ahead-objects", "true", "--segment-max-age-ms", "0", "--merge-interval-ms", "100"])
    pdir = Path(b.data_dir) / "objects" / "default" / topic_name
    with RawClient(b.bootstrap) as c:  # loads the partitions: the merger rewrites the logs a broker holds
        assert [c.list_offsets(topic_name, p, -1).offset for p in (0, 1)] == [9, 3]
    wait_until(lambda: all(list((pdir / str(p)).glob("*.kfs")) for p in (0, 1)), 30, "the pieces rewritten into segments", interval=0.1)
    rewritten = _log_dir_sizes(b.bootstrap, topic_name)
    assert rewritten == {p: stored_bytes(b.data_dir, topic_name, p) for p in (0, 1)} and rewritten[0] > rewritten[1] > 0


def test_alter_replica_log_dirs_unknown_dir_and_own_dir(broker, admin, topic_name):
    create(admin, topic_name)
    own = f"file://{broker.data_dir}/objects/default"
    for v in versions(34, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            dirs = tuple(
                req(34, v, "AlterReplicaLogDir", path=path, topics=(req(34, v, "AlterReplicaLogDirTopic", name=name, partitions=(p,)),))
                for path, name, p in ((broker.data_dir + "/elsewhere", topic_name, 0), (own, topic_name, 0), (own, topic_name, 5))
            )
            resp = c.request(34, v, req(34, v, dirs=dirs))
        got = [(r.topic_name, [(p.partition_index, error_code(p.error_code)) for p in r.partitions]) for r in resp.results]
        assert got == [(topic_name, [(0, ErrorCode.log_dir_not_found.value)]), (topic_name, [(0, 0)]), (topic_name, [(5, ErrorCode.unknown_topic_or_partition.value)])], v


def test_elect_leaders_election_not_needed(broker, admin, kp, topic_name):
    create(admin, topic_name, 2)
    # confluent-kafka: ELECTION_NOT_NEEDED per partition
    fut = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
    result = fut.result(15)
    assert {(tp.topic, tp.partition): (e.code() if e else None) for tp, e in result.items()} == {
        (topic_name, 0): ErrorCode.election_not_needed.value, (topic_name, 1): ErrorCode.election_not_needed.value}
    # kafka-python, unclean election and an unknown partition
    resp = kp.elect_leaders(1, {topic_name: [0, 9]}, raise_errors=False)
    assert error_code(resp.error_code) == 0
    [r] = resp.replica_election_results
    assert [(p.partition_id, p.error_code) for p in r.partition_result] == [(0, ErrorCode.election_not_needed.value), (9, ErrorCode.unknown_topic_or_partition.value)]
    # every version; null = all partitions, and those needing no election are left out (Kafka)
    for v in versions(43, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            resp = c.request(43, v, req(43, v, election_type=0, topic_partitions=None, timeout=5000))
        assert error_code(getattr(resp, "error_code", 0)) == 0
        mine = [r for r in resp.replica_election_results if r.topic == topic_name]
        assert [r.partition_result for r in mine] == [()], v


def test_partition_reassignments_list_empty_alter_refused(broker, admin, kp, topic_name):
    create(admin, topic_name, 2)
    assert kp.list_partition_reassignments() == {}
    for v in versions(46, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            resp = c.request(46, v, req(46, v, timeout=5000, topics=None))
        assert (error_code(resp.error_code), resp.topics) == (0, ()), v
    for v in versions(45, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            parts = (req(45, v, "ReassignablePartition", partition_index=0, replicas=(0,)),      # the current replica set: done
                     req(45, v, "ReassignablePartition", partition_index=1, replicas=(1, 2)),    # a move: refused
                     req(45, v, "ReassignablePartition", partition_index=0, replicas=None),      # cancel: none in progress
                     req(45, v, "ReassignablePartition", partition_index=7, replicas=(0,)))
            resp = c.request(45, v, req(45, v, timeout=5000, topics=(req(45, v, "ReassignableTopic", name=topic_name, partitions=parts),), allow_replication_factor_change=True))
        assert error_code(resp.error_code) == 0
        [t] = resp.responses
        assert [(p.partition_index, error_code(p.error_code)) for p in t.partitions] == [
            (0, 0), (1, ErrorCode.invalid_replica_assignment.value), (0, ErrorCode.no_reassignment_in_progress.value), (7, ErrorCode.unknown_topic_or_partition.value)], v
        assert "places partitions on brokers itself" in t.partitions[1].error_message


def test_describe_topic_partitions(broker, admin, kp, topic_name):
    create(admin, topic_name, 3)
    missing = topic_name + "-missing"
    out = kp.describe_topic_partitions([topic_name, missing])
    by = {t["name"]: t for t in out["topics"]}
    assert by[missing]["error_code"] == ErrorCode.unknown_topic_or_partition.value and by[missing]["partitions"] == []
    t = by[topic_name]
    assert t["error_code"] == 0 and not t["is_internal"] and t["topic_id"] is not None
    assert [(p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"], p["offline_replicas"]) for p in t["partitions"]] == [(i, 0, [0], [0], []) for i in range(3)]
    # paging: a limit of 2 partitions leaves a cursor at partition 2, which the next request follows
    with RawClient(broker.bootstrap) as c:
        first = c.request(75, 0, req(75, 0, topics=(req(75, 0, "TopicRequest", name=topic_name),), response_partition_limit=2, cursor=None))
        assert [p.partition_index for p in first.topics[0].partitions] == [0, 1]
        assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == (topic_name, 2)
        cur = req(75, 0, "Cursor", topic_name=topic_name, partition_index=2)
        second = c.request(75, 0, req(75, 0, topics=(req(75, 0, "TopicRequest", name=topic_name),), response_partition_limit=2, cursor=cur))
        assert [p.partition_index for p in second.topics[0].partitions] == [2] and second.next_cursor is None
    # confluent-kafka's describe_topics (whichever API librdkafka picks) agrees
    d = admin.describe_topics(TopicCollection([topic_name]))[topic_name].result(15)
    assert [(p.id, p.leader.id, [r.id for r in p.replicas]) for p in d.partitions] == [(i, 0, [0]) for i in range(3)]


def test_create_partitions_with_assignments(broker, admin, topic_name):
    create(admin, topic_name, 1)

    def code(count, assignments):
        fut = admin.create_partitions([NewPartitions(topic_name, count, replica_assignment=assignments)])[topic_name]
        with pytest.raises(KafkaException) as info:
            fut.result(15)
        return info.value.args[0].code()

    bad = ErrorCode.invalid_replica_assignment.value
    assert code(3, [[0], [7]]) == bad        # broker 7 is not registered
    for v in versions(37, broker.bootstrap):  # one assignment for two new partitions (librdkafka refuses to send it)
        with RawClient(broker.bootstrap) as c:
            for assignments in (((0,),), ((), ())):  # and an empty replica list
                a = tuple(req(37, v, "CreatePartitionsAssignment", broker_ids=ids) for ids in assignments)
                t = req(37, v, "CreatePartitionsTopic", name=topic_name, count=3, assignments=a)
                [r] = c.request(37, v, req(37, v, topics=(t,), timeout=5000, validate_only=False)).results
                assert error_code(r.error_code) == bad, (v, assignments)
    assert code(2, [[0, 0]]) == bad          # a broker twice
    with RawClient(broker.bootstrap) as c:
        assert c.metadata([topic_name], allow_auto=False).topics[0].partitions.__len__() == 1
    assert admin.create_partitions([NewPartitions(topic_name, 3, replica_assignment=[[0], [0]])])[topic_name].result(15) is None
    with RawClient(broker.bootstrap) as c:
        assert sorted(p.partition_index for p in c.metadata([topic_name], allow_auto=False).topics[0].partitions) == [0, 1, 2]


def test_the_new_apis_are_advertised_over_kios_range(broker):
    """From Kafka 3.9's lowest version (0; below kio's: protocol/legacy.py) to kio's highest."""
    with RawClient(broker.bootstrap) as c:
        advertised = {a.api_key: (a.min_version, a.max_version) for a in c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1")).api_keys}
    for key in (34, 35, 43, 45, 46, 75):
        assert advertised[key] == (0, kio_versions(key)[1]), key


def test_kafka_python_alter_calls(broker, admin, kp, topic_name):
    """kafka-python's own calls for the two "alter" APIs get the answers above."""
    from kafka import TopicPartition as KTP, TopicPartitionReplica
    from kafka.errors import InvalidReplicationAssignmentError, LogDirNotFoundError, NoError

    create(admin, topic_name, 2)
    own = f"file://{broker.data_dir}/objects/default"
    got = kp.alter_replica_log_dirs({TopicPartitionReplica(topic_name, 0, 0): "/elsewhere", TopicPartitionReplica(topic_name, 1, 0): own})
    assert got == {TopicPartitionReplica(topic_name, 0, 0): LogDirNotFoundError, TopicPartitionReplica(topic_name, 1, 0): NoError}
    got = kp.alter_partition_reassignments({KTP(topic_name, 0): [0], KTP(topic_name, 1): [1]})
    assert got[KTP(topic_name, 0)] is None and got[KTP(topic_name, 1)] is InvalidReplicationAssignmentError
    [t] = kp.describe_topics([topic_name])
    assert [(p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"]) for p in t["partitions"]] == [(0, 0, [0], [0]), (1, 0, [0], [0])]


def test_features_in_api_versions_and_update_features_refused(broker, kp):
    # As a new Kafka 4.0 cluster: metadata.version 3.3-IV3..4.0-IV3, transaction.version 2
    # (transactions v2; tests/test_transactions_v2.py), group.version 1 (KIP-848 consumer groups),
    # share.version 1 (KIP-932 share groups, on as in Kafka 4.2).
    assert kp.describe_features() == {
        "metadata.version": {"supported": (7, 25), "finalized": (25, 25), "finalized_epoch": 0},
        "transaction.version": {"supported": (0, 2), "finalized": (2, 2), "finalized_epoch": 0},
        "group.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 0},
        "share.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 0},
    }
    from kafka.errors import InvalidUpdateVersionError

    with pytest.raises(InvalidUpdateVersionError):
        kp.update_features({"metadata.version": 26})
    with pytest.raises(InvalidUpdateVersionError):
        kp.update_features({"transaction.version": 1})
    for v in (3, 4):
        with RawClient(broker.bootstrap) as c:
            r = c.request(18, v, req(18, v, client_software_name="t", client_software_version="1"))
        # Below v4 Kafka leaves out supported features whose minimum is 0.
        tv = [("transaction.version", 0, 2), ("group.version", 0, 1), ("share.version", 0, 1)] if v >= 4 else []
        assert [(f.name, f.min_version, f.max_version) for f in r.supported_features] == [("metadata.version", 7, 25), *tv]
        assert [(f.name, f.min_version_level, f.max_version_level) for f in r.finalized_features] == [
            ("metadata.version", 25, 25), ("transaction.version", 2, 2), ("group.version", 1, 1), ("share.version", 1, 1)]
        assert r.finalized_features_epoch == 0
    for v in versions(57, broker.bootstrap):
        with RawClient(broker.bootstrap) as c:
            ups = tuple(req(57, v, "FeatureUpdateKey", feature=f, max_version_level=lvl, allow_downgrade=False, upgrade_type=1)
                        for f, lvl in (("metadata.version", 25), ("group.version", 0)))
            resp = c.request(57, v, req(57, v, timeout=5000, feature_updates=ups, validate_only=False))
        if v >= 2:
            assert error_code(resp.error_code) == ErrorCode.invalid_update_version.value, v
        else:
            assert [(x.feature, error_code(x.error_code)) for x in resp.results] == [("metadata.version", 0), ("group.version", ErrorCode.invalid_update_version.value)], v
