"""ShareFetch (78) and ShareAcknowledge (79) of KIP-932, served by each partition's owner.

The rules live in `kafscale.share` (`partition.py`: record states; `sessions.py`: share
sessions; `manager.py`: the driver and durability); this module translates requests and
responses: topic ids, acknowledgements piggybacked on ShareFetch, the long poll
(MaxWaitMs: until a session partition has records to acquire, new or released), and
NOT_LEADER_OR_FOLLOWER with the current leader for partitions owned elsewhere.

Version 2 (Kafka 4.2) adds the RENEW acknowledge type (KIP-1222: restart the locks of
held records; allowed only with IsRenewAck, and a ShareFetch carrying renewals fetches
nothing, its fetch limits all 0, as in Kafka) and ShareAcquireMode (KIP-1206: 1,
record-limit, acquires no more than MaxRecords)."""

from __future__ import annotations

import asyncio
import logging
import time

from kafscale.broker.handlers.groups import _client_host
from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode, KafkaError
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.security.acl import Operation as Op, ResourceType as Res
from kafscale.share.partition import Ack
from kafscale.storage.failures import STORE_FAILURES, StorageError

log = logging.getLogger("kafscale.share")


class _Part:
    """One partition of a request: its acknowledgement outcome and what was fetched."""

    __slots__ = ("topic_id", "index", "name", "acks", "ack_error", "ack_message", "error", "message", "chunks", "acquired")

    def __init__(self, topic_id, index: int, name: str | None):
        self.topic_id, self.index, self.name = topic_id, index, name
        self.acks: list[Ack] = []
        self.ack_error, self.ack_message = ErrorCode.none, None
        self.error, self.message = ErrorCode.none, None
        self.chunks: list = []
        self.acquired: list = []


RENEW = 4  # the acknowledge type of ShareFetch and ShareAcknowledge v2


def _malformed(acks: list[Ack], max_type: int, renewing: bool) -> str | None:
    """Why a partition's acknowledgement batches are INVALID_REQUEST (Kafka's checks: ranges
    in order, one type or one per offset, known types, RENEW only with IsRenewAck), or None."""
    prev_last = -1
    for a in acks:
        if a.first_offset > a.last_offset or a.first_offset < prev_last:
            return f"acknowledgement batch {a.first_offset}-{a.last_offset} is out of order"
        if not a.types or (len(a.types) > 1 and len(a.types) != a.last_offset - a.first_offset + 1):
            return f"acknowledgement batch {a.first_offset}-{a.last_offset} has {len(a.types)} types"
        if any(t < 0 or t > max_type for t in a.types):
            return f"acknowledgement batch {a.first_offset}-{a.last_offset} has an unknown type"
        if RENEW in a.types and not renewing:
            return "RENEW acknowledgements need IsRenewAck set"
        prev_last = a.last_offset
    return None


async def _parts(ctx, topics, renewing: bool = False) -> dict[tuple, _Part]:
    """(topic id, partition) -> _Part of a request's topics (a topic may come twice).
    A topic the principal may not READ gets TOPIC_AUTHORIZATION_FAILED, as in Kafka;
    malformed acknowledgements INVALID_REQUEST for their partition."""
    names = TopicIdResolver(ctx.broker)
    out: dict[tuple, _Part] = {}
    for t in topics:
        name = await _name(ctx, names, t.topic_id)
        for p in t.partitions:
            part = out.get((t.topic_id, p.partition_index))
            if part is None:
                part = out[(t.topic_id, p.partition_index)] = _Part(t.topic_id, p.partition_index, name)
            part.acks += [Ack(b.first_offset, b.last_offset, tuple(b.acknowledge_types)) for b in p.acknowledgement_batches]
    max_type = RENEW if ctx.version >= 2 else RENEW - 1
    for part in out.values():
        if part.name is not None and not _may_read(ctx, part.name):
            part.error = part.ack_error = ErrorCode.topic_authorization_failed
            part.acks = []
        elif (why := _malformed(part.acks, max_type, renewing)) is not None:
            part.ack_error, part.ack_message, part.acks = ErrorCode.invalid_request, why, []
    return out


async def _name(ctx, names: TopicIdResolver, topic_id) -> str | None:
    try:
        return await names.name(None, topic_id)
    except StorageError:
        return None


def _may_read(ctx, topic: str) -> bool:
    authz = getattr(ctx.broker, "authorizer", None)
    if authz is None or not authz.enabled:
        return True
    return authz.authorize(ctx.principal, _client_host(ctx.peer).lstrip("/"), Op.READ, Res.TOPIC, topic)


def _refusal(e: BaseException) -> tuple[ErrorCode, str | None]:
    if isinstance(e, KafkaError):
        return e.code, e.message
    return ErrorCode.kafka_storage_error, str(e)


async def _acknowledge(ctx, group_id: str, member_id: str, parts) -> None:
    """Apply every partition's acknowledgements (durable when this returns)."""
    shares = ctx.broker.shares
    for part in parts:
        if not part.acks:
            continue
        if part.name is None:
            part.ack_error = ErrorCode.unknown_topic_id
            continue
        try:
            await shares.acknowledge(group_id, member_id, part.name, part.index, part.acks)
        except (KafkaError, *STORE_FAILURES) as e:
            part.ack_error, part.ack_message = _refusal(e)
            log.info("share group %s member %s: acknowledgement of %s-%d refused with %s: %s", group_id, member_id,
                     part.name, part.index, part.ack_error.name.upper(), part.ack_message)


def _leader(ctx, part: _Part, cls, endpoints: dict) -> object:
    cluster = ctx.broker.cluster
    leader_id, epoch = -1, -1
    moved = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
    if part.name is not None and (part.error in moved or part.ack_error in moved):
        try:
            leader_id, epoch = cluster.owner_of(part.name, part.index), cluster.leader_epoch(part.name, part.index)
        except Exception:
            leader_id = -1
        node = cluster.node(leader_id) if leader_id >= 0 else None
        where = node.endpoint(ctx.listener) if node is not None else None
        if where is not None:
            endpoints[leader_id] = dict(node_id=leader_id, host=where[0], port=where[1], rack=node.rack)
    return make(nested(cls, "LeaderIdAndEpoch"), leader_id=leader_id, leader_epoch=epoch)


async def _fetch(ctx, group_id: str, member_id: str, session, parts: dict, req) -> None:
    """Acquire records from the session's partitions, waiting up to MaxWaitMs for any."""
    shares = ctx.broker.shares
    names = TopicIdResolver(ctx.broker)
    for tid, index in sorted(session.partitions, key=str):
        if (tid, index) not in parts:
            part = parts[(tid, index)] = _Part(tid, index, await _name(ctx, names, tid))
            if part.name is not None and not _may_read(ctx, part.name):
                part.error = ErrorCode.topic_authorization_failed
    fetching = [parts[k] for k in sorted(parts, key=str) if k in session.partitions and not parts[k].error]
    deadline = time.monotonic() + req.max_wait.total_seconds()
    first_round = True
    while True:
        budget_records, budget_bytes = req.max_records, req.max_bytes
        for part in fetching:
            if part.name is None:
                part.error = ErrorCode.unknown_topic_id
                continue
            if budget_records <= 0 or budget_bytes <= 0:
                break
            try:
                got = await shares.acquire(group_id, member_id, part.name, part.index, budget_records, budget_bytes,
                                           new_session=first_round and req.share_session_epoch == 0,
                                           record_limit=getattr(req, "share_acquire_mode", 0) == RECORD_LIMIT,
                                           batch_size=req.batch_size)
            except (KafkaError, *STORE_FAILURES) as e:
                part.error, part.message = _refusal(e)
                continue
            part.chunks += got.chunks
            part.acquired += got.acquired
            budget_records -= sum(a.last_offset - a.first_offset + 1 for a in got.acquired)
            budget_bytes -= sum(len(c) for c in got.chunks)
        first_round = False
        remaining = deadline - time.monotonic()
        if any(p.acquired for p in fetching) or remaining <= 0 or not fetching or req.max_records <= 0:
            return
        if any(p.error for p in fetching):
            return
        wake = asyncio.get_running_loop().create_future()
        logs = [ctx.broker.logs.logs.get((p.name, p.index)) for p in fetching]
        logs = [lg for lg in logs if lg is not None]
        for lg in logs:
            lg.add_data_waiter(wake)
        shares.add_release_waiter(wake)
        try:
            await asyncio.wait_for(wake, remaining)
        except TimeoutError:
            pass
        finally:
            for lg in logs:
                lg.discard_data_waiter(wake)
            shares.discard_release_waiter(wake)


def _response(ctx, api_key: int, parts: dict, lock_ms: int, fetch: bool, **top):
    cls = response(api_key, ctx.version)
    endpoints: dict[int, dict] = {}
    by_topic: dict = {}
    for (tid, _), part in sorted(parts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        entry = dict(partition_index=part.index, current_leader=_leader(ctx, part, cls, endpoints))
        if fetch:
            entry.update(error_code=part.error, error_message=part.message, acknowledge_error_code=part.ack_error,
                         acknowledge_error_message=part.ack_message,
                         records=b"".join(bytes(c) for c in part.chunks),
                         acquired_records=[dict(first_offset=a.first_offset, last_offset=a.last_offset,
                                                delivery_count=a.delivery_count) for a in part.acquired])
        else:
            entry.update(error_code=part.ack_error, error_message=part.ack_message)
        by_topic.setdefault(tid, []).append(entry)
    topics = [dict(topic_id=tid, partitions=ps) for tid, ps in by_topic.items()]
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, acquisition_lock_timeout=lock_ms,
                responses=topics, node_endpoints=list(endpoints.values()), **top)


def _refused(ctx, api_key: int, code: ErrorCode, message: str | None):
    return make(response(api_key, ctx.version), throttle_time=0, error_code=code, error_message=message,
                acquisition_lock_timeout=0, responses=[], node_endpoints=[])


BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1  # ShareAcquireMode (v2)


def _bad_fetch(req, renewing: bool) -> str | None:
    if not req.group_id or not req.member_id:
        return "GroupId and MemberId must be set."
    if getattr(req, "share_acquire_mode", BATCH_OPTIMIZED) not in (BATCH_OPTIMIZED, RECORD_LIMIT):
        return f"Unknown ShareAcquireMode {req.share_acquire_mode}."
    if renewing and (req.max_bytes or req.min_bytes or req.max_records or req.max_wait.total_seconds()):
        # Kafka's rule: a fetch now could outlast the locks just renewed
        return "MaxBytes, MinBytes, MaxRecords and MaxWaitMs must be 0 when IsRenewAck is set."
    return None


async def share_fetch(ctx, req):
    shares = ctx.broker.shares
    renewing = ctx.version >= 2 and req.is_renew_ack
    if (why := _bad_fetch(req, renewing)) is not None:
        log.info("ShareFetch of group %s member %s refused: %s", req.group_id, req.member_id, why)
        return _refused(ctx, ApiKey.SHARE_FETCH, ErrorCode.invalid_request, why)
    settings = await shares.settings.for_group(req.group_id)
    parts = await _parts(ctx, req.topics, renewing)
    forget = {(t.topic_id, p) for t in req.forgotten_topics_data for p in t.partitions}
    key = (req.group_id, req.member_id)
    try:
        session, closing = shares.sessions.fetch(key, req.share_session_epoch, shares.clock(), set(parts), forget,
                                                 fetching=req.max_records > 0 and bool(parts), connection=ctx.peer)
    except KafkaError as e:
        log.info("ShareFetch of group %s member %s at session epoch %d refused with %s: %s", req.group_id,
                 req.member_id, req.share_session_epoch, e.code.name.upper(), e.message)
        return _refused(ctx, ApiKey.SHARE_FETCH, e.code, e.message)
    await _acknowledge(ctx, req.group_id, req.member_id, parts.values())
    if closing:
        await shares.close_session(session)
    elif req.max_records > 0:
        await _fetch(ctx, req.group_id, req.member_id, session, parts, req)
    # Partitions with nothing to say are left out of an incremental answer, as in Kafka.
    if req.share_session_epoch != 0:
        parts = {k: p for k, p in parts.items() if p.acks or p.acquired or p.error or k not in session.partitions}
    return _response(ctx, ApiKey.SHARE_FETCH, parts, settings.record_lock_duration_ms, fetch=True)


async def share_acknowledge(ctx, req):
    shares = ctx.broker.shares
    if not req.group_id or not req.member_id:
        return _refused(ctx, ApiKey.SHARE_ACKNOWLEDGE, ErrorCode.invalid_request, "GroupId and MemberId must be set.")
    settings = await shares.settings.for_group(req.group_id)
    try:
        session, closing = shares.sessions.acknowledge((req.group_id, req.member_id), req.share_session_epoch,
                                                       shares.clock())
    except KafkaError as e:
        log.info("ShareAcknowledge of group %s member %s at session epoch %d refused with %s: %s", req.group_id,
                 req.member_id, req.share_session_epoch, e.code.name.upper(), e.message)
        return _refused(ctx, ApiKey.SHARE_ACKNOWLEDGE, e.code, e.message)
    parts = await _parts(ctx, req.topics, ctx.version >= 2 and req.is_renew_ack)
    await _acknowledge(ctx, req.group_id, req.member_id, parts.values())
    if closing:
        await shares.close_session(session)
    return _response(ctx, ApiKey.SHARE_ACKNOWLEDGE, parts, settings.record_lock_duration_ms, fetch=False)


def register(router):
    router.register(ApiKey.SHARE_FETCH, share_fetch)
    router.register(ApiKey.SHARE_ACKNOWLEDGE, share_acknowledge)

