"""Produce (0): validate each batch (magic, CRC32C, size), assign offsets in place, and
answer once the flush that holds the batches is durable. Batches are never decompressed,
except to check record timestamps on topics that limit them (message.timestamp.*.max.ms),
record keys on compacted topics (records.check_keys) and schema ids on topics with
confluent.{key,value}.schema.validation (registry/validation.py).

Transactional batches (a request with a transactional id) are appended like any batch;
the partition opens the producer's transaction on it (storage/producers.py). The
coordinator's check that the partition is part of the producer's ongoing transaction is
the hook `broker.txn_produce_check` (docs/transactions.md): when the broker has one, it is
awaited as `check(transactional_id, producer_id, producer_epoch, topic, partition,
produce_version)` before the append and returns the ErrorCode to refuse the partition with,
or None to accept. With transactions v2 (Produce v12+, transaction.version 2) the same hook
adds the partition to the producer's transaction instead of only verifying it."""

from __future__ import annotations

import asyncio
import logging

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.metadata.internal_topics import is_internal
from kafscale.protocol import legacy_records, produce_request, records
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.protocol.produce_response import PartitionAnswer, ProduceAnswer, TopicAnswer
from kafscale.storage.failures import StorageError

log = logging.getLogger("kafscale.produce")


class _PartitionResult:
    __slots__ = ("index", "error", "message", "record_errors", "base_offset", "append_time", "log_start", "waiter", "batches")

    def __init__(self, index: int):
        self.index = index
        self.error = ErrorCode.none
        self.message = None
        self.record_errors = ()
        self.base_offset = -1
        self.append_time = -1
        self.log_start = -1
        self.waiter = None
        self.batches = 0


async def _append(ctx, topic: str, index: int, data, want_ack: bool, result: _PartitionResult, transactional_id: str | None = None) -> None:
    """Append to a log being loaded, or to a topic that validates schema ids."""
    try:
        lg = ctx.broker.logs.open_log(topic, index) or await ctx.broker.logs.get_log(topic, index)
        buf, headers = _validated(ctx, lg, data)
        settings = lg.settings
        if settings.schema_validation:  # confluent.{key,value}.schema.validation (registry/validation.py)
            await ctx.broker.schema_validator.check(topic, buf, headers, settings.key_schema_validation, settings.value_schema_validation)
        _append_validated(lg, buf, headers, want_ack, result, transactional_id)
    except (records.InvalidRecordError, StorageError) as e:
        _refused(ctx, topic, index, result, e)


def _append_now(ctx, lg, topic: str, index: int, data, want_ack: bool, result: _PartitionResult, transactional_id: str | None) -> None:
    """`_append` without a coroutine, for a loaded log of a topic without schema validation
    (nearly every partition of a Produce request: a coroutine a partition was a tenth of a
    small request's handling, #33)."""
    try:
        buf, headers = _validated(ctx, lg, data)
        _append_validated(lg, buf, headers, want_ack, result, transactional_id)
    except (records.InvalidRecordError, StorageError) as e:
        _refused(ctx, topic, index, result, e)


def _validated(ctx, lg, data) -> tuple[memoryview, list]:
    """The record set as a writable buffer and its batch headers, checked as the topic's
    settings say (raises InvalidRecordError)."""
    if data is None:
        raise records.InvalidRecordError("null record set", ErrorCode.invalid_record)
    # Offsets are patched in place: the zero-copy decoder hands us a writable view
    # into the request frame; anything else (bytes) is copied once.
    buf = data if isinstance(data, memoryview) and not data.readonly else memoryview(bytearray(data))
    settings = lg.settings
    max_bytes = settings.max_message_bytes
    if ctx.wire_version is not None and len(buf) > records.MAGIC and buf[records.MAGIC] < 2:
        # Produce v0-v2 with message format v0/v1: one v2 batch. Sizes are checked per
        # message, then the batch's (Kafka re-checks a converted batch's size too).
        buf = memoryview(legacy_records.up_convert(buf, max_bytes))
    headers = records.validate_record_set(buf, max_bytes)
    if not settings.log_append_time:  # message.timestamp.{before,after,difference}.max.ms
        records.check_timestamps(buf, headers, settings.timestamp_before_max_ms, settings.timestamp_after_max_ms)
    if settings.cleanup_compact:  # Kafka: a compacted topic refuses records without a key
        records.check_keys(buf, headers, f"{lg.topic}-{lg.partition}")
    return buf, headers


def _append_validated(lg, buf: memoryview, headers: list, want_ack: bool, result: _PartitionResult, transactional_id: str | None) -> None:
    if transactional_id is None and records.any_attribute(headers, records.TRANSACTIONAL_MASK):
        # As Kafka: transactional records need the request's transactional id (the
        # one authorized to write them).
        raise records.InvalidRecordError("transactional records without a transactional id", ErrorCode.transactional_id_authorization_failed)
    result.base_offset, result.append_time, result.waiter = lg.append(buf, headers, want_ack)
    result.log_start = lg.log_start_offset
    result.batches = len(headers)


def _refused(ctx, topic: str, index: int, result: _PartitionResult, e: Exception) -> None:
    if isinstance(e, records.InvalidRecordError):
        result.error, result.message, result.record_errors = e.error_code, str(e), e.record_errors
        log.warning("produce from client %s to %s-%d rejected: %s", ctx.client_id, topic, index, e, extra=ctx.log_fields(topic, index))
        return
    result.error, result.message = e.error_code, str(e)
    if e.error_code not in (ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower):
        log.warning("produce from client %s to %s-%d failed: %s", ctx.client_id, topic, index, e, extra=ctx.log_fields(topic, index))


async def _txn_check(ctx, transactional_id: str, topic: str, partition: int, data) -> ErrorCode | None:
    """The transaction coordinator's verdict on a transactional produce (None: go ahead)."""
    check = getattr(ctx.broker, "txn_produce_check", None)
    if check is None or data is None or len(data) < records.HEADER_SIZE:
        return None  # nothing to ask, or a record set the append refuses anyway
    h = records.read_header(data, 0)
    code = await check(transactional_id, h.producer_id, h.producer_epoch, topic, partition, ctx.version)
    return code if code else None


async def produce(ctx, req):
    broker = ctx.broker
    want_ack = req.acks != 0
    by_topic: list[tuple[str | None, object, list[_PartitionResult]]] = []
    names = TopicIdResolver(broker)
    # Offsets follow the connection's request order even when a request waits (e.g. for
    # its log to load) and a later one would not.
    await ctx.wait_turn()
    transactional_id = req.transactional_id
    open_log = broker.logs.open_log
    for td in req.topic_data:
        topic_id = getattr(td, "topic_id", None)
        name, lookup_error = await names.name_or_error(getattr(td, "name", None), topic_id)
        internal = is_internal(name)
        results = []
        for pd in td.partition_data:
            r = _PartitionResult(pd.index)
            if lookup_error is not None:
                r.error, r.message = lookup_error.error_code, str(lookup_error)
            elif name is None:
                r.error = ErrorCode.unknown_topic_id
            elif internal:
                # Kafka's ReplicaManager: only the broker itself writes internal topics.
                r.error, r.message = ErrorCode.invalid_topic_exception, f"Cannot append to internal topic {name}"
            elif transactional_id is not None and (refused := await _txn_check(ctx, transactional_id, name, pd.index, pd.records)):
                r.error, r.message = refused, f"transactional produce to {name}-{pd.index} refused by the transaction coordinator"
            elif (lg := open_log(name, pd.index)) is not None and not lg.settings.schema_validation:
                _append_now(ctx, lg, name, pd.index, pd.records, want_ack, r, transactional_id)
            else:
                await _append(ctx, name, pd.index, pd.records, want_ack, r, transactional_id)
            results.append(r)
        by_topic.append((name, topic_id, results))
    ctx.end_turn()
    if not want_ack:
        return None
    waiters = [r for _, _, rs in by_topic for r in rs if r.waiter is not None]
    if waiters:
        for r in waiters:
            # One by one: a flush answers all of a request's partitions in one pass, so the
            # first await wakes this handler and the rest are done by then (gather would
            # add a wake-up of the event loop to every acknowledgement).
            try:
                await r.waiter
            except Exception:  # noqa: BLE001 - each partition's outcome is read below
                pass
        for r in waiters:
            exc = r.waiter.exception()
            if exc is not None:
                r.error = exc.error_code if isinstance(exc, StorageError) else ErrorCode.kafka_storage_error
                r.message = str(exc)
                r.base_offset = -1
    if ctx.wire_version is None:  # encoded by hand (protocol/produce_response.py)
        return ProduceAnswer(ctx.version, [
            TopicAnswer(name, topic_id, [
                PartitionAnswer(r.index, r.error, r.base_offset, r.append_time, r.log_start, r.record_errors, r.message if r.error else None, r.batches)
                for r in results
            ])
            for name, topic_id, results in by_topic
        ])  # fmt: skip
    # An older version than kio's: kio's response, which protocol/legacy.py converts.
    cls = response(ApiKey.PRODUCE, ctx.version)
    topic_cls = nested(cls, "TopicProduceResponse")
    part_cls = nested(cls, "PartitionProduceResponse")
    out = []
    for name, topic_id, results in by_topic:
        parts = tuple(
            make(
                part_cls,
                index=r.index,
                error_code=r.error,
                base_offset=r.base_offset,
                log_append_time=r.append_time,
                log_start_offset=r.log_start,
                record_errors=tuple({"batch_index": i, "batch_index_error_message": m} for i, m in r.record_errors),
                error_message=r.message if r.error else None,
            )
            for r in results
        )
        out.append(make(topic_cls, name=name, topic_id=topic_id, partition_responses=parts))
    return make(cls, responses=tuple(out), throttle_time=0)


def register(router):
    router.register(ApiKey.PRODUCE, produce, decoder=produce_request.decode, in_order=True)
