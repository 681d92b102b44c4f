"""Consumer-group APIs over kio's whole version range.

FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
OffsetCommit (8), OffsetFetch (9), DescribeGroups (15), ListGroups (16),
DeleteGroups (42), OffsetDelete (47). The rules live in `kafscale.groups`; this module
translates requests and responses, which differ by version, through `build()`.
"""

from __future__ import annotations

import datetime

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.coordinator import log_commit_refused
from kafscale.groups.state import JoinResult
from kafscale.metadata.store import CommittedOffset
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import has_field, make, response
from kafscale.security.acl import CLUSTER_NAME, OPERATIONS_OF, Operation as Op, ResourceType as Res
from kafscale.storage.failures import STORE_FAILURES, StorageError

# The metadata store failing under a group API (StorageError: a topic id it could not look
# up): COORDINATOR_NOT_AVAILABLE, on which clients find the coordinator again and retry.
STORE_DOWN = (*STORE_FAILURES, StorageError)

COORDINATOR_KEY_GROUP = 0
COORDINATOR_KEY_TRANSACTION = 1
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default
# Every operation on a group (READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: 3400), what
# Kafka (3.8+, where groups have configs) reports without an authorizer.
GROUP_OPERATIONS = sum(1 << int(op) for op in OPERATIONS_OF[Res.GROUP])


# -- building version-specific responses ----------------------------------------------------


# One builder for every handler (kafscale.protocol.build); `build` is its name here.
build = make
_has = has_field


def _response(api_key: int, ctx) -> type:
    return response(api_key, ctx.version)


def _ms(value, default: int = -1) -> int:
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


def _client_host(peer: str) -> str:
    # Kafka reports InetAddress.toString(), e.g. "/127.0.0.1".
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host.strip("[]")


def _coordinator(ctx):
    groups = ctx.broker.groups
    if groups is not None and groups.cluster is None:
        groups.bind_cluster(ctx.broker.cluster)
    return groups


async def _owned(ctx, group_id: str) -> bool:
    """Is this broker the group's coordinator? If not, forget any copy we hold."""
    if ctx.broker.cluster.is_group_coordinator(group_id):
        return True
    groups = ctx.broker.groups
    if groups is not None:
        await groups.release(group_id)
    return False


async def group_refusal(ctx, group_id: str) -> ErrorCode | None:
    """INVALID_GROUP_ID or NOT_COORDINATOR when this broker cannot serve the group, else None."""
    if not group_id:
        return ErrorCode.invalid_group_id
    if _coordinator(ctx) is None or not await _owned(ctx, group_id):
        return ErrorCode.not_coordinator
    return None


async def _serving(ctx, api_key: ApiKey, group_id: str):
    """The preamble of a request on one group: (response class, the coordinator, the
    refusal answering the request when this broker cannot serve the group, else None)."""
    return _response(api_key, ctx), _coordinator(ctx), await group_refusal(ctx, group_id)


def _topic_lookup(ctx):
    """name -> (topic id, partition count) of the existing topics among names (for groups
    the broker assigns: consumer groups, their classic members too)."""
    resolver = TopicIdResolver(ctx.broker)

    async def lookup(names):
        out = {}
        for name in sorted(names):
            meta = await resolver.by_name(name)
            if meta is not None and meta.uuid is not None:
                out[name] = (str(meta.uuid), meta.partitions)
        return out

    return lookup


def _topic_names(ctx):
    async def names():
        return [t.name for t in await ctx.broker.metadata.list_topics()]

    return names


# -- FindCoordinator -------------------------------------------------------------------------


async def find_coordinator(ctx, req):
    cls = _response(ApiKey.FIND_COORDINATOR, ctx)
    key_type = getattr(req, "key_type", COORDINATOR_KEY_GROUP)
    keys = list(req.coordinator_keys) if _has(req, "coordinator_keys") else [req.key]
    entries = []
    for key in keys:
        if key_type == COORDINATOR_KEY_GROUP or (
            key_type == COORDINATOR_KEY_TRANSACTION and getattr(ctx.broker, "transactions", None) is not None
        ):
            # A group: the owner of its __consumer_offsets partition (Kafka's partitionFor).
            # A transactional id: the broker whose TransactionCoordinator owns it (`is_coordinator`).
            cluster = ctx.broker.cluster
            node = cluster.group_coordinator(key) if key_type == COORDINATOR_KEY_GROUP else cluster.coordinator_for(key)
            where = node.endpoint(ctx.listener)
            if where is None:
                # The coordinator has no listener of this name: Kafka answers
                # COORDINATOR_NOT_AVAILABLE and the client asks again.
                entries.append(dict(key=key, node_id=-1, host="", port=-1, error_code=ErrorCode.coordinator_not_available,
                                    error_message=f"coordinator {node.node_id} has no listener {ctx.listener}"))
                continue
            entries.append(dict(key=key, node_id=node.node_id, host=where[0], port=where[1],
                                error_code=ErrorCode.none, error_message=None))
        else:
            # Kafka answers INVALID_REQUEST for coordinator types it does not serve.
            what = "transactions are not supported" if key_type == COORDINATOR_KEY_TRANSACTION else (
                f"unsupported coordinator key type {key_type}")
            entries.append(dict(key=key, node_id=-1, host="", port=-1,
                                error_code=ErrorCode.invalid_request, error_message=what))
    if _has(cls, "coordinators"):
        return build(cls, throttle_time=0, coordinators=entries)
    first = entries[0]
    return build(cls, throttle_time=0, **{k: v for k, v in first.items() if k != "key"})


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup --------------------------------------------


def _join_response(cls, version: int, result: JoinResult):
    return build(
        cls,
        throttle_time=0,
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        # Before v7 the protocol name is not nullable: Kafka sends "".
        protocol_name=result.protocol_name if version >= 7 else (result.protocol_name or ""),
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            dict(member_id=mid, group_instance_id=instance, metadata=meta) for mid, instance, meta in result.members
        ],
    )


async def join_group(ctx, req):
    group_id = req.group_id
    cls, groups, error = await _serving(ctx, ApiKey.JOIN_GROUP, group_id)
    if error is not None:
        return _join_response(cls, ctx.version, JoinResult(error, req.member_id))
    instance_id = getattr(req, "group_instance_id", None)
    session_ms = _ms(req.session_timeout)
    try:
        result = await groups.join(
            group_id,
            member_id=req.member_id,
            group_instance_id=instance_id,
            client_id=ctx.client_id or "",
            client_host=_client_host(ctx.peer),
            session_timeout_ms=session_ms,
            # v0 has no rebalance timeout: Kafka uses the session timeout.
            rebalance_timeout_ms=_ms(getattr(req, "rebalance_timeout", None), session_ms),
            protocol_type=req.protocol_type,
            protocols=[(p.name, p.metadata) for p in req.protocols],
            # KIP-394: v4+ dynamic members first get their id with MEMBER_ID_REQUIRED.
            require_known_member_id=ctx.version >= 4 and instance_id is None,
            supports_skip_assignment=ctx.version >= 9,
            lookup=_topic_lookup(ctx),
            list_names=_topic_names(ctx),
        )
    except STORE_DOWN:
        result = JoinResult(ErrorCode.coordinator_not_available, req.member_id)
    return _join_response(cls, ctx.version, result)


def _generation_member(req) -> dict:
    """The member and generation a SyncGroup or Heartbeat request speaks for."""
    return {"member_id": req.member_id, "group_instance_id": getattr(req, "group_instance_id", None), "generation_id": req.generation_id}


async def sync_group(ctx, req):
    cls, groups, error = await _serving(ctx, ApiKey.SYNC_GROUP, req.group_id)
    if error is not None:
        return build(cls, throttle_time=0, error_code=error)
    try:
        result = await groups.sync(
            req.group_id,
            **_generation_member(req),
            protocol_type=getattr(req, "protocol_type", None),
            protocol_name=getattr(req, "protocol_name", None),
            assignments={a.member_id: a.assignment for a in req.assignments},
        )
    except STORE_DOWN:
        return build(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available)
    return build(cls, throttle_time=0, error_code=result.error, protocol_type=result.protocol_type, protocol_name=result.protocol_name, assignment=result.assignment)


async def heartbeat(ctx, req):
    cls, groups, error = await _serving(ctx, ApiKey.HEARTBEAT, req.group_id)
    if error is not None:
        return build(cls, throttle_time=0, error_code=error)
    try:
        error = await groups.heartbeat(req.group_id, **_generation_member(req))
    except STORE_DOWN:
        error = ErrorCode.coordinator_not_available
    return build(cls, throttle_time=0, error_code=error)


async def leave_group(ctx, req):
    batched = _has(req, "members")  # v3+: several members, per-member results
    identities = [(m.member_id, m.group_instance_id) for m in req.members] if batched else [(req.member_id, None)]
    group_id = req.group_id
    cls, groups, error = await _serving(ctx, ApiKey.LEAVE_GROUP, group_id)
    if error is not None:
        return build(cls, throttle_time=0, error_code=error)
    try:
        error, member_errors = await groups.leave(group_id, identities)
    except STORE_DOWN:
        return build(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available)
    if batched:
        members = [
            dict(member_id=mid, group_instance_id=instance, error_code=e)
            for (mid, instance), e in zip(identities, member_errors)
        ]
        return build(cls, throttle_time=0, error_code=error, members=members)
    if error is ErrorCode.none and member_errors:
        error = member_errors[0]  # before v3 the member's error is the response's error
    return build(cls, throttle_time=0, error_code=error)


# -- OffsetCommit / OffsetFetch / OffsetDelete ---------------------------------------------------


async def offset_commit(ctx, req):
    cls = _response(ApiKey.OFFSET_COMMIT, ctx)
    groups = _coordinator(ctx)
    by_id = ctx.version >= 10
    resolver = TopicIdResolver(ctx.broker)
    group_id = req.group_id

    # Per partition: (topic key for the response, partition, error or None when committable).
    rows: list[tuple[object, int, ErrorCode | None]] = []
    to_commit: dict[tuple[str, int], CommittedOffset] = {}
    too_large: list[int] = []
    try:
        for t in req.topics:
            meta = await (resolver.by_id(t.topic_id) if by_id else resolver.by_name(t.name))
            for p in t.partitions:
                if meta is None or not 0 <= p.partition_index < meta.partitions:
                    missing = ErrorCode.unknown_topic_id if by_id and meta is None else ErrorCode.unknown_topic_or_partition
                    rows.append((t, p.partition_index, missing))
                    continue
                rows.append((t, p.partition_index, None))
                metadata = p.committed_metadata if p.committed_metadata is not None else ""
                if len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    too_large.append(len(rows) - 1)
                    continue
                to_commit[(meta.name, p.partition_index)] = CommittedOffset(
                    offset=p.committed_offset,
                    leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    metadata=metadata,
                )
        group_error = ErrorCode.none
        if any(err is None for _, _, err in rows):
            if groups is None or not await _owned(ctx, group_id):
                group_error = ErrorCode.not_coordinator
                log_commit_refused("OffsetCommit", group_id, req.member_id, getattr(req, "group_instance_id", None),
                                   group_error, "this broker does not coordinate the group")
            else:
                group_error = await groups.commit_offsets(  # logs its own refusals
                    group_id,
                    member_id=req.member_id,
                    group_instance_id=getattr(req, "group_instance_id", None),
                    generation_id=req.generation_id_or_member_epoch,
                    offsets=to_commit,
                    api_version=ctx.version,
                )
    except STORE_DOWN as e:
        group_error = ErrorCode.coordinator_not_available
        log_commit_refused("OffsetCommit", group_id, req.member_id, getattr(req, "group_instance_id", None),
                           group_error, f"metadata store unavailable: {e}")
        # Every requested partition gets the error, also those not looked at yet.
        rows = [(t, p.partition_index, None) for t in req.topics for p in t.partitions]
        too_large = []

    too_large_rows = set(too_large)
    by_topic: dict[int, tuple[object, list]] = {}
    for i, (t, partition, err) in enumerate(rows):
        if err is None:
            if group_error is not ErrorCode.none:
                err = group_error
            elif i in too_large_rows:
                err = ErrorCode.offset_metadata_too_large
            else:
                err = ErrorCode.none
        by_topic.setdefault(id(t), (t, []))[1].append(dict(partition_index=partition, error_code=err))
    topics = [
        dict(name=getattr(t, "name", None), topic_id=getattr(t, "topic_id", None), partitions=parts)
        for t, parts in by_topic.values()
    ]
    return build(cls, throttle_time=0, topics=topics)


async def _fetch_group_offsets(ctx, groups, resolver, group_id: str, topics, by_id: bool, with_epoch: bool,
                              require_stable: bool = False, member: tuple[str | None, int] = (None, -1)):
    """(group error, response topics) for one group of an OffsetFetch; `member`: (member id,
    member epoch) of v9+, checked against a consumer-protocol group."""
    if groups is None or not await _owned(ctx, group_id):
        return ErrorCode.not_coordinator, None
    if (error := await groups.consumer.validate_offset_fetch(group_id, *member)) is not ErrorCode.none:
        return error, None
    committed = await groups.fetch_offsets(group_id)
    # require_stable (KIP-447): a partition with a transactional offset still pending answers
    # UNSTABLE_OFFSET_COMMIT (retriable) instead of an offset that may be about to change.
    unstable = await groups.pending_offset_partitions(group_id) if require_stable else set()

    def partition(p: int, o: CommittedOffset | None, topic: str | None = None) -> dict:
        if (topic, p) in unstable:
            return dict(partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                        error_code=ErrorCode.unstable_offset_commit)
        if o is None:
            return dict(partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                        error_code=ErrorCode.none)
        return dict(partition_index=p, committed_offset=o.offset,
                    committed_leader_epoch=o.leader_epoch if with_epoch else -1,
                    metadata=o.metadata if o.metadata is not None else "", error_code=ErrorCode.none)

    out = []
    if topics is None:
        # All topics with a committed offset.
        by_topic: dict[str, list] = {}
        for (topic, p), o in sorted(committed.items()):
            by_topic.setdefault(topic, []).append(partition(p, o, topic))
        for topic, parts in by_topic.items():
            if by_id:
                topic_id = await resolver.id_of(topic)
                if topic_id is None:
                    continue
                out.append(dict(topic_id=topic_id, partitions=parts))
            else:
                out.append(dict(name=topic, partitions=parts))
        return ErrorCode.none, out
    for t in topics:
        if by_id:
            meta = await resolver.by_id(t.topic_id)
            if meta is None:
                parts = [dict(partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                              error_code=ErrorCode.unknown_topic_id) for p in t.partition_indexes]
                out.append(dict(topic_id=t.topic_id, partitions=parts))
                continue
            name = meta.name
        else:
            name = t.name
        parts = [partition(p, committed.get((name, p)), name) for p in t.partition_indexes]
        out.append(dict(name=name, topic_id=getattr(t, "topic_id", None), partitions=parts))
    return ErrorCode.none, out


async def offset_fetch(ctx, req):
    cls = _response(ApiKey.OFFSET_FETCH, ctx)
    groups = _coordinator(ctx)
    resolver = TopicIdResolver(ctx.broker)
    by_id = ctx.version >= 10
    with_epoch = ctx.version >= 5
    require_stable = bool(getattr(req, "require_stable", False))
    if _has(req, "groups"):  # v8+: several groups per request
        results = []
        for g in req.groups:
            try:
                error, topics = await _fetch_group_offsets(
                    ctx, groups, resolver, g.group_id, g.topics, by_id, with_epoch, require_stable,
                    (getattr(g, "member_id", None), getattr(g, "member_epoch", -1)))
            except STORE_DOWN:
                error, topics = ErrorCode.coordinator_not_available, None
            results.append(dict(group_id=g.group_id, error_code=error, topics=topics or []))
        return build(cls, throttle_time=0, groups=results)
    try:
        error, topics = await _fetch_group_offsets(ctx, groups, resolver, req.group_id, req.topics, False, with_epoch,
                                                   require_stable)
    except STORE_DOWN:
        error, topics = ErrorCode.coordinator_not_available, None
    if topics is None:
        topics = []
        if not _has(cls, "error_code") and req.topics:
            # v1 has no top-level error: report it on every requested partition.
            topics = [
                dict(name=t.name, partitions=[dict(partition_index=p, committed_offset=-1, metadata="",
                                                   error_code=error) for p in t.partition_indexes])
                for t in req.topics
            ]
    return build(cls, throttle_time=0, error_code=error, topics=topics)


async def offset_delete(ctx, req):
    group_id = req.group_id
    cls, groups, error = await _serving(ctx, ApiKey.OFFSET_DELETE, group_id)
    if error is not None:
        return build(cls, throttle_time=0, error_code=error)
    resolver = TopicIdResolver(ctx.broker)
    try:
        known: list[tuple[str, int]] = []
        unknown: set[tuple[str, int]] = set()
        for t in req.topics:
            meta = await resolver.by_name(t.name)
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                if meta is None or not 0 <= p.partition_index < meta.partitions:
                    unknown.add(tp)
                else:
                    known.append(tp)
        error, results = await groups.delete_offsets(group_id, known)
    except STORE_DOWN:
        return build(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available)
    if error is not ErrorCode.none:
        return build(cls, throttle_time=0, error_code=error)
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            err = ErrorCode.unknown_topic_or_partition if tp in unknown else results.get(tp, ErrorCode.none)
            parts.append(dict(partition_index=p.partition_index, error_code=err))
        topics.append(dict(name=t.name, partitions=parts))
    return build(cls, throttle_time=0, error_code=ErrorCode.none, topics=topics)


# -- DescribeGroups / ListGroups / DeleteGroups --------------------------------------------------


async def describe_groups(ctx, req):
    cls = _response(ApiKey.DESCRIBE_GROUPS, ctx)
    groups = _coordinator(ctx)
    include_ops = getattr(req, "include_authorized_operations", False)
    out = []
    for group_id in req.groups:
        entry: dict = dict(group_id=group_id)
        try:
            if groups is None or not await _owned(ctx, group_id):
                entry.update(error_code=ErrorCode.not_coordinator)
                out.append(entry)
                continue
            described = await groups.describe(group_id)
            not_found = None if described is not None else f"Group {group_id} not found."
        except KafkaError as e:
            if e.code is not ErrorCode.group_id_not_found:
                entry.update(error_code=e.code, error_message=e.message)
                out.append(entry)
                continue
            described, not_found = None, e.message  # a consumer-protocol (mixed too) or share group
        except STORE_DOWN:
            entry.update(error_code=ErrorCode.coordinator_not_available)
            out.append(entry)
            continue
        if not_found is not None:
            # Kafka: an unknown group and a group of another type are Dead; from v6 with
            # GROUP_ID_NOT_FOUND and why, before v6 with no error.
            entry.update(group_state="Dead", error_code=ErrorCode.none)
            if ctx.version >= 6:
                entry.update(error_code=ErrorCode.group_id_not_found, error_message=not_found)
        else:
            entry.update(error_code=ErrorCode.none, **described)
        if include_ops and entry["error_code"] is ErrorCode.none:
            # Kafka reports the principal's operations on a group it answers without error.
            authz = getattr(ctx.broker, "authorizer", None)  # None: a broker assembled without one (unit tests)
            entry["authorized_operations"] = GROUP_OPERATIONS if authz is None else authz.authorized_operations(
                ctx.principal, _client_host(ctx.peer).lstrip("/"), Res.GROUP, group_id)
        out.append(entry)
    return build(cls, throttle_time=0, groups=out)


async def list_groups(ctx, req):
    cls = _response(ApiKey.LIST_GROUPS, ctx)
    groups = _coordinator(ctx)
    if groups is None:
        return build(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available)
    states = {s.lower() for s in getattr(req, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(req, "types_filter", ()) or ()}
    try:
        listed = await groups.list_every_group(ctx.broker.cluster.is_group_coordinator)
    except STORE_DOWN:
        return build(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available)
    entries = [
        dict(group_id=gid, protocol_type=ptype, group_state=state, group_type=gtype)
        for gid, ptype, state, gtype in listed
        if (not states or state.lower() in states) and (not types or gtype in types)
    ]
    authz = getattr(ctx.broker, "authorizer", None)
    if authz is not None and authz.enabled:
        # Kafka: DESCRIBE on the cluster lists every group, otherwise the groups the
        # principal may DESCRIBE.
        host = _client_host(ctx.peer).lstrip("/")
        if not authz.authorize(ctx.principal, host, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME, log_denial=False):
            entries = [e for e in entries if authz.authorize(ctx.principal, host, Op.DESCRIBE, Res.GROUP, e["group_id"], log_denial=False)]
    return build(cls, throttle_time=0, error_code=ErrorCode.none, groups=entries)


async def delete_groups(ctx, req):
    cls = _response(ApiKey.DELETE_GROUPS, ctx)
    groups = _coordinator(ctx)
    results = []
    for group_id in req.groups_names:
        try:
            if groups is None or not await _owned(ctx, group_id):
                error = ErrorCode.not_coordinator
            else:
                error = await groups.delete_group(group_id)
        except STORE_DOWN:
            error = ErrorCode.coordinator_not_available
        results.append(dict(group_id=group_id, error_code=error))
    return build(cls, throttle_time=0, results=results)


def register(router):
    handlers = {
        ApiKey.FIND_COORDINATOR: find_coordinator, ApiKey.JOIN_GROUP: join_group, ApiKey.HEARTBEAT: heartbeat,
        ApiKey.LEAVE_GROUP: leave_group, ApiKey.SYNC_GROUP: sync_group, ApiKey.OFFSET_COMMIT: offset_commit,
        ApiKey.OFFSET_FETCH: offset_fetch, ApiKey.DESCRIBE_GROUPS: describe_groups, ApiKey.LIST_GROUPS: list_groups,
        ApiKey.DELETE_GROUPS: delete_groups, ApiKey.OFFSET_DELETE: offset_delete,
    }
    for key, handler in handlers.items():
        router.register(key, handler)
