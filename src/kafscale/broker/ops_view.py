"""The broker as ops reads it: the read model ops defines (ops/read_model.py), implemented
over the Broker's parts. ops never imports broker/; this module is the only place that
knows both."""

from __future__ import annotations

import dataclasses
from typing import Any

from kafscale.ops.read_model import (
    BrokerState,
    HookPoints,
    OpsSettings,
    OwnedPartition,
    SharePartitionView,
    ShareState,
    TlsCounts,
)


class BrokerOpsView:
    """ops' BrokerReadModel of one Broker (broker/app.py, which builds it: not imported here,
    so no two modules import each other)."""

    def __init__(self, broker):
        self._broker = broker
        cfg = broker.config
        ssl_context = None
        if cfg.http_tls:
            def ssl_context():
                from kafscale.security.tls import server_context

                return server_context(dataclasses.replace(cfg.tls_settings(), client_auth="none", ca="", truststore=""))

        self.settings = OpsSettings(
            broker_id=cfg.broker_id, storage_kind=cfg.storage_url.scheme, metadata_kind=cfg.metadata_url.scheme, http=cfg.http,
            http_address=cfg.split_hostport(cfg.http) if cfg.http else None, http_basic_auth=cfg.http_basic_auth, http_ssl_context=ssl_context,
        )
        self.hooks = HookPoints(
            request_hooks=broker.server.request_hooks, response_hooks=broker.server.response_hooks,
            flush_hooks=broker.logs.flush_hooks, authentication_hooks=broker.auth.hooks,
            store_hooks=broker.store.request_hooks, metadata_hooks=broker.metadata.kv.request_hooks,
        )

    def scrape(self) -> BrokerState:
        b = self._broker
        logs, server, cluster = b.logs, b.server, b.cluster
        contexts = set(server.tls_contexts.values())
        try:
            brokers = len(cluster.brokers())
        except Exception:  # noqa: BLE001 - a cluster view being rebuilt: skip this scrape
            brokers = None
        lease_alive = getattr(cluster, "lease_alive", None)  # etcd clusters only
        return BrokerState(
            storage=logs.metrics,
            compaction=logs.compactor.counters,
            cache=logs.cache,
            connections=len(server.connections),
            request_memory=server.request_memory,
            authorization_denials=dict(b.authorizer.denials_by_operation) if b.authorizer.enabled else None,
            tls=TlsCounts(server.tls_handshake_failures, sum(t.reloads for t in contexts), sum(t.reload_failures for t in contexts)) if contexts else None,
            cluster_brokers=brokers,
            lease_alive=lease_alive() if callable(lease_alive) else None,
            partitions=[
                OwnedPartition(topic, partition, lg.high_watermark, lg.log_start_offset, max(lg.next_offset - lg.high_watermark, 0),
                               len(lg.state.segments), sum(s.size for s in lg.state.segments))
                for (topic, partition), lg in list(logs.logs.items())
            ],
            group_states={str(gid): g.state.value for gid, g in [*b.groups.groups.items(), *b.groups.consumer.groups.items()]},
            metadata_snapshot_age_s=b.snapshots.age_seconds(),
            share=self._share(),
        )

    def _share(self) -> ShareState:
        shares, owned = self._broker.shares, self._broker.logs.logs
        views = []
        for (group, topic, partition), entry in list(shares.partitions.items()):
            if (topic, partition) not in owned:
                continue  # moved away: its new owner reports it (this copy is dropped soon)
            sp = entry.sp
            views.append(SharePartitionView(group, topic, partition, sp.spso, sp.in_flight(), sp.acquired()))
        return ShareState(shares.counters, shares.writes, len(shares.sessions.sessions), views)

    def listener_serving(self) -> bool:
        return self._broker.server.is_serving()

    async def check_metadata(self) -> None:
        await self._broker.metadata.check()

    async def check_object_store(self) -> None:
        await self._broker.store.check()

    def topic_name_for_id(self, topic_id: Any) -> str | None:
        return self._broker.logs.topics.cached_name_for_id(topic_id)

    async def coordinated_group_states(self) -> dict[str, str]:
        # every protocol's groups (KIP-848 consumer groups: Empty, Assigning, Reconciling, Stable)
        return {gid: state for gid, _protocol_type, state, _type in await self._broker.groups.list_every_group()}

    def coordinates_group(self, group: str) -> bool:
        return self._broker.cluster.is_group_coordinator(group)

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {tp: committed.offset for tp, committed in (await self._broker.metadata.fetch_offsets(group)).items()}

    async def high_watermark(self, topic: str, partition: int) -> int | None:
        lg = self._broker.logs.logs.get((topic, partition))
        if lg is not None:
            return lg.high_watermark
        # Owned by another broker (or not loaded yet): the committed state.
        st = await self._broker.metadata.get_partition(topic, partition, with_segments=False)
        return st.high_watermark if st is not None else None

    async def live_topics(self) -> dict[Any, str]:
        return {t.uuid: t.name for t in await self._broker.metadata.list_topics()}
