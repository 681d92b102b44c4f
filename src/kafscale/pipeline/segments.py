"""Reading KafScale topic partitions straight from segment objects, without a broker.

Only *flushed* segments are visible here: records still in a broker's write buffer (not yet
sealed into a `segment-*.kfs` object) do not exist for this reader, so "latest" means "end of
the last flushed segment", which can trail the broker's high watermark.

This module is Spark-free (the Spark source in `source.py` is a thin layer over it):

* listing: `{namespace}/{topic}/{partition}/segment-{base:020d}.kfs` keys per partition;
* metadata: per segment, the `.index` (batch positions) and the tail of the object, whose
  footer gives the exact last offset (two small ranged GETs, no whole-object read); a
  segment without an index (small ones) by its footer alone, and then read whole;
* planning: a non-overlapping cover of an offset range by segments ordered by base offset
  (a background merger can briefly leave a merged segment *and* the small segments it
  replaced; their batches are byte-identical, so any cover is correct, but no offset may
  be read twice), split into byte ranges with the index when a segment is large;
* decoding: strict batch framing, CRC32C per batch (and per segment when the whole object is
  read), all codecs, control batches skipped, into columns for Arrow or into row tuples;
* read_committed (`transaction_outcomes`): the range ends before the first undecided
  transaction, and the batches of aborted transactions are skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import datetime as _dt
import itertools
import json
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from kafscale.metadata.internal_topics import is_internal
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.backends import open_store
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.pipeline")

T = TypeVar("T")

EARLIEST = -2  # Spark Kafka source convention in offset JSON
LATEST = -1
DEFAULT_MAX_PARTITION_BYTES = 64 * 1024 * 1024  # target bytes per Spark task (and largest slice of a segment)
DEFAULT_ARROW_BATCH_ROWS = 65_536
METADATA_CONCURRENCY = 32  # parallel small GETs while planning

TopicPartition = tuple[str, int]


class PipelineError(RuntimeError):
    """Base class for errors of the segment reader."""


class TopicNotFoundError(PipelineError):
    pass


class CorruptSegmentError(PipelineError):
    """A segment object that cannot be read as written; the message names object and offset."""

    def __init__(self, key: str, what: str, *, byte: int | None = None, offset: int | None = None):
        where = []
        if offset is not None:
            where.append(f"offset {offset}")
        if byte is not None:
            where.append(f"byte {byte}")
        at = f" at {', '.join(where)}" if where else ""
        super().__init__(
            f"corrupt KafScale segment {key}{at}: {what} "
            "(set option failOnCorruption=false to skip damaged data)"
        )
        self.key, self.what, self.byte, self.offset = key, what, byte, offset


class DataLossError(PipelineError):
    pass


# ---------------------------------------------------------------------------------------
# Running the async ObjectStore from synchronous Spark code.


def run_with_store(storage_url: str, fn: Callable[[ObjectStore], Awaitable[T]]) -> T:
    """Open the store, run `fn(store)` to completion on a private event loop, close the store.

    Spark calls the reader from plain threads (driver planner, executor workers); the store's
    clients (e.g. an S3 session) are bound to the loop they were created on, so store and loop
    live and die together here. If the calling thread already runs a loop (a notebook), the
    work moves to a helper thread instead of nesting loops.
    """

    out: list = []

    async def main() -> None:
        # The value is handed over in `out`, not returned: on the main thread asyncio.run()
        # (Python 3.11) formats repr(main task) -- result included -- when it restores the
        # SIGINT handler, which for a segment GET is the repr of megabytes of bytes (~30 ms
        # per 4 MiB object, as much as decoding it).
        store = open_store(storage_url)
        try:
            out.append(await fn(store))
        finally:
            await store.close()

    try:
        asyncio.get_running_loop()
        in_loop = True
    except RuntimeError:
        in_loop = False
    if not in_loop:
        # outside the except block: an error of fn is raised as itself, not chained to
        # get_running_loop's "no running event loop"
        asyncio.run(main())
        return out[0]
    result: list = []

    def in_thread() -> None:
        try:
            asyncio.run(main())
            result.append((True, out[0]))
        except BaseException as e:  # re-raised in the caller's thread
            result.append((False, e))

    t = threading.Thread(target=in_thread, name="kafscale-store")
    t.start()
    t.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


async def _gather_limited(coros: list[Awaitable[T]], limit: int = METADATA_CONCURRENCY) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


# ---------------------------------------------------------------------------------------
# Listing


@dataclass(slots=True)
class TopicListing:
    """Segment keys per partition, each list sorted by base offset."""

    segments: dict[TopicPartition, list[tuple[int, str]]]
    # segment keys whose .index object was listed too (None: not known); a segment without
    # one is measured by its footer alone, and many footers are read in one request
    indexed: set[str] | None = None

    def partitions(self) -> list[TopicPartition]:
        return sorted(self.segments)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.segments})


async def list_topics(
    store: ObjectStore,
    namespace: str,
    topics: list[str] | None = None,
    pattern: str | None = None,
    *,
    assigned: dict[str, list[int]] | None = None,
    require_all: bool = True,
) -> TopicListing:
    """Find partitions and segments of the subscribed topics.

    A subscribed topic without any segment object is an error: this reader cannot tell an
    unknown topic from one that has not flushed yet, and silently reading nothing would hide
    a typo in `subscribe`. `assigned` ({topic: [partitions]}, Spark's `assign`) reads only
    those partitions. With require_all False (a stream waiting for its topics) missing
    topics are simply absent from the listing.
    """
    if assigned is not None:
        topics = sorted(assigned)
    if (topics is None) == (pattern is None):
        raise ValueError("give exactly one of topics or pattern")
    if topics is not None:
        keys_per_topic = await asyncio.gather(*(store.list(f"{namespace}/{t}/") for t in topics))
        keys = [k for ks in keys_per_topic for k in ks]
    else:
        keys = await store.list(f"{namespace}/")
    regex = re.compile(pattern) if pattern is not None else None
    found: dict[TopicPartition, list[tuple[int, str]]] = {}
    indexed = {segment.segment_key_of_index(key) for key in keys if key.endswith(".index")}
    segment_key = segment.segment_key_pattern(namespace)
    for key in keys:
        m = segment_key.fullmatch(key)
        if m is None:
            continue
        topic, part, base = m.group(1), int(m.group(2)), int(m.group(3))
        if topics is not None and topic not in topics:
            continue
        if regex is not None and (is_internal(topic) or not regex.fullmatch(topic)):
            continue  # a pattern leaves internal topics out, as a Kafka consumer's subscribe(Pattern)
        if assigned is not None and part not in assigned[topic]:
            continue
        found.setdefault((topic, part), []).append((base, key))
    for segs in found.values():
        segs.sort()
    listing = TopicListing(found, indexed)
    if not require_all:
        return listing
    if assigned is not None:
        missing_parts = sorted(f"{t}/{p}" for t, ps in assigned.items() for p in ps if (t, p) not in found)
        if missing_parts:
            raise TopicNotFoundError(
                f"assigned partition(s) {', '.join(missing_parts)} not found: no flushed segments under {namespace}/ "
                "in the storage (check assign, namespace and storage options)"
            )
    if topics is not None:
        missing = sorted(set(topics) - set(listing.topics()))
        if missing and not found and not await store.list(f"{namespace}/"):
            raise TopicNotFoundError(_no_objects(store, namespace))
        if missing:
            raise TopicNotFoundError(
                f"topic(s) {', '.join(missing)} not found: no flushed segments under "
                + ", ".join(f"{namespace}/{t}/" for t in missing)
                + " in the storage (check subscribe, namespace and storage options)"
            )
    elif not found and not keys:
        raise TopicNotFoundError(_no_objects(store, namespace))
    elif not found:
        raise TopicNotFoundError(f"no topic matching subscribePattern {pattern!r} has flushed segments under {namespace}/")
    return listing


def _no_objects(store: ObjectStore, namespace: str) -> str:
    return (
        f"the storage holds no KafScale objects under {namespace}/ (nothing at all there): check the option storage "
        "(the broker's --storage URL, e.g. file:///var/lib/kafscale/objects) and namespace (the broker's --namespace)"
    )


# ---------------------------------------------------------------------------------------
# Segment metadata


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
    """Check that data[start:] is whole batches then the footer; return [(base, abs pos)], last offset.

    Walks the batches even when the footer is missing, so that a truncated object is
    reported at the batch (offset and byte) where it breaks off.
    """
    n = len(data)
    batches: list[tuple[int, int]] = []
    pos = start
    last = None
    while n - pos != segment.FOOTER_SIZE or segment.FOOTER.unpack_from(data, pos)[2] != segment.FOOTER_MAGIC:
        if pos >= n:
            raise CorruptSegmentError(key, "object ends without a segment footer (truncated)", byte=abs_start + n, offset=None if last is None else last + 1)
        h = _checked_header(key, data, pos, n - segment.FOOTER_SIZE, abs_start)
        batches.append((h.base_offset, abs_start + pos))
        last = h.last_offset
        pos += h.size
    _crc, footer_last, _magic = segment.FOOTER.unpack_from(data, pos)
    if last is not None and last > footer_last:
        # (below it is a compacted segment's trailing gap: its last records were removed,
        # its offset range stays)
        raise CorruptSegmentError(key, f"footer says last offset {footer_last} but the last batch ends at {last}", offset=last)
    return batches, footer_last


def _checked_header(key: str, buf, pos: int, end: int, abs_start: int = 0) -> records.BatchHeader:
    """Batch header at `pos`, checked to frame a whole v2 batch inside buf[:end]."""
    if end - pos < records.HEADER_SIZE:
        base = records.read_base_offset(buf, pos) if len(buf) - pos >= 8 else None
        raise CorruptSegmentError(key, f"record batch header cut short ({max(0, end - pos)} bytes left; object truncated?)", byte=abs_start + pos, offset=base)
    h = records.read_header(buf, pos)
    if h.magic != 2:
        raise CorruptSegmentError(key, f"record batch magic {h.magic} (expected 2)", byte=abs_start + pos, offset=h.base_offset)
    if h.batch_length < records.HEADER_SIZE - records.LOG_OVERHEAD or pos + h.size > end:
        raise CorruptSegmentError(key, f"record batch of {h.size} bytes runs past the data (object truncated?)", byte=abs_start + pos, offset=h.base_offset)
    if h.record_count < 0 or h.last_offset_delta < 0:
        raise CorruptSegmentError(key, "negative record count or offset delta", byte=abs_start + pos, offset=h.base_offset)
    return h


async def read_segment_meta(store: ObjectStore, key: str, base_offset: int, *, fail_on_corruption: bool = True) -> SegmentMeta:
    """Exact extent of one segment from its .index and the tail of the object.

    A segment without an index (brokers index only segments of index_min_bytes and more)
    is measured by its footer alone: one suffix read gives the size and the last offset,
    and the segment is read whole, so no batch positions are needed. Falls back to reading
    the whole object when the index or footer does not fit the object (an index written
    for an earlier object under the same key, or a damaged one).
    """
    index_obj = key[: -len(".kfs")] + ".index"
    index = None
    try:
        index = await segment.read_index(store, index_obj)  # None: missing or undecodable
    except Exception as e:  # the store failing on the index only costs a full read
        log.warning("ignoring unusable index %s: %s", index_obj, e)
    try:
        if index is None:
            tail, size = await store.get_tail(key, segment.FOOTER_SIZE)
            if size >= segment.HEADER_SIZE + segment.FOOTER_SIZE and len(tail) == segment.FOOTER_SIZE:
                _crc, last, magic = segment.FOOTER.unpack(tail)
                if magic == segment.FOOTER_MAGIC and last >= base_offset - 1:
                    return SegmentMeta(key, base_offset, last, size, (), ())
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


# ---------------------------------------------------------------------------------------
# Planning


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


@dataclass(slots=True)
class PartitionRange:
    start: int
    end: int


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
        tail, size = got
        if size >= segment.HEADER_SIZE + segment.FOOTER_SIZE and len(tail) == segment.FOOTER_SIZE:
            _crc, last, magic = segment.FOOTER.unpack(tail)
            if magic == segment.FOOTER_MAGIC and last >= base - 1:
                out[key] = SegmentMeta(key, base, last, size, (), ())
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
        read = dict(zip([k for _, k in todo], await _gather_limited([_meta_if_present(store, key, base, fail_on_corruption) for base, key in todo])))
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


async def partition_bounds(
    store: ObjectStore, listing: TopicListing, *, fail_on_corruption: bool = True, skipped: "SkipReport | None" = None, cache: MetaCache | None = None
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
    results = await _gather_limited([bounds(tp) for tp in tps])
    return dict(zip(tps, results))


async def plan_slices(
    store: ObjectStore,
    listing: TopicListing,
    ranges: dict[TopicPartition, PartitionRange],
    *,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
    fail_on_corruption: bool = True,
    fail_on_data_loss: bool = True,
    skipped: "SkipReport | None" = None,
    cache: MetaCache | None = None,
) -> list[SegmentSlice]:
    """Slices reading exactly the offsets [start, end) of each partition in `ranges`."""

    async def plan_one(tp: TopicPartition) -> list[SegmentSlice]:
        r = ranges[tp]
        if r.end <= r.start:
            return []
        segs = listing.segments.get(tp, [])
        metas = await fetch_metas(store, candidate_keys(segs, r.start, r.end), fail_on_corruption=fail_on_corruption, cache=cache, listed=segs, indexed=listing.indexed)
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


END_OF_LOG = 1 << 62  # an end offset past every segment (transaction_outcomes to the end)


async def transaction_outcomes(
    store: ObjectStore, segs: list[tuple[int, str]], start: int, end: int, *, fail_on_corruption: bool = True
) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """What read_committed needs for offsets [start, end) of a partition, from its flushed
    segments alone (no broker): (stable end, aborted). Each transactional batch's fate is the
    next end-transaction marker of its producer; the stable end is the first offset of a
    transaction with no marker up to `end` (so nothing undecided is read), else `end`;
    aborted lists (producer id, first offset, marker offset) of the transactions aborted in
    the range. Costs a read of every segment from `start` to `end` (only for read_committed).
    """
    if end <= start:
        return end, ()
    metas = await fetch_metas(store, candidate_keys(segs, start, end), fail_on_corruption=fail_on_corruption)
    open_first: dict[int, int] = {}  # producer id -> first offset of its undecided data in range
    aborted: list[tuple[int, int, int]] = []
    for m, a, b in cover(metas, start, end, fail_on_data_loss=False):
        if m.corrupt is not None:
            continue
        data = memoryview(await store.get(m.key))
        body_end = len(data) - segment.FOOTER_SIZE
        for pos, h in records.iter_batches(data, segment.HEADER_SIZE, body_end):
            if h.last_offset < a or h.base_offset >= b or h.producer_id < 0 or not h.is_transactional:
                continue
            if not h.is_control and h.record_count == 0:
                # emptied by compaction, which cleans only below the last stable offset: its
                # transaction is decided, and its marker may be gone (past its horizon)
                continue
            if not h.is_control:
                open_first.setdefault(h.producer_id, h.base_offset)
                continue
            kind, _epoch = records.read_control(data, pos, h)
            first = open_first.pop(h.producer_id, None)
            if kind == records.CONTROL_ABORT and first is not None:
                aborted.append((h.producer_id, first, h.base_offset))
    stable = min([end, *open_first.values()])
    return stable, tuple(a for a in aborted if a[1] < stable)


def aborted_batch(aborted: tuple[tuple[int, int, int], ...], h: records.BatchHeader) -> bool:
    """Is this transactional batch part of one of the `aborted` transactions?"""
    if not aborted or not h.is_transactional:
        return False
    return any(pid == h.producer_id and first <= h.base_offset <= last for pid, first, last in aborted)


async def offset_for_timestamp(store: ObjectStore, segs: list[tuple[int, str]], timestamp_ms: int) -> int | None:
    """First offset whose record timestamp is >= timestamp_ms (Kafka ListOffsets semantics), or None.

    Walks the partition's segments in order reading batch headers, and decodes only the first
    batch whose max timestamp reaches the target. Costs a read of every segment before the
    answer, so it suits recent timestamps and the modest segment counts of a partition.
    """
    covered = -1
    for base, key in segs:
        try:
            data = await store.get(key)
        except ObjectNotFound:
            continue  # replaced by a merge since listing; its batches live on in the merged one
        body_end = len(data) - segment.FOOTER_SIZE
        pos = segment.HEADER_SIZE
        while pos < body_end:
            h = _checked_header(key, data, pos, body_end)
            if h.last_offset > covered and not h.is_control and h.max_timestamp >= timestamp_ms:
                for rec in records.decode_records(data, pos, h):
                    if rec.offset > covered and rec.timestamp >= timestamp_ms:
                        return rec.offset
            covered = max(covered, h.last_offset)
            pos += h.size
    return None


# ---------------------------------------------------------------------------------------
# Decoding


class Columns:
    """Decoded records of one topic partition, column by column (Arrow-friendly).

    Headers are kept flat, as Arrow stores them: `header_ends[i]` is the end of row i's
    headers in `header_keys`/`header_values`; a row without headers is null (as in Spark's
    Kafka source), not an empty list.
    """

    __slots__ = ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends", "header_keys", "header_values")

    def __init__(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []  # milliseconds
        self.ts_types: list[int] = []
        self.header_ends: list[int] = []
        self.header_keys: list[str] = []
        self.header_values: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    def truncate(self, rows: int) -> None:
        """Drop rows from `rows` on (what a failed batch decode appended part-way)."""
        keep_headers = self.header_ends[rows - 1] if rows else 0
        for name in ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends"):
            del getattr(self, name)[rows:]
        del self.header_keys[keep_headers:]
        del self.header_values[keep_headers:]


def _varint_slow(buf: bytes, p: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def decode_batch_into(cols: Columns, body: bytes, h: records.BatchHeader, lo: int, hi: int) -> None:
    """Append the records of one (decompressed) batch body with offsets in [lo, hi) to `cols`.

    A hand-inlined parser: varints of small records take one or two bytes, so those cases
    are decoded in line; a call and a Record object per record would halve throughput.
    """
    keys, values, offs, tss, types = cols.keys, cols.values, cols.offsets, cols.timestamps, cols.ts_types
    hends, hkeys, hvals = cols.header_ends, cols.header_keys, cols.header_values
    base = h.base_offset
    log_append = h.is_log_append_time
    ts_type = 1 if log_append else 0
    first_ts = h.first_timestamp
    max_ts = h.max_timestamp
    p = 0
    for _ in range(h.record_count):
        # record length
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        rec_end = p + n
        p += 1  # record attributes
        # timestamp delta
        b = body[p]
        if b < 0x80:
            ts_delta, p = (b >> 1) ^ -(b & 1), p + 1
        else:
            ts_delta, p = _varint_slow(body, p)
        # offset delta
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        off = base + n
        if off < lo or off >= hi:
            p = rec_end
            continue
        # key
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        else:
            n, p = _varint_slow(body, p)
        if n < 0:
            keys.append(None)
        else:
            keys.append(body[p : p + n])
            p += n
        # value
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        if n < 0:
            values.append(None)
        else:
            values.append(body[p : p + n])
            p += n
        # headers
        b = body[p]
        if b == 0:
            p += 1
        else:
            nh, p = _varint_slow(body, p)
            for _h in range(nh):
                n, p = _varint_slow(body, p)
                if n < 0:
                    hkeys.append("")
                else:
                    hkeys.append(body[p : p + n].decode("utf-8", "replace"))
                    p += n
                n, p = _varint_slow(body, p)
                if n < 0:
                    hvals.append(None)
                else:
                    hvals.append(body[p : p + n])
                    p += n
        hends.append(len(hkeys))
        offs.append(off)
        tss.append(max_ts if log_append else first_ts + ts_delta)
        types.append(ts_type)
        if p != rec_end:
            raise ValueError(f"record at offset {off} does not match its length")


# Vectorized decoding. Python's per-record cost is what limits the reader, so a group of
# batches is decoded column-wise with numpy: one short Python loop finds where each record
# starts (a record's length is the only thing that says where the next one begins), then
# every field of every record is read with array operations, and keys, values and headers
# are cut out of the batch bodies by pyarrow in C (no bytes object per record). Anything the
# vectorized path does not handle -- a damaged or odd record, a failing codec, varints
# beyond 9 bytes -- sends the group to the per-record decoder above, which is the reference:
# it decides about errors, so both paths deliver the same rows and raise the same errors.


class _Irregular(Exception):
    """The vectorized decoder declines a group; the exact per-record decoder takes it."""


class Chunk:
    """Decoded rows of one topic partition as Arrow-ready columns (what read_slice yields).

    `keys`, `values`, `header_keys` (str) and `header_values` are pyarrow arrays, the others
    numpy arrays. Headers are kept flat, as Arrow stores them: row i's headers are
    `header_keys[header_ends[i]:header_ends[i + 1]]`; a row without headers is null (as in
    Spark's Kafka source), not an empty list.
    """

    __slots__ = ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends", "header_keys", "header_values")

    def __init__(self, keys, values, offsets, timestamps, ts_types, header_ends, header_keys, header_values) -> None:
        self.keys = keys
        self.values = values
        self.offsets = offsets  # int64
        self.timestamps = timestamps  # int64 milliseconds
        self.ts_types = ts_types  # int32
        self.header_ends = header_ends  # int32, len + 1 entries
        self.header_keys = header_keys
        self.header_values = header_values

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def from_columns(cls, cols: Columns) -> "Chunk":
        import numpy as np
        import pyarrow as pa

        return cls(
            pa.array(cols.keys, pa.binary()),
            pa.array(cols.values, pa.binary()),
            np.array(cols.offsets, np.int64),
            np.array(cols.timestamps, np.int64),
            np.array(cols.ts_types, np.int32),
            np.array([0] + cols.header_ends, np.int32),
            pa.array(cols.header_keys, pa.string()),
            pa.array(cols.header_values, pa.binary()),
        )


# Bytes from a record's start to the next record's, by the first byte of its length varint
# (sign bit ignored): 1-byte lengths need nothing else; 2-byte ones add (second byte << 6).
# A table lookup is ~30% cheaper per record than the shifts and masks.
_RECORD_STEP = [1 + (b >> 1) for b in range(0x80)] + [2 + ((b & 0x7F) >> 1) for b in range(0x80, 0x100)]


def _vvarint(np, arr, pos):
    """Zigzag varints starting at `pos` (int64 array) in the uint8 array `arr`: (values, next positions).

    Small records have 1- or 2-byte varints: those take one or two gathers over all elements;
    only longer ones are extended element by element. Over 9 bytes (beyond int64) is left to
    the exact decoder.
    """
    b = arr[pos]
    more = b >= 0x80
    if not more.any():
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), pos + 1
    c = arr.take(pos + 1, mode="clip")  # clip: a 1-byte varint may end the data; c is unused there
    if not (more & (c >= 0x80)).any():  # none longer than 2 bytes: no index lists needed
        v = b.astype(np.int64)
        v = np.where(more, (v & 0x7F) | (c.astype(np.int64) << 7), v)
        return (v >> 1) ^ -(v & 1), pos + 1 + more
    v = (b & 0x7F).astype(np.int64)
    nxt = pos + 1
    idx = np.flatnonzero(more)
    shift = 7
    while idx.size:
        if shift > 56:
            raise _Irregular
        c = arr[nxt[idx]]
        v[idx] |= (c & 0x7F).astype(np.int64) << shift
        nxt[idx] += 1
        idx = idx[c >= 0x80]
        shift += 7
    return (v >> 1) ^ -(v & 1), nxt


def _spans_to_binary(np, pa, pbuf, large: bool, pos, lens, null=None):
    """A binary array of data[pos[i]:pos[i] + lens[i]] (null where `null`), copied out in C.

    The spans and the gaps between them form one binary array over the unchanged buffer
    (offsets pos0, end0, pos1, end1, ...; spans are in buffer order); taking every other
    element packs the spans contiguously.
    """
    n = len(pos)
    if n == 0:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int64 if large else np.int32)
    bounds[0::2] = pos
    bounds[1::2] = pos + lens
    spans = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pbuf])
    idx = np.arange(0, 2 * n, 2, dtype=np.int64)
    out = spans.take(pa.array(idx, mask=null) if null is not None and null.any() else idx)
    return out.cast(pa.binary()) if large else out


def _decode_fast(buf, group: list[tuple[int, records.BatchHeader, int]], hi: "int | list[int]") -> Chunk:
    """Records with offsets in [first, hi) of the CRC-checked data batches `group`
    ((position in buf, header, first wanted offset)), or _Irregular. `hi` is one end for
    all batches, or a list of one per batch (batches of several slices joined)."""
    import numpy as np
    import pyarrow as pa

    hs = records.HEADER_SIZE
    if any(h.compression != records.COMPRESSION_NONE for _, h, _ in group):
        parts, spans, size = [], [], 0
        mv = memoryview(buf)
        for bpos, h, _ in group:
            body = mv[bpos + hs : bpos + h.size]
            if h.compression != records.COMPRESSION_NONE:
                try:
                    body = records.decompress(h.compression, body)
                except Exception:
                    raise _Irregular from None
            parts.append(body)
            spans.append((size, size + len(body)))
            size += len(body)
        data = b"".join(parts)
    else:
        data = buf  # read the bodies in place
        spans = [(bpos + hs, bpos + h.size) for bpos, h, _ in group]

    # Record starts: the only sequential step, so it does the least per record: it reads the
    # length varint's magnitude (ignoring the zigzag sign bit), so positions only grow and
    # "inside the body" is one check per batch. The vectorized pass below decodes the length
    # properly and declines the group if any record does not end where the next one starts.
    starts: list[int] = []
    add = starts.append
    step = _RECORD_STEP
    try:
        for (p, end), (_, h, _) in zip(spans, group):
            for _ in range(h.record_count):
                add(p)
                b = data[p]
                if b < 0x80:
                    p += step[b]
                else:
                    c = data[p + 1]
                    if c < 0x80:
                        p += step[b] + (c << 6)
                    else:
                        n, p = _varint_slow(data, p)
                        p += abs(n)
            if p > end:
                raise _Irregular
    except (IndexError, ValueError):
        raise _Irregular from None

    arr = np.frombuffer(data, np.uint8)
    limit = len(arr)
    rec = np.array(starts, np.int64)
    try:
        length, q = _vvarint(np, arr, rec)
        rec_end = q + length
        ts_delta, q = _vvarint(np, arr, q + 1)  # + 1: record attributes
        off_delta, q = _vvarint(np, arr, q)
        klen, q = _vvarint(np, arr, q)
        kpos = q
        if klen.max(initial=0) > limit:
            raise _Irregular
        q = q + np.maximum(klen, 0)
        vlen, q = _vvarint(np, arr, q)
        vpos = q
        if vlen.max(initial=0) > limit:
            raise _Irregular
        q = q + np.maximum(vlen, 0)
        nh, q = _vvarint(np, arr, q)
        nh = np.maximum(nh, 0)  # a negative count means no headers, as range() does
        n_rows = len(rec)
        hends = np.zeros(n_rows + 1, np.int64)
        np.cumsum(nh, out=hends[1:])
        total = int(hends[-1]) if n_rows else 0
        if total:
            # each header takes at least two bytes: also bounds the arrays allocated here
            if (nh > (rec_end - q) // 2).any():
                raise _Irregular
            hkpos = np.empty(total, np.int64)
            hklen = np.empty(total, np.int64)
            hvpos = np.empty(total, np.int64)
            hvlen = np.empty(total, np.int64)
            rows = np.flatnonzero(nh)
            slot, hq, left = hends[rows], q[rows], nh[rows]
            while rows.size:  # the j-th header of every row that has one, j = 0, 1, ...
                kl, hq = _vvarint(np, arr, hq)
                kl = np.maximum(kl, 0)  # a null header key reads as ""
                if kl.max() > limit:
                    raise _Irregular
                hkpos[slot], hklen[slot] = hq, kl
                hq = hq + kl
                vl, hq = _vvarint(np, arr, hq)
                if vl.max() > limit:
                    raise _Irregular
                hvpos[slot], hvlen[slot] = hq, vl
                hq = hq + np.maximum(vl, 0)
                left = left - 1
                done = left == 0
                q[rows[done]] = hq[done]
                more = ~done
                rows, slot, hq, left = rows[more], slot[more] + 1, hq[more], left[more]
    except IndexError:
        raise _Irregular from None
    # every field inside its record, each record read exactly to its end, and (lengths were
    # taken unsigned above) each one ending where the walk put the next record
    if not np.array_equal(q, rec_end) or (length < 0).any():
        raise _Irregular

    # Deltas from varints of at most 9 bytes are below 2**62 in magnitude, so int64 sums
    # cannot wrap unless a header value is that large too (Python ints would not wrap).
    if any(abs(h.base_offset) >= 1 << 62 or abs(h.first_timestamp) >= 1 << 62 for _, h, _ in group):
        raise _Irregular
    counts = [h.record_count for _, h, _ in group]
    which = np.repeat(np.arange(len(group)), counts)
    offsets = np.array([h.base_offset for _, h, _ in group], np.int64)[which] + off_delta
    first = np.array([f for _, _, f in group], np.int64)[which]
    keep = (offsets >= first) & (offsets < (np.array(hi, np.int64)[which] if isinstance(hi, list) else hi))
    log_append = np.array([h.is_log_append_time for _, h, _ in group], bool)
    if log_append.any():
        log_append = log_append[which]
        created = np.array([h.first_timestamp for _, h, _ in group], np.int64)[which] + ts_delta
        timestamps = np.where(log_append, np.array([h.max_timestamp for _, h, _ in group], np.int64)[which], created)
        ts_types = log_append.astype(np.int32)
    else:
        timestamps = np.array([h.first_timestamp for _, h, _ in group], np.int64)[which] + ts_delta
        ts_types = np.zeros(len(offsets), np.int32)
    if not keep.all():  # offsets outside the wanted range (slice ends, already read)
        offsets, timestamps, ts_types = offsets[keep], timestamps[keep], ts_types[keep]
        kpos, klen, vpos, vlen = kpos[keep], klen[keep], vpos[keep], vlen[keep]
        if total:
            hkeep = np.repeat(keep, nh)
            hkpos, hklen, hvpos, hvlen = hkpos[hkeep], hklen[hkeep], hvpos[hkeep], hvlen[hkeep]
        nh = nh[keep]
        hends = np.zeros(len(nh) + 1, np.int64)
        np.cumsum(nh, out=hends[1:])

    pbuf = pa.py_buffer(data)
    large = limit > 0x7FFFFFFF
    knull, vnull = klen < 0, vlen < 0
    keys = _spans_to_binary(np, pa, pbuf, large, kpos, np.maximum(klen, 0), knull)
    values = _spans_to_binary(np, pa, pbuf, large, vpos, np.maximum(vlen, 0), vnull)
    if total and len(hkpos):
        hkeys = _spans_to_binary(np, pa, pbuf, large, hkpos, hklen)
        try:
            hkeys = hkeys.cast(pa.string())  # checks UTF-8
        except pa.ArrowInvalid:  # not UTF-8: replace bad bytes, as bytes.decode(errors="replace")
            hkeys = pa.array([k.decode("utf-8", "replace") for k in hkeys.to_pylist()], pa.string())
        hvalues = _spans_to_binary(np, pa, pbuf, large, hvpos, np.maximum(hvlen, 0), hvlen < 0)
    else:
        hkeys, hvalues = pa.array([], pa.string()), pa.array([], pa.binary())
    return Chunk(keys, values, offsets, timestamps, ts_types, hends.astype(np.int32), hkeys, hvalues)


@dataclass(slots=True)
class SkipReport:
    """What a read skipped because of damage (only with failOnCorruption=false).

    Each entry names the object, the first offset and byte affected, and how many offsets
    were not delivered because of it.
    """

    entries: list[dict] = field(default_factory=list)

    @property
    def offsets(self) -> int:
        return sum(e["offsets_skipped"] for e in self.entries)

    def add(self, err: CorruptSegmentError, offsets_skipped: int, **extra: Any) -> None:
        entry = {"object": err.key, "offset": err.offset, "byte": err.byte, "error": err.what, "offsets_skipped": max(0, offsets_skipped), **extra}
        self.entries.append(entry)
        log.warning("skipped damaged data: %s", entry)

    def write(self, directory: str | None) -> None:
        """Leave the entries as one JSON file in `directory` (summed by `read_skip_log`)."""
        if not directory or not self.entries:
            return
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"skipped-{uuid.uuid4().hex}.json")
        with open(path, "w") as f:
            json.dump(self.entries, f)


def read_skip_log(directory: str) -> dict:
    """Sum what readers given `corruptionLog=<directory>` skipped: {"offsets_skipped": n, "entries": [...]}."""
    entries: list[dict] = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.startswith("skipped-") and name.endswith(".json"):
                with open(os.path.join(directory, name)) as f:
                    entries.extend(json.load(f))
    return {"offsets_skipped": sum(e["offsets_skipped"] for e in entries), "entries": entries}


@dataclass(slots=True)
class ReadOptions:
    storage: str
    namespace: str = "default"
    fail_on_corruption: bool = True
    corruption_log: str | None = None
    batch_rows: int = DEFAULT_ARROW_BATCH_ROWS


@dataclass(slots=True)
class _SliceState:
    next_expected: int  # offsets below it were emitted (or skipped) already: never emit twice
    skipped: SkipReport


def _decode_group(key: str, buf, group: list[tuple[int, records.BatchHeader, int]], hi: int, abs_start: int, st: _SliceState, fail: bool) -> Chunk:
    """Decode CRC-checked data batches (position, header, first wanted offset) at once;
    batch by batch with the exact decoder when the fast path declines."""
    try:
        return _decode_fast(buf, group, hi)
    except _Irregular:
        pass
    cols = Columns()
    for batch_pos, h, first in group:
        body = bytes(buf[batch_pos + records.HEADER_SIZE : batch_pos + h.size])
        mark = len(cols)
        try:
            if h.compression != records.COMPRESSION_NONE:
                body = records.decompress(h.compression, body)
            decode_batch_into(cols, body, h, first, hi)
        except Exception as ex:  # bad codec data or record layout inside a CRC-valid batch
            cols.truncate(mark)
            e = CorruptSegmentError(key, f"undecodable record batch ({type(ex).__name__}: {ex})", byte=abs_start + batch_pos, offset=h.base_offset)
            if fail:
                raise e from ex
            st.skipped.add(e, min(h.last_offset + 1, hi) - max(h.base_offset, first))
    return Chunk.from_columns(cols)


def _decode_range(
    opts: ReadOptions, st: _SliceState, s: SegmentSlice, key: str, buf, begin: int, end: int, abs_start: int, collect: "Callable[..., None] | None" = None
) -> Iterator[Chunk]:
    """Decode the whole batches in buf[begin:end], yielding chunks of about opts.batch_rows rows.

    Batches are framed and CRC-checked one by one, then decoded in groups. A group is
    decoded before any damage is handled, so errors and skip entries come in batch order.
    With `collect`, the checked groups are handed to it (key, buf, group, hi, abs_start, st)
    instead of being decoded here (see _Joined); nothing is yielded then.
    """
    fail = opts.fail_on_corruption
    lo, hi = s.start_offset, s.end_offset
    group: list[tuple[int, records.BatchHeader, int]] = []  # batches waiting to be decoded
    group_rows = 0

    def flush() -> "Chunk | tuple":
        nonlocal group, group_rows
        if collect is not None:
            collect(key, buf, group, hi, abs_start, st)
            chunk: Chunk | tuple = ()
        else:
            chunk = _decode_group(key, buf, group, hi, abs_start, st, fail)
        group, group_rows = [], 0
        return chunk

    pos = begin
    while pos < end:
        try:
            h = _checked_header(key, buf, pos, end, abs_start)
        except CorruptSegmentError as e:
            if group and len(chunk := flush()):
                yield chunk
            if fail:
                raise
            # framing is lost: nothing after this point can be located
            st.skipped.add(e, hi - st.next_expected, skipped_bytes=end - pos)
            st.next_expected = hi
            return
        batch_pos = pos
        pos += h.size
        if h.last_offset < max(lo, st.next_expected):
            continue
        if h.base_offset >= hi:
            break
        if records.crc32c(memoryview(buf)[batch_pos + records.CRC_START : batch_pos + h.size]) != h.crc:
            if group and len(chunk := flush()):
                yield chunk
            e = CorruptSegmentError(key, "record batch CRC32C mismatch", byte=abs_start + batch_pos, offset=h.base_offset)
            if fail:
                raise e
            st.skipped.add(e, min(h.last_offset + 1, hi) - max(h.base_offset, lo, st.next_expected))
            st.next_expected = max(st.next_expected, h.last_offset + 1)
            continue
        if not h.is_control and not aborted_batch(s.aborted, h):
            group.append((batch_pos, h, max(lo, st.next_expected)))
            group_rows += h.record_count
        st.next_expected = max(st.next_expected, h.last_offset + 1)
        if group_rows >= opts.batch_rows and len(chunk := flush()):
            yield chunk
    if group and len(chunk := flush()):
        yield chunk


PREFETCH_OBJECTS = 64  # objects fetched at once (concurrently, one event loop) for a packed task
PREFETCH_BYTES = 32 * 1024 * 1024


def read_slices(opts: ReadOptions, slices: "tuple[SegmentSlice, ...] | list[SegmentSlice]") -> Iterator[tuple[SegmentSlice, Chunk]]:
    """read_slice over several slices (a task packed from many small segments), fetching
    their objects in windows of up to PREFETCH_OBJECTS / PREFETCH_BYTES in one request to
    the store (ObjectStore.get_many) instead of one loop and one request at a time per object.

    With failOnCorruption (the default), consecutive slices of a partition are decoded
    together: their checked batches are joined into one buffer and decoded in one pass
    (_Joined), so a task over hundreds of tiny segments (a broker flushing every few
    milliseconds writes them) costs about what one segment of the same bytes costs, and
    yields chunks of about arrowBatchRows rows rather than one per segment. A slice whose
    object changed or is damaged goes through read_slice alone (re-plan, exact errors).
    """
    joined = _Joined(opts) if opts.fail_on_corruption else None
    i = 0
    while i < len(slices):
        window = [slices[i]]
        size = slices[i].size
        while i + len(window) < len(slices) and len(window) < PREFETCH_OBJECTS and size + slices[i + len(window)].size <= PREFETCH_BYTES:
            size += slices[i + len(window)].size
            window.append(slices[i + len(window)])
        i += len(window)
        fetched = run_with_store(opts.storage, _prefetch(window)) if len(window) > 1 or joined is not None else [None]
        for sl, data in zip(window, fetched):
            if joined is not None:
                if joined.tp not in (None, (sl.topic, sl.partition)):
                    yield from joined.drain()
                if data is not None and joined.add(sl, data):
                    if joined.rows >= opts.batch_rows:
                        yield from joined.drain()
                    continue
                yield from joined.drain()
            for chunk in read_slice(opts, sl, prefetched=data):
                yield sl, chunk
    if joined is not None:
        yield from joined.drain()


class _Joined:
    """Checked batches of consecutive slices of one partition, decoded together.

    `add` frames and CRC-checks a slice's batches (as read_slice does, raising the same
    errors) and keeps them; `drain` joins the kept batches into one buffer and decodes them
    in one vectorized pass, each batch keeping only its own slice's offsets. Should the fast
    decoder decline, each slice's groups are decoded on their own by the exact decoder.
    """

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.tp: TopicPartition | None = None
        self.first: SegmentSlice | None = None
        self.pending: list[tuple] = []  # (key, buf, group, hi, abs_start, st)
        self.rows = 0

    def _collect(self, key: str, buf, group: list, hi: int, abs_start: int, st: _SliceState) -> None:
        self.pending.append((key, buf, group, hi, abs_start, st))
        self.rows += sum(h.record_count for _, h, _ in group)

    def add(self, s: SegmentSlice, data: bytes) -> bool:
        """Take slice `s` (its fetched bytes); False when it needs read_slice instead: the
        object changed since planning, or it is damaged (exact error or re-plan there)."""
        st = _SliceState(s.start_offset, SkipReport())
        if s.byte_range is not None:
            if s.range_bounds is not None:
                try:
                    data = _within_bounds(data, s.byte_range, s.range_bounds)
                except _ObjectChanged:
                    return False
            if len(data) != s.byte_range[1] - s.byte_range[0]:
                return False
            begin, end, abs_start = 0, len(data), s.byte_range[0]
        else:
            try:
                decoded = segment.decode(data, verify_crc=True, name=s.key)
            except segment.SegmentFormatError:
                return False
            begin, end, abs_start = segment.HEADER_SIZE, len(decoded.data) - segment.FOOTER_SIZE, 0
        if self.first is None:
            self.first, self.tp = s, (s.topic, s.partition)
        for _ in _decode_range(self.opts, st, s, s.key, data, begin, end, abs_start, collect=self._collect):
            pass
        return True

    def drain(self) -> Iterator[tuple[SegmentSlice, Chunk]]:
        """Decode what is kept, in runs of about arrowBatchRows rows (a large slice's groups
        one by one, tiny slices' many at once)."""
        pending, first = self.pending, self.first
        self.pending, self.first, self.tp, self.rows = [], None, None, 0
        run: list[tuple] = []
        rows = 0
        for entry in pending:
            run.append(entry)
            rows += sum(h.record_count for _, h, _ in entry[2])
            if rows >= self.opts.batch_rows:
                yield from self._decode(first, run)
                run, rows = [], 0
        if run:
            yield from self._decode(first, run)

    @staticmethod
    def _decode(first: SegmentSlice, run: list[tuple]) -> Iterator[tuple[SegmentSlice, Chunk]]:
        if len(run) > 1:
            parts, group, his, size = [], [], [], 0
            for _key, buf, grp, hi, _abs, _st in run:
                mv = memoryview(buf)
                for pos, h, lo in grp:
                    parts.append(mv[pos : pos + h.size])
                    group.append((size, h, lo))
                    his.append(hi)
                    size += h.size
            try:
                chunk = _decode_fast(b"".join(parts), group, his)
            except _Irregular:
                pass
            else:
                if len(chunk):
                    yield first, chunk
                return
        for key, buf, grp, hi, abs_start, st in run:
            chunk = _decode_group(key, buf, grp, hi, abs_start, st, True)
            if len(chunk):
                yield first, chunk


def _prefetch(window: list[SegmentSlice]):
    async def get_all(store: ObjectStore) -> list:
        # an object not found comes back None: read_slice asks again and re-plans (a merge replaced it)
        return await store.get_many([(sl.key, _fetched_range(sl.byte_range, sl.range_bounds)) for sl in window], METADATA_CONCURRENCY)

    return get_all


def read_slice(opts: ReadOptions, s: SegmentSlice, prefetched: bytes | None = None) -> Iterator[Chunk]:
    """Decode the records of a slice in offset order, each offset at most once, in column
    chunks. `prefetched`: the slice's object (or byte range), already read."""
    st = _SliceState(s.start_offset, SkipReport())
    pending: list[tuple[str, tuple[int, int] | None, tuple[int, int] | None]] = [(s.key, s.byte_range, s.range_bounds)]
    replanned = False
    while pending and st.next_expected < s.end_offset:
        key, byte_range, bounds = pending.pop(0)
        try:
            if prefetched is not None:
                data, prefetched = prefetched, None
            else:
                data = run_with_store(opts.storage, _getter(key, _fetched_range(byte_range, bounds)))
            if byte_range is not None and bounds is not None:
                data = _within_bounds(data, byte_range, bounds)
        except (ObjectNotFound, _ObjectChanged):
            if replanned:
                raise
            # A merge deleted this object after planning, or a compaction rewrote it (other
            # batches at the planned byte positions): its offsets now live elsewhere or at
            # other positions; re-list the partition and read whatever covers what is still
            # missing (whole objects).
            replanned = True
            slices = _replan(opts, s, st.next_expected)
            pending = [(sl.key, sl.byte_range, sl.range_bounds) for sl in slices]
            # Offsets the new plan leaves out lie in segments found damaged (and skipped:
            # failOnCorruption=false; any other gap fails the re-plan): report them.
            pos = st.next_expected
            for lo, hi in [(sl.start_offset, sl.end_offset) for sl in slices] + [(s.end_offset, s.end_offset)]:
                if lo > pos:
                    st.skipped.add(CorruptSegmentError(key, "unreadable segment found when re-planning", offset=pos), lo - pos)
                pos = max(pos, hi)
            continue
        deferred = None
        if byte_range is None:
            area = _check_whole_segment(opts, st, s, key, data)
            if area is None:
                continue
            begin, end, deferred = area
            abs_start = 0
        else:
            want = byte_range[1] - byte_range[0]
            if len(data) != want:
                e = CorruptSegmentError(key, f"ranged read returned {len(data)} of {want} bytes (truncated object)", byte=byte_range[0] + len(data), offset=st.next_expected)
                if opts.fail_on_corruption:
                    raise e
                log.warning("%s; reading what is there", e)
            begin, end, abs_start = 0, len(data), byte_range[0]
        yield from _decode_range(opts, st, s, key, data, begin, end, abs_start)
        if deferred is not None:  # per-batch checks passed, yet the object is damaged
            raise CorruptSegmentError(key, deferred.what, offset=st.next_expected)
    st.skipped.write(opts.corruption_log)


class _ObjectChanged(PipelineError):
    """The object under a slice's key is not the one its byte range was planned on."""


def _fetched_range(byte_range: tuple[int, int] | None, bounds: tuple[int, int] | None) -> tuple[int, int] | None:
    """What to read for a slice's byte range: with bounds, the range and the 16 bytes after
    it (the next batch's base offset, or the footer), to check the object is the planned one."""
    if byte_range is None or bounds is None:
        return byte_range
    return byte_range[0], byte_range[1] + segment.FOOTER_SIZE


def _within_bounds(data: bytes, byte_range: tuple[int, int], bounds: tuple[int, int]) -> bytes:
    """The planned range out of `data` (read by _fetched_range), after checking that the
    batches around it are the planned ones (else _ObjectChanged). A batch with the planned
    base offset at each end means the range holds exactly the object's batches between them,
    whatever the compactor removed from them; anything else is another object."""
    n = byte_range[1] - byte_range[0]
    first, after = bounds
    ok = len(data) == n + segment.FOOTER_SIZE and n >= records.HEADER_SIZE and records.read_base_offset(data, 0) == first
    if ok and after >= 0:
        ok = records.read_base_offset(data, n) == after
    elif ok:
        ok = segment.FOOTER.unpack_from(data, n)[2] == segment.FOOTER_MAGIC
    if not ok:
        raise _ObjectChanged(f"byte range {byte_range} no longer lies between the batches at offsets {first} and {after}")
    return data[:n]


def _getter(key: str, byte_range: tuple[int, int] | None):
    async def get(store: ObjectStore) -> bytes:
        if byte_range is None:
            return await store.get(key)
        return await store.get(key, byte_range[0], byte_range[1])

    return get


def _check_whole_segment(opts: ReadOptions, st: _SliceState, s: SegmentSlice, key: str, data: bytes) -> tuple[int, int, CorruptSegmentError | None] | None:
    """Check header, footer and segment CRC of a whole object.

    Returns the batch area to decode and, when only the segment CRC failed, the error to
    raise if the per-batch checks do not pinpoint the damaged batch first. None: unreadable.
    """
    try:
        decoded = segment.decode(data, verify_crc=True, name=key)
        return segment.HEADER_SIZE, len(decoded.data) - segment.FOOTER_SIZE, None
    except segment.SegmentFormatError as e:
        err = CorruptSegmentError(key, str(e).removeprefix(f"{key}: "), offset=st.next_expected)
    header_ok = len(data) >= segment.HEADER_SIZE and int.from_bytes(data[:4], "big") == segment.SEGMENT_MAGIC
    footer_ok = header_ok and len(data) >= segment.HEADER_SIZE + segment.FOOTER_SIZE and int.from_bytes(data[-4:], "big") == segment.FOOTER_MAGIC
    if footer_ok:
        # The batch framing is intact: per-batch CRCs find the damaged batch (and its offset).
        return segment.HEADER_SIZE, len(data) - segment.FOOTER_SIZE, err if opts.fail_on_corruption else None
    if opts.fail_on_corruption:
        if header_ok:
            # a truncated object: decode up to the damage so the error names the batch
            return segment.HEADER_SIZE, len(data), err
        raise err from None
    if header_ok:
        log.warning("%s; reading its whole batches one by one", err)
        return segment.HEADER_SIZE, len(data), None
    st.skipped.add(err, s.end_offset - st.next_expected)
    st.next_expected = s.end_offset
    return None


def _replan(opts: ReadOptions, s: SegmentSlice, next_expected: int) -> list[SegmentSlice]:
    async def go(store: ObjectStore) -> list[SegmentSlice]:
        listing = await list_topics(store, opts.namespace, topics=[s.topic])
        segs = listing.segments.get((s.topic, s.partition), [])
        metas = await fetch_metas(store, candidate_keys(segs, next_expected, s.end_offset), fail_on_corruption=opts.fail_on_corruption)
        pieces = cover(metas, next_expected, s.end_offset, fail_on_data_loss=True, tp=(s.topic, s.partition))
        return [SegmentSlice(s.topic, s.partition, m.key, a, b, None) for m, a, b in pieces]

    return run_with_store(opts.storage, go)


# ---------------------------------------------------------------------------------------
# Output shapes


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def arrow_schema(include_headers: bool = True):
    """The Arrow form of the Spark Kafka source schema (what Spark expects from read());
    without the `headers` column unless include_headers (Spark's includeHeaders)."""
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


def columns_to_arrow(cols: "Chunk | Columns", topic: str, partition: int, schema=None):
    """One Arrow record batch of the source schema, built from arrays without a Python object per row."""
    import numpy as np
    import pyarrow as pa

    chunk = cols if isinstance(cols, Chunk) else Chunk.from_columns(cols)
    schema = schema or arrow_schema()
    n = len(chunk)
    arrays = [
        chunk.keys,
        chunk.values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.full(n, partition, np.int32)),
        pa.array(chunk.offsets),
        pa.array(chunk.timestamps * 1000, schema.field("timestamp").type),
        pa.array(chunk.ts_types),
    ]
    if schema.get_field_index("headers") >= 0:
        list_type = schema.field("headers").type
        if len(chunk.header_keys):
            header_structs = pa.StructArray.from_arrays([chunk.header_keys, chunk.header_values], fields=list(list_type.value_type))
            ends = chunk.header_ends
            headers = pa.ListArray.from_arrays(pa.array(ends), header_structs, type=list_type, mask=pa.array(ends[1:] == ends[:-1]))
        else:
            headers = pa.nulls(n, list_type)
        arrays.append(headers)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def columns_to_tuples(cols: "Chunk | Columns", topic: str, partition: int, include_headers: bool = True) -> Iterator[tuple]:
    """Row tuples of the source schema (the `arrow=false` path); columns go to Python objects
    in C where pyarrow/numpy can, so this is as fast as a row path gets."""
    import numpy as np

    chunk = cols if isinstance(cols, Chunk) else Chunk.from_columns(cols)
    n = len(chunk)
    epoch, delta = _EPOCH, _dt.timedelta
    headers: list = [None] * n
    if include_headers and len(chunk.header_keys):
        hkeys, hvals = chunk.header_keys.to_pylist(), chunk.header_values.to_pylist()
        ends = chunk.header_ends
        starts_l, ends_l = ends[:-1].tolist(), ends[1:].tolist()
        for i in np.flatnonzero(ends[1:] != ends[:-1]).tolist():
            a, b = starts_l[i], ends_l[i]
            headers[i] = list(zip(hkeys[a:b], hvals[a:b]))
    columns = [
        chunk.keys.to_pylist(),
        chunk.values.to_pylist(),
        itertools.repeat(topic, n),
        itertools.repeat(partition, n),
        chunk.offsets.tolist(),
        [epoch + delta(milliseconds=ts) for ts in chunk.timestamps.tolist()],
        chunk.ts_types.tolist(),
    ]
    if include_headers:
        columns.append(headers)
    return zip(*columns)
