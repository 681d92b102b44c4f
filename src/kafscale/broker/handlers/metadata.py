"""Metadata (3) with topic auto-creation, and DescribeCluster (60)."""

from __future__ import annotations

import dataclasses
import logging
import weakref

from kafscale.broker import topics
from kafscale.errors import ErrorCode
from kafscale.metadata.internal_topics import is_internal
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import ZERO_UUID, has_field, make, nested, response
from kafscale.protocol.codec import encode_entity
from kafscale.protocol.metadata_response import MetadataAnswer
from kafscale.protocol.error_response import RequestError
from kafscale.security.acl import CLUSTER_NAME, Operation as Op, ResourceType as Res
from kafscale.storage.failures import StorageError

log = logging.getLogger("kafscale.metadata")


class _EncodedTopics:
    """A cluster's topic entries, with their encoding, as answered while its
    `leaders_version()` is `leaders`: by (version, listener, name, id, partition count,
    authorized operations or None)."""

    __slots__ = ("leaders", "entries")

    def __init__(self, leaders):
        self.leaders = leaders
        self.entries: dict[tuple, tuple] = {}


# By cluster, so by broker (tests run several in one process). Bounded: a broker whose
# clients ask in many versions, listeners and principals starts over now and then.
_ENCODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MAX_ENCODED = 10_000


def _topic(ctx, cls, meta, include_ops: bool) -> tuple:
    """(entry, its encoding) of a topic the broker has: kept while the cluster says no
    leader, epoch or broker changed. Looked up and built without awaiting in between,
    so an entry is never kept past a change."""
    ops = _ops(ctx, Res.TOPIC, meta.name) if include_ops else None
    cluster = ctx.broker.cluster
    leaders = cluster.leaders_version()
    if leaders is None:
        return _topic_entry(ctx, cls, meta, ops), None
    cache = _ENCODED.get(cluster)
    if cache is None or cache.leaders != leaders or len(cache.entries) >= _MAX_ENCODED:
        cache = _ENCODED[cluster] = _EncodedTopics(leaders)
    key = (ctx.version, ctx.listener, meta.name, meta.uuid, meta.partitions, ops)
    found = cache.entries.get(key)
    if found is None:
        entry = _topic_entry(ctx, cls, meta, ops)
        found = cache.entries[key] = (entry, encode_entity(entry))
    return found


def _topic_entry(ctx, cls, meta, ops: int | None):
    part_cls = nested(cls, "MetadataResponsePartition")
    topic_cls = nested(cls, "MetadataResponseTopic")
    cluster = ctx.broker.cluster
    parts = []
    for p in range(meta.partitions):
        leader = cluster.owner_of(meta.name, p)
        code = ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available
        if leader >= 0 and ctx.listener is not None:
            node = cluster.node(leader)
            if node is not None and node.endpoint(ctx.listener) is None:
                # The leader has no listener of this name: Kafka's LISTENER_NOT_FOUND
                # (from v6; LEADER_NOT_AVAILABLE before), so the client does not go to an
                # address it cannot speak to.
                code = ErrorCode.listener_not_found if ctx.version >= 6 else ErrorCode.leader_not_available
                leader = -1
        replicas = (leader,) if leader >= 0 else ()
        parts.append(
            make(
                part_cls,
                error_code=code,
                partition_index=p,
                leader_id=leader,
                leader_epoch=cluster.leader_epoch(meta.name, p),
                replica_nodes=replicas,
                isr_nodes=replicas,
                offline_replicas=(),
            )
        )
    extra = {}
    if ops is not None:
        extra["topic_authorized_operations"] = ops
    return make(topic_cls, error_code=ErrorCode.none, name=meta.name, topic_id=meta.uuid, is_internal=is_internal(meta.name), partitions=tuple(parts), **extra)


def _ops(ctx, resource_type, name: str) -> int:
    host = ctx.peer.rsplit(":", 1)[0] if ":" in ctx.peer else ctx.peer
    return ctx.broker.authorizer.authorized_operations(ctx.principal, host, resource_type, name)


def _may(ctx, op, name: str, log_denial: bool = True) -> bool:
    """With --authorizer acls: may the principal do `op` on topic `name`?"""
    authz = ctx.broker.authorizer
    if not authz.enabled:
        return True
    host = ctx.peer.rsplit(":", 1)[0] if ":" in ctx.peer else ctx.peer
    if op == Op.CREATE and authz.authorize(ctx.principal, host, Op.CREATE, Res.CLUSTER, CLUSTER_NAME, log_denial=False):
        return True
    return authz.authorize(ctx.principal, host, op, Res.TOPIC, name, log_denial=log_denial)


async def metadata(ctx, req):
    cls = response(ApiKey.METADATA, ctx.version)
    topic_cls = nested(cls, "MetadataResponseTopic")
    broker = ctx.broker
    results = []
    requested = req.topics
    include_ops = bool(getattr(req, "include_topic_authorized_operations", False))
    if requested is None or (ctx.version == 0 and len(requested) == 0):
        try:
            listed = await broker.logs.topics.list_all()
        except StorageError as e:
            # The store is unreachable and this broker knows no topic yet (list_topics answers
            # with the known ones otherwise): what it knows is nothing, as a Kafka broker with
            # an empty metadata cache answers. The broker list still tells clients where to go.
            log.warning("metadata for all topics from client %s: %s", ctx.client_id, e)
            listed = []
        for meta in sorted(listed, key=lambda m: m.name):
            if _may(ctx, Op.DESCRIBE, meta.name, log_denial=False):  # Kafka hides what a principal may not describe
                results.append(_topic(ctx, cls, meta, include_ops))
    else:
        names = topics.TopicIdResolver(broker)
        allow_auto = broker.config.auto_create_topics and getattr(req, "allow_auto_topic_creation", True)
        if ctx.version < 12 and any(t.name is None for t in requested):
            # v10-11 have a nullable name but no lookup by id: Kafka refuses the request.
            raise RequestError(ErrorCode.invalid_request, f"topic name can not be null in Metadata v{ctx.version}")
        for t in requested:
            name = t.name
            if name is None and getattr(t, "topic_id", None) is None:  # neither name nor id
                results.append((make(topic_cls, error_code=ErrorCode.unknown_topic_id, name=None, topic_id=ZERO_UUID, partitions=()), None))
                continue
            if name is None and getattr(t, "topic_id", None) is not None:
                try:
                    name = await names.name(None, t.topic_id)
                    meta = await broker.logs.topics.get(name) if name is not None else None
                except StorageError as e:
                    log.warning("metadata for topic id %s from client %s: %s", t.topic_id, ctx.client_id, e)
                    results.append((make(topic_cls, error_code=ErrorCode.leader_not_available, name=name, topic_id=t.topic_id, partitions=()), None))
                    continue
                if meta is None:
                    results.append((make(topic_cls, error_code=ErrorCode.unknown_topic_id, name=None, topic_id=t.topic_id, partitions=()), None))
                else:
                    results.append(_topic(ctx, cls, meta, include_ops))
                continue
            if not _may(ctx, Op.DESCRIBE, name):
                results.append((make(topic_cls, error_code=ErrorCode.topic_authorization_failed, name=name, topic_id=ZERO_UUID, is_internal=is_internal(name), partitions=()), None))
                continue
            try:
                meta = await broker.logs.topics.get(name)
                if meta is None:
                    meta = await broker.logs.topics.get(name, refresh=True)
            except StorageError as e:
                # The metadata store cannot say whether the topic exists: LEADER_NOT_AVAILABLE,
                # on which clients wait and ask again (as while a topic is being created).
                log.warning("metadata for topic %s from client %s: %s", name, ctx.client_id, e)
                results.append((make(topic_cls, error_code=ErrorCode.leader_not_available, name=name, topic_id=ZERO_UUID, partitions=()), None))
                continue
            if meta is None:
                code = ErrorCode.unknown_topic_or_partition
                try:
                    topics.check_name(name)
                    if allow_auto and not _may(ctx, Op.CREATE, name):
                        code = ErrorCode.topic_authorization_failed
                    elif allow_auto and is_internal(name):
                        # Never a plain topic of that name: the internal topic, with its
                        # configs, as Kafka's auto-creation makes it.
                        meta = await topics.ensure_internal_topics(broker)
                        code = ErrorCode.leader_not_available
                    elif allow_auto:
                        meta = await topics.create(broker, name, -1, {})
                        log.info("auto-created topic %s with %d partitions", name, meta.partitions)
                except topics.TopicError as e:
                    if e.code == ErrorCode.topic_already_exists:
                        try:
                            meta = await broker.logs.topics.get(name, refresh=True)
                        except StorageError:
                            code = ErrorCode.leader_not_available
                    elif e.code == ErrorCode.request_timed_out:
                        code = ErrorCode.leader_not_available  # store unreachable: the client asks again
                    else:
                        code = e.code
                if meta is None:
                    results.append((make(topic_cls, error_code=code, name=name, topic_id=ZERO_UUID, partitions=()), None))
                    continue
            results.append(_topic(ctx, cls, meta, include_ops))
    broker_cls = nested(cls, "MetadataResponseBroker")
    brokers = tuple(make(broker_cls, node_id=b.node_id, host=host, port=port, rack=b.rack) for b, host, port in broker.cluster.brokers_on(ctx.listener))
    extra = {}
    if getattr(req, "include_cluster_authorized_operations", False) and has_field(cls, "cluster_authorized_operations"):
        extra["cluster_authorized_operations"] = _ops(ctx, Res.CLUSTER, CLUSTER_NAME)
    answer = make(
        cls,
        throttle_time=0,
        brokers=brokers,
        cluster_id=broker.cluster.cluster_id,
        controller_id=broker.cluster.controller_id,
        topics=(),
        error_code=ErrorCode.none,
        **extra,
    )
    try:
        encoded = [done if done is not None else encode_entity(entry) for entry, done in results]
    except Exception:  # noqa: BLE001 - an entry this version cannot hold (a name kio refuses)
        # The plain response: encode_answer fails on it the same way and answers with its fallback.
        return dataclasses.replace(answer, topics=tuple(entry for entry, _ in results))
    return MetadataAnswer(answer, encoded)


async def describe_cluster(ctx, req):
    cls = response(ApiKey.DESCRIBE_CLUSTER, ctx.version)
    b_cls = nested(cls, "DescribeClusterBroker")
    cluster = ctx.broker.cluster
    return make(
        cls,
        throttle_time=0,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=getattr(req, "endpoint_type", 1),
        cluster_id=cluster.cluster_id,
        controller_id=cluster.controller_id,
        brokers=tuple(make(b_cls, broker_id=b.node_id, host=host, port=port, rack=b.rack, is_fenced=False) for b, host, port in cluster.brokers_on(ctx.listener)),
        **({"cluster_authorized_operations": _ops(ctx, Res.CLUSTER, CLUSTER_NAME)} if getattr(req, "include_cluster_authorized_operations", False) else {}),
    )


def register(router):
    router.register(ApiKey.METADATA, metadata)
    router.register(ApiKey.DESCRIBE_CLUSTER, describe_cluster)
