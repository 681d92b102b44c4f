"""The registry of the partition logs this broker owns (LogManager): loading a log on first
use, with recovery on load; releasing, forgetting and stopping logs; topic deletion.

Offsets are assigned when a batch enters the write buffer; the high watermark (what
consumers see and what is acknowledged) only moves once the segment holding the batch is in
the object store and committed to the metadata store. If an upload fails, every batch not
yet durable is dropped and its producers get a retriable error, so offsets are never
handed out twice and nothing acknowledged is ever renumbered.

The rest of storage/, by job:
  partition_core.py  PartitionCore: one log's decisions (append, flush, answers, stop), no I/O
  partition_log.py   PartitionLog: the driver doing its uploads and commits; FlushedPartition:
                     the read-only view of a partition owned elsewhere
  reader.py          SegmentReader: the shared read path (cache, whole and ranged segment loads)
  recovery.py        adopting uncommitted segments and rebuilding producer state on load
  write_ahead.py     the write-ahead object format: one object per flush for all partitions
  write_ahead_flusher.py  WriteAheadFlusher: the broker-wide flush cycle writing them
  write_ahead_cleanup.py  deleting write-ahead objects no segment refers to (after the merger's rewrite)
  retention.py       which segments are past retention, and the task that deletes them
  merger.py          merging small adjacent segments (and the loop the compactor runs in)
  cleaner.py         log compaction's decisions (cleanable range, key map, batch rewriting)
  compactor.py       log compaction's driver over the object store (docs/compaction.md)
  rewrite.py         SegmentRewriter: reading a run of segments and writing it back as one
                     (the merger's and the compactor's)
  config.py          StorageConfig: the broker settings storage reads, typed, built once
  metrics.py         StorageMetrics: the sink the jobs report their events to
  topic_cache.py     TopicCache: topic metadata and the topic-id table
  failures.py        StorageError, and how store failures become retriable Kafka errors
  segment.py, cache.py, producers.py: the segment codec, the segment cache,
                     idempotent-producer sequences
  objectstore.py     the object-store contract; local_store.py, s3.py its backends;
                     backends.py open_store(url); url.py StorageURL (--storage parsed once)
"""

from __future__ import annotations

import asyncio
import logging
import time

from kafscale.errors import ErrorCode
from kafscale.metadata.store import MetadataStore, PartitionState, TopicMeta
from kafscale.protocol import records as record_batches
from kafscale.protocol.records import InvalidRecordError
from kafscale.storage import topic_marker
from kafscale.storage.compactor import Compactor
from kafscale.storage.config import StorageConfig
from kafscale.storage.failures import STORE_FAILURES, StorageError, store_failure
from kafscale.storage.merger import EAGER_FLUSH_PAUSE_FACTOR, SegmentMerger
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.partition_log import FlushedPartition, PartitionLog
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.reader import SegmentReader
from kafscale.storage.recovery import rebuild_producer_state, recover
from kafscale.storage.retention import Retention
from kafscale.storage.rewrite import SegmentRewriter
from kafscale.storage.topic_cache import TopicCache
from kafscale.storage.txn import TxnMarker
from kafscale.storage.write_ahead_cleanup import WriteAheadCleanup
from kafscale.storage.write_ahead_flusher import WriteAheadFlusher

log = logging.getLogger("kafscale.storage")


class LogManager:
    """The partition logs this broker owns. It builds the storage jobs and hands each the
    narrow things it uses (the typed config, the store, the reader and its cache, the
    metrics sink, the owned logs): the read path (self.reader), the topic cache
    (self.topics), retention (self.retention), the merger (self.merger) and the compactor
    (self.compactor).

    `config` is the broker's (BrokerConfig), read once into a StorageConfig, or one already."""

    def __init__(self, metadata: MetadataStore, store: ObjectStore, config, cluster):
        self.metadata = metadata
        self.store = store
        self.config = config = config if isinstance(config, StorageConfig) else StorageConfig.of(config)
        self.cluster = cluster
        self.namespace = config.namespace
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._loading: dict[tuple[str, int], asyncio.Future] = {}
        self._loaded_before: set[tuple[str, int]] = set()  # partitions a load of this process began for
        self.topics = TopicCache(metadata)
        self._readers: dict[tuple[str, int], "FlushedPartition"] = {}
        self._retention_task: asyncio.Task | None = None
        self._merge_task: asyncio.Task | None = None
        self.stopping = False
        self.metrics = StorageMetrics()
        # ops/metrics times and sizes each durable flush through these hooks.
        self.flush_hooks = self.metrics.flush_hooks
        self.reader = SegmentReader(store, self.namespace, config.cache_bytes, self.metrics)
        # One object per flush for all owned partitions (None: a segment per partition).
        self.write_ahead = (
            WriteAheadFlusher(store, metadata, self.namespace, config.broker_id, self.metrics,
                              commit_deadline_s=config.write_ahead_orphan_age_ms / 4000, min_interval_s=config.min_flush_interval_ms / 1000)
            if config.write_ahead_objects else None
        )
        self.cache = self.reader.cache
        rewriter = SegmentRewriter(store, self.reader, self.namespace, config.index_min_bytes, self.metrics, cluster.owns)
        self.merger = SegmentMerger(
            store, self.logs.values, rewriter, config.merge_interval_ms / 1000, config.merge_grace_ms / 1000,
            config.merge_max_pending_objects, config.merge_min_grace_ms / 1000,
        )
        self.merger.segment_max_age_ms = config.segment_max_age_ms
        if config.min_flush_interval_ms == 0:  # acknowledgements wait for each eager flush
            self.merger.pause_factor = EAGER_FLUSH_PAUSE_FACTOR
        self.merger.write_ahead_seen = config.write_ahead_objects
        self.merger.write_ahead_cleanup = WriteAheadCleanup(
            store, metadata, self.namespace, config.merge_grace_ms / 1000, config.write_ahead_orphan_age_ms / 1000
        )
        self.retention = Retention(self.logs.values, self.load_owned, config.retention_check_interval_ms / 1000, config.producer_id_expiration_ms)
        self.compactor = Compactor(self.logs.values, rewriter, config.compaction_key_map_bytes, self.merger.schedule_delete)
        self.compactor.between_groups = self.merger.delete_expired
        if config.compaction_interval_ms > 0:
            self.merger.compactor = self.compactor
            self.merger.compaction_interval_s = config.compaction_interval_ms / 1000
        # topic -> async hook(partition, producer_id, commit) awaited after a transaction
        # marker on that topic's partition is durable (the group coordinator's, for the
        # transactional offsets of __consumer_offsets); a failing hook is logged only
        self.marker_hooks: dict = {}

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._retention_task = loop.create_task(self.retention.run_forever(), name="retention")
        if self.config.merge_interval_ms > 0 or self.config.compaction_interval_ms > 0 or self.config.write_ahead_objects:
            self._merge_task = loop.create_task(self.merger.run_forever(), name="merger")

    async def stop(self) -> None:
        self.stopping = True  # no new logs from here on: clients go to the next owner
        for task in (self._retention_task, self._merge_task):
            if task:
                task.cancel()
        reason = StorageError("the broker is shutting down", ErrorCode.not_leader_or_follower)
        await asyncio.gather(*(self._stop_log(lg, reason, flush=True) for lg in list(self.logs.values())), return_exceptions=True)
        self.logs.clear()
        if self.write_ahead is not None:
            await self.write_ahead.stop()

    async def _stop_log(self, lg: PartitionLog, reason: StorageError, flush: bool) -> None:
        """Stop a log and then forget it; until then get_log refuses with its reason (no
        second log of the partition while the first one flushes)."""
        try:
            await lg.stop(reason, flush)
        finally:
            if self.logs.get((lg.topic, lg.partition)) is lg:
                del self.logs[(lg.topic, lg.partition)]

    # -- topics -------------------------------------------------------------------------

    def topic_changed(self, meta: TopicMeta) -> None:
        self.topics.put(meta)
        for (t, _p), lg in self.logs.items():
            if t == meta.name:
                lg.apply_configs(meta)

    def topics_seen(self, metas: list[TopicMeta]) -> None:
        """Topics as the cluster just read them: those changed through another broker (new
        partitions, altered configs) reach the cache and the running logs here too."""
        for meta in metas:
            if self.topics.cached(meta.name) not in (None, meta):
                self.topic_changed(meta)

    async def drop_topic(self, name: str, topic_id: str | None = None) -> None:
        """Forget a deleted topic's logs and cache, and delete its objects, its marker last
        (none of them when the name already belongs to a topic created again)."""
        await self.stop_topic(name)
        await topic_marker.remove_topic_objects(self.store, self.namespace, name, topic_id)

    async def stop_topic(self, name: str) -> None:
        """A topic was deleted (here, or by another broker): stop its logs, answering their
        waiting produces UNKNOWN_TOPIC_OR_PARTITION, and forget its cached state."""
        self.topics.forget(name)
        reason = StorageError(f"topic {name!r} was deleted", ErrorCode.unknown_topic_or_partition)
        doomed = [lg for (t, _p), lg in self.logs.items() if t == name]
        for lg in doomed:  # without flush: every waiting produce is answered before any I/O
            await self._stop_log(lg, reason, flush=False)
        for lg in doomed:
            try:
                await asyncio.wait_for(lg.upload_finished(), 30)
            except TimeoutError:
                log.warning("topic %s deleted while an upload of partition %d hangs: its object may be left behind", name, lg.partition)
        for key in [k for k in self._readers if k[0] == name]:
            del self._readers[key]
        self.reader.drop(name)

    # -- partition logs ------------------------------------------------------------------

    async def release(self, topic: str, partition: int, flush: bool) -> None:
        """Ownership is moving away: flush (graceful hand-over) or drop (fenced), then forget."""
        lg = self.logs.get((topic, partition))
        if lg is not None:
            await self._stop_log(lg, StorageError(f"{topic}-{partition} moved to another broker", ErrorCode.not_leader_or_follower), flush)
        self.reader.drop(topic, partition)

    def forget(self, topic: str, partition: int) -> None:
        """Ownership lost or fenced, seen by the log itself: stop it now (no flush)."""
        lg = self.logs.pop((topic, partition), None)
        if lg is not None:
            lg.halt(StorageError(f"{topic}-{partition} is no longer owned here", ErrorCode.not_leader_or_follower))

    async def _partition_state(self, topic: str, partition: int) -> PartitionState:
        try:
            st = await self.metadata.get_partition(topic, partition)
        except STORE_FAILURES as e:
            raise store_failure(e, f"reading {topic}-{partition}") from e
        if st is None:
            raise StorageError(f"unknown topic or partition {topic}-{partition}", ErrorCode.unknown_topic_or_partition)
        return st

    async def get_reader(self, topic: str, partition: int):
        """Something to fetch from: the owned log, or else a read-only view of the
        partition's flushed segments (any broker can serve those from the object store)."""
        try:
            return await self.get_log(topic, partition)
        except StorageError as e:
            if e.error_code != ErrorCode.not_leader_or_follower:
                raise
        key = (topic, partition)
        view = self._readers.get(key)
        if view is None or view.stale():
            st = await self._partition_state(topic, partition)
            if view is not None:
                self.reader.segments_changed(topic, partition, view.state.segments, st.segments)
            else:
                self.reader.drop(topic, partition)  # views cached under an older segment list
            view = self._readers[key] = FlushedPartition(st, self.reader, self.metadata)
        return view

    def open_log(self, topic: str, partition: int) -> PartitionLog | None:
        """The partition's log when it is loaded and open (produce's path without a
        coroutine a partition); None: ask get_log, which loads it or says why not."""
        lg = self.logs.get((topic, partition))
        return lg if lg is not None and not lg.closed else None

    async def get_log(self, topic: str, partition: int) -> PartitionLog:
        """The owned log of a partition, loading and recovering it on first use.

        Raises StorageError(UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER)."""
        key = (topic, partition)
        lg = self.logs.get(key)
        if lg is not None:
            if lg.closed:  # stopping: its reason says whether to retry elsewhere or give up
                raise lg.refusal()
            return lg
        if self.stopping or not self.cluster.owns(topic, partition):
            raise StorageError(f"{topic}-{partition} is not served by this broker", ErrorCode.not_leader_or_follower)
        fut = self._loading.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._loading[key] = fut
            try:
                lg = await self._load(topic, partition)
                self.logs[key] = lg
                fut.set_result(lg)
            except BaseException as e:
                fut.set_exception(e)
                fut.exception()  # mark retrieved
                raise
            finally:
                del self._loading[key]
            return lg
        return await asyncio.shield(fut)

    async def _load(self, topic: str, partition: int) -> PartitionLog:
        try:
            meta = await self.topics.get(topic)
            if meta is None or not 0 <= partition < meta.partitions:
                meta = await self.topics.get(topic, refresh=True)
            if meta is None or not 0 <= partition < meta.partitions:
                raise StorageError(f"unknown topic or partition {topic}-{partition}", ErrorCode.unknown_topic_or_partition)
            # Recovery commits adopted segments: another owner's commit in between is a
            # ConflictError, answered as NOT_LEADER_OR_FOLLOWER like any store failure here.
            st = await self._partition_state(topic, partition)
            self.reader.drop(topic, partition)  # views cached while another broker owned it
            producers = ProducerStateTable()
            await rebuild_producer_state(self.reader, topic, partition, st.segments, producers)
            if not self._first_writer(st):
                st = await recover(self.store, self.metadata, self.namespace, st, self.merger.schedule_delete, producers, topic_id=meta.topic_id)
            lg = PartitionLog(
                meta, st, producers, config=self.config, store=self.store, metadata=self.metadata, reader=self.reader,
                metrics=self.metrics, owns=self.cluster.owns, forget=self.forget, write_ahead=self.write_ahead,
            )
        except STORE_FAILURES as e:
            raise store_failure(e, f"loading {topic}-{partition}") from e
        return lg

    def _first_writer(self, st: PartitionState) -> bool:
        """Whether this load is the first by the first broker ever to own the partition:
        this broker took it at leader epoch 1 (only a takeover on etcd names an owner, and
        each bumps the epoch) and has not loaded it before. Nobody has flushed it then, so
        no object waits under its prefix for recovery to adopt or sweep, and its load skips
        the listing (a LIST a partition: 1,024 when a broker takes a new topic of 1,024).
        A later load (a reload after a failed flush, a restart, another owner) lists."""
        key = (st.topic, st.partition)
        first = st.owner == self.cluster.local.node_id and st.leader_epoch == 1 and key not in self._loaded_before
        self._loaded_before.add(key)
        return first

    async def load_owned(self) -> None:
        """Load every partition this broker owns but has not loaded yet (retention does, each round)."""
        for meta in await self.metadata.list_topics():
            for p in range(meta.partitions):
                if (meta.name, p) not in self.logs and self.cluster.owns(meta.name, p):
                    await self.get_log(meta.name, p)

    async def append_internal(self, topic: str, partition: int, recs: list[tuple[bytes | None, bytes | None]]) -> asyncio.Future:
        """The broker's own append (the group coordinator's records to `__consumer_offsets`):
        one batch of (key, value) records with the current time, through the owned log
        like any produce but with none of the produce path's refusals (internal topics,
        null keys). Offsets are assigned now, in call order; the returned future resolves
        when the batch is durable (or fails with the StorageError that dropped it).
        Raises StorageError now when this broker does not own the partition."""
        lg = await self.get_log(topic, partition)
        buf = memoryview(bytearray(record_batches.build_batch(recs, timestamp=int(time.time() * 1000))))
        headers = record_batches.validate_record_set(buf, None)
        _base, _append_time, waiter = lg.append(buf, headers, True)
        return waiter

    async def write_txn_markers(self, marker: TxnMarker) -> dict[tuple[str, int], ErrorCode]:
        """Append `marker` (COMMIT or ABORT of one producer's transaction) to each of its
        partitions owned here and wait until every one appended is durable. Per partition:
        none; not_leader_or_follower (owned elsewhere: the coordinator asks the owner);
        unknown_topic_or_partition (deleted: the marker is dropped, as Kafka);
        invalid_producer_epoch / transaction_coordinator_fenced (a zombie's marker);
        kafka_storage_error (retry)."""
        results: dict[tuple[str, int], ErrorCode] = {}
        waiting: dict[tuple[str, int], asyncio.Future] = {}
        for topic, partition in marker.partitions:
            key = (topic, partition)
            try:
                lg = await self.get_log(topic, partition)
                waiting[key] = lg.append_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, marker.commit)
                results[key] = ErrorCode.none
            except (StorageError, InvalidRecordError) as e:
                results[key] = e.error_code
                if e.error_code not in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
                    log.warning("transaction marker for producer %d on %s-%d refused: %s", marker.producer_id, topic, partition, e)
        if waiting:
            await asyncio.gather(*waiting.values(), return_exceptions=True)
            for key, fut in waiting.items():
                exc = fut.exception()
                if exc is not None:
                    results[key] = exc.error_code if isinstance(exc, StorageError) else ErrorCode.kafka_storage_error
                elif key[0] in self.marker_hooks:
                    try:
                        await self.marker_hooks[key[0]](key[1], marker.producer_id, marker.commit)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - the marker stands; only the hook's records are missing
                        log.warning("after the transaction marker of producer %d on %s-%d: %s", marker.producer_id, key[0], key[1], e)
        return results

    def epoch_end_offset(self, lg: PartitionLog, epoch: int) -> tuple[int, int]:
        """(end offset, epoch) for OffsetForLeaderEpoch: the current epoch ends at the high
        watermark; an older one ends where the current one began (its start offset)."""
        if epoch >= lg.leader_epoch:
            return lg.high_watermark, lg.leader_epoch
        return lg.state.epoch_start_offset, epoch
