"""CreateTopics (19), DeleteTopics (20), CreatePartitions (37)."""

from __future__ import annotations

import logging

from kafscale.broker import topics
from kafscale.errors import ErrorCode
from kafscale.metadata import topic_config
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import ZERO_UUID, make, nested, response
from kafscale.storage.failures import StorageError

log = logging.getLogger("kafscale.admin")


async def create_topics(ctx, req):
    cls = response(ApiKey.CREATE_TOPICS, ctx.version)
    r_cls = nested(cls, "CreatableTopicResult")
    c_cls = nested(cls, "CreatableTopicConfigs") if ctx.version >= 5 else None
    results = []
    for t in req.topics:
        configs = {c.name: c.value for c in t.configs}
        partitions = t.num_partitions
        if t.assignments:
            if partitions != -1:
                results.append(make(r_cls, name=t.name, topic_id=ZERO_UUID, error_code=ErrorCode.invalid_request, error_message="give either num_partitions or assignments", num_partitions=-1, replication_factor=-1, configs=()))
                continue
            partitions = len(t.assignments)
        try:
            meta = await topics.create(ctx.broker, t.name, partitions, configs, replication_factor=t.replication_factor, validate_only=req.validate_only)
        except topics.TopicError as e:
            results.append(make(r_cls, name=t.name, topic_id=ZERO_UUID, error_code=e.code, error_message=str(e), num_partitions=-1, replication_factor=-1, configs=()))
            continue
        if not req.validate_only:
            log.info("created topic %s with %d partitions (client %s)", meta.name, meta.partitions, ctx.client_id)
        cfgs = ()
        if c_cls is not None:
            static = ctx.broker.config.kafka_static_configs()
            resolved = (topic_config.resolve(k, meta.configs, static) for k in topic_config.listed(meta.configs))
            cfgs = tuple(make(c_cls, name=v.name, value=v.value, read_only=False, config_source=v.source, is_sensitive=False) for v in resolved)
        results.append(
            make(r_cls, name=meta.name, topic_id=meta.uuid, error_code=ErrorCode.none, error_message=None, num_partitions=meta.partitions, replication_factor=1, configs=cfgs)
        )
    return make(cls, throttle_time=0, topics=tuple(results))


async def delete_topics(ctx, req):
    cls = response(ApiKey.DELETE_TOPICS, ctx.version)
    r_cls = nested(cls, "DeletableTopicResult")
    wanted: list[tuple[str | None, object]] = []
    lookup_failed: dict[object, StorageError] = {}  # topic id -> why it could not be looked up
    if hasattr(req, "topics"):
        names = topics.TopicIdResolver(ctx.broker)
        for t in req.topics:
            try:
                wanted.append((await names.name(t.name, t.topic_id), t.topic_id if t.name is None else None))
            except StorageError as e:  # the metadata store cannot say which topic the id names
                lookup_failed[t.topic_id] = e
                wanted.append((None, t.topic_id))
    else:
        wanted = [(n, None) for n in req.topic_names]
    results = []
    for name, topic_id in wanted:
        if name is None and topic_id in lookup_failed:
            results.append(make(r_cls, name=None, topic_id=topic_id, error_code=ErrorCode.request_timed_out, error_message=str(lookup_failed[topic_id])))
            continue
        if name is None:
            results.append(make(r_cls, name=None, topic_id=topic_id, error_code=ErrorCode.unknown_topic_id, error_message="unknown topic id"))
            continue
        try:
            meta = await topics.delete(ctx.broker, name)
            log.info("deleted topic %s (client %s)", name, ctx.client_id)
            results.append(make(r_cls, name=name, topic_id=meta.uuid, error_code=ErrorCode.none, error_message=None))
        except topics.TopicError as e:
            results.append(make(r_cls, name=name, topic_id=topic_id, error_code=e.code, error_message=str(e)))
    return make(cls, throttle_time=0, responses=tuple(results))


async def _check_assignments(broker, name: str, count: int, assignments: list[tuple[int, ...]]) -> None:
    """Kafka's checks of explicit assignments of new partitions (INVALID_REPLICA_ASSIGNMENT).
    Valid ones are accepted, but the cluster places partitions itself: the new partitions
    go to whichever broker the balanced assignment picks, like every other partition."""
    meta = await broker.logs.topics.get(name, refresh=True)
    if meta is None or count <= meta.partitions:
        return  # add_partitions answers UNKNOWN_TOPIC_OR_PARTITION / INVALID_PARTITIONS
    bad = ErrorCode.invalid_replica_assignment
    if len(assignments) != count - meta.partitions:
        raise topics.TopicError(bad, f"attempted to add {count - meta.partitions} partition(s), but {len(assignments)} assignment(s) were given")
    live = {b.node_id for b in broker.cluster.brokers()}
    for replicas in assignments:
        if not replicas:
            raise topics.TopicError(bad, "an assignment has an empty replica list")
        if len(set(replicas)) != len(replicas):
            raise topics.TopicError(bad, f"an assignment names a broker twice: {list(replicas)}")
        unknown = [b for b in replicas if b not in live]
        if unknown:
            raise topics.TopicError(bad, f"an assignment names broker {unknown[0]}, but no such broker is registered")
        if len(replicas) != 1:
            raise topics.TopicError(bad, f"an assignment has {len(replicas)} replicas, but the topic's partitions have 1 (the object store keeps the copies)")


async def create_partitions(ctx, req):
    cls = response(ApiKey.CREATE_PARTITIONS, ctx.version)
    r_cls = nested(cls, "CreatePartitionsTopicResult")
    results = []
    for t in req.topics:
        try:
            if t.assignments is not None:
                await _check_assignments(ctx.broker, t.name, t.count, [tuple(a.broker_ids) for a in t.assignments])
            await topics.add_partitions(ctx.broker, t.name, t.count, req.validate_only)
            results.append(make(r_cls, name=t.name, error_code=ErrorCode.none, error_message=None))
        except topics.TopicError as e:
            results.append(make(r_cls, name=t.name, error_code=e.code, error_message=str(e)))
        except StorageError as e:  # the metadata store is unreachable: retriable
            results.append(make(r_cls, name=t.name, error_code=ErrorCode.request_timed_out, error_message=str(e)))
    return make(cls, throttle_time=0, results=tuple(results))


def register(router):
    router.register(ApiKey.CREATE_TOPICS, create_topics)
    router.register(ApiKey.DELETE_TOPICS, delete_topics)
    router.register(ApiKey.CREATE_PARTITIONS, create_partitions)
