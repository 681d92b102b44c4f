"""Write-ahead objects (WAOs): one object per flush for all the partitions of a broker.

With `--write-ahead-objects true` a broker's flush writes ONE object holding the pending
batches of every partition it flushes (storage/write_ahead_flusher.py), instead of one
segment object per partition, so the PUTs a flush costs do not grow with the number of
partitions. The merger later rewrites each partition's pieces into the spec's own
segments (`{namespace}/{topic}/{partition}/segment-{base}.kfs`), and the write-ahead
cleanup deletes the objects no partition references any more (storage/merger.py).

This module is the format's home (a pure codec; the reads of it through a store are the
two `read_*` functions at the end). Everything below is big-endian, as the spec's segments.

Key: `{namespace}/~wal/{created ms:013d}-{broker id}-{writer}-{sequence:010d}.wal`, sortable
by creation time; `writer` is a random token of the broker process (unique across restarts
of a broker id), `sequence` counts that process's objects. The `~` keeps the directory out
of topic names (as `~metadata/` and `~quarantine/`). Created with a create-only write
(`ObjectStore.create`), never replaced.

Object:

    header   16 bytes  magic u32 0x4B57414C ("KWAL"), version u16 (1), flags u16 (0),
                       created ms i64
    pieces             each one whole segment exactly as the spec writes it
                       (storage/segment.py `encode`: 32-byte header, the record batches as
                       produced, 16-byte footer), byte-exact, back to back; one piece per
                       partition flushed, in index order
    index              one entry per piece, in the order of the pieces:
                       topic length u16, topic (UTF-8), topic id (16 bytes, the UUID's
                       bytes), partition i32, base offset i64, last offset i64,
                       position i64 (the piece's first byte in this object), length i64
    trailer  24 bytes  index position u64, index length u32, entry count u32,
                       CRC32C (Castagnoli) of the index bytes u32, magic u32 0x4B57414C

A reader finds the index from the object's tail (`read_index`: one ranged read of the
last INDEX_TAIL_BYTES, a second one only for a longer index) and reads a piece with one
ranged GET of [position, position + length): that range is a complete spec segment, so
`segment.decode` checks it (header, footer, CRC32C of its batches) like any segment object.

In the metadata (metadata/segments.py SegmentInfo), a segment whose bytes live in a WAO has
`wao_key` (this object's key) and `wao_position` (the piece's position); its length is the
segment's `size`. A segment without `wao_key` (the empty string) is its own spec object,
as before. The index repeats what the metadata says so that the object store alone can
rebuild it (a metadata restore) and a cleanup can check what an object holds.
"""

from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass

from kafscale.protocol import records
from kafscale.storage import segment

WAL_DIR = "~wal"
WAO_MAGIC = 0x4B57414C  # "KWAL"
WAO_VERSION = 1
HEADER = struct.Struct(">IHHq")  # magic, version, flags, created ms
TRAILER = struct.Struct(">QIIII")  # index position, index length, entry count, crc32c, magic
ENTRY_FIXED = struct.Struct(">16siqqqq")  # after the topic: topic id, partition, base, last, position, length
HEADER_SIZE = HEADER.size
TRAILER_SIZE = TRAILER.size
INDEX_TAIL_BYTES = 64 * 1024  # the first read of an object's tail: holds the index of ~1,000 pieces

assert HEADER_SIZE == 16 and TRAILER_SIZE == 24


class WriteAheadFormatError(segment.SegmentFormatError):
    """A write-ahead object (or its index) that is not as written."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One partition's segment inside a write-ahead object (an index entry)."""

    topic: str
    topic_id: str  # the topic's UUID, as TopicMeta.topic_id
    partition: int
    base_offset: int
    last_offset: int
    position: int  # first byte of the piece in the object
    length: int  # bytes of the piece: a whole spec segment


@dataclass(slots=True)
class EncodedObject:
    parts: list  # header, each piece's parts, index, trailer: written without joining first
    pieces: list[Piece]
    size: int


def wal_prefix(namespace: str) -> str:
    return f"{namespace}/{WAL_DIR}/"


def object_key(namespace: str, created_ms: int, broker_id: int, writer: str, sequence: int) -> str:
    return f"{wal_prefix(namespace)}{created_ms:013d}-{broker_id}-{writer}-{sequence:010d}.wal"


_KEY = re.compile(r"([0-9]{13})-(-?[0-9]+)-([0-9a-z]+)-([0-9]+)\.wal")


def created_ms_of_key(key: str) -> int | None:
    """The creation time a write-ahead object's key names, or None for any other key."""
    m = _KEY.fullmatch(key.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def encode(pieces: list[tuple[str, str, int, segment.EncodedSegment]], created_ms: int) -> EncodedObject:
    """The object holding each (topic, topic id, partition, encoded segment), in order."""
    parts: list = [HEADER.pack(WAO_MAGIC, WAO_VERSION, 0, created_ms)]
    pos = HEADER_SIZE
    out: list[Piece] = []
    index = bytearray()
    for topic, topic_id, partition, enc in pieces:
        length = enc.info.size
        out.append(Piece(topic, topic_id, partition, enc.info.base_offset, enc.info.last_offset, pos, length))
        name = topic.encode()
        index += struct.pack(">H", len(name)) + name
        index += ENTRY_FIXED.pack(uuid.UUID(topic_id).bytes, partition, enc.info.base_offset, enc.info.last_offset, pos, length)
        parts.extend(enc.parts)
        pos += length
    index = bytes(index)
    parts.append(index)
    parts.append(TRAILER.pack(pos, len(index), len(out), records.crc32c(index), WAO_MAGIC))
    return EncodedObject(parts, out, pos + len(index) + TRAILER_SIZE)


def decode_trailer(tail, object_size: int) -> tuple[int, int, int, int]:
    """(index position, index length, entry count, index CRC) from an object's tail bytes
    (the last len(tail) bytes of an object of `object_size` bytes)."""
    if len(tail) < TRAILER_SIZE or object_size < HEADER_SIZE + TRAILER_SIZE:
        raise WriteAheadFormatError(f"{object_size} bytes is too short for a write-ahead object")
    index_pos, index_len, count, crc, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    if magic != WAO_MAGIC:
        raise WriteAheadFormatError("bad trailer magic (truncated object?)")
    if index_pos < HEADER_SIZE or index_pos + index_len + TRAILER_SIZE != object_size:
        raise WriteAheadFormatError(f"index at {index_pos} of {index_len} bytes does not end at the trailer")
    return index_pos, index_len, count, crc


def decode_index(index, count: int, crc: int, index_pos: int) -> list[Piece]:
    """The pieces of an index's bytes, checked against its CRC32C and the object's layout
    (each piece inside the data before the index, in order, not overlapping)."""
    mv = memoryview(index)
    if records.crc32c(mv) != crc:
        raise WriteAheadFormatError("CRC32C of the index does not match the trailer")
    out: list[Piece] = []
    pos = 0
    expected = HEADER_SIZE
    for _ in range(count):
        if len(mv) - pos < 2:
            raise WriteAheadFormatError("index entry cut short")
        (n,) = struct.unpack_from(">H", mv, pos)
        pos += 2
        if len(mv) - pos < n + ENTRY_FIXED.size:
            raise WriteAheadFormatError("index entry cut short")
        try:
            topic = bytes(mv[pos : pos + n]).decode()
        except UnicodeDecodeError as e:
            raise WriteAheadFormatError(f"index entry with a topic name that is not UTF-8: {e}") from None
        pos += n
        tid, partition, base, last, piece_pos, length = ENTRY_FIXED.unpack_from(mv, pos)
        pos += ENTRY_FIXED.size
        if piece_pos != expected or length < segment.HEADER_SIZE + segment.FOOTER_SIZE or piece_pos + length > index_pos or last < base - 1:
            raise WriteAheadFormatError(f"index entry of {topic}-{partition} at byte {piece_pos} ({length} bytes) does not fit the object")
        expected = piece_pos + length
        out.append(Piece(topic, str(uuid.UUID(bytes=tid)), partition, base, last, piece_pos, length))
    if pos != len(mv):
        raise WriteAheadFormatError(f"{len(mv) - pos} bytes after the last index entry")
    if expected != index_pos:
        raise WriteAheadFormatError(f"pieces end at byte {expected}, the index starts at {index_pos}")
    return out


def decode(data) -> tuple[int, list[Piece]]:
    """(created ms, pieces) of a whole write-ahead object, its header, trailer and index
    checked (each piece is checked when read: `piece_segment`)."""
    mv = memoryview(data)
    if len(mv) < HEADER_SIZE + TRAILER_SIZE:
        raise WriteAheadFormatError(f"{len(mv)} bytes is too short for a write-ahead object")
    magic, version, _flags, created_ms = HEADER.unpack_from(mv, 0)
    if magic != WAO_MAGIC:
        raise WriteAheadFormatError(f"bad header magic {magic:#x}")
    if version != WAO_VERSION:
        raise WriteAheadFormatError(f"unsupported write-ahead object version {version}")
    index_pos, index_len, count, crc = decode_trailer(mv, len(mv))
    return created_ms, decode_index(mv[index_pos : index_pos + index_len], count, crc, index_pos)


def piece_segment(data, piece: Piece, name: str = "write-ahead object") -> segment.DecodedSegment:
    """The spec segment `piece` of a whole object's bytes, decoded and checked."""
    return segment.decode(memoryview(data)[piece.position : piece.position + piece.length], name=f"{name} at byte {piece.position}")


async def read_index(store, key: str) -> list[Piece]:
    """The pieces of the write-ahead object at `key` from its tail (one ranged read, two
    for a long index). Raises ObjectNotFound, WriteAheadFormatError, ObjectStoreError."""
    tail, size = await store.get_tail(key, INDEX_TAIL_BYTES)
    index_pos, index_len, count, crc = decode_trailer(tail, size)
    tail_start = size - len(tail)
    if index_pos >= tail_start:
        index = memoryview(tail)[index_pos - tail_start : index_pos - tail_start + index_len]
    else:
        index = await store.get(key, index_pos, index_pos + index_len)
    return decode_index(index, count, crc, index_pos)
