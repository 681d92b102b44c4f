"""The #18 admin APIs on a cluster: two brokers sharing etcd and S3 (moto).

DescribeLogDirs asked of every broker reports each partition once, by its owner, sized as
its segments in S3 (its own objects or its pieces of write-ahead objects);
DescribeTopicPartitions names the owners Metadata names; CreatePartitions accepts
assignments to registered brokers only; client quotas written through one broker are read
through the other (they live in etcd)."""

from __future__ import annotations

import os
import time
import uuid

import boto3
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient

from kafscale.errors import ErrorCode
from kafscale.protocol import records
from kafscale.storage import write_ahead
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")


@pytest.fixture(scope="module")
def cluster(etcd_server, moto_server):
    tag = uuid.uuid4().hex[:8]
    bucket, prefix = f"ks-admin-{tag}", f"/ks-admin-{tag}"
    brokers = []
    for node in (0, 1):
        b = BrokerProcess(
            extra_args=["--broker-id", str(node), "--metadata", etcd_server.url, "--metadata-prefix", prefix,
                        "--storage", f"s3://{bucket}/data", "--lease-ttl-s", "3"],
            env={**moto_server.env, "KAFSCALE_S3_CREATE_BUCKET": "true"},
        )
        brokers.append(b.start())

    def both_seen():
        for b in brokers:
            with RawClient(b.bootstrap) as c:
                if sorted(x.node_id for x in c.metadata([], version=12).brokers) != [0, 1]:
                    return False
        return True

    wait_until(both_seen, 20, "both brokers to see each other")
    yield brokers, bucket, moto_server
    for b in brokers:
        b.stop()


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    with RawClient(bootstrap) as c:
        t = c.metadata([topic], version=12, allow_auto=False).topics[0]
    return {p.partition_index: p.leader_id for p in t.partitions}


def stored_sizes(s3, bucket: str, topic: str, partitions: int) -> dict[int, int]:
    """Bytes of each partition's segments in the bucket, wherever they live: its own segment
    objects and its pieces of write-ahead objects (each a whole spec segment; not rewritten
    into segments yet, the brokers keep them for --segment-max-age-ms, 10 minutes)."""
    sizes = dict.fromkeys(range(partitions), 0)
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"data/default/{topic}/").get("Contents", []):
        if o["Key"].endswith(".kfs"):
            sizes[int(o["Key"].split("/")[-2])] += o["Size"]
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"data/{write_ahead.wal_prefix('default')}").get("Contents", []):
        _created, pieces = write_ahead.decode(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
        for pc in pieces:
            if pc.topic == topic:
                sizes[pc.partition] += pc.length
    return sizes


def test_admin_apis_across_two_brokers(cluster):
    brokers, bucket, moto = cluster
    bootstrap = ",".join(b.bootstrap for b in brokers)
    topic = f"adm-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(20)
    balanced = lambda: sorted(leaders(brokers[0].bootstrap, topic).values()) == [0, 0, 1, 1]  # noqa: E731
    wait_until(balanced, 20, "two partitions on each broker")
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(40):
        p.produce(topic, b"x" * (100 + i), partition=i % 4)
    assert p.flush(30) == 0
    wait_until(balanced, 20, "two partitions on each broker")
    owner = leaders(brokers[0].bootstrap, topic)

    # DescribeLogDirs of every broker: each partition once, from its owner, sized as in S3
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    in_store = stored_sizes(s3, bucket, topic, 4)
    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        reported = {}
        for entry in kp.describe_log_dirs():
            [d] = entry["log_dirs"]
            assert d["log_dir"] == f"s3://{bucket}/data/default" and d["error_code"] == 0
            for t in d["topics"]:
                if t["name"] == topic:
                    for part in t["partitions"]:
                        assert part["partition_index"] not in reported
                        reported[part["partition_index"]] = (entry["broker"], part["partition_size"])
        assert reported == {q: (owner[q], in_store[q]) for q in range(4)} and all(in_store.values())
        # DescribeTopicPartitions from either broker names the owners
        for b in brokers:
            kb = KafkaAdminClient(bootstrap_servers=b.bootstrap)
            try:
                [t] = kb.describe_topic_partitions([topic])["topics"]
            finally:
                kb.close()
            assert {x["partition_index"]: x["leader_id"] for x in t["partitions"]} == owner
    finally:
        kp.close()

    # CreatePartitions: broker 1 is registered, broker 5 is not
    fut = admin.create_partitions([NewPartitions(topic, 5, replica_assignment=[[5]])])[topic]
    with pytest.raises(Exception) as info:
        fut.result(20)
    assert info.value.args[0].code() == ErrorCode.invalid_replica_assignment.value
    assert admin.create_partitions([NewPartitions(topic, 5, replica_assignment=[[1]])])[topic].result(20) is None
    # the other broker follows (its topic cache is refreshed from etcd's topic watch)
    for b in brokers:
        wait_until(lambda b=b: len(leaders(b.bootstrap, topic)) == 5, 20, f"the fifth partition in Metadata from {b.bootstrap}")

    # a config altered through one broker is enforced by the owner of each partition
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.before.max.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    admin0 = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    assert admin0.incremental_alter_configs([res])[res].result(20) is None
    owner = leaders(brokers[0].bootstrap, topic)
    old = int(time.time() * 1000) - 2 * 3_600_000
    for part in range(5):
        b = brokers[owner[part]]

        def refused(b=b, part=part):
            with RawClient(b.bootstrap) as c:
                return error_code(c.produce(topic, part, records.build_batch([(None, b"old")], timestamp=old)).error_code) == ErrorCode.invalid_timestamp.value

        wait_until(refused, 20, f"partition {part} on broker {owner[part]} to refuse an old timestamp")

    # client quotas live in etcd: set through broker 0, read through broker 1
    with RawClient(brokers[0].bootstrap) as c:
        e = (req(49, 1, "EntityData", entity_type="user", entity_name="carol"),)
        o = (req(49, 1, "OpData", key="consumer_byte_rate", value=5000.0, remove=False),)
        [r] = c.request(49, 1, req(49, 1, entries=(req(49, 1, "EntryData", entity=e, ops=o),), validate_only=False)).entries
        assert error_code(r.error_code) == 0
    with RawClient(brokers[1].bootstrap) as c:
        resp = c.request(48, 1, req(48, 1, components=(req(48, 1, "ComponentData", entity_type="user", match_type=0, match="carol"),), strict=True))
    assert [([(x.entity_type, x.entity_name) for x in en.entity], [(v.key, v.value) for v in en.values]) for en in resp.entries] == [
        ([("user", "carol")], [("consumer_byte_rate", 5000.0)])]
