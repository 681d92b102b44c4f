"""Transaction APIs over kio's whole version range.

InitProducerId (22) with a transactional id (called from `producers.py`),
AddPartitionsToTxn (24, v4+ batched and verify-only), AddOffsetsToTxn (25), EndTxn (26),
TxnOffsetCommit (28), DescribeTransactions (65), ListTransactions (66). Transactions v2
(KIP-890 part 2, with transaction.version finalized at 2): EndTxn v5+ bumps the epoch at
every end, TxnOffsetCommit v5+ adds its group to the transaction itself, and
AddPartitionsToTxn v4+ that is not verify-only is a partition leader adding the partition
of a Produce v12+ (handlers/produce.py). The rules live in
`kafscale.transactions` (state machine and coordinator); this module translates requests
and responses, which differ by version. Requests for a transactional id this broker does
not coordinate get NOT_COORDINATOR (clients find the coordinator again: FindCoordinator
with key type 1, in `groups.py`).

With `--transactions false` (BrokerConfig.transactions) the Broker takes these APIs out of
its table again, so they are not advertised and transactional ids are refused.
"""

from __future__ import annotations

import datetime
import logging

from kafscale.broker import authz_checks
from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.groups.coordinator import log_commit_refused
from kafscale.metadata.store import CommittedOffset
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import has_field, make, response
from kafscale.security.acl import Operation as Op, ResourceType as Res
from kafscale.storage.failures import STORE_FAILURES, StorageError
from kafscale.transactions.state import txn_offset_commit_error

TRANSACTION_APIS = (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.LIST_TRANSACTIONS)

OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default
STORE_DOWN = (*STORE_FAILURES, StorageError)
log = logging.getLogger("kafscale.transactions")

# From which version each API knows PRODUCER_FENCED (KIP-588); older ones get INVALID_PRODUCER_EPOCH.
PRODUCER_FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2, ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


def _ms(value) -> int:
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


def _for_version(api_key: int, version: int, error: ErrorCode) -> ErrorCode:
    if error is ErrorCode.producer_fenced and version < PRODUCER_FENCED_SINCE[api_key]:
        return ErrorCode.invalid_producer_epoch
    return error


# Kafka's -1 ("no transaction started") for a non-nullable timestamp: kio writes
# timestamp() * 1000 of a datetime, so one millisecond before the epoch.
NO_TIMESTAMP = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) - datetime.timedelta(milliseconds=1)


def _timestamp(ms: int):
    return NO_TIMESTAMP if ms < 0 else ms


def _txns(ctx):
    return ctx.broker.transactions


def _check(ctx, tid: str | None) -> ErrorCode | None:
    """INVALID_REQUEST / NOT_COORDINATOR when this broker cannot serve the id, else None."""
    if not tid:
        return ErrorCode.invalid_request
    if not _txns(ctx).owns(tid):
        return ErrorCode.not_coordinator
    return None


# -- InitProducerId ------------------------------------------------------------------------------


async def init_producer_id(ctx, req):
    """InitProducerId with a transactional id (producers.py hands these over)."""
    cls = response(ApiKey.INIT_PRODUCER_ID, ctx.version)

    def answer(error: ErrorCode, pid: int = -1, epoch: int = -1):
        return make(cls, throttle_time=0, error_code=_for_version(ApiKey.INIT_PRODUCER_ID, ctx.version, error),
                    producer_id=pid, producer_epoch=epoch)

    tid = req.transactional_id
    pid, epoch = getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
    if (pid == -1) != (epoch == -1):
        return answer(ErrorCode.invalid_request)
    if (error := _check(ctx, tid)) is not None:
        return answer(error)
    timeout_ms = _ms(req.transaction_timeout)
    if not _txns(ctx).timeout_valid(timeout_ms):
        return answer(ErrorCode.invalid_transaction_timeout)
    try:
        step = await _txns(ctx).init_producer_id(tid, timeout_ms, None if pid == -1 else (pid, epoch))
    except STORE_DOWN as e:
        log.warning("InitProducerId for %r: metadata store unavailable: %s", tid, e, extra=ctx.log_fields())
        return answer(ErrorCode.coordinator_not_available)
    if step.error is not ErrorCode.none:
        return answer(step.error)
    log.info("transactional id %r: producer id %d, epoch %d", tid, step.producer_id, step.producer_epoch, extra=ctx.log_fields())
    return answer(ErrorCode.none, step.producer_id, step.producer_epoch)


# -- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------------


async def _add_partitions_one(ctx, tid, pid, epoch, topics, verify_only: bool, batched: bool = False) -> dict[tuple[str, int], ErrorCode]:
    """Per-partition errors for one transaction of an AddPartitionsToTxn (`batched`: v4+,
    from a broker)."""
    wanted = [(t.name, p) for t in topics for p in t.partitions]
    if (error := _check(ctx, tid)) is not None:
        return {tp: error for tp in wanted}
    resolver = TopicIdResolver(ctx.broker)
    missing = {}
    for t in topics:
        meta = await resolver.by_name(t.name)
        for p in t.partitions:
            if meta is None or not 0 <= p < meta.partitions:
                missing[(t.name, p)] = ErrorCode.unknown_topic_or_partition
    if missing:
        # Kafka: one bad partition fails the whole transaction's request; the others are
        # OPERATION_NOT_ATTEMPTED.
        return {tp: missing.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    if verify_only:
        return await _txns(ctx).verify_partitions(tid, pid, epoch, wanted)
    # v4+ comes from a partition's broker: not verify-only, it is a transactions v2 Produce's add.
    error = await _txns(ctx).add_partitions(tid, pid, epoch, wanted, tv2=batched)
    return {tp: error for tp in wanted}


def _topic_results(errors: dict[tuple[str, int], ErrorCode], fix) -> list[dict]:
    by_topic: dict[str, list] = {}
    for (t, p), e in errors.items():
        by_topic.setdefault(t, []).append(dict(partition_index=p, partition_error_code=fix(e)))
    return [dict(name=t, results_by_partition=parts) for t, parts in by_topic.items()]


async def add_partitions_to_txn(ctx, req):
    cls = response(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.version)

    def fix(e):
        return _for_version(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.version, e)

    if not has_field(req, "transactions"):  # v0-v3: one transaction, from a client
        try:
            errors = await _add_partitions_one(ctx, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                               req.v3_and_below_producer_epoch, req.v3_and_below_topics, False)
        except STORE_DOWN:
            errors = {(t.name, p): ErrorCode.coordinator_not_available for t in req.v3_and_below_topics for p in t.partitions}
        return make(cls, throttle_time=0, results_by_topic_v3_and_below=_topic_results(errors, fix))
    results = []
    for txn in req.transactions:  # v4+: batched, from brokers (verify-only, or a transactions v2 produce's add)
        try:
            errors = await _add_partitions_one(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                               txn.topics, txn.verify_only, batched=True)
        except STORE_DOWN:
            errors = {(t.name, p): ErrorCode.coordinator_not_available for t in txn.topics for p in t.partitions}
        results.append(dict(transactional_id=txn.transactional_id, topic_results=_topic_results(errors, fix)))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, results_by_transaction=results)


async def add_offsets_to_txn(ctx, req):
    cls = response(ApiKey.ADD_OFFSETS_TO_TXN, ctx.version)
    tid = req.transactional_id
    error = _check(ctx, tid)
    if error is None:
        if not req.group_id:
            error = ErrorCode.invalid_group_id
        else:
            try:
                error = await _txns(ctx).add_partitions(tid, req.producer_id, req.producer_epoch, groups=[req.group_id])
            except STORE_DOWN:
                error = ErrorCode.coordinator_not_available
    return make(cls, throttle_time=0, error_code=_for_version(ApiKey.ADD_OFFSETS_TO_TXN, ctx.version, error))


# -- EndTxn ---------------------------------------------------------------------------------------


async def end_txn(ctx, req):
    cls = response(ApiKey.END_TXN, ctx.version)
    tid = req.transactional_id

    def answer(error: ErrorCode, pid: int = -1, epoch: int = -1):
        return make(cls, throttle_time=0, error_code=_for_version(ApiKey.END_TXN, ctx.version, error),
                    producer_id=pid, producer_epoch=epoch)

    if (error := _check(ctx, tid)) is not None:
        return answer(error)
    try:
        # EndTxn v5+ comes from clients using transactions v2 (KIP-890): every end bumps the epoch.
        step = await _txns(ctx).end_txn(tid, req.producer_id, req.producer_epoch, bool(req.committed), tv2=ctx.version >= 5)
    except STORE_DOWN:
        return answer(ErrorCode.coordinator_not_available)
    if step.error is not ErrorCode.none:
        return answer(step.error)
    return answer(ErrorCode.none, step.producer_id, step.producer_epoch)


# -- TxnOffsetCommit ------------------------------------------------------------------------------


async def txn_offset_commit(ctx, req):
    """Offsets of a transaction: held pending per (group, producer) until it ends. Answered
    by the group's coordinator, like OffsetCommit."""
    cls = response(ApiKey.TXN_OFFSET_COMMIT, ctx.version)
    groups = ctx.broker.groups
    group_id = req.group_id
    resolver = TopicIdResolver(ctx.broker)
    rows: list[tuple[str, int, ErrorCode | None]] = []
    offsets: dict[tuple[str, int], CommittedOffset] = {}
    try:
        for t in req.topics:
            meta = await resolver.by_name(t.name)
            for p in t.partitions:
                if meta is None or not 0 <= p.partition_index < meta.partitions:
                    rows.append((t.name, p.partition_index, ErrorCode.unknown_topic_or_partition))
                    continue
                metadata = p.committed_metadata if p.committed_metadata is not None else ""
                if len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                    rows.append((t.name, p.partition_index, ErrorCode.offset_metadata_too_large))
                    continue
                rows.append((t.name, p.partition_index, None))
                offsets[(t.name, p.partition_index)] = CommittedOffset(
                    offset=p.committed_offset,
                    leader_epoch=getattr(p, "committed_leader_epoch", -1),
                    metadata=metadata,
                )
        error = ErrorCode.none
        member_id = getattr(req, "member_id", "")  # v3+ (KIP-447); older versions name no member
        instance_id = getattr(req, "group_instance_id", None)
        refused = ""  # why this handler refuses the offsets (the group coordinator logs its own refusals)
        if offsets:
            if not group_id:
                error, refused = ErrorCode.invalid_group_id, "no group id"
            elif groups is None or not ctx.broker.cluster.is_group_coordinator(group_id):
                error, refused = ErrorCode.not_coordinator, "this broker does not coordinate the group"
            else:
                tid, pid, epoch = req.transactional_id, req.producer_id, req.producer_epoch
                if _txns(ctx).adds_implicitly("txn_offset_commit", ctx.version):
                    # Transactions v2: no AddOffsetsToTxn from the client; the group joins
                    # the transaction here (Kafka's group coordinator adds its partition).
                    error = await _txns(ctx).add_group(tid, pid, epoch, group_id)
                if error is ErrorCode.none:
                    error = await _txns(ctx).check_offset_commit(tid, pid, epoch, group_id)
                error = txn_offset_commit_error(error, ctx.version)
                if error is not ErrorCode.none:
                    refused = f"transaction {tid!r} (producer id {pid}, epoch {epoch}) cannot take offsets of the group"
                else:
                    error = await groups.commit_offsets(
                        group_id,
                        member_id=member_id,
                        group_instance_id=instance_id,
                        generation_id=getattr(req, "generation_id", -1),
                        offsets=offsets,
                        api_version=ctx.version,
                        pending_producer_id=pid,
                    )
        if refused:
            log_commit_refused("TxnOffsetCommit", group_id, member_id, instance_id,
                               _for_version(ApiKey.TXN_OFFSET_COMMIT, ctx.version, error), refused)
    except STORE_DOWN as e:
        error = ErrorCode.coordinator_not_available
        rows = [(t.name, p.partition_index, None) for t in req.topics for p in t.partitions]
        log_commit_refused("TxnOffsetCommit", group_id, getattr(req, "member_id", ""), getattr(req, "group_instance_id", None),
                           error, f"metadata store unavailable: {e}")
    error = _for_version(ApiKey.TXN_OFFSET_COMMIT, ctx.version, error)
    by_topic: dict[str, list] = {}
    for topic, partition, err in rows:
        by_topic.setdefault(topic, []).append(dict(partition_index=partition, error_code=error if err is None else err))
    return make(cls, throttle_time=0, topics=[dict(name=t, partitions=parts) for t, parts in by_topic.items()])


# -- DescribeTransactions / ListTransactions ------------------------------------------------------


async def describe_transactions(ctx, req):
    cls = response(ApiKey.DESCRIBE_TRANSACTIONS, ctx.version)
    states = []
    for tid in req.transactional_ids:
        entry = dict(transactional_id=tid, transaction_state="", transaction_timeout=0, transaction_start_time=NO_TIMESTAMP,
                     producer_id=-1, producer_epoch=-1, topics=[])
        error = _check(ctx, tid)
        if error is None and not authz_checks.may(ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, tid):
            error = ErrorCode.transactional_id_authorization_failed
        if error is None:
            try:
                meta = await _txns(ctx).describe(tid)
            except STORE_DOWN:
                meta, error = None, ErrorCode.coordinator_not_available
            if error is None and meta is None:
                error = ErrorCode.transactional_id_not_found
            if meta is not None:
                d = meta.describe()
                entry.update(
                    transaction_state=d["transaction_state"], transaction_timeout=d["transaction_timeout_ms"],
                    transaction_start_time=_timestamp(d["transaction_start_time_ms"]), producer_id=d["producer_id"],
                    producer_epoch=d["producer_epoch"],
                    # as Kafka: the partitions of topics the principal may not DESCRIBE are left out
                    topics=[dict(topic=t, partitions=ps) for t, ps in d["topics"].items() if authz_checks.may(ctx, Op.DESCRIBE, Res.TOPIC, t)],
                )
                error = ErrorCode.none
        states.append(dict(error_code=error, **entry))
    return make(cls, throttle_time=0, transaction_states=states)


async def list_transactions(ctx, req):
    import re

    from kafscale.transactions.state import TxnState

    cls = response(ApiKey.LIST_TRANSACTIONS, ctx.version)
    known = {s.value for s in TxnState}
    state_filters = list(getattr(req, "state_filters", ()) or ())
    unknown = [s for s in state_filters if s not in known]
    states = {s for s in state_filters if s in known}
    pids = set(getattr(req, "producer_id_filters", ()) or ())
    duration = getattr(req, "duration_filter", -1)
    pattern = getattr(req, "transactional_id_pattern", None)
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error:
        return make(cls, throttle_time=0, error_code=ErrorCode.invalid_regular_expression, unknown_state_filters=unknown,
                    transaction_states=[])
    try:
        listed = await _txns(ctx).list_transactions()
    except STORE_DOWN:
        return make(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available, unknown_state_filters=unknown,
                    transaction_states=[])
    now = _txns(ctx).clock()
    out = []
    for meta in listed:
        if meta.state is TxnState.DEAD:
            continue
        if pids and meta.producer_id not in pids:
            continue
        if state_filters and meta.state.value not in states:
            continue
        if duration >= 0 and now - meta.start_ms <= duration:
            continue
        if regex is not None and not regex.fullmatch(meta.transactional_id):
            continue
        if not authz_checks.may(ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, meta.transactional_id):
            continue  # Kafka lists only the ids the principal may DESCRIBE
        out.append(dict(transactional_id=meta.transactional_id, producer_id=meta.producer_id,
                        transaction_state=meta.state.value))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, unknown_state_filters=unknown, transaction_states=out)


def register(router):
    router.register(ApiKey.ADD_PARTITIONS_TO_TXN, add_partitions_to_txn)
    router.register(ApiKey.ADD_OFFSETS_TO_TXN, add_offsets_to_txn)
    router.register(ApiKey.END_TXN, end_txn)
    router.register(ApiKey.TXN_OFFSET_COMMIT, txn_offset_commit)
    router.register(ApiKey.DESCRIBE_TRANSACTIONS, describe_transactions)
    router.register(ApiKey.LIST_TRANSACTIONS, list_transactions)
