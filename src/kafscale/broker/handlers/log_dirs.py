"""DescribeLogDirs (35) and AlterReplicaLogDirs (34) on stateless brokers.

Each broker has one log dir standing for the object store: `<storage URL>/<namespace>`
(what `log.dirs` reports in DescribeConfigs). It holds the partitions this broker owns (is
leader of, as Metadata says), so an admin client that asks every broker and adds the
answers up counts each partition once. A partition's size is the sum of its committed
segments (the metadata store's segment list), its own objects or its pieces of write-ahead
objects alike, i.e. the bytes its log occupies in the object store wherever they live, as
Kafka reports each partition's log size; records still in the write buffer are not
counted, as Kafka counts only what is in the log's files. total_bytes/usable_bytes are -1 (unknown: object stores have no
fixed capacity)."""

from __future__ import annotations

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import StorageError


def log_dir(broker) -> str:
    return f"{broker.config.storage.rstrip('/')}/{broker.config.namespace}"


async def _owned(broker, wanted) -> dict[str, list[int]]:
    """Topic -> partitions this broker owns, of those asked for (None: all)."""
    cluster, me = broker.cluster, broker.cluster.local.node_id
    if wanted is None:
        metas = await broker.logs.topics.list_all()
        asked = {m.name: (m, range(m.partitions)) for m in metas}
    else:
        asked = {}
        for t in wanted:
            meta = await broker.logs.topics.get(t.topic)
            if meta is not None:
                asked[t.topic] = (meta, [p for p in t.partitions if 0 <= p < meta.partitions])
    return {name: [p for p in parts if cluster.owner_of(name, p) == me] for name, (meta, parts) in sorted(asked.items())}


async def describe_log_dirs(ctx, req):
    cls = response(ApiKey.DESCRIBE_LOG_DIRS, ctx.version)
    result_cls, topic_cls, part_cls = nested(cls, "DescribeLogDirsResult"), nested(cls, "DescribeLogDirsTopic"), nested(cls, "DescribeLogDirsPartition")
    broker = ctx.broker
    try:
        owned = await _owned(broker, req.topics)
        topics_out = []
        for name, parts in owned.items():
            entries = []
            for p in parts:
                st = await broker.metadata.get_partition(name, p)
                size = sum(s.size for s in st.segments) if st is not None else 0
                entries.append(make(part_cls, partition_index=p, partition_size=size, offset_lag=0, is_future_key=False))
            if entries or req.topics is not None:
                topics_out.append(make(topic_cls, name=name, partitions=tuple(entries)))
        code = ErrorCode.none
    except StorageError:
        # the metadata store is unreachable: the dir cannot be read, as a Kafka log dir offline
        topics_out, code = [], ErrorCode.kafka_storage_error
    result = make(result_cls, error_code=code, log_dir=log_dir(broker), topics=tuple(topics_out), total_bytes=-1, usable_bytes=-1)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, results=(result,))


async def alter_replica_log_dirs(ctx, req):
    """There is one dir per broker: moving a replica into it is a no-op (Kafka: the replica is
    already there), any other path is LOG_DIR_NOT_FOUND, as Kafka answers for a dir that is
    not in its log.dirs."""
    cls = response(ApiKey.ALTER_REPLICA_LOG_DIRS, ctx.version)
    topic_cls, part_cls = nested(cls, "AlterReplicaLogDirTopicResult"), nested(cls, "AlterReplicaLogDirPartitionResult")
    broker, mine = ctx.broker, log_dir(ctx.broker)
    results = []
    for d in req.dirs:
        for t in d.topics:
            codes = []
            for p in t.partitions:
                if d.path != mine:
                    code = ErrorCode.log_dir_not_found
                else:
                    try:
                        meta = await broker.logs.topics.get(t.name)
                    except StorageError:
                        meta, code = None, ErrorCode.kafka_storage_error
                    else:
                        if meta is None or not 0 <= p < meta.partitions:
                            code = ErrorCode.unknown_topic_or_partition
                        elif broker.cluster.owner_of(t.name, p) != broker.cluster.local.node_id:
                            code = ErrorCode.not_leader_or_follower
                        else:
                            code = ErrorCode.none
                codes.append(make(part_cls, partition_index=p, error_code=code))
            results.append(make(topic_cls, topic_name=t.name, partitions=tuple(codes)))
    return make(cls, throttle_time=0, results=tuple(results))


def register(router):
    router.register(ApiKey.DESCRIBE_LOG_DIRS, describe_log_dirs)
    router.register(ApiKey.ALTER_REPLICA_LOG_DIRS, alter_replica_log_dirs)
