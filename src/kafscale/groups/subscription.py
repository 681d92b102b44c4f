"""What the broker reads of a consumer's subscription (the member metadata of protocol type
"consumer"): its topic list, so a group knows which topics it consumes."""

from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def parse_subscription_topics(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (any version: the topic list comes first);
    None when the bytes are not a subscription."""
    try:
        pos = 2  # int16 version
        (count,) = _I32.unpack_from(data, pos)
        pos += 4
        if count < 0 or count > len(data):
            return None
        topics = set()
        for _ in range(count):
            (n,) = _I16.unpack_from(data, pos)
            pos += 2
            if n < 0 or pos + n > len(data):
                return None
            topics.add(bytes(data[pos : pos + n]).decode("utf-8"))
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
