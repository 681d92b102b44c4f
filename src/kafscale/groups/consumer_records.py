"""Kafka's `__consumer_offsets` records of consumer groups (KIP-848), as Kafka 4.0's group
coordinator writes them: ConsumerGroupMetadata (key version 3: the group epoch),
ConsumerGroupPartitionMetadata (4: the subscribed topics, ids, partition counts and racks),
ConsumerGroupMemberMetadata (5: a member's subscription, client and classic metadata),
ConsumerGroupTargetAssignmentMetadata (6: the assignment epoch),
ConsumerGroupTargetAssignmentMember (7: a member's target partitions) and
ConsumerGroupCurrentMemberAssignment (8: a member's epochs, state, partitions and those it
must revoke). Kafka's JSON message specs: keys are not flexible (an int16 version, then
int16-length strings), values are version 0, flexible (compact strings, arrays and bytes
with an unsigned varint length + 1, raw 16-byte uuids, tagged fields after every struct);
kio has no schemas for these data messages, so they are encoded here.

The store keeps the group's document, the source of truth; these records mirror its
changes for tools that read the topic. `changes(group, before, after)` gives the records
turning one stored document into the next (None: no group), in Kafka's order: tombstones
of members that left, members' metadata, the subscription metadata, the group epoch, target
assignments and their epoch, current assignments. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import struct
import uuid

from kafscale.groups.offsets_topic import Record, _string as _key_string
from kafscale.protocol.varint import encode_uvarint

GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_ASSIGNMENT_METADATA = 6
TARGET_ASSIGNMENT_MEMBER = 7
CURRENT_MEMBER_ASSIGNMENT = 8
VALUE_VERSION = 0
MEMBER_STATES = {"stable": 0, "unrevoked_partitions": 1, "unreleased_partitions": 2}  # Kafka's MemberState bytes

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
NO_TAGS = encode_uvarint(0)


# -- flexible encoding -------------------------------------------------------------------------


def _str(s: str | None) -> bytes:
    if s is None:
        return encode_uvarint(0)
    raw = s.encode()
    return encode_uvarint(len(raw) + 1) + raw


def _bytes(b: bytes) -> bytes:
    return encode_uvarint(len(b) + 1) + b


def _array(items: list[bytes]) -> bytes:
    return encode_uvarint(len(items) + 1) + b"".join(items)


def _int32s(values) -> bytes:
    return _array([_I32.pack(v) for v in values])


def _topic_partitions(doc: dict) -> bytes:
    """[TopicId uuid, Partitions []int32] from a partitions document {topic id: [p, ...]}."""
    return _array([uuid.UUID(tid).bytes + _int32s(sorted(ps)) + NO_TAGS for tid, ps in sorted(doc.items())])


def _value(*fields: bytes, tags: bytes = NO_TAGS) -> bytes:
    return _I16.pack(VALUE_VERSION) + b"".join(fields) + tags


# -- keys ----------------------------------------------------------------------------------------


def group_key(record_type: int, group_id: str) -> bytes:
    return _I16.pack(record_type) + _key_string(group_id)


def member_key(record_type: int, group_id: str, member_id: str) -> bytes:
    return _I16.pack(record_type) + _key_string(group_id) + _key_string(member_id)


# -- values (from the group document, `ConsumerGroup.to_doc`) -------------------------------------


def group_metadata_value(epoch: int) -> bytes:
    return _value(_I32.pack(epoch))


def partition_metadata_value(doc: dict) -> bytes:
    racks = doc.get("racks", {})
    topics = []
    for name, (tid, n) in sorted(doc.get("topics", {}).items(), key=lambda kv: kv[1][0]):
        per = racks.get(tid)
        # (Kafka stores an empty list when no partition has a rack)
        partitions = [_I32.pack(p) + _array([_str(r)] if r else []) + NO_TAGS for p, r in enumerate(per)] if per else []
        topics.append(uuid.UUID(tid).bytes + _str(name) + _I32.pack(n) + _array(partitions) + NO_TAGS)
    return _value(_array(topics))


def member_metadata_value(m: dict) -> bytes:
    tags = NO_TAGS
    classic = m.get("classic")
    if classic:
        protocols = [_str(name) + _bytes(base64.b64decode(meta)) + NO_TAGS for name, meta in classic["protocols"]]
        body = _I32.pack(int(classic["session_timeout_ms"])) + _array(protocols) + NO_TAGS
        # Tag 0, a nullable struct: its size (with the presence byte), the presence byte 1, the struct.
        tags = encode_uvarint(1) + encode_uvarint(0) + encode_uvarint(len(body) + 1) + encode_uvarint(1) + body
    return _value(
        _str(m.get("instance_id")), _str(m.get("rack_id")), _str(m.get("client_id", "")), _str(m.get("client_host", "")),
        _array([_str(t) for t in m.get("subscribed_topic_names", [])]), _str(m.get("subscribed_topic_regex")),
        _I32.pack(int(m.get("rebalance_timeout_ms", -1))), _str(m.get("server_assignor")),
        tags=tags,
    )


def target_metadata_value(epoch: int) -> bytes:
    return _value(_I32.pack(epoch))


def target_member_value(partitions: dict) -> bytes:
    return _value(_topic_partitions(partitions))


def current_assignment_value(m: dict) -> bytes:
    return _value(
        _I32.pack(int(m["member_epoch"])), _I32.pack(int(m.get("previous_member_epoch", -1))),
        _I8.pack(MEMBER_STATES.get(m.get("state", "stable"), 127)),
        _topic_partitions(m.get("assigned", {})), _topic_partitions(m.get("revoking", {})),
    )


# -- what a change of the document writes ----------------------------------------------------------

_MEMBER_METADATA_FIELDS = ("instance_id", "rack_id", "client_id", "client_host", "subscribed_topic_names",
                           "subscribed_topic_regex", "rebalance_timeout_ms", "server_assignor", "classic")
_CURRENT_FIELDS = ("member_epoch", "previous_member_epoch", "state", "assigned", "revoking")


def _pick(m: dict | None, fields) -> tuple | None:
    return None if m is None else tuple(repr(m.get(f)) for f in fields)


def _members(doc: dict | None) -> dict[str, dict]:
    return {m["member_id"]: m for m in (doc or {}).get("members", [])}


def changes(group_id: str, before: dict | None, after: dict | None) -> list[Record]:
    """The records that turn the stored document `before` into `after` (None: no group;
    both None: nothing)."""
    old, new = _members(before), _members(after)
    old_target, new_target = (before or {}).get("target", {}), (after or {}).get("target", {})
    out: list[Record] = []
    if after is None:
        if before is None:
            return out
        # The whole group goes, in Kafka's order (ConsumerGroup.createGroupTombstoneRecords).
        out += [(member_key(CURRENT_MEMBER_ASSIGNMENT, group_id, mid), None) for mid in old]
        out += [(member_key(TARGET_ASSIGNMENT_MEMBER, group_id, mid), None) for mid in old]
        out.append((group_key(TARGET_ASSIGNMENT_METADATA, group_id), None))
        out += [(member_key(MEMBER_METADATA, group_id, mid), None) for mid in old]
        out.append((group_key(PARTITION_METADATA, group_id), None))
        out.append((group_key(GROUP_METADATA, group_id), None))
        return out
    for mid in old:
        if mid not in new:
            out += [(member_key(CURRENT_MEMBER_ASSIGNMENT, group_id, mid), None),
                    (member_key(TARGET_ASSIGNMENT_MEMBER, group_id, mid), None),
                    (member_key(MEMBER_METADATA, group_id, mid), None)]
    for mid, m in new.items():
        if _pick(m, _MEMBER_METADATA_FIELDS) != _pick(old.get(mid), _MEMBER_METADATA_FIELDS):
            out.append((member_key(MEMBER_METADATA, group_id, mid), member_metadata_value(m)))
    b = before or {}
    if (b.get("topics"), b.get("racks")) != (after.get("topics"), after.get("racks")) or before is None:
        out.append((group_key(PARTITION_METADATA, group_id), partition_metadata_value(after)))
    if before is None or b.get("group_epoch") != after.get("group_epoch"):
        out.append((group_key(GROUP_METADATA, group_id), group_metadata_value(int(after.get("group_epoch", 0)))))
    for mid, tps in new_target.items():
        if before is None or old_target.get(mid) != tps:
            out.append((member_key(TARGET_ASSIGNMENT_MEMBER, group_id, mid), target_member_value(tps)))
    for mid in old_target:
        if mid not in new_target and mid in new:  # (the target of a member that stayed, now none)
            out.append((member_key(TARGET_ASSIGNMENT_MEMBER, group_id, mid), None))
    if before is None or b.get("target_epoch") != after.get("target_epoch"):
        out.append((group_key(TARGET_ASSIGNMENT_METADATA, group_id), target_metadata_value(int(after.get("target_epoch", 0)))))
    for mid, m in new.items():
        if _pick(m, _CURRENT_FIELDS) != _pick(old.get(mid), _CURRENT_FIELDS):
            out.append((member_key(CURRENT_MEMBER_ASSIGNMENT, group_id, mid), current_assignment_value(m)))
    return out
