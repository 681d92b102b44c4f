"""The embedded consumer protocol of classic groups (protocol type "consumer"): the
subscription a member sends in JoinGroup and the assignment it gets in SyncGroup, read and
written by the broker when it assigns for classic members itself (a classic member inside a
KIP-848 consumer group, and the conversions between the two kinds of group).

The schemas are kio's (Kafka's ConsumerProtocolSubscription / ConsumerProtocolAssignment);
each blob starts with its int16 version, and a version newer than the newest known is read
as the newest, as Kafka's ConsumerProtocol does."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module

from kio.serial import entity_reader, entity_writer

_VERSION = struct.Struct(">h")
NEWEST = 3  # the newest schema version kio has, of both


class MalformedProtocol(ValueError):
    """Bytes that are not a consumer protocol subscription or assignment."""


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    owned: tuple[tuple[str, int], ...] = ()  # (topic name, partition), v1+
    rack_id: str | None = None  # v3+


@lru_cache(maxsize=None)
def _schema(kind: str, version: int):
    name = "ConsumerProtocolSubscription" if kind == "subscription" else "ConsumerProtocolAssignment"
    module = import_module(f"kio.schema.consumer_protocol_{kind}.v{version}")
    cls = getattr(module, name)
    return cls, entity_reader(cls), entity_writer(cls), getattr(module.data if hasattr(module, "data") else module, "TopicPartition", None)


def _read(kind: str, data: bytes):
    data = bytes(data)
    try:
        (version,) = _VERSION.unpack_from(data, 0)
        if version < 0:
            raise MalformedProtocol(f"{kind} version {version}")
        cls, read, _w, _tp = _schema(kind, min(version, NEWEST))
        value, _size = read(memoryview(data), 2)
    except MalformedProtocol:
        raise
    except Exception as e:  # noqa: BLE001 - kio raises several kinds on short or bad bytes
        raise MalformedProtocol(f"malformed consumer protocol {kind}: {e}") from None
    return version, value


def parse_subscription(data: bytes) -> Subscription:
    version, s = _read("subscription", data)
    owned = tuple((tp.topic, int(p)) for tp in getattr(s, "owned_partitions", ()) for p in tp.partitions)
    return Subscription(version, tuple(s.topics), owned, getattr(s, "rack_id", None))


def subscription_version(data: bytes) -> int:
    """The version a member's subscription is in (its assignment is written in the same
    version, as Kafka does); 0 when the bytes are too short to say."""
    if len(data) < 2:
        return 0
    return max(0, _VERSION.unpack_from(bytes(data[:2]), 0)[0])


def parse_assignment(data: bytes) -> tuple[tuple[str, int], ...]:
    """(topic name, partition) of an assignment; empty bytes (a member never assigned) are none."""
    if not data:
        return ()
    _version, a = _read("assignment", data)
    return tuple((tp.topic, int(p)) for tp in a.assigned_partitions for p in tp.partitions)


def encode_assignment(partitions, version: int = 0) -> bytes:
    """An assignment of (topic name, partition) pairs, in `version` (capped at the newest)."""
    version = min(max(version, 0), NEWEST)
    cls, _r, write, topic_partition = _schema("assignment", version)
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        by_topic.setdefault(topic, []).append(p)
    value = cls(assigned_partitions=tuple(topic_partition(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
                user_data=None)
    buf = io.BytesIO()
    buf.write(_VERSION.pack(version))
    write(buf, value)
    return buf.getvalue()


def encode_subscription(topics, owned=(), version: int = 1, rack_id: str | None = None) -> bytes:
    """A subscription (for tests and tools: clients write their own)."""
    version = min(max(version, 0), NEWEST)
    cls, _r, write, topic_partition = _schema("subscription", version)
    fields = dict(topics=tuple(topics), user_data=None)
    if version >= 1:
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(owned):
            by_topic.setdefault(topic, []).append(p)
        fields["owned_partitions"] = tuple(topic_partition(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    if version >= 3:
        fields["rack_id"] = rack_id
    buf = io.BytesIO()
    buf.write(_VERSION.pack(version))
    write(buf, cls(**fields))
    return buf.getvalue()
