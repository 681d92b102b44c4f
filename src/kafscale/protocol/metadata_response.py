"""Metadata responses (API 3) put together from topic entries encoded beforehand.

A topic of 1,024 partitions is over a thousand entities for kio to build and write on
every Metadata request, and clients ask again and again while they look for leaders.
handlers/metadata.py keeps each topic's encoded entry while nothing it says changes;
`MetadataAnswer` puts the entries into the response: kio encodes the rest of it (brokers,
cluster id, controller, ...) with an empty topic array, and the entries take that array's
place. The bytes are the ones kio writes for the whole response (tests/test_metadata_answer.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from functools import lru_cache
from typing import Any

from kafscale.protocol import codec
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.varint import encode_uvarint

_FIXED_SIZE = {"int16": 2, "error_code": 2, "int32": 4}


@lru_cache(maxsize=None)
def _after_topics(cls: type) -> int:
    """Bytes that follow the topic array in an encoded `cls` (fixed-size fields, then the
    tagged fields' count of a flexible version, none of which a Metadata response sets)."""
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    size = 1 if cls.__flexible__ else 0
    for f in fields[names.index("topics") + 1 :]:
        if "tag" in f.metadata or f.metadata.get("kafka_type") not in _FIXED_SIZE:
            raise TypeError(f"{cls.__name__}.{f.name} after the topics is not a plain fixed-size field")
        size += _FIXED_SIZE[f.metadata["kafka_type"]]
    return size


@dataclasses.dataclass(slots=True)
class MetadataAnswer:
    """`response` (a kio Metadata response without topics) with `topics`, encoded entries
    in their order. `throttle_time_ms`: a quota's, written into the response when it
    has the field (v3+)."""

    response: Any
    topics: list[bytes]
    throttle_time_ms: int = 0

    def encode_frame(self, correlation_id: int) -> list[bytes]:
        response = self.response
        if self.throttle_time_ms and hasattr(response, "throttle_time"):
            response = dataclasses.replace(response, throttle_time=datetime.timedelta(milliseconds=self.throttle_time_ms))
        frame = codec.encode_response(ApiKey.METADATA, 0, correlation_id, response)[0]
        flexible = bool(type(response).__flexible__)
        empty = 1 if flexible else 4  # the empty array's length: uvarint 1, or int32 0
        tail = len(frame) - _after_topics(type(response))
        count = encode_uvarint(len(self.topics) + 1) if flexible else len(self.topics).to_bytes(4, "big")
        entries = b"".join(self.topics)
        size = len(frame) - 4 - empty + len(count) + len(entries)
        return [b"".join((size.to_bytes(4, "big"), frame[4 : tail - empty], count, entries, frame[tail:]))]
