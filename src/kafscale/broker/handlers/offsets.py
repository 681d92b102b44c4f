"""ListOffsets (2), DeleteRecords (21) and OffsetForLeaderEpoch (23)."""

from __future__ import annotations

import asyncio

from kafscale.errors import ErrorCode
from kafscale.metadata.internal_topics import is_internal
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import STORE_FAILURES, StorageError, store_failure

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
READ_COMMITTED = 1


async def _list_one(ctx, topic: str, p, committed: bool = False) -> dict:
    """One partition's offset. read_committed (as Kafka): latest is the last stable offset,
    and a timestamp lookup finds only offsets below it."""
    out = {"partition_index": p.partition_index, "error_code": ErrorCode.none, "timestamp": -1, "offset": -1, "leader_epoch": -1}
    try:
        lg = await ctx.broker.logs.get_log(topic, p.partition_index)
    except StorageError as e:
        out["error_code"] = e.error_code
        return out
    current = getattr(p, "current_leader_epoch", -1)
    if current >= 0 and current != lg.leader_epoch:
        out["error_code"] = ErrorCode.fenced_leader_epoch if current < lg.leader_epoch else ErrorCode.unknown_leader_epoch
        return out
    ts = p.timestamp
    out["leader_epoch"] = lg.leader_epoch
    try:
        if ts in (LATEST, LATEST_TIERED):
            out["offset"] = lg.last_stable_offset if committed else lg.high_watermark
        elif ts in (EARLIEST, EARLIEST_LOCAL):
            out["offset"] = lg.log_start_offset
        else:
            if ts == MAX_TIMESTAMP:
                out["offset"], out["timestamp"] = await lg.max_timestamp_offset()
            else:
                out["offset"], out["timestamp"] = await lg.offset_for_timestamp(ts)
            if committed and out["offset"] >= lg.last_stable_offset:
                out["offset"], out["timestamp"] = -1, -1
    except StorageError as e:
        out["error_code"] = e.error_code
    return out


async def _each_partition(ctx, req, api_key: int, topic_entity: str, partition_entity: str, one):
    """Response with `one(ctx, topic, partition)` run for every requested partition at once."""
    cls = response(api_key, ctx.version)
    t_cls, p_cls = nested(cls, topic_entity), nested(cls, partition_entity)
    topics = []
    for t in req.topics:
        parts = await asyncio.gather(*(one(ctx, t.name, p) for p in t.partitions))
        topics.append(make(t_cls, name=t.name, partitions=tuple(make(p_cls, **d) for d in parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))


async def list_offsets(ctx, req):
    committed = getattr(req, "isolation_level", 0) == READ_COMMITTED

    async def one(ctx, topic, p):
        return await _list_one(ctx, topic, p, committed)

    return await _each_partition(ctx, req, ApiKey.LIST_OFFSETS, "ListOffsetsTopicResponse", "ListOffsetsPartitionResponse", one)


async def _delete_one(ctx, topic: str, p) -> dict:
    out = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": ErrorCode.none}
    if is_internal(topic):  # Kafka: "Cannot delete records of internal topic"
        out["error_code"] = ErrorCode.invalid_topic_exception
        return out
    try:
        lg = await ctx.broker.logs.get_log(topic, p.partition_index)
        target = lg.high_watermark if p.offset == -1 else p.offset
        if target < 0 or target > lg.high_watermark:
            out["error_code"] = ErrorCode.offset_out_of_range
            return out
        await lg.advance_log_start(target)
        out["low_watermark"] = lg.log_start_offset
    except StorageError as e:
        out["error_code"] = e.error_code
    except STORE_FAILURES as e:  # a concurrent change (ownership moved) or a store failure
        out["error_code"] = store_failure(e, f"deleting records of {topic}-{p.partition_index}").error_code
    return out


async def delete_records(ctx, req):
    return await _each_partition(ctx, req, ApiKey.DELETE_RECORDS, "DeleteRecordsTopicResult", "DeleteRecordsPartitionResult", _delete_one)


async def offset_for_leader_epoch(ctx, req):
    """Each ownership change starts a new epoch at the then high watermark; with one epoch
    known per partition here, the end offset of the current (or any later) epoch is the
    high watermark, and of an unknown older epoch the log start (conservative)."""
    cls = response(ApiKey.OFFSET_FOR_LEADER_EPOCH, ctx.version)
    t_cls, p_cls = nested(cls, "OffsetForLeaderTopicResult"), nested(cls, "EpochEndOffset")
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            entry = {"partition": p.partition, "error_code": ErrorCode.none, "leader_epoch": -1, "end_offset": -1}
            try:
                lg = await ctx.broker.logs.get_log(t.topic, p.partition)
                current = getattr(p, "current_leader_epoch", -1)
                if current >= 0 and current != lg.leader_epoch:
                    entry["error_code"] = ErrorCode.fenced_leader_epoch if current < lg.leader_epoch else ErrorCode.unknown_leader_epoch
                elif p.leader_epoch > lg.leader_epoch:
                    pass  # unknown future epoch: -1/-1 as Kafka answers
                else:
                    end, epoch = ctx.broker.logs.epoch_end_offset(lg, p.leader_epoch)
                    entry["leader_epoch"], entry["end_offset"] = epoch, end
            except StorageError as e:
                entry["error_code"] = e.error_code
            parts.append(make(p_cls, **entry))
        topics.append(make(t_cls, topic=t.topic, partitions=tuple(parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))


def register(router):
    router.register(ApiKey.LIST_OFFSETS, list_offsets)
    router.register(ApiKey.DELETE_RECORDS, delete_records)
    router.register(ApiKey.OFFSET_FOR_LEADER_EPOCH, offset_for_leader_epoch)
