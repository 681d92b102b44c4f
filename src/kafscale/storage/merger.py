"""Background merging of small adjacent segments.

Eager group-commit flushes make many small segments. The merger rewrites a run of small
adjacent segments into one segment of up to `segment.bytes`: byte-for-byte the same batches
at the same offsets, stored under the key of the run's first segment. One metadata
transaction swaps the run for the merged segment; the other objects of the run are deleted
only after a grace period, so fetches and Spark reads already holding the old segment list
keep working. A crash at any point loses nothing: before the swap the old segment list is
still valid (the first key now holds a superset of its batches, which readers bound by
offset), after it the merged segment is; leftover objects below the high watermark that
the metadata does not list are never adopted and are swept later.

The merged object replaces the first segment's only with a conditional replace based on
the version of that object the merge was built from (`ObjectStore.replace`): an old owner
whose merge lands late, after the new owner merged a longer run into the same key, is
refused and drops its merge; it never replaces a committed object with a shorter one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable

from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.partition_log import PartitionLog
from kafscale.storage.rewrite import SegmentRewriter

log = logging.getLogger("kafscale.merger")


def plan_runs(segments: list[segment.SegmentInfo], segment_bytes: int) -> list[list[segment.SegmentInfo]]:
    """Runs of >= 2 adjacent small segments whose merged size stays within segment_bytes.

    A segment is small when it is under half of segment_bytes; bigger ones are left alone
    so that no byte is rewritten more than a bounded number of times. A run never mixes
    segments the compactor wrote (SegmentInfo.cleaned) with others: the cleaned ones are a
    compacted log's cleaned prefix, and a merge keeps the flag."""
    runs: list[list[segment.SegmentInfo]] = []
    run: list[segment.SegmentInfo] = []
    size = 0
    for seg in segments:
        small = seg.size < segment_bytes // 2 and not seg.wao_key  # (write-ahead pieces: plan_write_ahead_runs)
        contiguous = not run or (run[-1].last_offset + 1 == seg.base_offset and run[-1].cleaned == seg.cleaned)
        if small and contiguous and size + seg.size <= segment_bytes:
            run.append(seg)
            size += seg.size
            continue
        if len(run) >= 2:
            runs.append(run)
        run, size = ([seg], seg.size) if small else ([], 0)
    if len(run) >= 2:
        runs.append(run)
    return runs


def plan_write_ahead_runs(segments: list[segment.SegmentInfo], segment_bytes: int, max_age_ms: int, now_ms: int,
                          last_apart: bool = False) -> list[list[segment.SegmentInfo]]:
    """Runs of adjacent segments held in write-ahead objects (SegmentInfo.wao_key) to
    rewrite into the partition's own spec segments: all of them once they hold half of
    segment_bytes, or once the oldest is `max_age_ms` old (a partition writing slowly);
    none before (so a rewrite writes few, well-filled segments). A run of one is a run
    here: its bytes move out of the shared object. Runs stay within segment_bytes and never
    mix cleaned and dirty segments. `last_apart` (a compacted log): the newest segment is a
    run of its own, as it is the active segment the compactor never cleans; merged with the
    ones before it, it would keep them from the compactor until the next flush."""
    pieces = [s for s in segments if s.wao_key]
    if not pieces:
        return []
    if sum(s.size for s in pieces) < segment_bytes // 2 and min(s.created_ms for s in pieces) > now_ms - max_age_ms:
        return []
    runs: list[list[segment.SegmentInfo]] = []
    run: list[segment.SegmentInfo] = []
    size = 0
    for i, seg in enumerate(segments):
        if not seg.wao_key:
            if run:
                runs.append(run)
            run, size = [], 0
            continue
        newest = last_apart and i == len(segments) - 1
        if run and (newest or run[-1].last_offset + 1 != seg.base_offset or run[-1].cleaned != seg.cleaned or size + seg.size > segment_bytes):
            runs.append(run)
            run, size = [], 0
        run.append(seg)
        size += seg.size
    if run:
        runs.append(run)
    return runs


# Where every acknowledgement waits for a flush of its own (eager flushes: the local
# directory's min flush interval of 0), the merger pauses after each merge and each deletion
# of merged-away objects this many times as long as the step took, so background rewriting
# takes at most a third of the broker's time in bursts: a round of back-to-back merges
# (reads, a multi-MiB write and fsync, thousands of unlinks on worker threads taking the GIL
# back after each syscall) held back the produce path's flushes (paced 100 B on the file
# store, bench/run.py: p99 49-93 ms with back-to-back merges, 27-37 ms paced, 16-19 ms with
# merging off; #33). On S3 (flushes every flush interval, merges waiting on the network)
# the rewrite of write-ahead pieces must keep up with 10 MB/s over 1,024 partitions (#32):
# no pauses there (LogManager sets `pause_factor`).
EAGER_FLUSH_PAUSE_FACTOR = 2.0
# How often objects past their grace are looked for between merge rounds.
DELETE_CHECK_INTERVAL_S = 1.0
# With merging off (--merge-interval-ms 0) the pieces of write-ahead objects are still
# rewritten into segments and the objects nothing refers to deleted, this often: else
# they would stay in the bucket for good.
WRITE_AHEAD_ROUND_S = 10.0


class SegmentMerger:
    """Merges runs of small segments, and deletes the merged-away objects later.

    How long those objects stay is bounded two ways, so their number is too: each one at
    most `grace_s`; and while more than `max_pending` segments wait, the oldest go as soon
    as they are `min_grace_s` old. The short grace is enough for every reader that holds a
    segment list: this broker's reads use a list at most one fetch old, other brokers'
    views are refreshed every FlushedPartition.MAX_AGE_S (0.5 s), and the pipeline reader
    re-lists a partition when a planned object is gone. So the store holds about
    (merged-away segments per second) x min_grace_s, or max_pending if more, beyond the
    live segments (a partition's flushes since its last merge).

    It merges the logs `owned_logs()` gives through `rewriter`, and deletes from `store`."""

    def __init__(self, store: ObjectStore, owned_logs: Callable[[], Iterable[PartitionLog]], rewriter: SegmentRewriter | None,
                 interval_s: float, grace_s: float, max_pending: int = 1000, min_grace_s: float = 5.0):
        self.store = store
        self.owned_logs = owned_logs
        self.rewriter = rewriter
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.max_pending = max_pending
        self.min_grace_s = min(min_grace_s, grace_s)
        self._doomed: list[tuple[float, list[str]]] = []  # (scheduled at, keys), oldest first
        self.pending_segments = 0  # merged-away segment objects waiting in _doomed
        self.merged_segments = 0
        self.merges = 0
        # The log compactor (storage/compactor.py), run from this loop so that merging and
        # compaction of a partition never overlap; set by the LogManager.
        self.compactor = None
        self.compaction_interval_s = 0.0
        self.pause_factor = 0.0  # EAGER_FLUSH_PAUSE_FACTOR where flushes are eager
        # Segments in write-ahead objects are rewritten into spec segments after at most
        # this long (plan_write_ahead_runs); the objects then go through `write_ahead_cleanup`
        # (storage/write_ahead_cleanup.py), run after each round; both set by the LogManager.
        self.segment_max_age_ms = 600_000
        self.write_ahead_cleanup = None
        # Whether the cleanup runs: with --write-ahead-objects, and once a segment in a
        # write-ahead object was seen (the flag turned off since: its objects still go).
        self.write_ahead_seen = False

    async def run_forever(self) -> None:
        """Merge every `interval_s` (0: never, but for the rewrite of write-ahead pieces and
        the cleanup, every WRITE_AHEAD_ROUND_S then), run the compactor (`compactor`, if set)
        every `compaction_interval_s`, and delete objects past their grace in between."""
        never = float("inf")
        start = time.monotonic()
        merge_small = self.interval_s > 0
        every = self.interval_s if merge_small else WRITE_AHEAD_ROUND_S if self.write_ahead_seen else 0
        next_merge = start + every if every > 0 else never
        next_compact = start + self.compaction_interval_s if self.compactor is not None and self.compaction_interval_s > 0 else never
        while True:
            await asyncio.sleep(max(0.0, min(min(next_merge, next_compact) - time.monotonic(), DELETE_CHECK_INTERVAL_S)))
            now = time.monotonic()
            acted = False
            if now >= next_merge:
                next_merge = now + every
                await self.run_once(merge_small)
                acted = True
            if now >= next_compact:
                try:
                    await self.compactor.run_once()
                except Exception:  # noqa: BLE001 - a bug must not stop merging
                    log.exception("compaction round failed")
                next_compact = time.monotonic() + self.compaction_interval_s
                acted = True
            if not acted:
                await self.delete_expired()

    async def run_once(self, merge_small: bool = True) -> int:
        """Merge every owned partition once (only its write-ahead pieces when not
        `merge_small`) and delete objects past their grace period."""
        done = 0
        for lg in list(self.owned_logs()):
            if lg.closed:
                continue
            segments = lg.state.segments
            if lg.settings.cleanup_compact:
                # The newest segment is a compacted log's active segment, never cleaned:
                # merged with the ones before it, it would keep them from the compactor
                # until the next flush.
                segments = segments[:-1]
            runs = plan_runs(segments, lg.settings.segment_bytes) if merge_small else []
            wal_runs = plan_write_ahead_runs(lg.state.segments, lg.settings.segment_bytes, self.segment_max_age_ms, int(time.time() * 1000),
                                             last_apart=lg.settings.cleanup_compact)
            self.write_ahead_seen = self.write_ahead_seen or bool(wal_runs) or any(s.wao_key for s in lg.state.segments[-1:])
            runs += wal_runs
            for run in runs:
                try:
                    started = time.monotonic()
                    if await self.merge(lg, run):
                        done += 1
                    await asyncio.sleep((time.monotonic() - started) * self.pause_factor)
                except Exception as e:  # noqa: BLE001 - retried on the next round
                    log.warning("merge of %s-%s at %d failed: %s", lg.topic, lg.partition, run[0].base_offset, e)
                    break
        await self.delete_expired()
        if self.write_ahead_cleanup is not None and self.write_ahead_seen:
            try:
                await self.write_ahead_cleanup.run_once()
            except Exception as e:  # noqa: BLE001 - tried again next round
                log.warning("write-ahead cleanup failed (will retry): %s", e)
        return done

    async def merge(self, lg: PartitionLog, run: list[segment.SegmentInfo]) -> bool:
        base = run[0].base_offset
        # The object the merged one replaces, read with its version (the replace happens only
        # if the key still holds exactly this object), and exactly the others' committed
        # batches (never a stale cached view; an object holding more, from an earlier merge
        # that never committed, is bounded by its offsets).
        read = await self.rewriter.read_run(lg, run, "merge")
        if read is None:
            return False
        body = read.bodies  # uploaded as read, joined only into the cache's view
        # The aborted-transaction entries of the run, in offset order (each segment's are).
        enc = segment.encode(
            body, base, created_ms=run[0].created_ms, aborted=tuple(a for seg in run for a in seg.aborted), open_txns=run[-1].open_txns,
            last_offset=run[-1].last_offset, cleaned=run[0].cleaned,
            delete_horizon_ms=min((s.delete_horizon_ms for s in run if s.delete_horizon_ms >= 0), default=-1),
        )
        if enc.info.last_offset != run[-1].last_offset:
            raise RuntimeError(f"merged segment ends at {enc.info.last_offset}, run ends at {run[-1].last_offset}")
        # The spec keys a segment by its base offset, so the merged segment can only live
        # under run[0]'s key: it replaces run[0]'s object with byte-identical committed
        # batches at the same offsets plus the run's later ones, which readers bound by
        # offset (readers refuse an object that is not the committed segment, see
        # SegmentReader._load_segment).
        if not await self.rewriter.commit_run(lg, run, enc, body, read, self.schedule_delete, "merge"):
            return False
        self.merges += 1
        self.merged_segments += len(run)
        log.debug("merged %d segments of %s-%s into offsets %d-%d", len(run), lg.topic, lg.partition, base, enc.info.last_offset)
        return True

    def schedule_delete(self, keys: list[str]) -> None:
        if keys:
            self._doomed.append((time.monotonic(), keys))
            self.pending_segments += _segments_in(keys)

    def _due(self, now: float, force: bool) -> list[list[str]]:
        """Take the key lists to delete now: past the grace period, or, while more than
        max_pending segments wait, the oldest ones past the short grace."""
        excess = self.pending_segments - self.max_pending
        due, kept = [], []
        for scheduled, keys in self._doomed:
            age = now - scheduled
            if force or age >= self.grace_s or (excess > 0 and age >= self.min_grace_s):
                due.append(keys)
                excess -= _segments_in(keys)
                self.pending_segments -= _segments_in(keys)
            else:
                kept.append((scheduled, keys))
        self._doomed = kept
        return due

    async def delete_expired(self, force: bool = False) -> None:
        for keys in self._due(time.monotonic(), force):
            try:
                started = time.monotonic()
                await self.store.delete(keys)
                await asyncio.sleep((time.monotonic() - started) * self.pause_factor)
            except Exception as e:  # noqa: BLE001 - tried again next round
                log.warning("deleting merged-away objects failed (will retry): %s", e)
                self._doomed.insert(0, (time.monotonic() - self.grace_s, keys))  # due at the next look
                self.pending_segments += _segments_in(keys)


def _segments_in(keys: list[str]) -> int:
    return sum(1 for k in keys if segment.parse_segment_key(k) is not None)
