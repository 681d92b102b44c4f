"""What each API needs, Kafka's way: (operation, resource) checks run before the handler
when `--authorizer acls` is on. A request naming any resource the principal may not use
is answered whole with the resource type's error (TOPIC_/GROUP_/CLUSTER_/
TRANSACTIONAL_ID_AUTHORIZATION_FAILED) in every topic, partition or group it named
(Kafka answers per topic; a client asking for several topics at once where only some
are denied gets all of them refused here). Metadata filters instead (handlers/metadata.py).
"""

from __future__ import annotations

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.security.acl import CLUSTER_NAME, Operation as Op, ResourceType as Res

DENIED_CODE = {
    Res.TOPIC: ErrorCode.topic_authorization_failed,
    Res.GROUP: ErrorCode.group_authorization_failed,
    Res.CLUSTER: ErrorCode.cluster_authorization_failed,
    Res.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}


def host_of(peer: str) -> str:
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


async def _topic_names(ctx, items) -> list[str]:
    names = TopicIdResolver(ctx.broker)
    out = []
    for t in items or ():
        name = getattr(t, "name", None) or getattr(t, "topic", None)
        if name is None and getattr(t, "topic_id", None) is not None:
            name = await names.name(None, t.topic_id)
        if name is not None:
            out.append(name)
    return out


async def required(ctx, api_key: int, req) -> list[tuple]:
    """[(operation, resource type, name) | ("any-of", [(op, type, name), ...])] the request needs."""
    cluster = (Res.CLUSTER, CLUSTER_NAME)
    g = getattr
    if api_key == 0:  # Produce
        checks = [(Op.WRITE, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topic_data", ()))]
        if g(req, "transactional_id", None):
            checks.append((Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id))
        return checks
    if api_key == 1:  # Fetch (followers do not exist here)
        return [(Op.READ, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topics", ()))]
    if api_key in (2, 23):  # ListOffsets, OffsetForLeaderEpoch
        return [(Op.DESCRIBE, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topics", ()))]
    if api_key == 8:  # OffsetCommit
        return [(Op.READ, Res.GROUP, req.group_id)] + [(Op.READ, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topics", ()))]
    if api_key == 9:  # OffsetFetch
        groups = [x.group_id for x in g(req, "groups", ())] or ([req.group_id] if g(req, "group_id", None) is not None else [])
        return [(Op.DESCRIBE, Res.GROUP, x) for x in groups]
    if api_key == 10:  # FindCoordinator
        keys = list(g(req, "coordinator_keys", ()) or ()) or [req.key]
        kind = Res.TRANSACTIONAL_ID if g(req, "key_type", 0) == 1 else Res.GROUP
        return [(Op.DESCRIBE, kind, k) for k in keys]
    if api_key in (11, 12, 13, 14):  # JoinGroup, Heartbeat, LeaveGroup, SyncGroup
        return [(Op.READ, Res.GROUP, req.group_id)]
    if api_key == 15:  # DescribeGroups
        return [(Op.DESCRIBE, Res.GROUP, x) for x in req.groups]
    if api_key == 19:  # CreateTopics: CREATE on the cluster or on each topic
        return [("any-of", [(Op.CREATE, *cluster), (Op.CREATE, Res.TOPIC, t.name)]) for t in req.topics]
    if api_key in (20, 21):  # DeleteTopics, DeleteRecords
        return [(Op.DELETE, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topics", None) or [_Named(x) for x in g(req, "topic_names", ())])]
    if api_key == 22:  # InitProducerId
        if g(req, "transactional_id", None):
            return [(Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id)]
        return [("idempotent",)]
    if api_key in (24, 25, 26, 28):  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
        tid = g(req, "transactional_id", None)
        checks = [(Op.WRITE, Res.TRANSACTIONAL_ID, tid)] if tid else []
        if api_key in (25, 28):
            checks.append((Op.READ, Res.GROUP, req.group_id))
        return checks
    if api_key == 27:  # WriteTxnMarkers: brokers only
        return [(Op.CLUSTER_ACTION, *cluster)]
    if api_key == 37:  # CreatePartitions
        return [(Op.ALTER, Res.TOPIC, t.name) for t in req.topics]
    if api_key in (42, 47):  # DeleteGroups, OffsetDelete
        groups = list(g(req, "groups_names", ()) or ()) or [req.group_id]
        return [(Op.DELETE, Res.GROUP, x) for x in groups]
    if api_key in (32, 33, 44):  # DescribeConfigs, AlterConfigs, IncrementalAlterConfigs
        op = Op.DESCRIBE_CONFIGS if api_key == 32 else Op.ALTER_CONFIGS
        out = []
        for r in req.resources:
            if r.resource_type == 2:
                out.append((op, Res.TOPIC, r.resource_name))
            elif r.resource_type in (4, 8):  # broker, broker logger
                out.append((op, *cluster))
        return out
    if api_key == 50:  # DescribeUserScramCredentials
        return [(Op.DESCRIBE, *cluster)]
    if api_key == 51:  # AlterUserScramCredentials
        return [(Op.ALTER, *cluster)]
    if api_key == 60:  # DescribeCluster
        return [(Op.DESCRIBE, *cluster)]
    return []


class _Named:
    __slots__ = ("name", "topic_id")

    def __init__(self, name):
        self.name, self.topic_id = name, None


async def denied(ctx, api_key: int, req) -> tuple[int, str] | None:
    """(error code, reason) for the first check the principal fails, or None."""
    authz = ctx.broker.authorizer
    host = host_of(ctx.peer)
    for check in await required(ctx, api_key, req):
        if check[0] == "any-of":
            if any(authz.authorize(ctx.principal, host, op, rt, name, log_denial=False) for op, rt, name in check[1]):
                continue
            op, rt, name = check[1][-1]
            authz.authorize(ctx.principal, host, op, rt, name)  # counted and logged once
            return DENIED_CODE[rt], f"{ctx.principal} may not {op.name} {rt.name} {name}"
        if check[0] == "idempotent":
            if authz.authorize(ctx.principal, host, Op.IDEMPOTENT_WRITE, Res.CLUSTER, CLUSTER_NAME, log_denial=False) or authz.may_write_some_topic(ctx.principal, host):
                continue
            authz.authorize(ctx.principal, host, Op.IDEMPOTENT_WRITE, Res.CLUSTER, CLUSTER_NAME)
            return ErrorCode.cluster_authorization_failed, f"{ctx.principal} may not write idempotently"
        op, rt, name = check
        if not authz.authorize(ctx.principal, host, op, rt, name):
            return DENIED_CODE[rt], f"{ctx.principal} may not {op.name} {rt.name} {name}"
    return None
