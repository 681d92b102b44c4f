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

from kafscale.protocol import varint
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
    __slots__ = ("buf", "readonly", "pos", "end")

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos, self.end = buf, pos, len(buf)
        self.readonly = memoryview(buf).toreadonly()  # kio's varint reader takes read-only buffers only

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise MalformedRequest(f"Produce request truncated at byte {self.pos} (needs {n} more)")

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

    def uvarint(self) -> int:
        pos = self.pos
        if pos < self.end and (b := self.buf[pos]) < 0x80:  # one byte: nearly every length and count
            self.pos = pos + 1
            return b
        try:
            value, self.pos = varint.read_uvarint(self.readonly, self.pos)
        except varint.VarintError as e:
            raise MalformedRequest(f"{e} in Produce request at byte {self.pos}") from None
        return value

    def take(self, n: int) -> memoryview:
        self.need(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self, flexible: bool, nullable: bool) -> str | None:
        n = self.uvarint() - 1 if flexible else self.int16()
        if n < 0:
            if n == -1 and nullable:
                return None
            raise MalformedRequest(f"null or negative string length {n} in Produce request")
        # Invalid UTF-8 is replaced, as Apache Kafka's `new String(bytes, UTF_8)` does: the
        # topic name is then answered with INVALID_TOPIC_EXCEPTION, not a decode error.
        return str(self.take(n), "utf-8", "replace")

    def array_len(self, flexible: bool) -> int:
        n = self.uvarint() - 1 if flexible else self.int32()
        if n < 0:
            raise MalformedRequest("null array in Produce request")
        return n

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


def decode(version: int, payload: memoryview, offset: int) -> ProduceRequest:
    flexible = version >= 9
    r = _Reader(payload, offset)
    transactional_id = r.string(flexible, nullable=True) if version >= 3 else None
    r.need(6)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(payload, r.pos)
    r.pos += 6
    topics = []
    for _ in range(r.array_len(flexible)):
        if version >= 13:
            name, topic_id = None, uuid.UUID(bytes=bytes(r.take(16)))
        else:
            name, topic_id = r.string(flexible, nullable=False), None
        parts = []
        for _ in range(r.array_len(flexible)):
            index = r.int32()
            n = r.uvarint() - 1 if flexible else r.int32()
            records = None if n < 0 else r.take(n)
            if flexible:
                r.skip_tags()
            parts.append(PartitionProduceData(index, records))
        if flexible:
            r.skip_tags()
        topics.append(TopicProduceData(name, topic_id, parts))
    if flexible:
        r.skip_tags()
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)
