"""Share groups of KIP-932: ShareGroupHeartbeat (76) and ShareGroupDescribe (77). The rules
live in `kafscale.groups.share_group`; this module translates requests and responses
(topic ids on the wire, names in subscriptions). ShareFetch and ShareAcknowledge, served by
the partitions' owners, are in `share_fetch.py`."""

from __future__ import annotations

from kafscale.broker.handlers.consumer_groups import _topic_lookup, answer_heartbeat, describe_modern_groups
from kafscale.broker.handlers.groups import _client_host
from kafscale.groups.share_group import SHARE_ASSIGNOR, ShareHeartbeatRequest
from kafscale.protocol.api_keys import ApiKey


async def share_group_heartbeat(ctx, req):
    request = ShareHeartbeatRequest(
        member_id=req.member_id, member_epoch=req.member_epoch, rack_id=req.rack_id,
        subscribed_topic_names=req.subscribed_topic_names, client_id=ctx.client_id or "",
        client_host=_client_host(ctx.peer),
    )
    return await answer_heartbeat(ctx, ApiKey.SHARE_GROUP_HEARTBEAT, req, lambda groups: groups.share.heartbeat(
        req.group_id, request, _topic_lookup(ctx)))


async def share_group_describe(ctx, req):
    def describe(group, assignment):
        members = [
            dict(member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch, client_id=m.client_id,
                 client_host=m.client_host, subscribed_topic_names=m.subscribed_topic_names,
                 assignment=assignment(m.assigned))
            for m in group.members.values()
        ]
        return dict(assignment_epoch=group.assignment_epoch, assignor_name=SHARE_ASSIGNOR, members=members)

    return await describe_modern_groups(ctx, ApiKey.SHARE_GROUP_DESCRIBE, req, lambda groups: groups.share, "share",
                                        describe)


def register(router):
    router.register(ApiKey.SHARE_GROUP_HEARTBEAT, share_group_heartbeat)
    router.register(ApiKey.SHARE_GROUP_DESCRIBE, share_group_describe)
