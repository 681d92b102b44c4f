"""StorageConfig: the broker settings storage reads, typed and frozen, built once from the
broker's config (LogManager does, from BrokerConfig or anything with the same fields)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True, slots=True)
class StorageConfig:
    namespace: str = "default"  # first component of every object key
    flush_interval_ms: int = 500
    min_flush_interval_ms: int = 0
    index_min_bytes: int = 16 * 1024 * 1024  # a segment from this size on gets an .index
    cache_bytes: int = 256 * 1024 * 1024
    merge_interval_ms: int = 10_000
    merge_grace_ms: int = 60_000
    merge_max_pending_objects: int = 1000
    merge_min_grace_ms: int = 5000
    compaction_interval_ms: int = 15_000
    compaction_key_map_bytes: int = 128 * 1024 * 1024
    retention_check_interval_ms: int = 30_000
    producer_id_expiration_ms: int = 86_400_000
    broker_id: int = 0  # names this broker's write-ahead objects
    # One write-ahead object per flush for all partitions (storage/write_ahead_flusher.py),
    # rewritten into per-partition segments by the merger after at most segment_max_age_ms.
    # A broker resolves it by its store (BrokerConfig: on for s3://, off for a directory).
    write_ahead_objects: bool = True
    segment_max_age_ms: int = 600_000
    write_ahead_orphan_age_ms: int = 300_000
    # The operator-given broker settings that are Kafka configs (log.segment.bytes, ...):
    # the defaults under each topic's own configs.
    kafka_static_configs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, settings) -> "StorageConfig":
        """From the broker's config (BrokerConfig: the same field names, and its
        kafka_static_configs())."""
        values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(cls) if f.name != "kafka_static_configs"}
        return cls(**values, kafka_static_configs=MappingProxyType(dict(settings.kafka_static_configs())))
