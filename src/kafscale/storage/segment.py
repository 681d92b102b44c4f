"""Segment (.kfs) and sparse index (.index) files, byte-exact to kafscale-spec.md.

Segment: 32-byte header | Kafka v2 record batches as produced | 16-byte footer.
Index:   16-byte header | entries of (offset i64, file position i32).

Shared by the broker (write and read paths) and the Spark reader, so there is one codec.
"""

from __future__ import annotations

import bisect
import logging
import re
import struct
import time
from dataclasses import dataclass
from typing import Iterator

from kafscale.metadata.segments import SegmentInfo  # re-exported: the codec produces it
from kafscale.protocol import records
from kafscale.storage.objectstore import ObjectNotFound

log = logging.getLogger("kafscale.storage")

SEGMENT_MAGIC = 0x4B414653  # "KAFS"
FOOTER_MAGIC = 0x454E4421  # "END!"
INDEX_MAGIC = 0x00494458  # "IDX"
FORMAT_VERSION = 1
HEADER = struct.Struct(">IHHqiqI")  # magic, version, flags, base offset, count, created, reserved
FOOTER = struct.Struct(">IqI")  # crc32c of batches, last offset, magic
INDEX_HEADER = struct.Struct(">IHIIH")  # magic, version, entry count, interval, reserved
INDEX_ENTRY = struct.Struct(">qi")
HEADER_SIZE = HEADER.size
FOOTER_SIZE = FOOTER.size
DEFAULT_INDEX_INTERVAL = 100  # records between index entries

assert HEADER_SIZE == 32 and FOOTER_SIZE == 16 and INDEX_HEADER.size == 16


class SegmentFormatError(ValueError):
    """A segment (or index) object that is not as written. `what` says what is wrong without
    the object's name; `byte` and `offset` say where, when known (readers name the object
    and the place in their own error type)."""

    def __init__(self, message: str, *, what: str | None = None, byte: int | None = None, offset: int | None = None):
        super().__init__(message)
        self.what = message if what is None else what
        self.byte, self.offset = byte, offset


def segment_key(namespace: str, topic: str, partition: int, base_offset: int) -> str:
    return f"{namespace}/{topic}/{partition}/segment-{base_offset:020d}.kfs"


def index_key(namespace: str, topic: str, partition: int, base_offset: int) -> str:
    return f"{namespace}/{topic}/{partition}/segment-{base_offset:020d}.index"


def stored_at(namespace: str, topic: str, partition: int, seg: SegmentInfo) -> tuple[str, int, int | None]:
    """Where a committed segment's bytes are: (key, start, end), end None for the whole
    object. Its own spec object, or the range of a write-ahead object holding it
    (SegmentInfo.wao_key; storage/write_ahead.py), which is a whole spec segment too."""
    if seg.wao_key:
        return seg.wao_key, seg.wao_position, seg.wao_position + seg.size
    return segment_key(namespace, topic, partition, seg.base_offset), 0, None


def segment_key_pattern(namespace: str) -> re.Pattern:
    """Matches a whole segment_key under `namespace`; groups: topic, partition, base offset.
    One regex match per key: a stream lists tens of thousands of keys a trigger."""
    return re.compile(re.escape(namespace) + r"/([^/]+)/([0-9]+)/segment-([0-9]+)\.kfs")


def segment_key_of_index(key: str) -> str:
    """The segment_key an index_key belongs to."""
    return key[: -len(".index")] + ".kfs"


def index_key_of_segment(key: str) -> str:
    """The index_key of a segment_key."""
    return key[: -len(".kfs")] + ".index"


def partition_prefix(namespace: str, topic: str, partition: int) -> str:
    return f"{namespace}/{topic}/{partition}/"


def parse_segment_key(key: str) -> int | None:
    """Base offset of a `segment-<offset>.kfs` key, or None for any other key."""
    name = key.rsplit("/", 1)[-1]
    if not (name.startswith("segment-") and name.endswith(".kfs")):
        return None
    digits = name[len("segment-") : -len(".kfs")]
    return int(digits) if digits.isdigit() else None


@dataclass(slots=True)
class EncodedSegment:
    info: SegmentInfo
    parts: list  # header, batch buffers..., footer: written without joining first
    index: bytes


def encode(
    batches: list,
    base_offset: int,
    *,
    index_interval: int = DEFAULT_INDEX_INTERVAL,
    created_ms: int | None = None,
    aborted: tuple = (),
    open_txns: tuple = (),
    last_offset: int | None = None,
    cleaned: bool = False,
    delete_horizon_ms: int = -1,
) -> EncodedSegment:
    """Wrap already-offset-patched batch buffers in a segment, and build its sparse index.

    `batches` is a list of bytes-like objects, each holding one or more whole batches;
    `aborted` the aborted-transaction entries of its ABORT markers and `open_txns` the
    transactions open at its end (kept in the metadata only: the segment file format has no
    place for them). `last_offset` overrides the last batch's: a compacted segment keeps the
    offset range it had even when its last records were cleaned away, and is `cleaned`
    (SegmentInfo.cleaned: written by the compactor) with the earliest delete horizon of what
    it kept (`delete_horizon_ms`).
    """
    created_ms = int(time.time() * 1000) if created_ms is None else created_ms
    count = 0
    last_offset_seen = base_offset - 1
    max_ts = -1
    crc = 0
    entries: list[bytes] = []
    since_entry = index_interval  # force an entry for the first batch
    pos = HEADER_SIZE
    for buf in batches:
        crc = records.crc32c(buf, crc)
        for bpos, batch_base, batch_last, batch_max_ts, records_in in records.batch_spans(buf):
            if since_entry >= index_interval:
                entries.append(INDEX_ENTRY.pack(batch_base, pos + bpos))
                since_entry = 0
            since_entry += records_in
            count += records_in
            last_offset_seen = batch_last
            if batch_max_ts > max_ts:
                max_ts = batch_max_ts
        pos += len(buf)
    if last_offset is not None:
        if last_offset < last_offset_seen:
            raise ValueError(f"last offset {last_offset} is below the last batch's {last_offset_seen}")
        last_offset_seen = last_offset
    last_offset = last_offset_seen
    size = pos + FOOTER_SIZE
    header = HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, base_offset, count, created_ms, 0)
    footer = FOOTER.pack(crc, last_offset, FOOTER_MAGIC)
    index = INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, len(entries), index_interval, 0) + b"".join(entries)
    info = SegmentInfo(base_offset, last_offset, size, count, max_ts, created_ms, tuple(aborted), tuple(open_txns), cleaned, delete_horizon_ms)
    return EncodedSegment(info, [header, *batches, footer], index)


def segment_objects(namespace: str, topic: str, partition: int, enc: EncodedSegment, index_min_bytes: int) -> list[tuple[str, list]]:
    """The objects to upload for one sealed segment: the .kfs, plus its .index when it is
    big enough to be read by ranges (from `index_min_bytes` on; smaller segments are always
    read whole, so an index would be one more PUT per flush that no reader needs)."""
    objects = [(segment_key(namespace, topic, partition, enc.info.base_offset), enc.parts)]
    if enc.info.size >= index_min_bytes:
        objects.append((index_key(namespace, topic, partition, enc.info.base_offset), [enc.index]))
    return objects


@dataclass(frozen=True, slots=True)
class DecodedSegment:
    info: SegmentInfo
    data: memoryview  # the whole object; batches live in data[HEADER_SIZE : size - FOOTER_SIZE]

    @property
    def batches(self) -> memoryview:
        return self.data[HEADER_SIZE : len(self.data) - FOOTER_SIZE]


def decode(data, *, verify_crc: bool = True, name: str = "segment") -> DecodedSegment:
    """Parse and check a whole segment object."""
    mv = memoryview(data)
    if len(mv) < HEADER_SIZE + FOOTER_SIZE:
        _malformed(name, f"{len(mv)} bytes is too short for a segment")
    magic, version, _flags, base_offset, count, created, _ = HEADER.unpack_from(mv, 0)
    if magic != SEGMENT_MAGIC:
        _malformed(name, f"bad header magic {magic:#x}")
    if version != FORMAT_VERSION:
        _malformed(name, f"unsupported segment version {version}")
    crc, last_offset, fmagic = FOOTER.unpack_from(mv, len(mv) - FOOTER_SIZE)
    if fmagic != FOOTER_MAGIC:
        _malformed(name, "bad footer magic (truncated object?)")
    body_end = len(mv) - FOOTER_SIZE
    if verify_crc and records.crc32c(mv[HEADER_SIZE:body_end]) != crc:
        _malformed(name, "CRC32C of the batches does not match the footer")
    max_ts = -1
    expected = base_offset
    for pos, h in walk(mv, HEADER_SIZE, body_end, name=name):
        if h.base_offset < expected:
            _malformed(name, f"batch at byte {pos} has offset {h.base_offset} < {expected}")
        expected = h.last_offset + 1
        max_ts = max(max_ts, h.max_timestamp)
    return DecodedSegment(SegmentInfo(base_offset, last_offset, len(mv), count, max_ts, created), mv)


def checked_batch(buf, pos: int, end: int, *, abs_start: int = 0, name: str = "segment") -> records.BatchHeader:
    """The header of the batch at buf[pos], checked to frame a whole v2 batch inside buf[:end]
    (SegmentFormatError naming its byte, abs_start + pos, and offset otherwise)."""
    if end - pos < records.HEADER_SIZE:
        base = records.read_base_offset(buf, pos) if len(buf) - pos >= 8 else None
        _malformed(name, f"record batch header cut short ({max(0, end - pos)} bytes left; object truncated?)", abs_start + pos, base)
    h = records.read_header(buf, pos)
    if h.magic != 2:
        _malformed(name, f"record batch magic {h.magic} (expected 2)", abs_start + pos, h.base_offset)
    if h.batch_length < records.HEADER_SIZE - records.LOG_OVERHEAD or pos + h.size > end:
        _malformed(name, f"record batch of {h.size} bytes runs past the data (object truncated?)", abs_start + pos, h.base_offset)
    if h.record_count < 0 or h.last_offset_delta < 0:
        _malformed(name, "negative record count or offset delta", abs_start + pos, h.base_offset)
    return h


def _malformed(name: str, what: str, byte: int | None = None, offset: int | None = None):
    raise SegmentFormatError(f"{name}: {what}", what=what, byte=byte, offset=offset)


def walk(buf, start: int, end: int, *, abs_start: int = 0, name: str = "segment") -> Iterator[tuple[int, records.BatchHeader]]:
    """(position, header) of each batch of buf[start:end], which must be whole v2 batches
    (checked_batch); the one walk over a segment's batches that checks their framing."""
    pos = start
    while pos < end:
        h = checked_batch(buf, pos, end, abs_start=abs_start, name=name)
        yield pos, h
        pos += h.size


def footer_last_offset(buf, pos: int) -> int | None:
    """The last offset of the footer at buf[pos], or None when no footer is there."""
    if len(buf) - pos != FOOTER_SIZE:
        return None
    _crc, last, magic = FOOTER.unpack_from(buf, pos)
    return last if magic == FOOTER_MAGIC else None


def walk_to_footer(buf, start: int, *, abs_start: int = 0, name: str = "segment") -> tuple[list[tuple[int, int]], int]:
    """Check that buf[start:] is whole batches then the footer (buf: the tail of an object
    from byte abs_start); return [(base offset, byte in the object)] and the footer's last
    offset. Walks the batches even when the footer is missing, so that a truncated object
    is reported at the batch (offset and byte) where it breaks off."""
    n = len(buf)
    batches: list[tuple[int, int]] = []
    pos = start
    last = None
    while (footer_last := footer_last_offset(buf, pos)) is None:
        if pos >= n:
            _malformed(name, "object ends without a segment footer (truncated)", abs_start + n, None if last is None else last + 1)
        h = checked_batch(buf, pos, n - FOOTER_SIZE, abs_start=abs_start, name=name)
        batches.append((h.base_offset, abs_start + pos))
        last = h.last_offset
        pos += h.size
    if last is not None and last > footer_last:
        # (below it is a compacted segment's trailing gap: its last records were removed,
        # its offset range stays)
        _malformed(name, f"footer says last offset {footer_last} but the last batch ends at {last}", offset=last)
    return batches, footer_last


def batches_through(batches, last_offset: int, known_last: int | None = None) -> memoryview:
    """The leading whole batches of `batches` that end at or before `last_offset`: a
    segment's own batches out of an object that may hold more (its key was replaced by a
    merge or compaction that never committed). `known_last`: the offset the batches are
    known to end by (the object's footer, a cached view's last batch); when it is within
    `last_offset`, as it nearly always is, they are all kept without walking them again."""
    mv = memoryview(batches)
    if known_last is not None and known_last <= last_offset:
        return mv
    end = 0
    for pos, h in records.iter_batches(mv):
        if h.last_offset > last_offset:
            break
        end = pos + h.size
    return mv[:end]


def decode_header(data) -> tuple[int, int, int]:
    """(base offset, message count, created ms) from the first 32 bytes."""
    magic, version, _f, base_offset, count, created, _ = HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION:
        raise SegmentFormatError("not a KafScale segment header")
    return base_offset, count, created


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    interval: int
    offsets: list[int]
    positions: list[int]

    def lookup(self, offset: int) -> int:
        """File position of the last indexed batch starting at or before `offset`."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        return self.positions[i] if i >= 0 else HEADER_SIZE


async def read_index(store, key: str) -> SegmentIndex | None:
    """The sparse index stored at `key` in an ObjectStore: None when there is none or when it
    does not decode (logged; an unusable index only costs reading the segment whole).
    Other store errors propagate."""
    try:
        raw = await store.get(key)
    except ObjectNotFound:
        return None
    try:
        return decode_index(raw)
    except Exception as e:  # noqa: BLE001 - damaged or foreign bytes under the index key
        log.warning("ignoring unusable index %s: %s", key, e)
        return None


def decode_index(data) -> SegmentIndex:
    magic, version, n, interval, _ = INDEX_HEADER.unpack_from(data, 0)
    if magic != INDEX_MAGIC or version != FORMAT_VERSION:
        raise SegmentFormatError("not a KafScale index")
    offsets, positions = [], []
    for i in range(n):
        off, pos = INDEX_ENTRY.unpack_from(data, INDEX_HEADER.size + i * INDEX_ENTRY.size)
        offsets.append(off)
        positions.append(pos)
    return SegmentIndex(interval, offsets, positions)
