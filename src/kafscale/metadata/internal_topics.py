"""Kafka's internal topics that KafScale keeps: `__consumer_offsets`.

Groups and committed offsets live in the metadata store (the source of truth); the group
coordinator also writes them, in Kafka's record format, to the compacted internal topic
`__consumer_offsets` so lag monitors and tools that read that topic work. This module is
the shared vocabulary: the topic's name and configs, whether a topic is internal, and the
group -> partition mapping (Kafka's: Utils.abs of the Java hash code of the group id,
modulo the partition count). Imported by cluster/ (who coordinates a group), groups/ (where
its records go) and broker/ (creation, Metadata, refusals).
"""

from __future__ import annotations

OFFSETS_TOPIC = "__consumer_offsets"  # Kafka's Topic.GROUP_METADATA_TOPIC_NAME
DEFAULT_OFFSETS_PARTITIONS = 50  # offsets.topic.num.partitions
DEFAULT_OFFSETS_SEGMENT_BYTES = 104_857_600  # offsets.topic.segment.bytes
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})


def is_internal(topic: str | None) -> bool:
    """Kafka's Topic.isInternal for the internal topics KafScale has."""
    return topic in INTERNAL_TOPICS


def offsets_topic_configs(segment_bytes: int = DEFAULT_OFFSETS_SEGMENT_BYTES) -> dict[str, str]:
    """The topic configs Kafka's group coordinator creates `__consumer_offsets` with."""
    return {"cleanup.policy": "compact", "compression.type": "producer", "segment.bytes": str(segment_bytes)}


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units, 32-bit signed overflow)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: Math.abs, except Integer.MIN_VALUE (whose Math.abs is negative) -> 0."""
    return 0 if n == -(1 << 31) else abs(n)


def offsets_partition_for(group_id: str, partitions: int) -> int:
    """The `__consumer_offsets` partition holding a group: Kafka's partitionFor,
    Utils.abs(groupId.hashCode()) % the topic's partition count."""
    return java_abs(java_string_hash(group_id)) % max(1, partitions)
