"""Fetch (1): stored batches returned as they are, with a long poll over all requested
partitions at once (MaxWaitMs / MinBytes), request and partition byte limits.

isolation_level 1 (read_committed): only the whole batches below the last stable offset,
with the aborted transactions of the returned range (the consumer drops their records and
the control batches); only the partition's owner knows its open transactions, so a
read_committed fetch elsewhere is NOT_LEADER_OR_FOLLOWER."""

from __future__ import annotations

import asyncio
import time

from kafscale.broker.topics import TopicIdResolver
from kafscale.errors import ErrorCode
from kafscale.metadata import topic_config
from kafscale.protocol import fetch_response, legacy_records, records
from kafscale.protocol.api_keys import ApiKey
from kafscale.storage.failures import StorageError

READ_COMMITTED = 1


class _Part:
    __slots__ = ("topic", "index", "offset", "max_bytes", "leader_epoch", "log", "error", "chunks", "size", "lso")

    def __init__(self, topic, index, offset, max_bytes, leader_epoch):
        self.topic, self.index, self.offset, self.max_bytes, self.leader_epoch = topic, index, offset, max_bytes, leader_epoch
        self.log = None
        self.error = ErrorCode.none
        self.chunks = []
        self.size = 0
        self.lso = None  # read_committed: the last stable offset the read was bounded by


async def _resolve(ctx, req) -> list[tuple[object, list[_Part]]]:
    broker = ctx.broker
    names = TopicIdResolver(broker)
    out = []
    for ft in req.topics:
        topic_id = getattr(ft, "topic_id", None)
        name, lookup_error = await names.name_or_error(getattr(ft, "topic", None), topic_id)
        parts = []
        # Fetch v0-v3 is served by down-converting (protocol/legacy.py): Kafka answers
        # UNSUPPORTED_VERSION where the topic turned that off (message.downconversion.enable)
        no_conversion = ctx.wire_version is not None and name is not None and not await _downconversion_enabled(broker, names, name)
        for fp in ft.partitions:
            p = _Part(name, fp.partition, fp.fetch_offset, fp.partition_max_bytes, getattr(fp, "current_leader_epoch", -1))
            if lookup_error is not None:
                p.error = lookup_error.error_code
            elif name is None:
                p.error = ErrorCode.unknown_topic_id
            elif no_conversion:
                p.error = ErrorCode.unsupported_version
            else:
                try:
                    p.log = await broker.logs.get_reader(name, fp.partition)
                except StorageError as e:
                    p.error = e.error_code
            if p.log is not None and p.leader_epoch >= 0 and p.leader_epoch != p.log.leader_epoch:
                p.error = ErrorCode.fenced_leader_epoch if p.leader_epoch < p.log.leader_epoch else ErrorCode.unknown_leader_epoch
            parts.append(p)
        out.append(((name, topic_id), parts))
    return out


async def _downconversion_enabled(broker, names: TopicIdResolver, name: str) -> bool:
    try:
        meta = await names.by_name(name)
    except StorageError:
        return True  # the partition lookup that follows answers the store's failure
    if meta is None:
        return True  # unknown topic: the partition lookup answers that
    return topic_config.LogSettings.from_configs(meta.configs, broker.config.kafka_static_configs()).downconversion


async def _read(parts: list[_Part], max_bytes: int, committed: bool, legacy: bool = False) -> int:
    """Read every partition that has data; returns the bytes gathered."""
    # Segments not in the cache are loaded for all partitions at once (a consumer catching
    # up on several partitions); the reads below then go in order, as the byte budget needs.
    loads = [p.log.start_load(p.offset) for p in parts if not p.error and p.log is not None]
    loads = [f for f in loads if f is not None]
    if len(loads) > 1:
        await asyncio.wait(loads)
    total = 0
    for p in parts:
        if p.error or p.log is None:
            continue
        budget = min(p.max_bytes, max_bytes - total)
        if budget <= 0 and total > 0:
            continue
        if committed:
            p.lso = p.log.last_stable_offset
            if p.lso is None:  # a view of a partition owned elsewhere: the owner knows
                p.error = ErrorCode.not_leader_or_follower
                continue
        try:
            p.chunks = await p.log.read(p.offset, max(budget, 0), at_least_one=(total == 0), upto=p.lso)
            if legacy:
                p.chunks = await _past_unconvertible(p, max(budget, 0), total == 0, p.lso)
        except StorageError as e:
            p.error = e.error_code
            continue
        p.size = sum(len(c) for c in p.chunks)
        total += p.size
    return total


async def _past_unconvertible(p: _Part, budget: int, at_least_one: bool, upto: int | None) -> list:
    """Fetch v0-v3: batches that down-convert to no message at or after the fetch offset
    (emptied or control batches, a compacted batch's tail) would send an old consumer back
    to the same offset forever: read on past them (their offsets are gaps to it)."""
    chunks, offset = p.chunks, p.offset
    while chunks and not legacy_records.has_messages_from(chunks, p.offset):
        offset = _end_of(chunks, offset)
        chunks = await p.log.read(offset, budget, at_least_one, upto) if offset < p.log.high_watermark else []
    return chunks


async def fetch(ctx, req):
    started = time.monotonic()
    max_wait = req.max_wait.total_seconds()
    topics = await _resolve(ctx, req)
    parts = [p for _, ps in topics for p in ps]
    committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
    while True:
        total = await _read(parts, req.max_bytes, committed, legacy=ctx.wire_version is not None)
        remaining = max_wait - (time.monotonic() - started)
        if total >= req.min_bytes or remaining <= 0 or any(p.error for p in parts) or not parts:
            break
        loop = asyncio.get_running_loop()
        wake = loop.create_future()
        for p in parts:
            if p.log is not None:
                p.log.add_data_waiter(wake)
        try:
            await asyncio.wait_for(wake, remaining)
        except TimeoutError:
            pass
        finally:
            for p in parts:
                if p.log is not None:
                    p.log.discard_data_waiter(wake)
    out = []
    for (name, topic_id), ps in topics:
        entries = []
        for p in ps:
            hw = p.log.high_watermark if p.log is not None else -1
            start = p.log.log_start_offset if p.log is not None else -1
            stable = p.log.last_stable_offset if p.log is not None else -1
            if stable is None:  # a view of a partition owned elsewhere: no open transactions known
                stable = hw
            aborted = None
            if committed and not p.error:
                aborted = []
                if p.log.may_have_aborted_from(p.offset):
                    aborted = p.log.aborted_transactions(p.offset, _end_of(p.chunks, p.offset))
            data = fetch_response.PartitionData(p.index, p.error, hw, stable, start, fetch_response.RecordChunks(p.chunks), aborted)
            entries.append(data)
        out.append(fetch_response.TopicData(name, topic_id, entries))
    return fetch_response.FetchResponse(ctx.version, out)


def _end_of(chunks, offset: int) -> int:
    """The offset after the last batch of `chunks` (`offset` when empty)."""
    end = offset
    for c in chunks:
        for _pos, h in records.iter_batches(c):
            end = h.last_offset + 1
    return end


def register(router):
    router.register(ApiKey.FETCH, fetch)
