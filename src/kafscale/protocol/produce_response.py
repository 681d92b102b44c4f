"""Produce response encoding (the versions kio has, v3-v13) without kio.

A producer spread over many partitions gets one entry a partition in every answer; kio's
generic builder and writer cost ~190 us an entry (about a fifth of a broker's CPU at
1,000 records/s over 1,024 partitions), this a few. The entries are plain slotted classes
with kio's field names (the metrics tap and authorization's merge read them so); an entry
that is a kio TopicProduceResponse (authorization's refusals merged in) is written by kio.
Tagged fields are all left at their defaults, so none is written. The bytes are those
kio writes (tests/test_produce_answer.py).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from kafscale.protocol import codec
from kafscale.protocol.fetch_response import array_len, string

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ihq")  # index, error code, base offset
_I64 = struct.Struct(">q")


@dataclass(slots=True)
class PartitionAnswer:
    index: int
    error_code: int
    base_offset: int
    log_append_time: int = -1  # ms
    log_start_offset: int = -1
    record_errors: tuple[tuple[int, str | None], ...] = ()  # (batch index, message)
    error_message: str | None = None
    batches: int = 0  # batches appended; not on the wire (the metrics tap counts them from here)


@dataclass(slots=True)
class TopicAnswer:
    name: str | None
    topic_id: uuid.UUID | None
    partition_responses: list[PartitionAnswer] = field(default_factory=list)


@dataclass(slots=True)
class ProduceAnswer:
    version: int
    responses: list  # TopicAnswer, or kio's TopicProduceResponse of this version
    throttle_time_ms: int = 0

    def encode_frame(self, correlation_id: int) -> list[bytes]:
        v = self.version
        flexible = v >= 9
        out = [_I32.pack(correlation_id) + b"\0" if flexible else _I32.pack(correlation_id), array_len(len(self.responses), flexible)]
        append = out.append
        plain = _PLAIN_PARTITION[min(v, 9)]  # a partition without record errors or message
        for t in self.responses:
            if not isinstance(t, TopicAnswer):
                append(codec.encode_entity(t))
                continue
            append((t.topic_id or uuid.UUID(int=0)).bytes if v >= 13 else string(t.name or "", flexible))
            append(array_len(len(t.partition_responses), flexible))
            for p in t.partition_responses:
                if not p.record_errors and p.error_message is None:
                    append(plain(p.index, p.error_code, p.base_offset, p.log_append_time, p.log_start_offset))
                    continue
                append(_HEAD.pack(p.index, p.error_code, p.base_offset))
                append(_I64.pack(p.log_append_time))
                if v >= 5:
                    append(_I64.pack(p.log_start_offset))
                if v >= 8:
                    append(array_len(len(p.record_errors), flexible))
                    for batch_index, message in p.record_errors:
                        append(_I32.pack(batch_index) + _nullable_string(message, flexible))
                        if flexible:
                            append(b"\0")
                    append(_nullable_string(p.error_message, flexible))
                if flexible:
                    append(b"\0")  # partition tagged fields
            if flexible:
                append(b"\0")  # topic tagged fields
        append(_I32.pack(self.throttle_time_ms) + b"\0" if flexible else _I32.pack(self.throttle_time_ms))  # flexible: response tagged fields
        body = b"".join(out)
        return [_I32.pack(len(body)) + body]


def _plain_partition(fmt: str, tail: bytes):
    """pack(index, error code, base offset, log append time, log start offset) of one
    version's partition entry without record errors or error message, in one call."""
    head = struct.Struct(fmt)
    if fmt.count("q") == 2:  # v3-v4: no log start offset
        return lambda index, code, base, append_time, _start: head.pack(index, code, base, append_time) + tail
    return lambda index, code, base, append_time, start: head.pack(index, code, base, append_time, start) + tail


# By version (9: every flexible one): v5 added the log start offset, v8 the record errors
# and error message (an empty array, a null string), v9 the compact forms and tagged fields.
_PLAIN_PARTITION = {
    3: _plain_partition(">ihqq", b""),
    4: _plain_partition(">ihqq", b""),
    5: _plain_partition(">ihqqq", b""),
    6: _plain_partition(">ihqqq", b""),
    7: _plain_partition(">ihqqq", b""),
    8: _plain_partition(">ihqqq", _I32.pack(0) + _I16.pack(-1)),
    9: _plain_partition(">ihqqq", b"\1\0\0"),  # empty compact array, null compact string, no tags
}


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is not None:
        return string(s, flexible)
    return b"\0" if flexible else _I16.pack(-1)

