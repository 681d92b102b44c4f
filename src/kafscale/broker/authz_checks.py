"""What each API needs, Kafka's way: (operation, resource) checks run before the handler
when `--authorizer acls` is on. A request naming a group, transactional id or cluster
action the principal may not use is answered whole with the resource type's error
(GROUP_/CLUSTER_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED). Topics of the APIs in
`PER_TOPIC` are authorized one by one, as Kafka does: the denied ones come back with
TOPIC_AUTHORIZATION_FAILED and the handler serves the rest (`split_topics`); other APIs
naming a denied topic are refused whole. Metadata filters instead (handlers/metadata.py).
"""

from __future__ import annotations

import dataclasses

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.protocol import error_response, fetch_response
from kafscale.security.acl import CLUSTER_NAME, Operation as Op, ResourceType as Res

DENIED_CODE = {
    Res.TOPIC: ErrorCode.topic_authorization_failed,
    Res.GROUP: ErrorCode.group_authorization_failed,
    Res.CLUSTER: ErrorCode.cluster_authorization_failed,
    Res.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}


# APIs whose topics Kafka authorizes one by one: request array, response array, operation.
PER_TOPIC = {
    0: ("topic_data", "responses", Op.WRITE),  # Produce
    1: ("topics", "responses", Op.READ),  # Fetch
    2: ("topics", "topics", Op.DESCRIBE),  # ListOffsets
    8: ("topics", "topics", Op.READ),  # OffsetCommit (its group is checked whole)
    21: ("topics", "topics", Op.DELETE),  # DeleteRecords
    23: ("topics", "topics", Op.DESCRIBE),  # OffsetForLeaderEpoch
    37: ("topics", "results", Op.ALTER),  # CreatePartitions
    61: ("topics", "topics", Op.READ),  # DescribeProducers
}


def host_of(peer: str) -> str:
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


def may(ctx, op: Op, resource_type: Res, name: str) -> bool:
    """For handlers that filter what they show (DescribeTransactions, ListTransactions):
    whether the principal may `op` the resource; True without an authorizer. Not logged as
    a denial (nothing is refused, something is left out)."""
    authz = ctx.broker.authorizer
    return not authz.enabled or authz.authorize(ctx.principal, host_of(ctx.peer), op, resource_type, name, log_denial=False)


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
    # (the topics of PER_TOPIC APIs: split_topics)
    if api_key == 0:  # Produce
        return [(Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id)] if g(req, "transactional_id", None) else []
    if api_key in (1, 2, 21, 23, 37, 61):  # Fetch (no followers here), ListOffsets, DeleteRecords, OffsetForLeaderEpoch, CreatePartitions, DescribeProducers
        return []
    if api_key == 8:  # OffsetCommit
        return [(Op.READ, Res.GROUP, req.group_id)]
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
    if api_key == 20:  # DeleteTopics
        return [(Op.DELETE, Res.TOPIC, n) for n in await _topic_names(ctx, g(req, "topics", None) or [_Named(x) for x in g(req, "topic_names", ())])]
    if api_key == 22:  # InitProducerId
        if g(req, "transactional_id", None):
            return [(Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id)]
        return [("idempotent",)]
    if api_key == 24 and g(req, "transactions", None) is not None:
        # AddPartitionsToTxn v4+: from brokers only (verification, transactions v2 adds), as Kafka
        return [(Op.CLUSTER_ACTION, *cluster)]
    if api_key == 25 and g(req, "transactional_id", None):
        # AddOffsetsToTxn: from the client, or from the group's broker adding the group of a
        # TxnOffsetCommit v5+ it authorized (transactions v2): CLUSTER_ACTION stands in.
        # (the client's check last: a denial answers with its code, as Kafka)
        return [("any-of", [(Op.CLUSTER_ACTION, *cluster), (Op.WRITE, Res.TRANSACTIONAL_ID, req.transactional_id)]),
                ("any-of", [(Op.CLUSTER_ACTION, *cluster), (Op.READ, Res.GROUP, req.group_id)])]
    if api_key in (24, 25, 26, 28):  # AddPartitionsToTxn v0-v3, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
        tid = g(req, "transactional_id", None)
        checks = [(Op.WRITE, Res.TRANSACTIONAL_ID, tid)] if tid else []
        if api_key in (25, 28):
            checks.append((Op.READ, Res.GROUP, req.group_id))
        return checks
    if api_key == 27:  # WriteTxnMarkers: brokers only
        return [(Op.CLUSTER_ACTION, *cluster)]
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


async def split_topics(ctx, api_key: int, req) -> tuple[object, object | None, tuple[int, str] | None]:
    """For a PER_TOPIC API: (request to serve, request of the denied topics or None, refusal
    or None). With some topics denied the handler serves the others and the server adds the
    denied ones to its answer (`merge_denied`); with all denied, or a Produce with acks=0
    (no answer to carry the errors: Kafka closes), the refusal answers the request whole."""
    spec = PER_TOPIC.get(api_key)
    if spec is None:
        return req, None, None
    field, _response_field, op = spec
    authz = ctx.broker.authorizer
    host = host_of(ctx.peer)
    allowed, denied = [], []
    first_denied = None
    for item in getattr(req, field, None) or ():
        [name] = await _topic_names(ctx, [item]) or [None]
        if name is None or authz.authorize(ctx.principal, host, op, Res.TOPIC, name):
            allowed.append(item)  # an unknown topic id: the handler answers UNKNOWN_TOPIC_ID
        else:
            denied.append(item)
            first_denied = first_denied or name
    if not denied:
        return req, None, None
    reason = f"{ctx.principal} may not {op.name} TOPIC {first_denied}"
    if not allowed or (api_key == 0 and getattr(req, "acks", -1) == 0):
        return req, None, (ErrorCode.topic_authorization_failed, reason)
    return _with(req, field, allowed), _with(req, field, denied), None


def refused_fetch(version: int, request, code: int) -> fetch_response.FetchResponse:
    """`code` in every partition the Fetch named, encoded as the fetch handler encodes (empty
    records, no leader epoch data); the top level is fine."""
    fr = fetch_response
    return fr.FetchResponse(version, [
        fr.TopicData(getattr(t, "topic", None), getattr(t, "topic_id", None), [fr.PartitionData(p.partition, code, -1, -1, -1) for p in t.partitions])
        for t in request.topics
    ])


def merge_denied(api_key: int, version: int, response, denied_request):
    """The handler's response with TOPIC_AUTHORIZATION_FAILED entries for the denied topics."""
    code = ErrorCode.topic_authorization_failed
    field = PER_TOPIC[api_key][1]
    if api_key == 1:
        extra = refused_fetch(version, denied_request, code)
    else:
        extra = error_response.build(api_key, version, denied_request, code)
    return _with(response, field, list(getattr(response, field)) + list(getattr(extra, field)))


def _with(obj, field: str, items: list):
    current = getattr(obj, field)
    return dataclasses.replace(obj, **{field: tuple(items) if isinstance(current, tuple) else list(items)})
