"""DescribeTopicPartitions (75), what Kafka 3.8+ admin clients use to describe topics:
Metadata's partition view (leader = the owner, one replica, in sync) paged by
response_partition_limit and a cursor, topics in name order as Kafka pages them. Eligible
leader replicas (KIP-966) are empty lists: there is never more than one replica."""

from __future__ import annotations

from kafscale.errors import ErrorCode
from kafscale.metadata.internal_topics import is_internal
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import ZERO_UUID, make, nested, response
from kafscale.storage.failures import StorageError

MAX_PARTITIONS_PER_RESPONSE = 2000  # Kafka's max.request.partition.size.limit default


async def describe_topic_partitions(ctx, req):
    cls = response(ApiKey.DESCRIBE_TOPIC_PARTITIONS, ctx.version)
    topic_cls, part_cls = nested(cls, "DescribeTopicPartitionsResponseTopic"), nested(cls, "DescribeTopicPartitionsResponsePartition")
    cursor_cls = nested(cls, "Cursor")
    broker, cluster = ctx.broker, ctx.broker.cluster
    cursor = req.cursor
    try:
        if req.topics:
            metas = {t.name: await broker.logs.topics.get(t.name) for t in req.topics}
        else:
            metas = {m.name: m for m in await broker.logs.topics.list_all()}
    except StorageError as e:
        failed = tuple(make(topic_cls, error_code=ErrorCode.request_timed_out, name=t.name, topic_id=ZERO_UUID, partitions=()) for t in req.topics)
        return make(cls, throttle_time=0, topics=failed, next_cursor=None)
    names = sorted(n for n in metas if cursor is None or n >= cursor.topic_name)
    remaining = max(1, min(req.response_partition_limit, MAX_PARTITIONS_PER_RESPONSE))
    out, next_cursor = [], None
    for i, name in enumerate(names):
        meta = metas[name]
        if meta is None:
            out.append(make(topic_cls, error_code=ErrorCode.unknown_topic_or_partition, name=name, topic_id=ZERO_UUID, is_internal=False, partitions=()))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        end = min(meta.partitions, start + remaining)
        parts = []
        for p in range(start, end):
            leader = cluster.owner_of(name, p)
            replicas = (leader,) if leader >= 0 else ()
            parts.append(make(part_cls, error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available, partition_index=p, leader_id=leader,
                              leader_epoch=cluster.leader_epoch(name, p), replica_nodes=replicas, isr_nodes=replicas,
                              eligible_leader_replicas=(), last_known_elr=(), offline_replicas=()))
        out.append(make(topic_cls, error_code=ErrorCode.none, name=name, topic_id=meta.uuid, is_internal=is_internal(name), partitions=tuple(parts)))
        remaining -= end - start
        if end < meta.partitions:
            next_cursor = make(cursor_cls, topic_name=name, partition_index=end)
            break
        if remaining <= 0:
            later = [n for n in names[i + 1:] if metas[n] is not None]
            if later:
                next_cursor = make(cursor_cls, topic_name=later[0], partition_index=0)
            break
    return make(cls, throttle_time=0, topics=tuple(out), next_cursor=next_cursor)


def register(router):
    router.register(ApiKey.DESCRIBE_TOPIC_PARTITIONS, describe_topic_partitions)
