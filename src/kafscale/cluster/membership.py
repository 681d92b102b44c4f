"""Who is in the cluster and who owns what.

`Cluster` is the interface the handlers use: the live brokers, the owner of a partition,
the coordinator of a group (Kafka's model: the owner of the group's partition of the
internal topic `__consumer_offsets`, where the coordinator writes the group's records) and
of a transactional id. `SingleNodeCluster` is the embedded default: this broker owns
everything. The etcd-backed cluster (leases, balanced ownership) implements the same.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable
from dataclasses import dataclass

from kafscale.metadata.internal_topics import DEFAULT_OFFSETS_PARTITIONS, OFFSETS_TOPIC, offsets_partition_for


class BrokerIdInUse(Exception):
    """Another live broker is registered under this broker's id: this one must not start."""


@dataclass(frozen=True, slots=True)
class BrokerNode:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    # (listener name, host, port) per advertised listener; () for a registration from a
    # broker that predates listeners: host and port then serve every listener name.
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """Where a client that came in on `listener` reaches this broker (None: this
        broker has no such listener, and Kafka leaves it out of that client's view)."""
        if not self.endpoints or listener is None:
            return self.host, self.port
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return None


class Cluster:
    cluster_id: str = "kafscale"
    # offsets_topic_partitions: partitions of __consumer_offsets before the topic is known
    # (the broker's --offsets-topic-num-partitions); the topic's real count wins once known.

    def __init__(self, local: BrokerNode, offsets_topic_partitions: int = DEFAULT_OFFSETS_PARTITIONS):
        self.local = local
        self.offsets_topic_partitions = offsets_topic_partitions

    def brokers(self) -> list[BrokerNode]:
        return [self.local]

    def brokers_on(self, listener: str | None) -> list[tuple[BrokerNode, str, int]]:
        """(broker, host, port) of the live brokers reachable on `listener`, as a client
        that came in on it must be told (Kafka: the same listener name on every broker)."""
        out = []
        for b in self.brokers():
            where = b.endpoint(listener)
            if where is not None:
                out.append((b, where[0], where[1]))
        return out

    def node(self, node_id: int) -> BrokerNode | None:
        return next((b for b in self.brokers() if b.node_id == node_id), None)

    def owner_of(self, topic: str, partition: int) -> int:
        """Node id of the partition's owner (its Kafka 'leader')."""
        return self.local.node_id

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as this broker knows it (bumped on ownership moves)."""
        return 0

    def owns(self, topic: str, partition: int) -> bool:
        return self.owner_of(topic, partition) == self.local.node_id

    def leaders_version(self) -> Hashable | None:
        """A value that differs whenever `owner_of`, `leader_epoch` or the brokers may
        answer differently than before (Metadata keeps encoded answers while it is the
        same); None: no such promise, nothing may be kept."""
        return None

    def coordinator_for(self, key: str) -> BrokerNode:
        """The broker coordinating a transactional id (by hashing over the live brokers;
        also the fallback for groups while `__consumer_offsets` has no owner)."""
        live = sorted(self.brokers(), key=lambda b: b.node_id)
        return live[zlib.crc32(key.encode()) % len(live)]

    def is_coordinator(self, key: str) -> bool:
        return self.coordinator_for(key).node_id == self.local.node_id

    def offsets_partition_count(self) -> int:
        return self.offsets_topic_partitions

    def offsets_topic_seen(self, partitions: int) -> None:
        """`__consumer_offsets` exists with this many partitions (it may predate a change
        of --offsets-topic-num-partitions): groups map onto the real count, as in Kafka."""
        self.offsets_topic_partitions = partitions

    def offsets_partition(self, group_id: str) -> int:
        """The group's partition of `__consumer_offsets` (Kafka's partitionFor)."""
        return offsets_partition_for(group_id, self.offsets_partition_count())

    def group_coordinator(self, group_id: str) -> BrokerNode:
        """The broker coordinating a group: the owner of its `__consumer_offsets` partition,
        so the coordinator appends the group's records to a log it owns (Kafka's model)."""
        node = self.node(self.owner_of(OFFSETS_TOPIC, self.offsets_partition(group_id)))
        return node if node is not None else self.coordinator_for(group_id)

    def is_group_coordinator(self, group_id: str) -> bool:
        return self.group_coordinator(group_id).node_id == self.local.node_id

    @property
    def controller_id(self) -> int:
        return min(b.node_id for b in self.brokers())

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class SingleNodeCluster(Cluster):
    """The embedded default: one broker that owns every partition and group."""

    def leaders_version(self) -> Hashable | None:
        return 0  # this broker leads everything at epoch 0, always
