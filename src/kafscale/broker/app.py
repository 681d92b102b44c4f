"""The Broker: wires config, stores, logs, cluster, groups and the Kafka listener together."""

from __future__ import annotations

import asyncio
import logging

from kafscale.backup.guard import refuse_lost_metadata
from kafscale.backup.snapshot import SnapshotStore
from kafscale.backup.writer import SnapshotWriter
from kafscale.broker import topics
from kafscale.broker.auth import Authenticator
from kafscale.broker.authz import BrokerAuthorizer
from kafscale.broker.quota_manager import QuotaManager
from kafscale.broker.config import BrokerConfig
from kafscale.broker.ops_view import BrokerOpsView
from kafscale.broker.router import build_router
from kafscale.broker.server import KafkaServer
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.groups.coordinator import GroupCoordinator
from kafscale.share.manager import SharePartitionManager
from kafscale.share.settings import ShareSettings, broker_share_settings
from kafscale.metadata.internal_topics import OFFSETS_TOPIC
from kafscale.metadata.backends import open_kv
from kafscale.metadata.timed_kv import TimedKV
from kafscale.metadata.producer_ids import ProducerIdAllocator
from kafscale.metadata.store import MetadataStore
from kafscale.protocol.api_keys import ApiKey
from kafscale.storage.logs import LogManager
from kafscale.storage.backends import open_store
from kafscale.storage.timed_store import TimedObjectStore
from kafscale.ops.http import start_ops
from kafscale.protocol import build
from kafscale.registry.service import SCHEMAS_TOPIC, SCHEMAS_TOPIC_CONFIGS, RegistryService
from kafscale.registry.validation import ProduceValidator
from kafscale.transactions.coordinator import TransactionCoordinator

log = logging.getLogger("kafscale.broker")


class Broker:
    def __init__(self, config: BrokerConfig):
        self.config = config
        # Both timed for ops' latency histograms (ops/metrics.py, through HookPoints).
        self.metadata = MetadataStore(TimedKV(open_kv(config.metadata_url, config.data_dir, config.metadata_prefix, config.metadata_timeout_ms / 1000)))
        self.store = TimedObjectStore(open_store(config.storage_url))
        self.listeners, advertised = config.resolved_listeners()
        first = advertised[0]
        local = BrokerNode(config.broker_id, first.host, first.port, config.broker_rack or None, endpoints=tuple((a.name, a.host, a.port) for a in advertised))
        if config.metadata_url.is_etcd:
            from kafscale.cluster.etcd_cluster import EtcdCluster

            # The cluster stops the logs of partitions it loses. The log manager (built
            # next: it asks the cluster who owns what) exists before the cluster starts,
            # which is when it can first lose one.
            self.cluster = EtcdCluster(
                local, self.metadata.kv, self.metadata, config.lease_ttl_s, resync_interval_s=config.ownership_resync_ms / 1000,
                on_release=self._release_log, on_topic_deleted=self._stop_topic_logs, on_topics=self._topics_seen,
                offsets_topic_partitions=config.offsets_topic_num_partitions,
            )
        else:
            self.cluster = SingleNodeCluster(local, config.offsets_topic_num_partitions)
        self.logs = LogManager(self.metadata, self.store, config, self.cluster)
        self.producer_ids = ProducerIdAllocator(self.metadata)
        self.router = build_router()
        for api_key in (ApiKey.PRODUCE, ApiKey.FETCH):  # their first responses must not import on the event loop
            build.prepare(api_key)
        # Share groups' settings (broker defaults, per-group overrides), read by the group
        # coordinator and the share partitions alike
        self.share_settings = ShareSettings(broker_share_settings(config))
        self.groups = GroupCoordinator(self.metadata, config, self.cluster, append_records=self.logs.append_internal,
                                       share_settings=self.share_settings)
        # The share partitions of the partitions this broker owns, and its share sessions
        self.shares = SharePartitionManager(self.metadata, self.logs, self.share_settings)
        # a member gone from its share group gives its records back: at once when this broker
        # coordinates the group, else when this broker's share partitions see it missing
        self.groups.share.on_member_left = self.shares.member_left
        self.shares.members_of = self.groups.share.stored_members
        self.logs.marker_hooks[OFFSETS_TOPIC] = self.groups.txn_marker_written
        self.transactions: TransactionCoordinator | None = None
        if config.transactions:
            self.transactions = TransactionCoordinator(self.metadata, config, self.cluster, self.logs, self.producer_ids)
        else:
            from kafscale.broker.handlers.transactions import TRANSACTION_APIS

            for key in TRANSACTION_APIS:
                self.router.unregister(key)
        self.auth = Authenticator(config, self.metadata)
        self.authorizer = BrokerAuthorizer(config, self.metadata)
        self.quotas = QuotaManager(
            self.metadata, refresh_s=max(0.05, config.quota_refresh_ms / 1000),
            window_ms=max(1, config.quota_window_size_seconds) * 1000, samples=max(2, config.quota_window_num),
        )
        self.server = KafkaServer(self, config)
        # Produce requests wait in memory until durable: the segment cache gives way to them
        # (one budget, --cache-bytes, for segment data written and read; storage/cache.py),
        # and to the frame buffers kept for the next requests (broker/memory.py FramePool).
        self.logs.cache.held_outside = lambda: self.server.request_memory + self.server.frames.free_bytes
        self.server.request_memory_grew = self.logs.cache.give_way
        self.server.close_hooks.append(self.shares.connection_closed)
        self.backup_store = open_store(config.metadata_backup_url) if config.metadata_backup_url else self.store
        self.snapshots = SnapshotWriter(
            self.metadata.kv, SnapshotStore(self.backup_store, config.namespace), self.cluster, config.broker_id,
            config.metadata_snapshot_interval_ms / 1000, config.metadata_snapshots_keep,
        )
        self.ops = None
        # The schema registry's state (any broker: produce validation reads it) and its
        # REST API (--schema-registry, registry/server.py).
        self.schemas = RegistryService(self, lambda: topics.create(self, SCHEMAS_TOPIC, 1, dict(SCHEMAS_TOPIC_CONFIGS)))
        self.schema_validator = ProduceValidator(self.schemas)
        self.registry = None
        self.stopped = asyncio.Event()

    async def start(self) -> None:
        # An empty metadata store over a namespace holding data: restore or stop, never
        # start empty (raises MetadataLost).
        await refuse_lost_metadata(self.metadata.kv, self.store, self.snapshots.snapshots, self.config)
        # Before anything reads groups: stores written before keys were escaped.
        await self.metadata.migrate_legacy_keys()
        await self.cluster.start()
        await self.logs.start()
        await topics.ensure_internal_topics(self)
        await topics.sync_markers(self)
        await self.groups.start()
        if self.transactions is not None:
            await self.transactions.start()
        await self.authorizer.start()
        await self.quotas.start()
        await self.server.start()
        await self.snapshots.start()
        self.ops = await start_ops(BrokerOpsView(self))
        if self.config.schema_registry:
            from kafscale.registry.server import start_registry

            self.registry = await start_registry(self, self.schemas)

    async def stop(self) -> None:
        """Stop accepting, flush every buffer, release everything."""
        if self.ops is not None:
            await self.ops.stop()  # readiness fails from the first moment of shutdown
        if self.registry is not None:
            await self.registry.stop()
        await self.server.stop_accepting()
        if self.transactions is not None:
            await self.transactions.stop()  # markers in flight resume on the next coordinator
        await self.shares.stop()
        await self.logs.stop()
        await self.groups.stop()
        await self.snapshots.stop()  # the last snapshot holds every flushed segment
        await self.server.close()
        await self.authorizer.stop()
        await self.quotas.stop()
        await self.cluster.stop()
        await self.close_stores()
        self.stopped.set()

    async def close_stores(self) -> None:
        await self.metadata.close()
        await self.store.close()
        if self.backup_store is not self.store:
            await self.backup_store.close()

    async def txn_produce_check(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                topic: str, partition: int, produce_version: int = 0):
        """The produce path's hook (handlers/produce.py): the first transactional batch of a
        producer's transaction on a partition is accepted only if the transaction coordinator
        has the partition in that transaction (KIP-890), or, for a Produce v12+ with
        transactions v2, once the coordinator has added it. Later batches of the same open
        transaction go through without asking."""
        if self.transactions is None:
            return None
        adds = self.transactions.adds_implicitly("produce", produce_version)
        if not adds and not self.config.transaction_partition_verification_enable:
            return None  # (the add of transactions v2 is not optional: it is how the partition joins)
        try:
            lg = await self.logs.get_log(topic, partition)
        except Exception:
            return None  # the append answers this partition's error itself
        entry = lg.producers.producers.get(producer_id)
        if entry is not None and entry.txn_first_offset >= 0 and entry.epoch == producer_epoch:
            return None  # verified when the transaction opened here
        return await self.transactions.verify_produce(transactional_id, producer_id, producer_epoch, topic, partition,
                                                      produce_version)

    async def _release_log(self, topic: str, partition: int, flush: bool) -> None:
        await self.logs.release(topic, partition, flush=flush)

    async def _stop_topic_logs(self, topic: str) -> None:
        await self.logs.stop_topic(topic)

    def _topics_seen(self, metas) -> None:
        self.logs.topics_seen(metas)

    @property
    def listen_address(self) -> tuple[str, int]:
        return self.server.address
