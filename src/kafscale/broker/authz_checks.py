"""What each API needs, Kafka's way: (operation, resource) checks run before the handler
when `--authorizer acls` is on. `RULES` holds one `Rule` per API, keyed by `ApiKey`; an API
without one needs nothing (ApiVersions, Metadata: it filters instead, handlers/metadata.py).

A request naming a group, transactional id or cluster action the principal may not use is
answered whole with the resource type's error (GROUP_/CLUSTER_/TRANSACTIONAL_ID_
AUTHORIZATION_FAILED). Topics of a rule with `PerTopic` are authorized one by one, as Kafka
does: the denied ones come back with TOPIC_AUTHORIZATION_FAILED and the handler serves the
rest (`split_topics`, `merge_denied`); a rule with `WholeTopics` refuses the request whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.protocol import error_response, fetch_response
from kafscale.protocol.api_keys import ApiKey
from kafscale.security.acl import CLUSTER_NAME, Operation as Op, ResourceType as Res

DENIED_CODE = {
    Res.TOPIC: ErrorCode.topic_authorization_failed,
    Res.GROUP: ErrorCode.group_authorization_failed,
    Res.CLUSTER: ErrorCode.cluster_authorization_failed,
    Res.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}
Refusal = tuple[int, str]  # (error code, reason)


# -- the checks a request can need -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Need:
    """`op` on one resource."""

    op: Op
    resource_type: Res
    name: str

    def allowed(self, authz, principal: str, host: str, log_denial: bool = True) -> bool:
        return authz.authorize(principal, host, self.op, self.resource_type, self.name, log_denial=log_denial)

    def refusal(self, principal: str) -> Refusal:
        return DENIED_CODE[self.resource_type], f"{principal} may not {self.op.name} {self.resource_type.name} {self.name}"

    def denial(self, authz, principal: str, host: str) -> Refusal | None:
        return None if self.allowed(authz, principal, host) else self.refusal(principal)


@dataclass(frozen=True, slots=True)
class AnyOf:
    """Any one of `options` suffices; a denial is logged and answered as the last one's."""

    options: tuple[Need, ...]

    def denial(self, authz, principal: str, host: str) -> Refusal | None:
        if any(n.allowed(authz, principal, host, log_denial=False) for n in self.options):
            return None
        last = self.options[-1]
        last.allowed(authz, principal, host)  # counted and logged once
        return last.refusal(principal)


@dataclass(frozen=True, slots=True)
class IdempotentWrite:
    """A producer id without a transactional id: IDEMPOTENT_WRITE on the cluster, or WRITE
    on some topic (Kafka 2.8+, KIP-679)."""

    def denial(self, authz, principal: str, host: str) -> Refusal | None:
        need = _cluster(Op.IDEMPOTENT_WRITE)
        if need.allowed(authz, principal, host, log_denial=False) or authz.may_write_some_topic(principal, host):
            return None
        need.allowed(authz, principal, host)
        return ErrorCode.cluster_authorization_failed, f"{principal} may not write idempotently"


Check = Need | AnyOf | IdempotentWrite


@dataclass(frozen=True, slots=True)
class PerTopic:
    """Topics authorized one by one: `request_field` / `response_field` hold them."""

    request_field: str
    response_field: str
    op: Op


@dataclass(frozen=True, slots=True)
class WholeTopics:
    """Every topic the request names (by name or id) needs `op`, or it is refused whole."""

    op: Op
    items: Callable[[Any], Any]


def _refused_by_error_response(api_key: int, version: int, request, code: int):
    return error_response.build(api_key, version, request, code)


@dataclass(frozen=True, slots=True)
class Rule:
    """What one API needs: `needs(request)` lists the checks beyond its topics."""

    needs: Callable[[Any], list[Check]] = lambda _req: []
    topics: PerTopic | WholeTopics | None = None
    # the answer to a refused request (or to its denied topics): `code` everywhere it names
    refused: Callable[[int, int, Any, int], Any] = _refused_by_error_response


# -- the rules ---------------------------------------------------------------------------------


def _cluster(op: Op) -> Need:
    return Need(op, Res.CLUSTER, CLUSTER_NAME)


def _writes_txn(tid: str) -> Need:
    return Need(Op.WRITE, Res.TRANSACTIONAL_ID, tid)


def _group(op: Op) -> Callable[[Any], list[Check]]:
    return lambda req: [Need(op, Res.GROUP, req.group_id)]


def _consumer_group_heartbeat(req) -> list[Check]:
    # Kafka: READ on the group, DESCRIBE on each topic named in the subscription.
    return [Need(Op.READ, Res.GROUP, req.group_id),
            *(Need(Op.DESCRIBE, Res.TOPIC, t) for t in (req.subscribed_topic_names or ()))]


def _produce(req) -> list[Check]:
    return [_writes_txn(req.transactional_id)] if getattr(req, "transactional_id", None) else []


def _offset_fetch(req) -> list[Check]:
    groups = [x.group_id for x in getattr(req, "groups", ())] or ([req.group_id] if getattr(req, "group_id", None) is not None else [])
    return [Need(Op.DESCRIBE, Res.GROUP, x) for x in groups]


def _find_coordinator(req) -> list[Check]:
    keys = list(getattr(req, "coordinator_keys", ()) or ()) or [req.key]
    kind = Res.TRANSACTIONAL_ID if getattr(req, "key_type", 0) == 1 else Res.GROUP
    return [Need(Op.DESCRIBE, kind, k) for k in keys]


def _create_topics(req) -> list[Check]:
    # CREATE on the cluster or on each topic
    return [AnyOf((_cluster(Op.CREATE), Need(Op.CREATE, Res.TOPIC, t.name))) for t in req.topics]


def _init_producer_id(req) -> list[Check]:
    return [_writes_txn(req.transactional_id)] if getattr(req, "transactional_id", None) else [IdempotentWrite()]


def _add_partitions_to_txn(req) -> list[Check]:
    if getattr(req, "transactions", None) is not None:
        return [_cluster(Op.CLUSTER_ACTION)]  # v4+: from brokers only (verification, transactions v2 adds), as Kafka
    return _end_txn(req)


def _add_offsets_to_txn(req) -> list[Check]:
    tid = getattr(req, "transactional_id", None)
    if not tid:
        return [Need(Op.READ, Res.GROUP, req.group_id)]
    # From the client, or from the group's broker adding the group of a TxnOffsetCommit v5+
    # it authorized (transactions v2): CLUSTER_ACTION stands in. (The client's check last:
    # a denial answers with its code, as Kafka.)
    return [AnyOf((_cluster(Op.CLUSTER_ACTION), _writes_txn(tid))), AnyOf((_cluster(Op.CLUSTER_ACTION), Need(Op.READ, Res.GROUP, req.group_id)))]


def _end_txn(req) -> list[Check]:
    tid = getattr(req, "transactional_id", None)
    return [_writes_txn(tid)] if tid else []


def _txn_offset_commit(req) -> list[Check]:
    return [*_end_txn(req), Need(Op.READ, Res.GROUP, req.group_id)]


def _delete_groups(req) -> list[Check]:
    groups = list(getattr(req, "groups_names", ()) or ()) or [req.group_id]
    return [Need(Op.DELETE, Res.GROUP, x) for x in groups]


def _configs(op: Op) -> Callable[[Any], list[Check]]:
    def needs(req) -> list[Check]:
        out: list[Check] = []
        for r in req.resources:
            if r.resource_type == 2:  # topic
                out.append(Need(op, Res.TOPIC, r.resource_name))
            elif r.resource_type in (4, 8):  # broker, broker logger
                out.append(_cluster(op))
            elif r.resource_type == 32:  # group: Kafka checks DESCRIBE_CONFIGS / ALTER_CONFIGS on the group
                out.append(Need(op, Res.GROUP, r.resource_name))
        return out

    return needs


class _Named:
    __slots__ = ("name", "topic_id")

    def __init__(self, name):
        self.name, self.topic_id = name, None


def _deleted_topics(req):
    return getattr(req, "topics", None) or [_Named(x) for x in getattr(req, "topic_names", ())]


def refused_fetch(_api_key: int, version: int, request, code: int) -> fetch_response.FetchResponse:
    """`code` in every partition the Fetch named, encoded as the fetch handler encodes (empty
    records, no leader epoch data); the top level is fine."""
    fr = fetch_response
    return fr.FetchResponse(version, [
        fr.TopicData(getattr(t, "topic", None), getattr(t, "topic_id", None), [fr.PartitionData(p.partition, code, -1, -1, -1) for p in t.partitions])
        for t in request.topics
    ])


RULES: dict[int, Rule] = {
    ApiKey.PRODUCE: Rule(_produce, PerTopic("topic_data", "responses", Op.WRITE)),
    ApiKey.FETCH: Rule(topics=PerTopic("topics", "responses", Op.READ), refused=refused_fetch),  # no followers here
    ApiKey.LIST_OFFSETS: Rule(topics=PerTopic("topics", "topics", Op.DESCRIBE)),
    ApiKey.OFFSET_COMMIT: Rule(_group(Op.READ), PerTopic("topics", "topics", Op.READ)),
    ApiKey.OFFSET_FETCH: Rule(_offset_fetch),
    ApiKey.FIND_COORDINATOR: Rule(_find_coordinator),
    ApiKey.JOIN_GROUP: Rule(_group(Op.READ)),
    ApiKey.HEARTBEAT: Rule(_group(Op.READ)),
    ApiKey.LEAVE_GROUP: Rule(_group(Op.READ)),
    ApiKey.SYNC_GROUP: Rule(_group(Op.READ)),
    ApiKey.DESCRIBE_GROUPS: Rule(lambda req: [Need(Op.DESCRIBE, Res.GROUP, x) for x in req.groups]),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: Rule(_consumer_group_heartbeat),
    ApiKey.CONSUMER_GROUP_DESCRIBE: Rule(lambda req: [Need(Op.DESCRIBE, Res.GROUP, x) for x in req.group_ids]),
    ApiKey.SHARE_GROUP_HEARTBEAT: Rule(_consumer_group_heartbeat),  # Kafka checks the same
    ApiKey.SHARE_GROUP_DESCRIBE: Rule(lambda req: [Need(Op.DESCRIBE, Res.GROUP, x) for x in req.group_ids]),
    ApiKey.SHARE_FETCH: Rule(_group(Op.READ)),  # READ on each topic: in the handler (handlers/share_fetch.py)
    ApiKey.SHARE_ACKNOWLEDGE: Rule(_group(Op.READ)),
    # TOPIC DESCRIBE (90) / READ (91, 92) on each topic: in the handler (handlers/share_offsets.py)
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: Rule(lambda req: [Need(Op.DESCRIBE, Res.GROUP, g.group_id) for g in req.groups]),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: Rule(_group(Op.READ)),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: Rule(_group(Op.DELETE)),
    ApiKey.CREATE_TOPICS: Rule(_create_topics),
    ApiKey.DELETE_TOPICS: Rule(topics=WholeTopics(Op.DELETE, _deleted_topics)),
    ApiKey.DELETE_RECORDS: Rule(topics=PerTopic("topics", "topics", Op.DELETE)),
    ApiKey.INIT_PRODUCER_ID: Rule(_init_producer_id),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: Rule(topics=PerTopic("topics", "topics", Op.DESCRIBE)),
    ApiKey.ADD_PARTITIONS_TO_TXN: Rule(_add_partitions_to_txn),
    ApiKey.ADD_OFFSETS_TO_TXN: Rule(_add_offsets_to_txn),
    ApiKey.END_TXN: Rule(_end_txn),
    ApiKey.WRITE_TXN_MARKERS: Rule(lambda _req: [_cluster(Op.CLUSTER_ACTION)]),  # brokers only
    ApiKey.TXN_OFFSET_COMMIT: Rule(_txn_offset_commit),
    ApiKey.DESCRIBE_CONFIGS: Rule(_configs(Op.DESCRIBE_CONFIGS)),
    ApiKey.ALTER_CONFIGS: Rule(_configs(Op.ALTER_CONFIGS)),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: Rule(_configs(Op.ALTER_CONFIGS)),
    ApiKey.CREATE_PARTITIONS: Rule(topics=PerTopic("topics", "results", Op.ALTER)),
    ApiKey.DELETE_GROUPS: Rule(_delete_groups),
    ApiKey.OFFSET_DELETE: Rule(_delete_groups),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: Rule(lambda _req: [_cluster(Op.DESCRIBE)]),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: Rule(lambda _req: [_cluster(Op.ALTER)]),
    ApiKey.DESCRIBE_CLUSTER: Rule(lambda _req: [_cluster(Op.DESCRIBE)]),
    ApiKey.DESCRIBE_PRODUCERS: Rule(topics=PerTopic("topics", "topics", Op.READ)),
}
NO_RULE = Rule()


# -- applying them -----------------------------------------------------------------------------


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


async def denied(ctx, api_key: int, req) -> Refusal | None:
    """The refusal of the first check the principal fails, or None."""
    rule = RULES.get(api_key, NO_RULE)
    authz, host = ctx.broker.authorizer, host_of(ctx.peer)
    for check in rule.needs(req):
        refusal = check.denial(authz, ctx.principal, host)
        if refusal is not None:
            return refusal
    if isinstance(rule.topics, WholeTopics):
        for name in await _topic_names(ctx, rule.topics.items(req)):
            refusal = Need(rule.topics.op, Res.TOPIC, name).denial(authz, ctx.principal, host)
            if refusal is not None:
                return refusal
    return None


async def authorize(ctx, api_key: int, req) -> tuple[object, object | None, Refusal | None]:
    """(request to serve, request of its denied topics or None, refusal of the whole request
    or None): the rule's checks first, then its topics (`split_topics`)."""
    refusal = await denied(ctx, api_key, req)
    if refusal is not None:
        return req, None, refusal
    return await split_topics(ctx, api_key, req)


async def split_topics(ctx, api_key: int, req) -> tuple[object, object | None, Refusal | None]:
    """For a PerTopic rule: (request to serve, request of the denied topics or None, refusal
    or None). With some topics denied the handler serves the others and the server adds the
    denied ones to its answer (`merge_denied`); with all denied, or a Produce with acks=0
    (no answer to carry the errors: Kafka closes), the refusal answers the request whole."""
    spec = RULES.get(api_key, NO_RULE).topics
    if not isinstance(spec, PerTopic):
        return req, None, None
    authz = ctx.broker.authorizer
    host = host_of(ctx.peer)
    allowed, denied = [], []
    first_denied = None
    for item in getattr(req, spec.request_field, None) or ():
        [name] = await _topic_names(ctx, [item]) or [None]
        if name is None or authz.authorize(ctx.principal, host, spec.op, Res.TOPIC, name):
            allowed.append(item)  # an unknown topic id: the handler answers UNKNOWN_TOPIC_ID
        else:
            denied.append(item)
            first_denied = first_denied or name
    if not denied:
        return req, None, None
    reason = f"{ctx.principal} may not {spec.op.name} TOPIC {first_denied}"
    if not allowed or (api_key == ApiKey.PRODUCE and getattr(req, "acks", -1) == 0):
        return req, None, (ErrorCode.topic_authorization_failed, reason)
    return _with(req, spec.request_field, allowed), _with(req, spec.request_field, denied), None


def refused(api_key: int, version: int, request, code: int):
    """The answer to a request refused whole: `code` everywhere it names (None: Produce
    with acks=0, which has no answer)."""
    return RULES.get(api_key, NO_RULE).refused(api_key, version, request, code)


def merge_denied(api_key: int, version: int, response, denied_request):
    """The handler's response with TOPIC_AUTHORIZATION_FAILED entries for the denied topics."""
    field = RULES[api_key].topics.response_field
    extra = refused(api_key, version, denied_request, ErrorCode.topic_authorization_failed)
    return _with(response, field, list(getattr(response, field)) + list(getattr(extra, field)))


def _with(obj, field: str, items: list):
    current = getattr(obj, field)
    return dataclasses.replace(obj, **{field: tuple(items) if isinstance(current, tuple) else list(items)})
