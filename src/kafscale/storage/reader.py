"""The shared read path: owned or not, a partition's segments come from the metadata, and
its batches from the object store through the segment cache.

A segment up to WHOLE_SEGMENT_READ_BYTES is loaded whole into the cache (one load per
segment however many fetches wait for it) and a cold read of one loads the next one ahead,
for a consumer catching up; a larger one is read by index-guided byte ranges. Every loaded
object is checked to be the committed segment before it is served.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from typing import Iterable

from kafscale.errors import ErrorCode
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.cache import SegmentCache, SegmentView
from kafscale.storage.failures import StorageError
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger("kafscale.storage")

# Segments up to this size are read whole into the cache; larger ones by index-guided ranges
# (config.index_min_bytes decides which segments get an index; one without is read whole).
WHOLE_SEGMENT_READ_BYTES = 16 * 1024 * 1024


def _base_offset(seg: segment.SegmentInfo) -> int:
    return seg.base_offset


def first_record_at_or_after(data, batches: Iterable[tuple[int, records.BatchHeader]], timestamp: int, min_offset: int = 0) -> records.Record | None:
    """The first record of `batches` ((position in `data`, header), in offset order) whose
    timestamp is >= `timestamp` and offset >= `min_offset` (Kafka's ListOffsets by time).
    Batch max timestamps pick the batches to decode; only those are decoded (CRC-checked).
    The broker's lookup over a partition's cached segments and the Spark source's over
    segment objects both come here."""
    for pos, h in batches:
        if h.max_timestamp < timestamp or h.last_offset < min_offset:
            continue
        for rec in records.decode_records(data, pos, h):
            if rec.timestamp >= timestamp and rec.offset >= min_offset:
                return rec
    return None


def _one_buffer(body: list):
    """A written segment's batch buffers as one buffer for its cached view. A segment of one
    batch that fills (7/8 or more of) the buffer it lies in (a produce request's frame of one
    partition's batch) is cached as a read-only view of it, not copied: that copy of every
    flushed byte, a fresh allocation each flush, was about a tenth of the broker's CPU under
    a single producer of large lz4 batches (#33). The cache counts the view's bytes, so the
    memory it keeps is at most 8/7 of that (a bytearray's allocation counts: a frame may lie
    in a larger buffer, broker/memory.py FramePool). Anything else is joined."""
    if len(body) == 1:
        (only,) = body
        if isinstance(only, memoryview):
            held = only.obj
            size = held.__alloc__() if isinstance(held, bytearray) else len(held) if isinstance(held, bytes) else None
            if size is not None and only.nbytes * 8 >= size * 7:
                return only.toreadonly()
    return b"".join(body)


class SegmentReader:
    """Reads stored batches of any partition, through the segment cache."""

    def __init__(self, store: ObjectStore, namespace: str, cache_bytes: int, metrics: StorageMetrics):
        self.store = store
        self.namespace = namespace
        self.cache = SegmentCache(cache_bytes)
        self.metrics = metrics  # object reads and read-aheads are counted there
        self._segment_loads: dict[tuple, asyncio.Future] = {}

    async def read(
        self, topic: str, partition: int, segments: list[segment.SegmentInfo], offset: int, high_watermark: int, max_bytes: int, at_least_one: bool
    ) -> list[memoryview]:
        """Whole batches from the one holding `offset` (or the next one after it: compaction
        leaves offset gaps inside batches, between them, at a segment's start and at its end),
        up to `max_bytes` (the first batch whole if `at_least_one`), below `high_watermark`.

        The byte budget ends the read inside a segment without skipping ahead; a segment
        read to its end (its last batch may end before its last offset) hands on to the next."""
        out: list[memoryview] = []
        if offset >= high_watermark or not segments:
            return out
        i = max(bisect.bisect_right(segments, offset, key=_base_offset) - 1, 0)
        remaining = max_bytes
        while i < len(segments) and offset < high_watermark:
            seg = segments[i]
            if seg.last_offset < offset:
                i += 1
                continue
            if seg.size <= segment.HEADER_SIZE + segment.FOOTER_SIZE:
                # no batch at all (compaction removed every one): nothing to load
                offset = seg.last_offset + 1
                i += 1
                continue
            cached = self.cache.contains((topic, partition, seg.base_offset))
            view = await self.segment_view(topic, partition, seg, offset, remaining)
            if not cached and i + 1 < len(segments):
                self._read_ahead(topic, partition, segments[i + 1])  # a consumer catching up
            chunk = view.read(offset, remaining, at_least_one and not out)
            while not chunk and view.batch_index(offset) == len(view.positions) and not view.to_end:
                # a byte range of a large segment ending before `offset`'s batch: the next range
                view = await self._ranged_view(topic, partition, seg, offset, remaining, after=view)
                chunk = view.read(offset, remaining, at_least_one and not out)
            if not chunk and view.batch_index(offset) < len(view.positions):
                break  # the next batch does not fit in the byte budget: never skip ahead
            if chunk:
                out.append(chunk)
                remaining -= len(chunk)
                for _pos, h in records.iter_batches(chunk):
                    offset = h.last_offset + 1
                if remaining <= 0 or offset <= view.last_offset or not view.to_end:
                    break  # the byte budget ended inside this segment: never skip ahead
            # Every batch of this segment from `offset` on is read: what is left of its
            # offsets (up to its last offset) was compacted away; go on with the next one.
            # (An object holding more than its committed segment, a merge's superset, may
            # have taken `offset` further: segments already read are passed over.)
            offset = max(offset, seg.last_offset + 1)
            i += 1
        return out

    def start_load(self, topic: str, partition: int, segments: list[segment.SegmentInfo], offset: int) -> asyncio.Future | None:
        """Start loading the segment holding `offset` unless it is cached (or read by ranges):
        a fetch warms all its partitions at once, then reads them in order from the cache."""
        i = bisect.bisect_right(segments, offset, key=_base_offset) - 1
        if i < 0 or segments[i].last_offset < offset:
            return None
        seg = segments[i]
        key = (topic, partition, seg.base_offset)
        if seg.size > WHOLE_SEGMENT_READ_BYTES or seg.size <= segment.HEADER_SIZE + segment.FOOTER_SIZE or self.cache.contains(key):
            return None  # (a segment without batches is never loaded: read passes over it)
        if key not in self._segment_loads and i + 1 < len(segments):
            self._read_ahead(topic, partition, segments[i + 1])  # a consumer catching up
        return self._whole_segment_load(topic, partition, seg)

    def _whole_segment_load(self, topic: str, partition: int, seg: segment.SegmentInfo) -> asyncio.Future:
        """The one load of a whole segment into the cache, started if not running yet."""
        key = (topic, partition, seg.base_offset)
        fut = self._segment_loads.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_task(self._load_segment(topic, partition, seg))
            self._segment_loads[key] = fut

            def done(f: asyncio.Future) -> None:
                self._segment_loads.pop(key, None)
                if not f.cancelled():
                    f.exception()  # retrieved: whoever awaits the load reports it

            fut.add_done_callback(done)
        return fut

    def _read_ahead(self, topic: str, partition: int, seg: segment.SegmentInfo) -> None:
        """Load the next segment in the background, so a sequential reader finds it cached."""
        key = (topic, partition, seg.base_offset)
        if seg.size > WHOLE_SEGMENT_READ_BYTES or self.cache.contains(key) or key in self._segment_loads:
            return
        self._whole_segment_load(topic, partition, seg)  # a failed read-ahead is harmless
        self.metrics.read_ahead()

    async def segment_view(self, topic: str, partition: int, seg: segment.SegmentInfo, offset: int | None = None, max_bytes: int | None = None) -> SegmentView:
        """The batches of `seg` from the cache, or loaded; a segment read by ranges gives the
        range from `offset` (default: its base offset) of about `max_bytes` (default: its size)."""
        if offset is None:
            offset = seg.base_offset
        if max_bytes is None:
            max_bytes = seg.size
        key = (topic, partition, seg.base_offset)
        view = self.cache.get(key)
        if view is not None:
            if view.stands_for == (seg.size, seg.last_offset):
                return view
            # Cached for the segment committed under this base before a merge or compaction
            # replaced it (here or on another broker): it lacks the offsets the new segment
            # took over from the ones after it. Read the object again.
            self.cache.drop(key)
        if seg.size > WHOLE_SEGMENT_READ_BYTES and not seg.wao_key:  # (a write-ahead piece has no .index: read whole)
            return await self._ranged_view(topic, partition, seg, offset, max_bytes)
        return await asyncio.shield(self._whole_segment_load(topic, partition, seg))

    async def _load_segment(self, topic: str, partition: int, seg: segment.SegmentInfo) -> SegmentView:
        key, start, end = segment.stored_at(self.namespace, topic, partition, seg)
        # The segment counts in the cache's budget from the GET on, not once it lands: with
        # the loads of a consumer catching up in flight (read and read-ahead of every
        # partition) the cache was over its budget by as much.
        arriving = seg.size
        self.cache.arriving += arriving
        self.cache.give_way()
        try:
            data = await self.store.get(key, start, end)
            self.metrics.read_objects()
        except ObjectNotFound as e:
            raise StorageError(f"segment {key} is gone (deleted by retention?)", ErrorCode.offset_out_of_range) from e
        except ObjectStoreError as e:
            raise StorageError(f"object store unavailable: {e}") from e
        finally:
            self.cache.arriving -= arriving
        try:
            if end is not None and len(data) != end - start:
                raise segment.SegmentFormatError(f"{key}: {len(data)} bytes at {start}, the committed segment has {end - start} (truncated?)")
            decoded = segment.decode(data, name=key)
            got = decoded.info
            if got.base_offset != seg.base_offset or got.created_ms != seg.created_ms or got.last_offset < seg.last_offset:
                # Another writer's object under the committed key (a store without
                # conditional creates, see s3.py): refuse it rather than serve other records
                # at acknowledged offsets. A merge keeps created_ms and only adds offsets.
                raise segment.SegmentFormatError(f"{key}: the object is not the committed segment (created {got.created_ms}, offsets {got.base_offset}-{got.last_offset}; committed: created {seg.created_ms}, offsets {seg.base_offset}-{seg.last_offset})")
        except segment.SegmentFormatError as e:
            log.error("corrupt segment: %s", e, extra={"topic": topic, "partition": partition})
            raise StorageError(str(e)) from e
        view = SegmentView(seg.base_offset, decoded.batches)
        view.stands_for = (seg.size, seg.last_offset)
        self.cache.put((topic, partition, seg.base_offset), view)
        return view

    async def _ranged_view(
        self, topic: str, partition: int, seg: segment.SegmentInfo, offset: int, max_bytes: int, after: SegmentView | None = None
    ) -> SegmentView:
        """Large segment: look the position up in the sparse index, then read a byte range
        (`after`: the range right after that view's last whole batch, when the batch holding
        `offset` lies beyond it)."""
        skey = segment.segment_key(self.namespace, topic, partition, seg.base_offset)
        ikey = segment.index_key(self.namespace, topic, partition, seg.base_offset)
        try:
            index = await segment.read_index(self.store, ikey)
            if index is None or not index.offsets:
                # Written without an index (a larger index_min_bytes back then), or the
                # index is unusable: the segment itself is the truth, read it whole.
                log.warning("segment %s has no usable index: reading it whole", skey)
                return await self._load_segment(topic, partition, seg)
            at = max(bisect.bisect_right(index.offsets, offset) - 1, 0)  # (entry 0: the first batch)
            start = index.positions[at]
            if after is not None:
                if not after.positions:
                    raise StorageError(f"no whole batch at byte {after.start} of {skey}")
                start = max(start, after.start + after.positions[-1] + records.read_header(after.data, after.positions[-1]).size)
            end_limit = seg.size - segment.FOOTER_SIZE
            if start >= end_limit:
                return SegmentView(seg.last_offset + 1, b"", start=start)
            want = max(max_bytes, 1 << 20) + (1 << 20)
            data = await self.store.get(skey, start, min(end_limit, start + want))
            first = records.read_header(data, 0)
            # The batch there must be the indexed one: an index left from the object before a
            # compaction rewrote it (the index is written after the segment) points elsewhere.
            if (after is None and first.base_offset != index.offsets[at]) or first.magic != 2:
                log.warning("index of %s does not match the segment (stale?): reading it whole", skey)
                return await self._load_segment(topic, partition, seg)
            end = start + len(data)
            if first.size > len(data):  # one batch bigger than the range: read it whole
                data = await self.store.get(skey, start, min(end_limit, start + first.size))
                end = start + len(data)
            self.metrics.read_objects(2)
        except ObjectStoreError as e:
            raise StorageError(f"object store unavailable: {e}") from e
        for pos, h in records.iter_batches(data):
            if records.crc32c(memoryview(data)[pos + records.CRC_START : pos + h.size]) != h.crc:
                raise StorageError(f"corrupt batch at offset {h.base_offset} in {skey}")
        return SegmentView(first.base_offset, data, to_end=end >= end_limit, start=start)

    # -- timestamps (ListOffsets) ---------------------------------------------------------

    async def offset_for_timestamp(self, topic: str, partition: int, segments: list[segment.SegmentInfo], log_start_offset: int, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record with timestamp >= `timestamp`, or (-1, -1).

        Batch max timestamps pick the batch; only that batch is decoded."""
        for seg in segments:
            if seg.max_timestamp < timestamp:
                continue
            view = await self.segment_view(topic, partition, seg)
            candidates = ((pos, records.read_header(view.data, pos)) for i, pos in enumerate(view.positions) if view.max_timestamps[i] >= timestamp)
            rec = first_record_at_or_after(view.data, candidates, timestamp, log_start_offset)
            if rec is not None:
                return rec.offset, rec.timestamp
        return -1, -1

    async def max_timestamp_offset(self, topic: str, partition: int, segments: list[segment.SegmentInfo]) -> tuple[int, int]:
        """(offset, timestamp) of the first record with the largest timestamp, or (-1, -1).

        Batch max timestamps pick the batches to decode. A batch may hold fewer records than
        its max timestamp says (compaction keeps a batch's header, and an emptied batch of a
        producer, while removing the record that had it), so the search goes on, newest max
        first, until no batch left can hold a larger timestamp (or an equal one earlier)."""
        best_offset, best_ts = -1, -1
        for seg in sorted(segments, key=lambda s: (-s.max_timestamp, s.base_offset)):
            if seg.max_timestamp < 0 or seg.max_timestamp < best_ts or (seg.max_timestamp == best_ts and seg.base_offset > best_offset):
                break
            view = await self.segment_view(topic, partition, seg)
            for i in sorted(range(len(view.positions)), key=lambda j: (-view.max_timestamps[j], j)):
                if view.max_timestamps[i] < best_ts:
                    break
                for rec in records.decode_records(view.data, view.positions[i]):
                    if rec.timestamp > best_ts or (rec.timestamp == best_ts and rec.offset < best_offset):
                        best_offset, best_ts = rec.offset, rec.timestamp
        return (best_offset, best_ts) if best_offset >= 0 else (-1, -1)

    # -- the cache, as writers change segments --------------------------------------------

    @staticmethod
    def _written_view(base_offset: int, body: list, last_offset: int | None) -> SegmentView:
        """The view of a segment this broker just wrote: `body` its batch buffers, joined
        here (writers upload from the buffers, so no joined copy is held outside the budget
        while a segment uploads), `last_offset` the committed last offset (default: the last
        batch's)."""
        view = SegmentView(base_offset, _one_buffer(body))
        view.stands_for = (segment.HEADER_SIZE + len(view.data) + segment.FOOTER_SIZE, view.last_offset if last_offset is None else last_offset)
        return view

    def cache_segment(self, topic: str, partition: int, base_offset: int, body: list, last_offset: int | None = None) -> None:
        """A segment just made durable (a flush): its batches are cached for the readers."""
        self.cache.put((topic, partition, base_offset), self._written_view(base_offset, body, last_offset))

    def replace_cached(self, topic: str, partition: int, old_bases: list[int], base_offset: int, body: list, last_offset: int | None = None) -> None:
        """A merge or compaction swapped the segments at `old_bases` for the one at
        `base_offset` (`last_offset`: its committed last offset, when past its last batch)."""
        for base in old_bases:
            self.cache.drop((topic, partition, base))
        self.cache.put((topic, partition, base_offset), self._written_view(base_offset, body, last_offset))

    def segments_changed(self, topic: str, partition: int, old: list[segment.SegmentInfo], new: list[segment.SegmentInfo]) -> None:
        """A partition owned elsewhere has a new segment list: forget the cached views of
        segments the owner merged or compacted since (a view cached for a run's first
        segment must not stand for the merged one under its key: it would lack the run's
        other batches, and the reader would pass over their offsets as a gap)."""
        before = {s.base_offset: s for s in old}
        for seg in new:
            if before.get(seg.base_offset, seg) != seg:
                self.cache.drop((topic, partition, seg.base_offset))

    def drop(self, topic: str, partition: int | None = None) -> None:
        """Forget the cached segments of a topic, or of one of its partitions."""
        self.cache.drop_prefix((topic,) if partition is None else (topic, partition))
