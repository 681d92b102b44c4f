"""Kafka's `__consumer_offsets` records: keys and values as Kafka's group coordinator
writes them (its JSON message specs OffsetCommitKey, OffsetCommitValue, GroupMetadataKey,
GroupMetadataValue; kio has no schemas for these data messages, so they are encoded here).

Every key and value starts with its int16 schema version. The versions are the ones Kafka
3.x writes by default (MetadataVersion.offsetCommitValueVersion / groupMetadataValueVersion
for any recent metadata version): OffsetCommitKey v1, OffsetCommitValue v3 (offset, leader
epoch, metadata, commit timestamp), GroupMetadataKey v2, GroupMetadataValue v3 (protocol
type, generation, protocol, leader, current state timestamp, members with their
subscription and assignment). None of these versions is flexible: strings are an int16
length and UTF-8 bytes (length -1: null), bytes an int32 length, arrays an int32 count.
A null value is a tombstone: the offset was deleted or expired, or the group removed.

Pure functions, no I/O: `groups/coordinator.py` appends what they return.
"""

from __future__ import annotations

import base64
import struct
from typing import Iterable

from kafscale.metadata.store import CommittedOffset

OFFSET_COMMIT_KEY_VERSION = 1
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3

Record = tuple[bytes, bytes | None]  # (key, value); value None is a tombstone

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def _string(s: str | None, nullable: bool = False) -> bytes:
    if s is None:
        if not nullable:
            s = ""
        else:
            return _I16.pack(-1)
    raw = s.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes does not fit an int16 length")
    return _I16.pack(len(raw)) + raw


def _bytes(b: bytes | None) -> bytes:
    b = b or b""
    return _I32.pack(len(b)) + bytes(b)


def offset_commit_key(group_id: str, topic: str, partition: int) -> bytes:
    return _I16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(group_id) + _string(topic) + _I32.pack(partition)


def offset_commit_value(offset: CommittedOffset) -> bytes:
    return (
        _I16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _I64.pack(offset.offset)
        + _I32.pack(offset.leader_epoch if offset.leader_epoch is not None else -1)
        + _string(offset.metadata or "")
        + _I64.pack(offset.commit_ms)
    )


def group_metadata_key(group_id: str) -> bytes:
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(group_id)


def group_metadata_value(doc: dict) -> bytes:
    """GroupMetadataValue v3 from a group snapshot (`snapshot.to_doc`: subscription and
    assignment are base64 there)."""
    members = doc.get("members") or []
    out = [
        _I16.pack(GROUP_METADATA_VALUE_VERSION),
        _string(doc.get("protocol_type") or ""),
        _I32.pack(int(doc.get("generation", 0))),
        _string(doc.get("protocol"), nullable=True),
        _string(doc.get("leader"), nullable=True),
        _I64.pack(int(doc.get("state_ts", -1))),
        _I32.pack(len(members)),
    ]
    for m in members:
        out += [
            _string(m["member_id"]),
            _string(m.get("group_instance_id"), nullable=True),
            _string(m.get("client_id", "")),
            _string(m.get("client_host", "")),
            _I32.pack(int(m.get("rebalance_timeout", m.get("session_timeout", -1)))),
            _I32.pack(int(m.get("session_timeout", -1))),
            _bytes(base64.b64decode(m.get("subscription", ""))),
            _bytes(base64.b64decode(m.get("assignment", ""))),
        ]
    return b"".join(out)


# -- the records one event writes ------------------------------------------------------------


def offset_commit_records(group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> list[Record]:
    return [(offset_commit_key(group_id, t, p), offset_commit_value(o)) for (t, p), o in sorted(offsets.items())]


def offset_tombstones(group_id: str, partitions: Iterable[tuple[str, int]]) -> list[Record]:
    return [(offset_commit_key(group_id, t, p), None) for t, p in sorted(partitions)]


def group_metadata_record(group_id: str, doc: dict) -> Record:
    return group_metadata_key(group_id), group_metadata_value(doc)


def group_tombstone(group_id: str) -> Record:
    return group_metadata_key(group_id), None


# -- reading them back (metadata restore: offsets committed after the newest snapshot) ---------


def _read_string(buf: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = _I16.unpack_from(buf, pos)
    if n < 0:
        return None, pos + 2
    return bytes(buf[pos + 2 : pos + 2 + n]).decode(), pos + 2 + n


def read_offset_commit_key(key: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an OffsetCommitKey (v0/v1); None for any other key
    (GroupMetadataKey, v2)."""
    (version,) = _I16.unpack_from(key, 0)
    if version not in (0, 1):
        return None
    group_id, pos = _read_string(key, 2)
    topic, pos = _read_string(key, pos)
    (partition,) = _I32.unpack_from(key, pos)
    return group_id or "", topic or "", partition


def read_offset_commit_value(value: bytes) -> CommittedOffset:
    """An OffsetCommitValue v0-v3 (Kafka's non-flexible versions). Raises ValueError for
    other versions, struct.error for a value cut short."""
    (version,) = _I16.unpack_from(value, 0)
    if not 0 <= version <= 3:
        raise ValueError(f"OffsetCommitValue version {version} is not read here")
    (offset,) = _I64.unpack_from(value, 2)
    pos, epoch = 10, -1
    if version >= 3:
        (epoch,) = _I32.unpack_from(value, pos)
        pos += 4
    metadata, pos = _read_string(value, pos)
    (commit_ms,) = _I64.unpack_from(value, pos)
    return CommittedOffset(offset, epoch, metadata or "", commit_ms)
