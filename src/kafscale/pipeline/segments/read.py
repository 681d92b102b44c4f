"""Reading a planned slice: fetch its object (or byte range), check it, decode it batch by
batch (CRC32C per batch, and per segment when the whole object is read), skip control
batches and aborted transactions, re-plan when a merge or compaction changed the object.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from kafscale.pipeline.segments.decode import Chunk, Columns, Declined, decode_batch_into, decode_fast
from kafscale.pipeline.segments.errors import CorruptSegmentError, PipelineError, SkipReport
from kafscale.pipeline.segments.listing import TopicPartition, list_topics
from kafscale.pipeline.segments.planning import SegmentSlice, candidate_keys, cover
from kafscale.pipeline.segments.runner import METADATA_CONCURRENCY, run_with_store
from kafscale.pipeline.segments.segment_meta import fetch_metas
from kafscale.pipeline.segments.transactions import aborted_batch
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.pipeline")

DEFAULT_ARROW_BATCH_ROWS = 65_536


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
        return decode_fast(buf, group, hi)
    except Declined:
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
            h = segment.checked_batch(buf, pos, end, abs_start=abs_start, name=key)
        except segment.SegmentFormatError as format_error:
            e = CorruptSegmentError.of(key, format_error)
            if group and len(chunk := flush()):
                yield chunk
            if fail:
                raise e from None
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
                chunk = decode_fast(b"".join(parts), group, his)
            except Declined:
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
        ok = segment.footer_last_offset(data, n) is not None
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
