"""The consumer group protocol of KIP-848: ConsumerGroupHeartbeat (68) and
ConsumerGroupDescribe (69). The rules live in `kafscale.groups.consumer_group`; this module
translates requests and responses (topic ids on the wire, names in subscriptions)."""

from __future__ import annotations

import logging
import uuid

from kafscale.broker.handlers.groups import (
    GROUP_OPERATIONS,
    STORE_DOWN,
    _client_host,
    _coordinator,
    _ms,
    _owned,
    _topic_lookup,
    _topic_names,
    build,
)
from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.consumer_group import HeartbeatRequest
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import nested, response
from kafscale.security.acl import ResourceType as Res

log = logging.getLogger("kafscale.groups")


def _by_topic(tps) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic_id, p in sorted(tps):
        out.setdefault(topic_id, []).append(p)
    return out


async def answer_heartbeat(ctx, api_key: int, req, call):
    """A consumer or share group heartbeat's answer: `call(groups)` runs it on the group
    coordinator and gives the machine's result; refusals become the error response."""
    cls = response(api_key, ctx.version)
    groups = _coordinator(ctx)

    def refused(code: ErrorCode, message: str | None = None):
        return build(cls, throttle_time=0, error_code=code, error_message=message, member_id=None, member_epoch=-1,
                     heartbeat_interval=0, assignment=None)

    if not req.group_id:
        return refused(ErrorCode.invalid_request, "GroupId can't be empty.")
    if groups is None or not await _owned(ctx, req.group_id):
        return refused(ErrorCode.not_coordinator)
    try:
        result = await call(groups)
    except KafkaError as e:
        # The client sees the code (and the message); the log says who and why.
        log.info("%s of group %r member %r epoch %d refused with %s: %s", ApiKey(api_key).name, req.group_id,
                 req.member_id, req.member_epoch, e.code.name.upper(), e.message)
        return refused(e.code, e.message)
    except STORE_DOWN:
        return refused(ErrorCode.coordinator_not_available)
    assignment = None
    if result.assignment is not None:
        # (a single nested entity: built here, the builder converts only lists of dicts)
        assignment = build(nested(cls, "Assignment"), topic_partitions=[
            dict(topic_id=uuid.UUID(t), partitions=ps) for t, ps in _by_topic(result.assignment).items()])
    return build(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, member_id=result.member_id,
                 member_epoch=result.member_epoch, heartbeat_interval=result.heartbeat_interval_ms, assignment=assignment)


async def consumer_group_heartbeat(ctx, req):
    owned = None
    if req.topic_partitions is not None:
        owned = frozenset((str(t.topic_id), p) for t in req.topic_partitions for p in t.partitions)
    request = HeartbeatRequest(
        member_id=req.member_id, member_epoch=req.member_epoch, instance_id=req.instance_id, rack_id=req.rack_id,
        rebalance_timeout_ms=_ms(req.rebalance_timeout), subscribed_topic_names=req.subscribed_topic_names,
        subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None), server_assignor=req.server_assignor,
        owned=owned, client_id=ctx.client_id or "", client_host=_client_host(ctx.peer), version=ctx.version,
    )
    return await answer_heartbeat(ctx, ApiKey.CONSUMER_GROUP_HEARTBEAT, req, lambda groups: groups.consumer.heartbeat(
        req.group_id, request, _topic_lookup(ctx), _topic_names(ctx)))


async def describe_modern_groups(ctx, api_key: int, req, driver_of, kind: str, describe):
    """ConsumerGroupDescribe / ShareGroupDescribe: `driver_of(groups)` is the driver of the
    kind of group asked about; `describe(cls, group, assignment)` gives the entry's fields
    (members, epochs, assignor), `assignment(tps)` building an Assignment with topic names."""
    cls = response(api_key, ctx.version)
    groups = _coordinator(ctx)
    out = []
    for group_id in req.group_ids:
        entry = dict(group_id=group_id, group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[])
        try:
            if groups is None or not await _owned(ctx, group_id):
                out.append(dict(entry, error_code=ErrorCode.not_coordinator))
                continue
            group = await driver_of(groups).describe(group_id)
        except STORE_DOWN:
            out.append(dict(entry, error_code=ErrorCode.coordinator_not_available))
            continue
        if group is None:
            out.append(dict(entry, error_code=ErrorCode.group_id_not_found,
                            error_message=f"Group {group_id} not found or not a {kind} group."))
            continue
        names = {tid: name for name, (tid, _) in group.topics.items()}

        def assignment(tps):
            return build(nested(cls, "Assignment"), topic_partitions=[dict(topic_id=uuid.UUID(t), topic_name=names.get(t, ""), partitions=ps)
                                          for t, ps in _by_topic(tps).items()])

        if req.include_authorized_operations:
            authz = getattr(ctx.broker, "authorizer", None)
            entry["authorized_operations"] = GROUP_OPERATIONS if authz is None else authz.authorized_operations(
                ctx.principal, _client_host(ctx.peer).lstrip("/"), Res.GROUP, group_id)
        entry.update(error_code=ErrorCode.none, group_state=group.state.value, group_epoch=group.group_epoch,
                     **describe(group, assignment))
        out.append(entry)
    return build(cls, throttle_time=0, groups=out)


async def consumer_group_describe(ctx, req):
    def describe(group, assignment):
        members = [
            dict(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                 client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                 subscribed_topic_regex=m.subscribed_topic_regex, assignment=assignment(m.assigned),
                 target_assignment=assignment(group.target.get(m.member_id, frozenset())),
                 member_type=0 if m.uses_classic else 1)  # 0: a classic member, 1: consumer protocol
            for m in group.members.values()
        ]
        return dict(assignment_epoch=group.target_epoch, assignor_name=group.preferred_assignor(), members=members)

    return await describe_modern_groups(ctx, ApiKey.CONSUMER_GROUP_DESCRIBE, req, lambda groups: groups.consumer,
                                        "consumer", describe)


def register(router):
    router.register(ApiKey.CONSUMER_GROUP_HEARTBEAT, consumer_group_heartbeat)
    router.register(ApiKey.CONSUMER_GROUP_DESCRIBE, consumer_group_describe)
