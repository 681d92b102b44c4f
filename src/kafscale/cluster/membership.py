"""Who is in the cluster and who owns what.

`Cluster` is the interface the handlers use: the live brokers, the owner of a partition,
the coordinator of a group. `SingleNodeCluster` is the embedded default: this broker
owns everything. The etcd-backed cluster (leases, balanced ownership) implements the same.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


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

    def __init__(self, local: BrokerNode):
        self.local = local

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

    def coordinator_for(self, key: str) -> BrokerNode:
        """The broker coordinating a group (or other coordinator key)."""
        live = sorted(self.brokers(), key=lambda b: b.node_id)
        return live[zlib.crc32(key.encode()) % len(live)]

    def is_coordinator(self, key: str) -> bool:
        return self.coordinator_for(key).node_id == self.local.node_id

    @property
    def controller_id(self) -> int:
        return min(b.node_id for b in self.brokers())

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class SingleNodeCluster(Cluster):
    """The embedded default: one broker that owns every partition and group."""
