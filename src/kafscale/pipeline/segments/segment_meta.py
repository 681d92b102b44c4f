"""Segment metadata: the exact extent of each segment from its `.index` and the tail of the
object (two small ranged GETs, no whole-object read); a segment without an index (small
ones) by its footer alone, read whole later. Kept across a stream's triggers (MetaCache).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from kafscale.pipeline.segments.errors import CorruptSegmentError, ListingChanged, SkipReport
from kafscale.pipeline.segments.listing import PartitionRange, TopicListing, TopicPartition
from kafscale.pipeline.segments.runner import METADATA_CONCURRENCY, gather_limited
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.pipeline")


@dataclass(frozen=True, slots=True)
class SegmentMeta:
    key: str
    base_offset: int
    last_offset: int  # from the footer; base - 1 for an empty segment
    size: int  # bytes of the object
    index_offsets: tuple[int, ...]  # base offsets of indexed batches
    index_positions: tuple[int, ...]  # their byte positions in the object
    corrupt: str | None = None  # why the segment is unreadable (only kept with failOnCorruption=false)

    @property
    def end_offset(self) -> int:
        """Next offset after this segment."""
        return self.last_offset + 1

    def position_at_or_before(self, offset: int) -> int:
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else segment.HEADER_SIZE

    def position_of_first_batch_from(self, offset: int) -> int:
        """Byte position of the first indexed batch whose base offset is >= `offset`, or the footer."""
        i = bisect.bisect_left(self.index_offsets, offset)
        return self.index_positions[i] if i < len(self.index_positions) else self.size - segment.FOOTER_SIZE

    def offset_at_position(self, pos: int) -> int:
        """Base offset of the indexed batch at byte `pos`; -1 for the footer's position."""
        i = bisect.bisect_left(self.index_positions, pos)
        if i < len(self.index_positions) and self.index_positions[i] == pos:
            return self.index_offsets[i]
        if pos == self.size - segment.FOOTER_SIZE:
            return -1
        raise ValueError(f"{self.key}: no indexed batch at byte {pos}")


def _walk_to_footer(key: str, data, start: int, abs_start: int) -> tuple[list[tuple[int, int]], int]:
    """storage's segment.walk_to_footer, its errors as CorruptSegmentError."""
    try:
        return segment.walk_to_footer(data, start, abs_start=abs_start, name=key)
    except segment.SegmentFormatError as e:
        raise CorruptSegmentError.of(key, e) from None


def _meta_from_footer(key: str, base_offset: int, tail, size: int) -> SegmentMeta | None:
    """The extent of a segment without an index from its footer (the last FOOTER_SIZE bytes
    of an object of `size` bytes); None when no footer is there."""
    if size < segment.HEADER_SIZE + segment.FOOTER_SIZE:
        return None
    last = segment.footer_last_offset(tail, 0)
    return SegmentMeta(key, base_offset, last, size, (), ()) if last is not None and last >= base_offset - 1 else None


async def read_segment_meta(store: ObjectStore, key: str, base_offset: int, *, fail_on_corruption: bool = True) -> SegmentMeta:
    """Exact extent of one segment from its .index and the tail of the object.

    A segment without an index (brokers index only segments of index_min_bytes and more)
    is measured by its footer alone: one suffix read gives the size and the last offset,
    and the segment is read whole, so no batch positions are needed. Falls back to reading
    the whole object when the index or footer does not fit the object (an index written
    for an earlier object under the same key, or a damaged one).
    """
    index_obj = segment.index_key_of_segment(key)
    index = None
    try:
        index = await segment.read_index(store, index_obj)  # None: missing or undecodable
    except Exception as e:  # the store failing on the index only costs a full read
        log.warning("ignoring unusable index %s: %s", index_obj, e)
    try:
        if index is None:
            meta = _meta_from_footer(key, base_offset, *await store.get_tail(key, segment.FOOTER_SIZE))
            if meta is not None:
                return meta
        if index is not None and index.positions:
            tail_pos = index.positions[-1]
            try:
                tail = await store.get(key, tail_pos)
                _, last = _walk_to_footer(key, tail, 0, tail_pos)
                return SegmentMeta(key, base_offset, last, tail_pos + len(tail), tuple(index.offsets), tuple(index.positions))
            except CorruptSegmentError:
                pass  # stale index or real damage: the full read below tells which
        data = await store.get(key)
        if len(data) < segment.HEADER_SIZE:
            raise CorruptSegmentError(key, f"{len(data)} bytes is too short for a segment (truncated)", offset=base_offset)
        try:
            hdr_base, _count, _created = segment.decode_header(data)
        except segment.SegmentFormatError as e:
            raise CorruptSegmentError(key, str(e), byte=0, offset=base_offset) from None
        if hdr_base != base_offset:
            raise CorruptSegmentError(key, f"header base offset {hdr_base} does not match the key", offset=base_offset)
        batches, last = _walk_to_footer(key, data, segment.HEADER_SIZE, 0)
        return SegmentMeta(key, base_offset, last, len(data), tuple(b for b, _ in batches), tuple(p for _, p in batches))
    except CorruptSegmentError as e:
        if fail_on_corruption:
            raise
        log.warning("skipping %s", e)
        return SegmentMeta(key, base_offset, base_offset - 1, 0, (), (), corrupt=e.what)


async def _meta_if_present(store: ObjectStore, key: str, base: int, fail_on_corruption: bool) -> SegmentMeta | None:
    try:
        return await read_segment_meta(store, key, base, fail_on_corruption=fail_on_corruption)
    except ObjectNotFound:
        return None  # deleted since listing: merged into the segment before it, or retention


class MetaCache:
    """Segment metadata kept across a stream's triggers, so that each trigger reads the
    metadata of the new segments only (a broker flushing every few milliseconds adds
    hundreds a second).

    An object can change under its key: the merger stores a run of small segments under the
    run's first key (and deletes the others after a grace period), the compactor rewrites a
    segment in place with the same offset range. So an entry is used only while the
    partition's next listed segment starts right where the entry ends: a merged run's
    followers are listed until the merged object covers them, and re-reading a key whose
    follower is gone finds the merged extent. A rewrite in place keeps the offsets; the
    batches at a ranged slice's bounds are checked when it is read (re-planned if they
    moved). The last segment of a partition (no follower) is always read afresh.
    """

    def __init__(self) -> None:
        self.metas: dict[str, SegmentMeta] = {}

    def usable(self, key: str, next_base: int | None) -> SegmentMeta | None:
        m = self.metas.get(key)
        return m if m is not None and next_base is not None and m.end_offset == next_base else None

    def keep_only(self, keys: set[str]) -> None:
        """Forget segments no longer listed (deleted by retention or a merge)."""
        for k in [k for k in self.metas if k not in keys]:
            del self.metas[k]


async def _footer_metas(store: ObjectStore, segs: list[tuple[int, str]]) -> dict[str, SegmentMeta | None]:
    """Metadata of segments that have no index, from their footers read in one request:
    {key: meta}, None for a key gone since listing; a footer that does not check out is
    left out (read_segment_meta then reads that object on its own)."""
    out: dict[str, SegmentMeta | None] = {}
    tails = await store.get_tails([k for _, k in segs], segment.FOOTER_SIZE, METADATA_CONCURRENCY)
    for (base, key), got in zip(segs, tails):
        if got is None:
            out[key] = None
            continue
        meta = _meta_from_footer(key, base, *got)
        if meta is not None:
            out[key] = meta
    return out


async def fetch_metas(
    store: ObjectStore,
    segs: list[tuple[int, str]],
    *,
    fail_on_corruption: bool = True,
    cache: MetaCache | None = None,
    listed: list[tuple[int, str]] | None = None,
    indexed: set[str] | None = None,
) -> list[SegmentMeta]:
    """Metadata of segments `segs` (missing ones left out); with `cache`, entries still valid
    for the partition's listing `listed` (default `segs`) are not read again; `indexed` (the
    listing's segments with an .index): the others are measured by footers read together."""
    if cache is None:
        footers: dict[str, SegmentMeta | None] = {}
        if indexed is not None:
            footers = await _footer_metas(store, [(b, k) for b, k in segs if k not in indexed])
        todo = [(b, k) for b, k in segs if k not in footers]
        read = dict(zip([k for _, k in todo], await gather_limited([_meta_if_present(store, key, base, fail_on_corruption) for base, key in todo])))
        metas = [footers[k] if k in footers else read[k] for _, k in segs]
        return [m for m in metas if m is not None]
    order = listed if listed is not None else segs
    next_base = {k: order[i + 1][0] for i, (_, k) in enumerate(order[:-1])}
    found = {k: m for _, k in segs if (m := cache.usable(k, next_base.get(k))) is not None}
    todo = [(b, k) for b, k in segs if k not in found]
    for m in await fetch_metas(store, todo, fail_on_corruption=fail_on_corruption, indexed=indexed):
        found[m.key] = m
        if m.corrupt is None:
            cache.metas[m.key] = m
    return [found[k] for _, k in segs if k in found]


async def listed_metas(store: ObjectStore, segs: list[tuple[int, str]], **kwargs) -> list[SegmentMeta]:
    """`fetch_metas` of listed segments that must all be there, as a plan needs them: one
    gone since the listing raises ListingChanged (left out, its offsets would read as lost
    between two segments, or silently not at all after the last one)."""
    metas = await fetch_metas(store, segs, **kwargs)
    if len(metas) < len(segs):
        found = {m.key for m in metas}
        gone = [k for _, k in segs if k not in found]
        raise ListingChanged(f"{gone[0]} (and {len(gone) - 1} more) gone since the listing")
    return metas


async def partition_bounds(
    store: ObjectStore, listing: TopicListing, *, fail_on_corruption: bool = True, skipped: SkipReport | None = None, cache: MetaCache | None = None
) -> dict[TopicPartition, PartitionRange]:
    """Earliest and latest (next) offset of each partition's flushed log."""

    async def bounds(tp: TopicPartition) -> PartitionRange:
        segs = listing.segments[tp]
        # walk back over empty or skipped-corrupt tail segments
        for i in range(len(segs) - 1, -1, -1):
            base, key = segs[i]
            if cache is not None:
                got = await fetch_metas(store, [(base, key)], fail_on_corruption=fail_on_corruption, cache=cache, listed=segs[i : i + 2], indexed=listing.indexed)
                m = got[0] if got else None
            else:
                m = await _meta_if_present(store, key, base, fail_on_corruption)
            if m is None:
                continue
            if m.corrupt is not None and skipped is not None:
                # how much it held is unknown: nothing after it says where it ended
                skipped.add(CorruptSegmentError(m.key, m.corrupt, offset=m.base_offset), 0, last_segment=True)
            if m.corrupt is None and m.end_offset > m.base_offset:
                return PartitionRange(segs[0][0], m.end_offset)
        return PartitionRange(segs[0][0], segs[0][0])

    tps = listing.partitions()
    results = await gather_limited([bounds(tp) for tp in tps])
    return dict(zip(tps, results))
