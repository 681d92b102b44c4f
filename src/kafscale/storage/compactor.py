"""The log compactor: Kafka's log compaction over the object store (docs/compaction.md).

`Compactor.run_once()` looks at every partition log this broker owns whose topic has
`cleanup.policy` compact, and `Compactor.compact(lg)` runs one pass over one of them; the
segment merger's background loop calls `run_once` every `--compaction-interval-ms`, so
merging and compaction of a partition never run at once on a broker. The decisions are
storage/cleaner.py's (pure); this module does the I/O around them:

1. `cleaner.plan` picks the cleanable segments (or none: not due).
2. The key map is filled from the dirty segments (read by `SegmentRewriter.read_segment_batches`: the
   cached view only when it is exactly the committed object, else the store), whole
   segments only, within `key_map_bytes` (--compaction-key-map-bytes); the pass then covers
   the log from its start through the last segment mapped.
3. Those segments are grouped (input bytes <= segment.bytes); each group's batches are
   cleaned off the event loop (`asyncio.to_thread`) and, unless nothing changed, written as
   one segment under the group's first key with a conditional replace over the version read
   (an old owner's late pass is refused, as the merger's), its index after; one metadata
   transaction (`PartitionLog.swap_segments`) swaps the group for it; the group's other
   objects are deleted after the merger's grace period.

A crash at any point leaves a readable log: before the swap, the first key holds exactly
the survivors of its group (every record removed is superseded by one still in place, or a
tombstone past its horizon whose older values went with it), which readers bound by the
committed segment's offsets; after it, the swap is complete.

Use outside the broker (bench/bench_compaction.py): build a LogManager as the broker does,
then `await manager.compactor.compact(await manager.get_log(topic, partition))`; its counters
are `compactor.counters` (also on /metrics as kafscale_compaction_*).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from kafscale.storage import cleaner, segment
from kafscale.storage.partition_log import PartitionLog
from kafscale.storage.rewrite import SegmentRewriter

log = logging.getLogger("kafscale.compactor")


@dataclass
class CompactionCounters:
    """What compaction counts as it goes (/metrics: kafscale_compaction_*)."""

    rounds: int = 0  # looks at every owned compacted partition
    runs: int = 0  # passes completed
    bytes_read: int = 0
    bytes_written: int = 0
    segments_written: int = 0
    records_removed: int = 0
    recompressions: int = 0
    key_map_peak_entries: int = 0  # a gauge: the most keys one pass held


class Compactor:
    """Compacts the logs `owned_logs()` gives through `rewriter`; `schedule_delete` is the
    merger's (objects compacted away are deleted after its grace period)."""

    def __init__(self, owned_logs: Callable[[], Iterable[PartitionLog]], rewriter: SegmentRewriter, key_map_bytes: int, schedule_delete):
        self.owned_logs = owned_logs
        self.rewriter = rewriter
        self.key_map_bytes = key_map_bytes
        self.schedule_delete = schedule_delete
        # Awaited after each group written (the merger's delete_expired): a long pass runs
        # in the merger's loop, and the objects merged or compacted away must still go.
        self.between_groups = None
        self.counters = CompactionCounters()

    async def run_once(self) -> int:
        """One pass over every owned compacted partition that is due. Returns the passes done."""
        done = 0
        self.counters.rounds += 1
        for lg in list(self.owned_logs()):
            if lg.closed or not lg.settings.cleanup_compact:
                continue
            try:
                if await self.compact(lg):
                    done += 1
            except Exception as e:  # noqa: BLE001 - retried on the next round
                log.warning("compaction of %s-%s failed: %s", lg.topic, lg.partition, e, extra={"topic": lg.topic, "partition": lg.partition})
        return done

    async def compact(self, lg: PartitionLog, now_ms: int | None = None) -> bool:
        """One compaction pass over `lg` if it is due. True when a pass ran to its end."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        plan = cleaner.plan(lg.state.segments, last_stable_offset=lg.last_stable_offset, now_ms=now, settings=lg.settings)
        if plan is None:
            return False
        # 1. The key map, from the dirty segments: whole segments only.
        key_map = cleaner.KeyMap(self.key_map_bytes)
        end = plan.first_dirty
        for seg in plan.dirty:
            if not key_map.fits(seg.record_count):
                break
            data = await self._read(lg, seg)
            await asyncio.to_thread(key_map.add, data, plan.aborted)
            self.counters.bytes_read += len(data)
            end += 1
        if plan.dirty and end == plan.first_dirty:
            log.warning(
                "compaction of %s-%s: the segment at %d (%d records) does not fit the key map (%d entries, --compaction-key-map-bytes)",
                lg.topic, lg.partition, plan.dirty[0].base_offset, plan.dirty[0].record_count, key_map.capacity,
            )
            return False
        self.counters.key_map_peak_entries = max(self.counters.key_map_peak_entries, key_map.peak_entries)
        # 2. Clean from the log start through the last mapped segment, group by group.
        c = cleaner.BatchCleaner(
            key_map,
            now_ms=now,
            delete_retention_ms=lg.settings.delete_retention_ms,
            aborted=plan.aborted,
            producer_last_offsets=lg.producers.last_batch_offsets(),
        )
        removed_before = c.records_in - c.records_out
        for group in cleaner.group_segments(plan.segments[:end], lg.settings.segment_bytes):
            if not await self._clean_group(lg, group, c):
                return False  # the rest waits for the next pass
            if self.between_groups is not None:
                await self.between_groups()
        self.counters.records_removed += (c.records_in - c.records_out) - removed_before
        self.counters.recompressions += c.recompressions
        self.counters.runs += 1
        log.info(
            "compacted %s-%s (%s): offsets %d-%d, %d of %d records kept, key map %d entries",
            lg.topic, lg.partition, plan.reason, plan.segments[0].base_offset, plan.segments[end - 1].last_offset,
            c.records_out, c.records_in, len(key_map),
        )
        return True

    async def _read(self, lg: PartitionLog, seg: segment.SegmentInfo) -> memoryview:
        return await self.rewriter.read_segment_batches(lg.topic, lg.partition, seg)

    async def _clean_group(self, lg: PartitionLog, group: list[segment.SegmentInfo], c: cleaner.BatchCleaner) -> bool:
        read = await self.rewriter.read_run(lg, group, "compaction")
        if read is None:
            return False
        bodies = read.bodies
        results = await asyncio.to_thread(lambda: [c.clean(b) for b in bodies])
        self.counters.bytes_read += sum(len(b) for b in bodies)
        horizons = [r.delete_horizon_ms for r in results if r.delete_horizon_ms >= 0]
        if len(group) == 1 and group[0].cleaned and not results[0].changed:
            # Already clean: nothing to write. A horizon that passed with nothing to remove
            # (a marker whose transaction still has batches) is dropped from the metadata,
            # or the partition would be due for a pass forever.
            horizon = min(horizons, default=-1)
            if horizon != group[0].delete_horizon_ms:
                return await lg.swap_segments(group, dataclasses.replace(group[0], delete_horizon_ms=horizon))
            return True
        body = [r.body for r in results]  # uploaded as they are, joined only into the cache's view
        removed_markers = {o for r in results for o in r.removed_markers}
        enc = segment.encode(
            body,
            group[0].base_offset,
            created_ms=group[0].created_ms,
            aborted=tuple(a for seg in group for a in seg.aborted if a[2] not in removed_markers),
            open_txns=group[-1].open_txns,
            last_offset=group[-1].last_offset,
            cleaned=True,
            delete_horizon_ms=min(horizons, default=-1),
        )
        if not await self.rewriter.commit_run(lg, group, enc, body, read, self.schedule_delete, "compaction"):
            return False
        self.counters.bytes_written += enc.info.size
        self.counters.segments_written += 1
        log.debug("compaction of %s-%s: %d segments (%d bytes) -> offsets %d-%d (%d bytes)", lg.topic, lg.partition, len(group),
                  sum(s.size for s in group), group[0].base_offset, enc.info.last_offset, enc.info.size)
        return True
