"""Share groups of KIP-932: ShareGroupHeartbeat (76) and ShareGroupDescribe (77). The rules
live in `kafscale.groups.share_group`; this module translates requests and responses
(topic ids on the wire, names in subscriptions). ShareFetch and ShareAcknowledge, served by
the partitions' owners, are in `share_fetch.py`."""

from __future__ import annotations

import logging
import uuid

from kafscale.broker.handlers.consumer_groups import _by_topic, _topic_lookup
from kafscale.broker.handlers.groups import GROUP_OPERATIONS, STORE_DOWN, _client_host, _coordinator, _owned, build
from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.share_group import SHARE_ASSIGNOR, ShareHeartbeatRequest
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import nested, response
from kafscale.security.acl import ResourceType as Res

log = logging.getLogger("kafscale.groups")


async def share_group_heartbeat(ctx, req):
    cls = response(ApiKey.SHARE_GROUP_HEARTBEAT, ctx.version)
    groups = _coordinator(ctx)

    def refused(code: ErrorCode, message: str | None = None):
        return build(cls, throttle_time=0, error_code=code, error_message=message, member_id=None, member_epoch=-1,
                     heartbeat_interval=0, assignment=None)

    if not req.group_id:
        return refused(ErrorCode.invalid_request, "GroupId can't be empty.")
    if groups is None or not await _owned(ctx, req.group_id):
        return refused(ErrorCode.not_coordinator)
    request = ShareHeartbeatRequest(
        member_id=req.member_id, member_epoch=req.member_epoch, rack_id=req.rack_id,
        subscribed_topic_names=req.subscribed_topic_names, client_id=ctx.client_id or "",
        client_host=_client_host(ctx.peer),
    )
    try:
        result = await groups.share.heartbeat(req.group_id, request, _topic_lookup(ctx))
    except KafkaError as e:
        log.info("ShareGroupHeartbeat of group %r member %r epoch %d refused with %s: %s", req.group_id,
                 req.member_id, req.member_epoch, e.code.name.upper(), e.message)
        return refused(e.code, e.message)
    except STORE_DOWN:
        return refused(ErrorCode.coordinator_not_available)
    assignment = None
    if result.assignment is not None:
        assignment = build(nested(cls, "Assignment"), topic_partitions=[
            dict(topic_id=uuid.UUID(t), partitions=ps) for t, ps in _by_topic(result.assignment).items()])
    return build(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, member_id=result.member_id,
                 member_epoch=result.member_epoch, heartbeat_interval=result.heartbeat_interval_ms, assignment=assignment)


async def share_group_describe(ctx, req):
    cls = response(ApiKey.SHARE_GROUP_DESCRIBE, ctx.version)
    groups = _coordinator(ctx)
    out = []
    for group_id in req.group_ids:
        entry = dict(group_id=group_id, group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[])
        try:
            if groups is None or not await _owned(ctx, group_id):
                out.append(dict(entry, error_code=ErrorCode.not_coordinator))
                continue
            group = await groups.share.describe(group_id)
        except STORE_DOWN:
            out.append(dict(entry, error_code=ErrorCode.coordinator_not_available))
            continue
        if group is None:
            out.append(dict(entry, error_code=ErrorCode.group_id_not_found,
                            error_message=f"Group {group_id} not found or not a share group."))
            continue
        names = {tid: name for name, (tid, _) in group.topics.items()}
        members = [
            dict(member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                 client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                 assignment=build(nested(cls, "Assignment"), topic_partitions=[
                     dict(topic_id=uuid.UUID(t), topic_name=names.get(t, ""), partitions=ps)
                     for t, ps in _by_topic(m.assigned).items()]))
            for m in group.members.values()
        ]
        if req.include_authorized_operations:
            authz = getattr(ctx.broker, "authorizer", None)
            entry["authorized_operations"] = GROUP_OPERATIONS if authz is None else authz.authorized_operations(
                ctx.principal, _client_host(ctx.peer).lstrip("/"), Res.GROUP, group_id)
        entry.update(error_code=ErrorCode.none, group_state=group.state.value, group_epoch=group.group_epoch,
                     assignment_epoch=group.assignment_epoch, assignor_name=SHARE_ASSIGNOR, members=members)
        out.append(entry)
    return build(cls, throttle_time=0, groups=out)


def register(router):
    router.register(ApiKey.SHARE_GROUP_HEARTBEAT, share_group_heartbeat)
    router.register(ApiKey.SHARE_GROUP_DESCRIBE, share_group_describe)
