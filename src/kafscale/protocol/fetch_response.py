"""Fetch response encoding (v4-v18) that never copies record data.

kio's writer would join the stored batches, copy them into a buffer and copy that buffer
out again: three copies of every byte a consumer reads. Here the response is a list of
buffers: small encoded pieces around the stored batches themselves (memoryviews into the
segment cache), handed to the transport's `writelines` as they are. Tagged fields are all
left at their defaults, so none is written (strict decoders reject default-valued tags).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from kafscale.errors import ErrorCode
from kafscale.protocol.varint import encode_uvarint as uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, last stable, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset


class RecordChunks(list):
    """The stored batches of one partition: a list of buffers; len() is their byte size."""

    def __len__(self) -> int:  # noqa: D105 - byte size, as for a bytes field
        return sum(len(c) for c in self.__iter__())

    def __bool__(self) -> bool:
        return any(len(c) for c in self.__iter__())


@dataclass(slots=True)
class PartitionData:
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: RecordChunks = field(default_factory=RecordChunks)
    # read_committed: (producer id, first offset) of the aborted transactions in the
    # returned range; None (read_uncommitted) is written as a null array
    aborted_transactions: list[tuple[int, int]] | None = None


@dataclass(slots=True)
class TopicData:
    topic: str | None
    topic_id: uuid.UUID | None
    partitions: list[PartitionData]


@dataclass(slots=True)
class FetchResponse:
    version: int
    responses: list[TopicData]
    error_code: int = ErrorCode.none
    session_id: int = 0
    throttle_time_ms: int = 0

    def encode_frame(self, correlation_id: int) -> list:
        """The whole frame (length prefix first) as a list of buffers."""
        v = self.version
        flexible = v >= 12
        out: list = []
        head = bytearray(_I32.pack(correlation_id))
        if flexible:
            head += b"\0"  # response header v1: no tagged fields
        head += _I32.pack(self.throttle_time_ms)
        if v >= 7:
            head += _I16.pack(self.error_code) + _I32.pack(self.session_id)
        head += array_len(len(self.responses), flexible)
        for t in self.responses:
            if v >= 13:
                head += (t.topic_id or uuid.UUID(int=0)).bytes
            else:
                head += string(t.topic or "", flexible)
            head += array_len(len(t.partitions), flexible)
            for p in t.partitions:
                head += _PARTITION_HEAD.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset)
                if v < 5:
                    del head[-8:]  # log_start_offset arrived in v5
                aborted = p.aborted_transactions
                if aborted is None:
                    head += b"\0" if flexible else _I32.pack(-1)
                else:
                    head += array_len(len(aborted), flexible)
                    for pid, first in aborted:
                        head += _ABORTED.pack(pid, first)
                        if flexible:
                            head += b"\0"  # entry tagged fields
                if v >= 11:
                    head += _I32.pack(-1)  # preferred_read_replica
                size = sum(len(c) for c in p.records)
                head += uvarint(size + 1) if flexible else _I32.pack(size)
                if size:
                    out.append(bytes(head))
                    out.extend(c for c in p.records if len(c))
                    head = bytearray()
                if flexible:
                    head += b"\0"  # partition tagged fields
            if flexible:
                head += b"\0"  # topic tagged fields
        if flexible:
            head += b"\0"  # response tagged fields
        out.append(bytes(head))
        total = sum(len(b) for b in out)
        out.insert(0, _I32.pack(total))
        return out


def array_len(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)


def string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return (uvarint(len(b) + 1) if flexible else _I16.pack(len(b))) + b
