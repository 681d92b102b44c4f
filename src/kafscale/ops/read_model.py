"""What ops reads of a broker: the read model ops defines and the broker implements
(broker/ops_view.py). ops imports nothing of broker/; it sees a broker only through this.

A scrape gathers everything it shows in one synchronous `scrape()` (it runs on the broker's
loop, where the structures it reads are safe to iterate); what needs awaits (readiness,
consumer lag, the groups persisted before a restart) has its own calls, used by the samplers.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Callable, Protocol


@dataclass(frozen=True, slots=True)
class OpsSettings:
    broker_id: int
    storage_kind: str  # "file" or "s3": the broker_info label
    metadata_kind: str  # "embedded", "sqlite" or "etcd"
    http: str  # --http as given ('' disables the HTTP server and the samplers)
    http_address: tuple[str, int] | None  # where to bind it
    http_basic_auth: str  # USER:PASSWORD guarding /metrics ('' for none)
    http_ssl_context: Callable[[], ssl.SSLContext] | None  # --http-tls: builds the server context


@dataclass(frozen=True, slots=True)
class HookPoints:
    """The lists ops registers its observers on (and removes them from on stop)."""

    request_hooks: list  # hook(api key, version, seconds, error) after each request
    response_hooks: dict  # api key -> [hook(request, response)]; no key without hooks
    flush_hooks: list  # hook(bytes, seconds, puts) after each durable flush (a segment or a write-ahead object)
    authentication_hooks: list  # hook(mechanism, succeeded) after each SASL authentication
    store_hooks: list  # hook(operation, seconds, failed) after each object-store call
    metadata_hooks: list  # hook(operation, seconds, failed) after each metadata-store call


class StorageCounts(Protocol):
    produce_bytes: int
    produce_records: int
    flushes: int
    flush_failures: int
    segment_bytes: int
    puts: int
    gets: int


class CompactionCounts(Protocol):
    rounds: int
    runs: int
    bytes_read: int
    bytes_written: int
    segments_written: int
    records_removed: int
    recompressions: int
    key_map_peak_entries: int


class CacheCounts(Protocol):
    hits: int
    misses: int
    bytes: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class TlsCounts:
    handshake_failures: int
    reloads: int
    reload_failures: int


@dataclass(frozen=True, slots=True)
class OwnedPartition:
    topic: str
    partition: int
    high_watermark: int
    log_start_offset: int
    unflushed_records: int
    segments: int  # committed segments (the metadata store's list, the same for every backend)
    segment_bytes: int  # their bytes in the object store (what DescribeLogDirs reports)


class ShareCounts(Protocol):
    """What the share partitions served here did (records; share/partition.py ShareCounters)."""

    acquired: int
    redelivered: int
    acknowledged: dict[str, int]  # by acknowledge type: accept, release, reject, gap, renew
    lock_timeouts: int
    archived: dict[str, int]  # by why: rejected, delivery_limit, gap
    released: dict[str, int]  # by why: session_closed, member_left


@dataclass(frozen=True, slots=True)
class SharePartitionView:
    """One share partition (a share group's view of a partition) served here."""

    group: str
    topic: str
    partition: int
    start_offset: int  # the SPSO
    in_flight: int  # records from the start offset to the end of what was acquired
    acquired: int  # ... held by a consumer now


@dataclass(frozen=True, slots=True)
class ShareState:
    counts: ShareCounts
    state_writes: int  # share-partition documents written to the metadata store
    sessions: int  # open share sessions
    partitions: list[SharePartitionView]


@dataclass(frozen=True, slots=True)
class BrokerState:
    """One scrape's view of the broker."""

    storage: StorageCounts
    compaction: CompactionCounts
    cache: CacheCounts
    connections: int
    request_memory: int
    authorization_denials: dict[str, int] | None  # by operation; None without the ACL authorizer
    tls: TlsCounts | None  # None without TLS listeners
    cluster_brokers: int | None  # None while the cluster view is being rebuilt
    lease_alive: bool | None  # None on a single-node (non-etcd) cluster
    partitions: list[OwnedPartition]  # the owned, loaded partition logs
    group_states: dict[str, str]  # group -> state (Kafka's spelling) of the groups in memory here
    metadata_snapshot_age_s: float | None  # None: no snapshot known
    share: ShareState | None = None  # share groups' partitions served here


class BrokerReadModel(Protocol):
    settings: OpsSettings
    hooks: HookPoints

    def scrape(self) -> BrokerState: ...

    def listener_serving(self) -> bool: ...

    async def check_metadata(self) -> None:
        """Raise when the metadata store does not answer."""

    async def check_object_store(self) -> None:
        """Raise when the object store does not answer."""

    def topic_name_for_id(self, topic_id: Any) -> str | None:
        """A topic's name from the ids this broker has seen (Fetch v13+ names topics by id)."""

    async def coordinated_group_states(self) -> dict[str, str]:
        """group -> state of the groups this broker coordinates, persisted ones loaded too."""

    def coordinates_group(self, group: str) -> bool: ...

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], int]: ...

    async def high_watermark(self, topic: str, partition: int) -> int | None:
        """The owned log's, else the committed one (None: no such partition)."""

    async def live_topics(self) -> dict[Any, str]:
        """topic id -> name of every topic."""
