"""A share group's offsets (KIP-932): DescribeShareGroupOffsets (90), AlterShareGroupOffsets
(91) and DeleteShareGroupOffsets (92), served by the group's coordinator. What they read and
change is each share partition's state document in the metadata store
(`MetadataStore.get_share_state`); alter and delete need an empty group, and the
partition's owner picks the change up when the next share session opens (it compares its
copy with the store then, `share/manager.py`)."""

from __future__ import annotations

import uuid

from kafscale.broker.handlers.groups import STORE_DOWN, _client_host, _coordinator, build, group_refusal
from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.metadata.store import ConflictError
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import response
from kafscale.security.acl import Operation as Op, ResourceType as Res
from kafscale.share.partition import RecordState, SharePartition

NO_TOPIC_ID = uuid.UUID(int=0)
UNINITIALIZED = -1  # Kafka's start offset (and lag) of a partition the group never read
_WRITE_ATTEMPTS = 3


def start_offset(doc: dict | None, topic_id: str) -> int:
    """The share-partition start offset a state document holds for the topic of `topic_id`
    (the state of a deleted topic of the same name does not count)."""
    if doc is None or doc.get("topic_id") not in (None, topic_id):
        return UNINITIALIZED
    return doc["start_offset"]


def share_lag(doc: dict, high_watermark: int) -> int:
    """Kafka's share-partition lag: records below the high watermark not yet done with, the
    available (or acquired: written as available) ones of the window and all past its end."""
    start = doc["start_offset"]
    end = min(doc.get("end_offset", start), high_watermark)
    waiting = sum(max(min(last + 1, end) - max(first, start), 0)
                  for first, last, state, _count in doc.get("records", ()) if state == RecordState.AVAILABLE)
    return waiting + max(high_watermark - max(end, start), 0)


def reset_doc(topic_id: str, offset: int) -> dict:
    """A share partition starting afresh at `offset`: nothing in flight."""
    return dict(SharePartition(offset).to_doc(), topic_id=topic_id)


def _may(ctx, op: Op, topic: str) -> bool:
    authz = getattr(ctx.broker, "authorizer", None)
    return authz is None or authz.authorize(ctx.principal, _client_host(ctx.peer).lstrip("/"), op, Res.TOPIC, topic)


async def _topic(ctx, resolver: TopicIdResolver, op: Op, name: str):
    """(topic meta, error): TOPIC_AUTHORIZATION_FAILED before UNKNOWN_TOPIC_OR_PARTITION, as Kafka."""
    if not _may(ctx, op, name):
        return None, ErrorCode.topic_authorization_failed
    meta = await resolver.by_name(name)
    return meta, (ErrorCode.none if meta is not None else ErrorCode.unknown_topic_or_partition)


# -- DescribeShareGroupOffsets ------------------------------------------------------------------


async def _describe_group(ctx, resolver: TopicIdResolver, group) -> dict:
    entry = dict(group_id=group.group_id, topics=[], error_code=ErrorCode.none, error_message=None)
    refusal = await group_refusal(ctx, group.group_id)
    if refusal is not None:
        return dict(entry, error_code=refusal)
    groups = _coordinator(ctx)
    if await groups.share.describe(group.group_id) is None:
        return dict(entry, error_code=ErrorCode.group_id_not_found,
                    error_message=f"Group {group.group_id} not found or not a share group.")
    states = await ctx.broker.metadata.list_share_states(group.group_id)
    if group.topics is None:  # all the partitions the group has a state for
        wanted: dict[str, list[int] | None] = {}
        for topic, p in sorted(states):
            if _may(ctx, Op.DESCRIBE, topic):  # Kafka leaves out topics not authorized
                wanted.setdefault(topic, []).append(p)
    else:
        wanted = {t.topic_name: list(t.partitions) for t in group.topics}
    for name, partitions in wanted.items():
        meta, error = await _topic(ctx, resolver, Op.DESCRIBE, name)
        if meta is None and group.topics is None:
            continue  # the state of a deleted topic
        rows = []
        for p in partitions:
            row = dict(partition_index=p, start_offset=UNINITIALIZED, leader_epoch=-1, lag=UNINITIALIZED,
                       error_code=error, error_message=None)
            if error == ErrorCode.none:
                if not 0 <= p < meta.partitions:
                    row["error_code"] = ErrorCode.unknown_topic_or_partition
                else:
                    row["start_offset"] = start_offset(states.get((name, p)), meta.topic_id)
                    # lag and epoch from the log where this broker holds it (-1 elsewhere, as Kafka when unknown)
                    lg = ctx.broker.logs.logs.get((name, p))
                    if lg is not None and row["start_offset"] != UNINITIALIZED:
                        row.update(lag=share_lag(states[(name, p)], lg.high_watermark), leader_epoch=lg.leader_epoch)
            rows.append(row)
        entry["topics"].append(dict(topic_name=name, topic_id=meta.uuid if meta is not None else NO_TOPIC_ID,
                                    partitions=rows))
    return entry


async def describe_share_group_offsets(ctx, req):
    cls = response(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, ctx.version)
    resolver = TopicIdResolver(ctx.broker)
    out = []
    for group in req.groups:
        try:
            out.append(await _describe_group(ctx, resolver, group))
        except STORE_DOWN:
            out.append(dict(group_id=group.group_id, topics=[], error_code=ErrorCode.coordinator_not_available))
    return build(cls, throttle_time=0, groups=out)


# -- AlterShareGroupOffsets ----------------------------------------------------------------------


async def _put_start(metadata, group_id: str, topic: str, p: int, topic_id: str, offset: int) -> None:
    for attempt in range(_WRITE_ATTEMPTS):
        _doc, version = await metadata.get_share_state(group_id, topic, p)
        try:
            await metadata.put_share_state(group_id, topic, p, reset_doc(topic_id, offset), version)
            return
        except ConflictError:
            # the owner wrote its last acknowledgement of the group's last session meanwhile
            if attempt == _WRITE_ATTEMPTS - 1:
                raise


async def alter_share_group_offsets(ctx, req):
    cls = response(ApiKey.ALTER_SHARE_GROUP_OFFSETS, ctx.version)
    resolver = TopicIdResolver(ctx.broker)
    topics = []  # (response entry, meta or None, [(partition row, start offset)])
    for t in req.topics:
        meta, error = await _topic(ctx, resolver, Op.READ, t.topic_name)
        rows = []
        for p in t.partitions:
            code = error
            if code == ErrorCode.none and not 0 <= p.partition_index < meta.partitions:
                code = ErrorCode.unknown_topic_or_partition
            rows.append((dict(partition_index=p.partition_index, error_code=code, error_message=None), p.start_offset))
        topics.append((dict(topic_name=t.topic_name, topic_id=meta.uuid if meta is not None else NO_TOPIC_ID), meta, rows))

    async def change():
        for _entry, meta, rows in topics:
            for row, offset in rows:
                if row["error_code"] == ErrorCode.none:
                    await _put_start(ctx.broker.metadata, req.group_id, meta.name, row["partition_index"],
                                     meta.topic_id, offset)

    code = await group_refusal(ctx, req.group_id)
    try:
        code = code or await _coordinator(ctx).share.while_empty(req.group_id, change)
    except STORE_DOWN:
        code = ErrorCode.coordinator_not_available
    except ConflictError:
        code = ErrorCode.unknown_server_error
    if code != ErrorCode.none:
        for _entry, _meta, rows in topics:
            for row, _offset in rows:
                row["error_code"] = row["error_code"] or code
    responses = [dict(entry, partitions=[row for row, _ in rows]) for entry, _meta, rows in topics]
    return build(cls, throttle_time=0, error_code=code, error_message=None, responses=responses)


# -- DeleteShareGroupOffsets ---------------------------------------------------------------------


async def delete_share_group_offsets(ctx, req):
    cls = response(ApiKey.DELETE_SHARE_GROUP_OFFSETS, ctx.version)
    resolver = TopicIdResolver(ctx.broker)
    topics = []  # (response entry, meta or None)
    for t in req.topics:
        meta, error = await _topic(ctx, resolver, Op.READ, t.topic_name)
        topics.append((dict(topic_name=t.topic_name, topic_id=meta.uuid if meta is not None else NO_TOPIC_ID,
                            error_code=error, error_message=None), meta))

    async def change():
        doomed = [(meta.name, p) for entry, meta in topics if entry["error_code"] == ErrorCode.none
                  for p in range(meta.partitions)]
        if doomed:
            await ctx.broker.metadata.delete_share_states(req.group_id, doomed)

    code = await group_refusal(ctx, req.group_id)
    try:
        code = code or await _coordinator(ctx).share.while_empty(req.group_id, change)
    except STORE_DOWN:
        code = ErrorCode.coordinator_not_available
    responses = [entry if code == ErrorCode.none or entry["error_code"] else dict(entry, error_code=code)
                 for entry, _meta in topics]
    return build(cls, throttle_time=0, error_code=code, error_message=None, responses=responses)


def register(router):
    router.register(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, describe_share_group_offsets)
    router.register(ApiKey.ALTER_SHARE_GROUP_OFFSETS, alter_share_group_offsets)
    router.register(ApiKey.DELETE_SHARE_GROUP_OFFSETS, delete_share_group_offsets)
