"""Zero-copy Produce request decoding (v0-v13; v0-v2 have no transactional id).

kio's generated decoder copies every record set into a new `bytes`; on the produce path
that is the largest cost after the network itself. This decoder returns the record sets as
writable memoryviews into the request frame, so the broker validates them, patches base
offsets in place and keeps the very bytes the client sent. Field names match kio's, so the
handler reads either. Everything else about Produce still comes from kio (the response).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from kafscale.protocol.codec import MalformedRequest

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str | None
    topic_id: uuid.UUID | None
    partition_data: list[PartitionProduceData]


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


class _Reader:
    """v0-v8 (no flexible fields): fixed-width lengths and counts."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos, self.end = buf, pos, len(buf)

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise _truncated(self.pos, n)

    def int16(self) -> int:
        self.need(2)
        (v,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v

    def int32(self) -> int:
        self.need(4)
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def take(self, n: int) -> memoryview:
        self.need(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self, nullable: bool) -> str | None:
        n = self.int16()
        if n < 0:
            if n == -1 and nullable:
                return None
            raise MalformedRequest(f"null or negative string length {n} in Produce request")
        # Invalid UTF-8 is replaced, as Apache Kafka's `new String(bytes, UTF_8)` does: the
        # topic name is then answered with INVALID_TOPIC_EXCEPTION, not a decode error.
        return str(self.take(n), "utf-8", "replace")

    def array_len(self) -> int:
        n = self.int32()
        if n < 0:
            raise MalformedRequest("null array in Produce request")
        return n


def decode(version: int, payload: memoryview, offset: int) -> ProduceRequest:
    if version >= 9:
        return _decode_flexible(version, payload, offset)
    r = _Reader(payload, offset)
    transactional_id = r.string(nullable=True) if version >= 3 else None
    r.need(6)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(payload, r.pos)
    r.pos += 6
    topics = []
    for _ in range(r.array_len()):
        name = r.string(nullable=False)
        parts = []
        for _ in range(r.array_len()):
            index = r.int32()
            n = r.int32()
            parts.append(PartitionProduceData(index, None if n < 0 else r.take(n)))
        topics.append(TopicProduceData(name, None, parts))
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


def _decode_flexible(version: int, buf: memoryview, pos: int) -> ProduceRequest:
    """v9 and later (what current clients send), each partition's fields read inline: a
    one-byte varint (nearly every length, count and tag section) without a call, the others
    through `_uvarint`. The same checks as `_Reader`'s: each length within the frame, no
    null array, no null topic name (#33: a method call per field was half of decoding a
    small Produce request)."""
    end = len(buf)
    transactional_id, pos = _compact_string(buf, pos, end, nullable=True)
    if pos + 6 > end:
        raise _truncated(pos, 6)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    count, pos = _compact_array_len(buf, pos, end)
    by_id = version >= 13
    topics = []
    for _ in range(count):
        if by_id:
            if pos + 16 > end:
                raise _truncated(pos, 16)
            name, topic_id = None, uuid.UUID(bytes=bytes(buf[pos : pos + 16]))
            pos += 16
        else:
            topic_id = None
            name, pos = _compact_string(buf, pos, end, nullable=False)
        parts_count, pos = _compact_array_len(buf, pos, end)
        parts = []
        for _ in range(parts_count):
            if pos + 4 > end:
                raise _truncated(pos, 4)
            (index,) = _I32.unpack_from(buf, pos)
            pos += 4
            if pos < end and (n := buf[pos]) < 0x80:
                pos += 1
            else:
                n, pos = _uvarint(buf, pos, end)
            n -= 1
            if n < 0:
                records = None
            else:
                if pos + n > end:
                    raise _truncated(pos, n)
                records = buf[pos : pos + n]
                pos += n
            if pos < end and buf[pos] == 0:  # no tagged fields
                pos += 1
            else:
                pos = _skip_tags(buf, pos, end)
            parts.append(PartitionProduceData(index, records))
        if pos < end and buf[pos] == 0:
            pos += 1
        else:
            pos = _skip_tags(buf, pos, end)
        topics.append(TopicProduceData(name, topic_id, parts))
    if not (pos < end and buf[pos] == 0):
        _skip_tags(buf, pos, end)
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


def _compact_string(buf: memoryview, pos: int, end: int, nullable: bool) -> tuple[str | None, int]:
    n, pos = _uvarint(buf, pos, end)
    n -= 1
    if n < 0:
        if n == -1 and nullable:
            return None, pos
        raise MalformedRequest(f"null or negative string length {n} in Produce request")
    if pos + n > end:
        raise _truncated(pos, n)
    # invalid UTF-8 replaced, as in _Reader.string
    return str(buf[pos : pos + n], "utf-8", "replace"), pos + n


def _compact_array_len(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    n, pos = _uvarint(buf, pos, end)
    if n < 1:
        raise MalformedRequest("null array in Produce request")
    return n - 1, pos


def _truncated(pos: int, n: int) -> MalformedRequest:
    return MalformedRequest(f"Produce request truncated at byte {pos} (needs {n} more)")


def _uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at `pos` (at most 5 bytes)."""
    value = shift = 0
    start = pos
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 35:
            raise MalformedRequest(f"varint too long in Produce request at byte {start}")
    raise MalformedRequest(f"truncated varint in Produce request at byte {start}")


def _skip_tags(buf: memoryview, pos: int, end: int) -> int:
    """Position after the tagged-field section at `pos` (count, then tag, size, bytes)."""
    count, pos = _uvarint(buf, pos, end)
    for _ in range(count):
        _tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        if pos + size > end:
            raise _truncated(pos, size)
        pos += size
    return pos
