"""Retention: which segments are past retention.ms / retention.bytes (a pure function), and
the background task that applies it to every owned partition log."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Iterable

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.topic_config import LogSettings
from kafscale.storage.partition_log import PartitionLog

log = logging.getLogger("kafscale.storage")


def segments_past_retention(segments: list[SegmentInfo], settings: LogSettings, now_ms: int) -> list[SegmentInfo]:
    """The whole segments past retention.ms / retention.bytes (-1: unlimited), oldest first:
    by time, the leading segments whose newest record (or, with no timestamps, whose
    creation) is older than retention.ms; by size, the leading segments whose removal keeps
    the log at or above retention.bytes. Only under cleanup.policy delete (as Kafka: a
    compact-only or empty policy keeps every segment; compaction shrinks a compacted log)."""
    s = settings
    if not s.cleanup_delete:
        return []
    segs = segments
    doomed = []
    if s.retention_ms >= 0:
        for seg in segs:
            if seg.max_timestamp >= 0 and seg.max_timestamp < now_ms - s.retention_ms:
                doomed.append(seg)
            elif seg.max_timestamp < 0 and seg.created_ms < now_ms - s.retention_ms:
                doomed.append(seg)
            else:
                break
    if s.retention_bytes >= 0:
        total = sum(seg.size for seg in segs)
        for seg in segs:
            if total - seg.size < s.retention_bytes and seg not in doomed:
                break
            total -= seg.size
            if seg not in doomed:
                doomed.append(seg)
    return doomed


class Retention:
    """Every interval: load the partitions this broker owns but has not loaded yet
    (`load_owned`), expire idle producer ids, and delete each owned log's segments past
    retention (the logs `owned_logs()` gives)."""

    def __init__(self, owned_logs: Callable[[], Iterable[PartitionLog]], load_owned: Callable[[], Awaitable[None]],
                 interval_s: float, producer_id_expiration_ms: int):
        self.owned_logs = owned_logs
        self.load_owned = load_owned
        self.interval_s = interval_s
        self.producer_id_expiration_ms = producer_id_expiration_ms

    async def run_forever(self) -> None:
        interval = self.interval_s
        while True:
            await asyncio.sleep(interval)
            await self.run_once()

    async def run_once(self) -> int:
        now_ms = int(time.time() * 1000)
        deleted = 0
        try:
            await self.load_owned()
        except Exception as e:  # noqa: BLE001 - stores unavailable: retry next round
            log.warning("retention: cannot load partitions: %s", e)
        for lg in list(self.owned_logs()):
            if lg.closed:
                continue
            lg.producers.expire(now_ms, self.producer_id_expiration_ms)
            try:
                doomed = segments_past_retention(lg.state.segments, lg.settings, now_ms)
                if doomed:
                    await lg.drop_leading_segments(doomed)
                    deleted += len(doomed)
            except Exception as e:  # noqa: BLE001 - retry next round
                log.warning("retention of %s-%s failed: %s", lg.topic, lg.partition, e, extra={"topic": lg.topic, "partition": lg.partition})
        return deleted
