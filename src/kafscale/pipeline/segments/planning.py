"""Planning: a non-overlapping cover of an offset range by segments ordered by base offset
(a background merger can briefly leave a merged segment *and* the small segments it
replaced; their batches are byte-identical, so any cover is correct, but no offset may be
read twice), split into byte ranges with the index when a segment is large, and grouped
into Spark tasks.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from dataclasses import dataclass

from kafscale.pipeline.segments.errors import CorruptSegmentError, DataLossError, SkipReport
from kafscale.pipeline.segments.listing import PartitionRange, TopicListing, TopicPartition
from kafscale.pipeline.segments.segment_meta import MetaCache, SegmentMeta, listed_metas
from kafscale.storage.objectstore import ObjectStore

EARLIEST = -2  # Spark Kafka source convention in offset JSON
LATEST = -1
DEFAULT_MAX_PARTITION_BYTES = 64 * 1024 * 1024  # target bytes per Spark task (and largest slice of a segment)


@dataclass(frozen=True, slots=True)
class SegmentSlice:
    """Offsets [start_offset, end_offset) of one partition, read from one segment object.

    `byte_range` None means the whole object (checked end to end, segment CRC included);
    otherwise (first, end) byte positions of whole batches taken from the index.
    """

    topic: str
    partition: int
    key: str
    start_offset: int
    end_offset: int
    byte_range: tuple[int, int] | None = None
    size: int = 0  # bytes this slice reads (known when planned from metadata; for packing)
    # read_committed: (producer id, first offset, marker offset) of aborted transactions;
    # their transactional batches in this slice are skipped (see transaction_outcomes)
    aborted: tuple[tuple[int, int, int], ...] = ()
    # With a byte range: the base offsets of the batch at its first byte and of the one
    # right after it (-1: the footer), as the index said when planning. The compactor
    # rewrites a segment under its key, batches at other positions: a range planned on the
    # old object is recognised by these and re-planned rather than read (see read_slice).
    range_bounds: tuple[int, int] | None = None


def cover(metas: list[SegmentMeta], start: int, end: int, *, fail_on_data_loss: bool = True, tp: TopicPartition | None = None) -> list[tuple[SegmentMeta, int, int]]:
    """Non-overlapping (segment, first offset, end offset) pieces covering [start, end).

    Segments are taken by base offset (the larger extent first for equal bases); a segment
    that only repeats offsets already covered is dropped. Offsets no segment holds are a gap:
    data lost to retention or deletion, an error unless fail_on_data_loss is False. Segments
    found corrupt (and skipped) are not counted as loss: they were reported already.
    """
    pieces: list[tuple[SegmentMeta, int, int]] = []
    pos = start
    ordered = sorted(metas, key=lambda m: (m.base_offset, -m.last_offset))
    for i, m in enumerate(ordered):
        if pos >= end:
            break
        if m.corrupt is not None:
            # its offsets run up to the next segment's base; nothing to read from it
            nxt = next((o.base_offset for o in ordered[i + 1 :] if o.base_offset > m.base_offset), None)
            if m.base_offset <= pos and nxt is not None:
                pos = max(pos, min(nxt, end))
            continue
        if m.end_offset <= pos or m.end_offset <= m.base_offset:
            continue
        if m.base_offset > pos:
            if fail_on_data_loss:
                where = f"{tp[0]}/{tp[1]}" if tp else "partition"
                raise DataLossError(
                    f"{where}: offsets {pos}..{min(m.base_offset, end) - 1} are in no segment "
                    "(deleted by retention?); set failOnDataLoss=false to skip them"
                )
            pos = m.base_offset
            if pos >= end:
                break
        piece_end = min(m.end_offset, end)
        pieces.append((m, pos, piece_end))
        pos = piece_end
    return pieces


def split_piece(tp: TopicPartition, m: SegmentMeta, start: int, end: int, max_bytes: int) -> list[SegmentSlice]:
    """One slice for a small segment; for a large one, byte ranges of at most about max_bytes
    cut at indexed batch boundaries (a range is never empty, so one huge batch stays whole)."""
    topic, part = tp
    if m.size <= max_bytes or not m.index_offsets:
        return [SegmentSlice(topic, part, m.key, start, end, None, m.size)]
    first = m.position_at_or_before(start)
    last = m.position_of_first_batch_from(end)
    cuts = [(off, pos) for off, pos in zip(m.index_offsets, m.index_positions) if start < off < end]
    slices = []
    chunk_off, chunk_pos = start, first
    prev: tuple[int, int] | None = None
    def ranged(a_off: int, b_off: int, a: int, b: int) -> SegmentSlice:
        return SegmentSlice(topic, part, m.key, a_off, b_off, (a, b), b - a, range_bounds=(m.offset_at_position(a), m.offset_at_position(b)))

    for off, pos in cuts + [(end, last)]:
        if pos - chunk_pos > max_bytes and prev is not None:
            slices.append(ranged(chunk_off, prev[0], chunk_pos, prev[1]))
            chunk_off, chunk_pos = prev
        prev = (off, pos) if pos > chunk_pos else None
    slices.append(ranged(chunk_off, end, chunk_pos, last))
    return slices


def pack_slices(slices: list[SegmentSlice], max_bytes: int) -> list[tuple[SegmentSlice, ...]]:
    """Consecutive slices (in plan order) packed into groups of at most about max_bytes.

    A Spark task of a Python data source has a fixed cost of tens of milliseconds (worker
    hand-over, per-task code generation and metrics on the JVM), as much as decoding a few
    MiB; packing small segments makes fewer, larger tasks. A slice is never split here and
    a group holds at least one.
    """
    packs: list[tuple[SegmentSlice, ...]] = []
    group: list[SegmentSlice] = []
    size = 0
    for s in slices:
        if group and size + s.size > max_bytes:
            packs.append(tuple(group))
            group, size = [], 0
        group.append(s)
        size += s.size
    if group:
        packs.append(tuple(group))
    return packs


def split_offset_ranges(
    ranges: dict[TopicPartition, PartitionRange], *, min_partitions: int | None = None, max_records: int | None = None
) -> list[tuple[TopicPartition, int, int]]:
    """Offset ranges [start, end) per Spark task, as Spark's Kafka source divides them.

    Empty ranges are dropped. maxRecordsPerPartition first cuts every range into equal
    parts of at most that many offsets; then, while there are fewer ranges than
    minPartitions, the ranges are divided again in proportion to their size (a range worth
    less than one task of the total stays whole), so the count comes out at about
    minPartitions.
    """
    out = [(tp, r.start, r.end) for tp, r in sorted(ranges.items()) if r.end > r.start]
    if max_records:
        out = [piece for tp, a, b in out for piece in _equal_parts(tp, a, b, -(-(b - a) // max_records))]
    if min_partitions and len(out) < min_partitions:
        total = sum(b - a for _, a, b in out)

        def parts(size: int, of: int, n: int) -> int:
            return max(int(size / of * n + 0.5), 1) if of else 1

        whole = [i for i, (_, a, b) in enumerate(out) if parts(b - a, total, min_partitions) == 1]
        rest_total = total - sum(out[i][2] - out[i][1] for i in whole)
        rest_n = max(min_partitions - len(whole), 1)
        keep = set(whole)
        out = [
            piece
            for i, (tp, a, b) in enumerate(out)
            for piece in ([(tp, a, b)] if i in keep else _equal_parts(tp, a, b, parts(b - a, rest_total, rest_n)))
        ]
    return out


def _equal_parts(tp: TopicPartition, start: int, end: int, n: int) -> list[tuple[TopicPartition, int, int]]:
    pieces = []
    left, pos = end - start, start
    for i in range(n):
        size = left // (n - i)
        left -= size
        if size > 0:
            pieces.append((tp, pos, pos + size))
        pos += size
    return pieces


def group_slices(
    slices: list[SegmentSlice],
    max_bytes: int,
    offset_ranges: list[tuple[TopicPartition, int, int]] | None = None,
    *,
    pack: bool = True,
) -> list[tuple[SegmentSlice, ...]]:
    """Spark input partitions (tuples of slices) for planned slices.

    Without offset ranges, consecutive slices are packed up to max_bytes per task (pack) or
    each slice is its own task. With offset ranges (minPartitions, maxRecordsPerPartition),
    the slices are cut at the range bounds and each range is packed on its own, so there is
    at least one task per range (a slice cut in two reads its object in both tasks, each
    keeping only its offsets).
    """
    if offset_ranges is None:
        return pack_slices(slices, max_bytes) if pack else [(s,) for s in slices]
    by_tp: dict[TopicPartition, list[SegmentSlice]] = {}
    for s in slices:
        by_tp.setdefault((s.topic, s.partition), []).append(s)
    groups: list[tuple[SegmentSlice, ...]] = []
    for tp, a, b in offset_ranges:
        inside = []
        for s in by_tp.get(tp, []):
            lo, hi = max(a, s.start_offset), min(b, s.end_offset)
            if lo >= hi:
                continue
            span = max(1, s.end_offset - s.start_offset)
            size = s.size * (hi - lo) // span if (lo, hi) != (s.start_offset, s.end_offset) else s.size
            inside.append(dataclasses.replace(s, start_offset=lo, end_offset=hi, size=size))
        if inside:
            groups.extend(pack_slices(inside, max_bytes) if pack else [(s,) for s in inside])
    return groups


def candidate_keys(segs: list[tuple[int, str]], start: int | None, end: int | None) -> list[tuple[int, str]]:
    """Segments that may hold offsets in [start, end): from the last one based at or before
    start (it may extend past later bases after a merge) to the last one based below end."""
    bases = [b for b, _ in segs]
    i0 = 0 if start is None else max(0, bisect.bisect_right(bases, start) - 1)
    i1 = len(segs) if end is None else bisect.bisect_left(bases, end)
    return segs[i0:i1]


async def plan_slices(
    store: ObjectStore,
    listing: TopicListing,
    ranges: dict[TopicPartition, PartitionRange],
    *,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
    fail_on_corruption: bool = True,
    fail_on_data_loss: bool = True,
    skipped: SkipReport | None = None,
    cache: MetaCache | None = None,
) -> list[SegmentSlice]:
    """Slices reading exactly the offsets [start, end) of each partition in `ranges`."""

    async def plan_one(tp: TopicPartition) -> list[SegmentSlice]:
        r = ranges[tp]
        if r.end <= r.start:
            return []
        segs = listing.segments.get(tp, [])
        metas = await listed_metas(store, candidate_keys(segs, r.start, r.end), fail_on_corruption=fail_on_corruption, cache=cache, listed=segs, indexed=listing.indexed)
        if skipped is not None:
            bases = [b for b, _ in segs]
            for m in metas:
                if m.corrupt is not None:
                    i = bisect.bisect_right(bases, m.base_offset)
                    nxt = bases[i] if i < len(bases) else r.end
                    lost = min(nxt, r.end) - max(m.base_offset, r.start)
                    skipped.add(CorruptSegmentError(m.key, m.corrupt, offset=m.base_offset), lost)
        out: list[SegmentSlice] = []
        for m, a, b in cover(metas, r.start, r.end, fail_on_data_loss=fail_on_data_loss, tp=tp):
            out.extend(split_piece(tp, m, a, b, max_partition_bytes))
        return out

    tps = sorted(ranges)
    planned = await asyncio.gather(*(plan_one(tp) for tp in tps))
    return [s for slices in planned for s in slices]
