"""TransactionCoordinator: the asyncio driver around the pure state machine (`state.py`).

It owns what the state machine must not: the clock, the metadata store, producer-id
allocation, the marker writes and the periodic sweep.

- Ownership: a transactional id is coordinated by `cluster.coordinator_for(transactional
  id)` (the same mechanism as groups; FindCoordinator with key type 1 answers it). A broker
  keeps the transactions it coordinates in memory, loaded from the store on first use, and
  forgets those that moved away on membership changes.
- Persistence before acting: every new state is written to the metadata store (guarded by
  the version read, so a broker holding a stale copy fails with NOT_COORDINATOR instead of
  overwriting) before the request is answered or any marker is sent.
- Markers: once PrepareCommit/PrepareAbort is persisted, a task writes the markers to every
  partition of the transaction, and to the `__consumer_offsets` partition of each group
  with offsets in it (Kafka's AddOffsetsToTxn; there the group coordinator appends the
  committed offsets' records): `logs.write_txn_markers` for partitions this broker owns,
  WriteTxnMarkers (API 27) to the owner for the others, retrying until each partition
  answers NONE or UNKNOWN_TOPIC_OR_PARTITION (a deleted partition needs no marker). Then
  CompleteCommit/CompleteAbort is persisted together with the move of the transaction's
  pending TxnOffsetCommit offsets into the committed offsets (or their removal on abort).
- Transactions v2 (KIP-890 part 2) with the transaction.version feature finalized at 2
  (`--transaction-version`): a Produce v12+ adds its partition (`verify_produce`: directly
  here, else AddPartitionsToTxn v5 not verify-only from the partition's broker) and a
  TxnOffsetCommit v5+ its group (`add_group`: AddOffsetsToTxn from the group's
  coordinator), instead of the client's AddPartitionsToTxn / AddOffsetsToTxn. Markers of a
  v2 transaction go out as WriteTxnMarkers v2 with transaction_version 2.
- Recovery: a transaction loaded in PrepareCommit/PrepareAbort (after a restart or a
  coordinator move) gets its markers written again (harmless twice) and is completed.
- The sweep (every transaction_abort_timed_out_transaction_cleanup_interval_ms) aborts
  and fences Ongoing transactions past their timeout, finishes prepared ones of ids this
  broker now coordinates, and removes ids unused for transactional.id.expiration.ms.

Every operation on a transactional id runs under that id's lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Callable, Iterable

from kafscale.errors import ErrorCode
from kafscale.metadata.internal_topics import OFFSETS_TOPIC
from kafscale.metadata.store import ConflictError, MetadataStore
from kafscale.protocol.api_keys import ApiKey
from kafscale.security.inter_broker import InterBrokerSecurity
from kafscale.transactions.state import (
    DEFAULT_ID_EXPIRATION_MS,
    DEFAULT_MAX_TIMEOUT_MS,
    PRODUCE_ADDS_PARTITION_SINCE,
    TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE,
    Markers,
    Step,
    TransactionMetadata,
    TxnState,
    produce_error,
    valid_timeout,
)

log = logging.getLogger("kafscale.transactions")

WRITE_TXN_MARKERS_VERSION = 2  # v2 carries the transaction version (2: the epoch was bumped at the end)
MARKER_DONE = frozenset({ErrorCode.none, ErrorCode.unknown_topic_or_partition})
# A partition that has seen a newer epoch of this producer (or a newer coordinator) refuses
# the marker: this coordinator's copy is stale. Kafka's coordinator stops sending then.
MARKER_FENCED = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced})
MARKER_RETRY_MIN_S = 0.05
MARKER_RETRY_MAX_S = 2.0
COORDINATOR_EPOCH = 0  # ownership is fenced by the guarded store writes, not by an epoch
# A request for an id whose markers are being written waits this long for them before it
# is answered CONCURRENT_TRANSACTIONS: a producer's next transaction usually starts right
# after its commit, and a retry costs it the client's backoff (librdkafka: 100 ms).
MARKER_WAIT_S = 1.0
INTER_BROKER_LISTENER = "PLAINTEXT"  # without broker settings (tests building a coordinator alone)


def _inter_broker_security(config) -> InterBrokerSecurity:
    if not hasattr(config, "resolved_listeners"):
        return InterBrokerSecurity(INTER_BROKER_LISTENER)  # a bare config (unit tests of the coordinator)
    return InterBrokerSecurity.from_config(config)
ADD_PARTITIONS_TO_TXN_VERSION = 5  # broker to broker: batched, verify-only or (transactions v2) adding
ADD_OFFSETS_TO_TXN_VERSION = 4
TRANSACTION_VERSION = 2  # the transaction.version feature level finalized by default (a Kafka 4.0 cluster)


class TransactionCoordinator:
    def __init__(
        self,
        metadata: MetadataStore,
        config,
        cluster,
        logs=None,
        producer_ids=None,
        clock: Callable[[], float] | None = None,
    ):
        self.metadata = metadata
        self.cluster = cluster
        self.logs = logs
        self.producer_ids = producer_ids
        self.max_timeout_ms = int(getattr(config, "transaction_max_timeout_ms", DEFAULT_MAX_TIMEOUT_MS))
        self.id_expiration_ms = int(getattr(config, "transactional_id_expiration_ms", DEFAULT_ID_EXPIRATION_MS))
        self.sweep_interval_ms = int(getattr(config, "transaction_abort_timed_out_transaction_cleanup_interval_ms", 10_000))
        # The finalized transaction.version feature level (ApiVersions): from 2, Produce v12+
        # and TxnOffsetCommit v5+ add their partition / group to the transaction themselves.
        self.transaction_version = int(getattr(config, "transaction_version", TRANSACTION_VERSION))
        self.clock = clock or (lambda: time.time() * 1000.0)
        self.txns: dict[str, TransactionMetadata] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._marker_tasks: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._sweep_task: asyncio.Task | None = None
        self._stopping = False
        self.security = _inter_broker_security(config)
        self.remote = RemoteMarkerWriter(security=self.security)
        listeners = getattr(cluster, "listeners", None)
        if isinstance(listeners, list):
            listeners.append(self._on_membership_change)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        self._sweep_task = asyncio.ensure_future(self._sweep_loop())

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (self._sweep_task, *self._marker_tasks.values(), *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sweep_task = None
        self._marker_tasks.clear()
        self.txns.clear()
        await self.remote.close()

    def owns(self, transactional_id: str) -> bool:
        return self.cluster is None or self.cluster.is_coordinator(transactional_id)

    def _on_membership_change(self, cluster) -> None:
        for tid in [t for t in self.txns if not self.owns(t)]:
            self._spawn(self.release(tid))
        if not self._stopping and self._sweep_task is not None:
            # Ids this broker just took over may hold prepared transactions whose markers
            # their previous coordinator did not finish: finish them now, not at the next sweep.
            self._spawn(self._sweep_quietly())

    async def _sweep_quietly(self) -> None:
        try:
            await self.sweep()
        except Exception:
            log.exception("transaction sweep after a membership change failed")

    async def release(self, transactional_id: str) -> None:
        """Another broker coordinates this id now: stop its markers and forget it."""
        task = self._marker_tasks.pop(transactional_id, None)
        if task is not None:
            task.cancel()
        async with self._locks[transactional_id]:
            self.txns.pop(transactional_id, None)

    # -- requests -------------------------------------------------------------------------

    def timeout_valid(self, timeout_ms: int) -> bool:
        return valid_timeout(timeout_ms, self.max_timeout_ms)

    async def _await_markers(self, tid: str) -> None:
        task = self._marker_tasks.get(tid)
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=MARKER_WAIT_S)  # never cancels the task

    async def init_producer_id(self, tid: str, timeout_ms: int, expected: tuple[int, int] | None) -> Step:
        await self._await_markers(tid)
        async with self._locks[tid]:
            meta = await self._load(tid)
            now = self.clock()
            if meta is None:
                meta = TransactionMetadata.new(tid, await self.producer_ids.allocate(), timeout_ms, now)
            step = meta.init_producer_id(now, timeout_ms, expected)
            if step.needs_producer_id:
                step = meta.init_producer_id(now, timeout_ms, expected, new_producer_id=await self.producer_ids.allocate())
            return await self._apply(meta, step)

    async def add_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                             partitions: Iterable[tuple[str, int]] = (), groups: Iterable[str] = (),
                             tv2: bool = False) -> ErrorCode:
        await self._await_markers(tid)
        async with self._locks[tid]:
            meta = await self._load(tid)
            if meta is None:
                return ErrorCode.invalid_producer_id_mapping
            step = meta.add_partitions(self.clock(), producer_id, producer_epoch, set(partitions), set(groups), tv2)
            return (await self._apply(meta, step)).error

    async def verify_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                                partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        async with self._locks[tid]:
            meta = await self._load(tid)
            if meta is None:
                return {tp: ErrorCode.invalid_producer_id_mapping for tp in partitions}
            return meta.verify_partitions(producer_id, producer_epoch, partitions).partition_errors

    async def end_txn(self, tid: str, producer_id: int, producer_epoch: int, commit: bool, tv2: bool = False) -> Step:
        if tv2:
            # A v2 client may end its next transaction right after the last one's answer
            # (an abort with nothing added): give the last one's markers a moment first.
            await self._await_markers(tid)
        async with self._locks[tid]:
            meta = await self._load(tid)
            if meta is None:
                return Step(ErrorCode.invalid_producer_id_mapping)
            now = self.clock()
            step = meta.end_txn(now, producer_id, producer_epoch, commit, tv2)
            if step.needs_producer_id:
                step = meta.end_txn(now, producer_id, producer_epoch, commit, tv2,
                                    new_producer_id=await self.producer_ids.allocate())
            return await self._apply(meta, step)

    async def describe(self, tid: str) -> TransactionMetadata | None:
        async with self._locks[tid]:
            meta = await self._load(tid)
            return None if meta is None or meta.state is TxnState.DEAD else meta

    async def list_transactions(self) -> list[TransactionMetadata]:
        """Every transaction this broker coordinates."""
        out = []
        for tid, (doc, version) in sorted((await self.metadata.list_transactions()).items()):
            if not self.owns(tid):
                continue
            meta = self.txns.get(tid) or TransactionMetadata.from_doc(tid, doc, version)
            out.append(meta)
        return out

    def adds_implicitly(self, api: str, version: int) -> bool:
        """Transactions v2 finalized and a request version that adds its partition (Produce
        v12+) or group (TxnOffsetCommit v5+) to the transaction itself."""
        since = PRODUCE_ADDS_PARTITION_SINCE if api == "produce" else TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE
        return self.transaction_version >= 2 and version >= since

    async def verify_produce(self, tid: str, producer_id: int, producer_epoch: int, topic: str, partition: int,
                             produce_version: int = 0) -> ErrorCode | None:
        """KIP-890's check before a partition accepts the first transactional batch of a
        producer's transaction: is the partition in the producer's ongoing transaction? With
        transactions v2 and Produce v12+ the partition is added instead (starting the
        transaction when none is in progress). Done by this broker's coordinator directly,
        else by the id's coordinator with AddPartitionsToTxn v5 (verify-only or adding), as
        Kafka's partition leaders do. Returns the error to refuse the batch with (Produce's
        codes for this version), or None to accept it."""
        tp = (topic, partition)
        if not tid:
            return ErrorCode.invalid_request
        add = self.adds_implicitly("produce", produce_version)

        async def local() -> ErrorCode:
            if add:
                return await self.add_partitions(tid, producer_id, producer_epoch, [tp], tv2=True)
            return (await self.verify_partitions(tid, producer_id, producer_epoch, [tp]))[tp]

        error = await self._at_coordinator(
            tid, local,
            lambda host, port: self.remote.add_partition(host, port, tid, producer_id, producer_epoch, tp, verify_only=not add),
            f"{'add to' if add else 'verify'} the transaction",
        )
        return produce_error(error, produce_version)

    async def add_group(self, tid: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        """Transactions v2, TxnOffsetCommit v5+: the group coordinator adds the group to the
        producer's transaction (Kafka adds the group's __consumer_offsets partition): this
        broker's coordinator directly, else AddOffsetsToTxn to the id's coordinator (our
        broker-to-broker path: it names the group, which the coordinator keeps). Returns
        the coordinator's error (state.txn_offset_commit_error says what to answer)."""
        return await self._at_coordinator(
            tid,
            lambda: self.add_partitions(tid, producer_id, producer_epoch, groups=[group_id], tv2=True),
            lambda host, port: self.remote.add_offsets(host, port, tid, producer_id, producer_epoch, group_id),
            f"add group {group_id!r} to the transaction",
        )

    async def _at_coordinator(self, tid: str, local, remote, what: str) -> ErrorCode:
        """`local()` when this broker coordinates `tid`, else `remote(host, port)` at the
        broker that does; a coordinator that cannot be reached is the retriable
        NETWORK_EXCEPTION, as Kafka answers when it cannot verify."""
        if self.owns(tid):
            return await local()
        node = self.cluster.coordinator_for(tid)
        host, port = node.endpoint(INTER_BROKER_LISTENER) or (node.host, node.port)
        try:
            return await remote(host, port)
        except Exception as e:
            log.warning("could not %s of %r at its coordinator %d: %s", what, tid, node.node_id, e)
            return ErrorCode.network_exception

    async def check_offset_commit(self, tid: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        """TxnOffsetCommit (answered by the group's coordinator, maybe another broker): the
        producer must be the transactional id's current one, with the group added by
        AddOffsetsToTxn to its ongoing transaction. Read from the store: the transaction's
        coordinator persists before it answers, so the store is never behind the client."""
        found = await self.metadata.get_transaction(tid)
        if found is None:
            return ErrorCode.invalid_producer_id_mapping
        meta = TransactionMetadata.from_doc(tid, *found)
        if meta.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if meta.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced
        if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
            return ErrorCode.transaction_abortable  # not in the transaction (v0-v3: INVALID_TXN_STATE)
        return ErrorCode.none

    # -- the sweep ------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Abort timed-out transactions, finish prepared ones, remove expired ids."""
        for tid in list(self.txns):
            if not self.owns(tid):
                await self.release(tid)
        for tid in sorted(await self.metadata.list_transactions()):
            if not self.owns(tid):
                continue
            async with self._locks[tid]:
                meta = await self._load(tid)
                if meta is None:
                    continue
                now = self.clock()
                step = meta.abort_if_timed_out(now)
                if step is not None:
                    log.info("transactional id %s: transaction timed out after %d ms; aborting it and fencing producer %d",
                             tid, meta.timeout_ms, meta.producer_id)
                    await self._apply(meta, step)
                elif meta.expired(now, self.id_expiration_ms):
                    log.info("transactional id %s unused for %d ms: removing it", tid, self.id_expiration_ms)
                    try:
                        await self.metadata.delete_transaction(tid, meta.version)
                    except ConflictError:
                        pass
                    self.txns.pop(tid, None)

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("transaction sweep failed")
            await asyncio.sleep(self.sweep_interval_ms / 1000)

    # -- internals ------------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, tid: str) -> TransactionMetadata | None:
        """The transaction from memory, else from the store (with its id's lock held); a
        prepared one loaded from the store gets its markers written (recovery)."""
        meta = self.txns.get(tid)
        if meta is not None:
            return meta
        found = await self.metadata.get_transaction(tid)
        if found is None:
            return None
        meta = TransactionMetadata.from_doc(tid, *found)
        self.txns[tid] = meta
        markers = meta.markers_to_resend()
        if markers is not None:
            log.info("transactional id %s loaded in %s: writing its markers", tid, meta.state.value)
            self._start_markers(tid, markers)
        return meta

    async def _apply(self, meta: TransactionMetadata, step: Step) -> Step:
        """Persist the step's new state (guarded by the version we hold), install it, then
        start its markers. A store conflict means another broker wrote this id: forget our
        copy and answer NOT_COORDINATOR (the client finds the coordinator again)."""
        if step.new is not None:
            tid = meta.transactional_id
            try:
                step.new.version = await self.metadata.put_transaction(tid, step.new.to_doc(), meta.version)
            except ConflictError:
                log.warning("transactional id %s was changed by another coordinator; dropping our copy", tid)
                self.txns.pop(tid, None)
                return Step(ErrorCode.not_coordinator)
            self.txns[tid] = step.new
            if step.markers is not None:
                self._start_markers(tid, step.markers)
        return step

    def _start_markers(self, tid: str, markers: Markers) -> None:
        if self._stopping:
            return
        old = self._marker_tasks.get(tid)
        if old is not None and not old.done():
            return  # already writing this id's markers
        task = asyncio.ensure_future(self._finish(tid, markers))
        self._marker_tasks[tid] = task
        task.add_done_callback(lambda t, tid=tid: self._marker_tasks.pop(tid, None) if self._marker_tasks.get(tid) is t else None)

    async def _finish(self, tid: str, markers: Markers) -> None:
        """Write every marker (retrying), then persist CompleteCommit/CompleteAbort."""
        delay = MARKER_RETRY_MIN_S
        # As Kafka: a transaction with offsets (AddOffsetsToTxn) also gets its marker on each
        # group's __consumer_offsets partition, whose owner (the group's coordinator) then
        # writes the offsets' records to that partition on commit.
        remaining = set(markers.partitions) | {(OFFSETS_TOPIC, self.cluster.offsets_partition(g)) for g in markers.groups}
        while remaining:
            try:
                results = await self.write_markers(markers, remaining)
            except Exception as e:
                log.warning("transactional id %s: writing markers failed (%s); retrying", tid, e)
                results = {}
            fenced = {tp: e for tp, e in results.items() if e in MARKER_FENCED}
            if fenced:
                log.warning("transactional id %s: markers for producer %d epoch %d refused as stale (%s); "
                            "this coordinator's copy is out of date, dropping it", tid, markers.producer_id,
                            markers.producer_epoch, fenced)
                async with self._locks[tid]:
                    self.txns.pop(tid, None)
                return
            remaining = {tp for tp in remaining if results.get(tp) not in MARKER_DONE}
            if remaining:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MARKER_RETRY_MAX_S)
        while True:
            try:
                async with self._locks[tid]:
                    meta = self.txns.get(tid)
                    if (
                        meta is None
                        or meta.markers_to_resend() != markers
                    ):
                        return  # released, or already completed by someone else
                    now = self.clock()
                    new = meta.complete(now).new
                    try:
                        new.version = await self.metadata.complete_transaction(
                            tid, new.to_doc(), meta.version, markers.producer_id, markers.groups, markers.commit, int(now)
                        )
                    except ConflictError:
                        log.warning("transactional id %s was changed by another coordinator; dropping our copy", tid)
                        self.txns.pop(tid, None)
                        return
                    self.txns[tid] = new
                    log.debug("transactional id %s: %s", tid, new.state.value)
                    return
            except Exception as e:  # the store is down: the outcome is fixed, keep trying
                log.warning("transactional id %s: could not record the end of its transaction (%s); retrying", tid, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MARKER_RETRY_MAX_S)

    async def write_markers(self, markers: Markers, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        """One round of marker writes: locally for owned partitions, WriteTxnMarkers to the
        owner of the others. Returns each partition's error."""
        by_owner: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for tp in sorted(partitions):
            by_owner[self.cluster.owner_of(*tp)].append(tp)
        local = self.cluster.local.node_id
        results: dict[tuple[str, int], ErrorCode] = {}
        for owner, tps in by_owner.items():
            try:
                if owner == local:
                    results.update(await self._write_local(markers, tps))
                else:
                    node = self.cluster.node(owner)
                    if node is None:
                        continue  # owner unknown right now: retried
                    # The inter-broker listener (security/inter_broker.py), else its first.
                    host, port = node.endpoint(self.security.listener) or (node.host, node.port)
                    results.update(await self.remote.write(host, port, markers, tps))
            except Exception as e:
                log.warning("markers for producer %d to %s (broker %d) failed: %s", markers.producer_id, tps, owner, e)
        return results

    async def _write_local(self, markers: Markers, tps: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        # The partition side (storage/txn.py) lands separately; until then markers wait.
        from kafscale.storage.txn import TxnMarker

        marker = TxnMarker(
            producer_id=markers.producer_id,
            producer_epoch=markers.producer_epoch,
            coordinator_epoch=COORDINATOR_EPOCH,
            commit=markers.commit,
            partitions=list(tps),
        )
        return {tp: ErrorCode(code) for tp, code in (await self.logs.write_txn_markers(marker)).items()}


class RemoteMarkerWriter:
    """A minimal broker-to-broker client: WriteTxnMarkers to a partition's owner over the
    Kafka protocol (its advertised listener), one connection per owner, one request at a time."""

    def __init__(self, client_id: str = "kafscale-txn-coordinator", timeout_s: float = 30.0, security: InterBrokerSecurity | None = None):
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.security = security or InterBrokerSecurity(INTER_BROKER_LISTENER)
        self._conns: dict[tuple[str, int], tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._locks: defaultdict[tuple[str, int], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._correlation = 0

    async def write(self, host: str, port: int, markers: Markers, tps: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        from kafscale.protocol.build import nested
        from kafscale.protocol.codec import schema

        cls = schema(ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, "request")
        marker_cls, topic_cls = nested(cls, "WritableTxnMarker"), nested(cls, "WritableTxnMarkerTopic")
        by_topic: dict[str, list[int]] = defaultdict(list)
        for t, p in tps:
            by_topic[t].append(p)
        body = cls(markers=(marker_cls(
            producer_id=markers.producer_id,
            producer_epoch=markers.producer_epoch,
            transaction_result=markers.commit,
            topics=tuple(topic_cls(name=t, partition_indexes=tuple(ps)) for t, ps in by_topic.items()),
            coordinator_epoch=COORDINATOR_EPOCH,
            transaction_version=2 if markers.tv2 else 0,  # Kafka: the client's transaction version
        ),))
        resp = await self._request((host, port), ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, body)
        out: dict[tuple[str, int], ErrorCode] = {}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = ErrorCode(p.error_code)
        return out

    async def add_partition(self, host: str, port: int, tid: str, producer_id: int, producer_epoch: int,
                            tp: tuple[str, int], verify_only: bool = True) -> ErrorCode:
        """AddPartitionsToTxn v5 for one partition to the id's coordinator: verify-only
        (KIP-890 part 1), or adding it (part 2, a Produce v12+)."""
        from kafscale.protocol.build import nested
        from kafscale.protocol.codec import schema

        version = ADD_PARTITIONS_TO_TXN_VERSION
        cls = schema(ApiKey.ADD_PARTITIONS_TO_TXN, version, "request")
        topic_cls, txn_cls = nested(cls, "AddPartitionsToTxnTopic"), nested(cls, "AddPartitionsToTxnTransaction")
        body = cls(transactions=(txn_cls(
            transactional_id=tid, producer_id=producer_id, producer_epoch=producer_epoch, verify_only=verify_only,
            topics=(topic_cls(name=tp[0], partitions=(tp[1],)),),
        ),))
        resp = await self._request((host, port), ApiKey.ADD_PARTITIONS_TO_TXN, version, body)
        if resp.error_code != ErrorCode.none:
            return ErrorCode(resp.error_code)
        for res in resp.results_by_transaction:
            for t in res.topic_results:
                for p in t.results_by_partition:
                    if (t.name, p.partition_index) == tp:
                        return ErrorCode(p.partition_error_code)
        return ErrorCode.unknown_server_error

    async def add_offsets(self, host: str, port: int, tid: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        """AddOffsetsToTxn to the id's coordinator, for a TxnOffsetCommit v5+ (transactions v2)."""
        from kafscale.protocol.codec import schema

        cls = schema(ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS_TO_TXN_VERSION, "request")
        body = cls(transactional_id=tid, producer_id=producer_id, producer_epoch=producer_epoch, group_id=group_id)
        resp = await self._request((host, port), ApiKey.ADD_OFFSETS_TO_TXN, ADD_OFFSETS_TO_TXN_VERSION, body)
        return ErrorCode(resp.error_code)

    async def _request(self, addr: tuple[str, int], api_key: int, version: int, body):
        from kafscale.protocol.codec import decode_response, encode_request

        async with self._locks[addr]:
            conn = self._conns.get(addr)
            try:
                if conn is None:
                    conn = await self.security.connect(*addr, self.timeout_s, self.client_id)
                    self._conns[addr] = conn
                reader, writer = conn
                self._correlation = (self._correlation + 1) & 0x7FFFFFFF
                correlation = self._correlation
                writer.write(encode_request(api_key, version, correlation, self.client_id, body))
                await writer.drain()
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), self.timeout_s), "big", signed=True)
                payload = await asyncio.wait_for(reader.readexactly(size), self.timeout_s)
                got, resp = decode_response(api_key, version, payload)
                if got != correlation:
                    raise ConnectionError(f"correlation id {got} != {correlation}")
                return resp
            except BaseException:
                self._drop(addr)
                raise

    def _drop(self, addr) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn[1].close()

    async def close(self) -> None:
        for addr in list(self._conns):
            self._drop(addr)
