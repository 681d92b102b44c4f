"""Many stateless brokers sharing etcd: membership, partition ownership, fencing.

- Each broker holds one etcd lease and registers `/brokers/{id}` under it.
- The desired owner of a partition is chosen from the live brokers and the current owners
  (sticky, at most ceil(partitions / brokers) each, rendezvous preference for the rest), so
  every broker computes the same answer and ownership moves only for the share a joining
  or leaving broker takes or gives up. A group's coordinator is the owner of its partition
  of `__consumer_offsets` (Kafka's model); transaction coordinators go by rendezvous hashing.
- Ownership is the key `/owners/{topic}/{p}`, tied to the owner's lease. Taking it is one
  transaction that also bumps the partition's leader epoch (so the old owner's next
  segment commit fails its compare): the old owner cannot commit after a takeover.
- The lease is refreshed every TTL/6 from a thread of its own (own gRPC channel), so a busy
  event loop cannot make a refresh late. A refresh sent at time s that etcd accepts keeps
  the lease alive until at least s + TTL (etcd renews from arrival, and never renews an
  expired lease); the broker writes only until s + TTL/2 of its last accepted refresh, so
  an owner stops writing well before etcd can expire the lease and anyone else take over,
  and an old owner's upload cannot land on a key after the new owner has written it.
- One id, one broker: registration creates `/brokers/{id}` only when absent. A key left by
  an earlier run (kill -9) is waited out for its lease TTL; one whose lease is still being
  refreshed after that belongs to a live broker, and this one refuses to start.
- SIGTERM: flush, then revoke the lease (deleting the owner keys with it): hand-over in well under a second.
- Changes are seen by etcd watches on the broker registrations, owner keys and topics: a
  change runs a reconcile at once (a burst of changes runs one). A full re-read every
  --ownership-resync-ms is the safety net, and every 0.5 s while this broker's share is not
  settled yet (a step failed, the lease is not alive). A broken watch (etcd down,
  compaction) is set up again, followed by a full re-read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from kafscale.cluster.membership import BrokerIdInUse, BrokerNode, Cluster
from kafscale.metadata import codec, keys
from kafscale.metadata.internal_topics import DEFAULT_OFFSETS_PARTITIONS, OFFSETS_TOPIC
from kafscale.metadata.kv import MetadataUnavailable, Txn
from kafscale.metadata.store import MetadataStore, PartitionState

if TYPE_CHECKING:
    from kafscale.metadata.etcd import EtcdKV

log = logging.getLogger("kafscale.cluster")
RESYNC_INTERVAL_S = 5.0  # full re-read when nothing changed (the watches see changes)
UNSETTLED_RETRY_S = 0.5  # re-read this often while our share is not reached
COALESCE_S = 0.01  # wait this long after a change for the rest of its burst
MIN_RECONCILE_GAP_S = 0.05  # between reconcile starts: a long burst (mass hand-over) re-reads at most 20/s
WATCH_RETRY_S = (0.2, 2.0)  # first and longest pause before setting a broken watch up again
WATCHED = (keys.BROKERS, keys.OWNERS, keys.TOPICS)  # membership, ownership, partition counts
KEEPALIVES_PER_TTL = 6  # a refresh every TTL/6: two can fail before writing stops at TTL/2
WRITE_MARGIN = 0.5  # of the TTL: writes stop this long after the last accepted refresh was sent
REGISTRATION_GRACE_S = 2.0  # past a lease's TTL, for etcd to revoke it and delete its keys
# Takeovers per etcd transaction: two compares and two puts each. etcd's --max-txn-ops
# (128 by default) bounds a transaction's compares and its operations apart.
TAKEOVERS_PER_TXN = 64


def keepalive_period(ttl_s: float) -> float:
    return max(ttl_s / KEEPALIVES_PER_TTL, 0.1)


def _score(key: str, node_id: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{node_id}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, node_ids: list[int]) -> int:
    """Highest-random-weight choice: stable when other nodes come and go."""
    return max(node_ids, key=lambda n: _score(key, n)) if node_ids else -1


def assign_topic(topic: str, partitions: int, node_ids: list[int], current: dict[int, int] | None = None) -> list[int]:
    """Owner of each partition, at most ceil(partitions / nodes) per node.

    Sticky: a live current owner keeps its partitions up to that cap, so a joining broker
    takes only the excess and a leaving one gives up only its own; the rest go by
    rendezvous preference. Every broker computes the same from the same view."""
    if not node_ids:
        return [-1] * partitions
    cap = -(-partitions // len(node_ids))
    load = dict.fromkeys(node_ids, 0)
    owners = [-1] * partitions
    for p, node in sorted((current or {}).items()):
        if p < partitions and node in load and load[node] < cap:
            owners[p] = node
            load[node] += 1
    for p in range(partitions):
        if owners[p] >= 0:
            continue
        key = f"{topic}/{p}"
        for n in sorted(node_ids, key=lambda n: _score(key, n), reverse=True):
            if load[n] < cap:
                load[n] += 1
                owners[p] = n
                break
    return owners


class EtcdCluster(Cluster):
    def __init__(
        self,
        local: BrokerNode,
        kv: "EtcdKV",
        metadata: MetadataStore,
        lease_ttl_s: int,
        resync_interval_s: float = RESYNC_INTERVAL_S,
        *,
        on_release: Callable[[str, int, bool], Awaitable[None]] | None = None,
        on_topic_deleted: Callable[[str], Awaitable[None]] | None = None,
        on_topics: Callable[[list], None] | None = None,
        offsets_topic_partitions: int = DEFAULT_OFFSETS_PARTITIONS,
    ):
        """`on_release(topic, partition, flush)` and `on_topic_deleted(topic)` stop this
        broker's logs of partitions it no longer owns (the broker passes its log manager's;
        None: a cluster with no logs, as in tests of membership alone)."""
        super().__init__(local, offsets_topic_partitions)
        self.kv = kv
        self.metadata = metadata
        self.ttl = lease_ttl_s
        self.on_release = on_release
        self.on_topic_deleted = on_topic_deleted
        # `on_topics(metas)`: every topic as just read, so the broker's topic cache and logs
        # follow partitions and configs changed through other brokers
        self.on_topics = on_topics
        self.lease = 0
        self._write_deadline = 0.0  # monotonic time until which we may write (lease surely alive)
        self._lease_lock = threading.Lock()  # lease and deadline, set by the loop and the keeper thread
        self._lease_gone = 0  # a lease the keeper thread found expired: the loop registers again
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._live: dict[int, BrokerNode] = {local.node_id: local}
        self._owners: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, p) -> (node, epoch)
        self._owned: set[tuple[str, int]] = set()
        self._epochs: dict[tuple[str, int], int] = {}
        self._partition_counts: dict[str, int] = {}
        self._desired: dict[str, list[int]] = {}  # topic -> desired owner of each partition
        self._tasks: list[asyncio.Task] = []
        self.resync_interval_s = resync_interval_s
        self._changed = asyncio.Event()  # something watched changed: reconcile
        self._broken_watches: set[str] = set()  # prefixes not watched now: poll meanwhile
        self._stopping = False
        self.listeners: list = []  # callables(cluster) run after membership changes
        # callables(cluster) run after membership changes and after ownership changes of
        # __consumer_offsets: group coordinators move with either
        self.group_listeners: list = []
        self._offsets_owners: dict[int, int] = {}
        # Bumped by every change of what owner_of, leader_epoch and brokers answer (the
        # live brokers, owners, epochs, desired owners, what this broker owns), right
        # where it happens, before any await: Metadata never keeps an answer past one.
        self._leaders_changes = 0

    # -- Cluster interface ---------------------------------------------------------------

    def brokers(self) -> list[BrokerNode]:
        return sorted(self._live.values(), key=lambda b: b.node_id)

    def lease_alive(self) -> bool:
        return time.monotonic() < self._write_deadline

    def leaders_version(self):
        # owns() also ends when the lease does, without any change being made
        return self._leaders_changes, self.lease_alive()

    def _leaders_changed(self) -> None:
        self._leaders_changes += 1

    def owns(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._owned and self.lease_alive()

    def owner_of(self, topic: str, partition: int) -> int:
        if self.owns(topic, partition):
            return self.local.node_id
        owner = self._owners.get((topic, partition))
        if owner is not None and owner[0] in self._live:
            return owner[0]
        return self.desired_owner(topic, partition)

    def leader_epoch(self, topic: str, partition: int) -> int:
        # The highest epoch seen, also while a partition is between owners: clients
        # (KIP-320) ignore metadata whose epoch went backwards.
        return self._epochs.get((topic, partition), 0)

    def desired_owner(self, topic: str, partition: int) -> int:
        owners = self._desired.get(topic)
        if owners is None or partition >= len(owners):
            return rendezvous(f"{topic}/{partition}", list(self._live))
        return owners[partition]

    def coordinator_for(self, key: str) -> BrokerNode:
        return self._live[rendezvous(f"group/{key}", list(self._live))]

    def offsets_partition_count(self) -> int:
        return self._partition_counts.get(OFFSETS_TOPIC) or self.offsets_topic_partitions

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self._register()
        self._start_keeper()
        await self.reconcile()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._lease_loop(), name="lease"), loop.create_task(self._reconcile_loop(), name="ownership")]
        self._tasks += [loop.create_task(self._watch(prefix), name=f"watch {prefix}") for prefix in WATCHED]

    async def _register(self) -> None:
        """Take a new lease and create `/brokers/{id}` under it, only where no live broker holds it."""
        key = keys.broker(self.local.node_id)
        doc = json.dumps({
            "host": self.local.host, "port": self.local.port, "rack": self.local.rack,
            "listeners": [list(e) for e in self.local.endpoints],
        }).encode()
        waited_for: tuple[int, float] | None = None  # (lease seen holding the key, when it must be gone by)
        while True:
            held = await self.kv.key_lease(key)
            if held is None:
                started = time.monotonic()
                lease = await self.kv.grant_lease(self.ttl)
                registered = False
                try:
                    registered = await self.kv.commit(Txn(compares=[(key, 0)], leased_puts=[(key, doc)], lease=lease))
                finally:
                    if not registered:
                        await self._revoke_quietly(lease)
                if registered:
                    with self._lease_lock:
                        self.lease, self._write_deadline = lease, started + self.ttl * WRITE_MARGIN
                    log.info("broker %d registered with lease %x (ttl %ds)", self.local.node_id, lease, self.ttl)
                    return
                continue  # another broker with our id was faster: see whether it lives
            holder, granted_ttl = held
            if not holder:
                raise BrokerIdInUse(f"broker id {self.local.node_id}: {self.kv.prefix}{key} exists without a lease (not a broker's registration); delete it or give this broker another --broker-id")
            now = time.monotonic()
            if waited_for is None or waited_for[0] != holder:
                # A lease alive for longer than its whole TTL after we first saw it has been
                # refreshed since: a live broker holds this id (a killed one's lease just runs out).
                waited_for = (holder, now + granted_ttl + REGISTRATION_GRACE_S)
                if granted_ttl:
                    log.warning(
                        "broker id %d is registered under lease %x (ttl %ds): waiting for it to expire (an earlier run that did not shut down?)",
                        self.local.node_id, holder, granted_ttl,
                    )  # fmt: skip
            elif granted_ttl and now > waited_for[1]:
                other = await self.kv.get(key)
                where = json.loads(other.value) if other is not None else {}
                raise BrokerIdInUse(
                    f"broker id {self.local.node_id} is in use by a live broker at {where.get('host')}:{where.get('port')} "
                    f"(its registration {self.kv.prefix}{key} is kept alive by lease {holder:x}); give this broker another --broker-id"
                )
            elif not granted_ttl:
                waited_for = (holder, max(waited_for[1], now + REGISTRATION_GRACE_S))  # expired: deletion under way
            await asyncio.sleep(0.25)

    async def _revoke_quietly(self, lease: int) -> None:
        try:
            await self.kv.revoke_lease(lease)
        except MetadataUnavailable as e:  # unused, so harmless: it just expires
            log.warning("could not revoke unused lease %x: %s", lease, e)

    async def stop(self) -> None:
        """Hand everything over at once: flush and release partitions, revoke the lease."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)  # watch streams closed before the channels
        # All flushes at once (a broker owns its share of __consumer_offsets' 50 partitions
        # besides the users' topics); the owner keys go with the lease revoked below, at once.
        results = await asyncio.gather(*(self._release(*key, flush=True, delete_owner_key=False) for key in list(self._owned)), return_exceptions=True)
        for error in (r for r in results if isinstance(r, Exception)):
            log.warning("releasing a partition on shutdown failed (its lease runs out): %s", error)
        self._keeper_stop.set()
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.join, self.ttl)
        try:
            await self.kv.revoke_lease(self.lease)
        except MetadataUnavailable as e:
            log.warning("could not revoke lease on shutdown (it expires in %ds): %s", self.ttl, e)

    def _start_keeper(self) -> None:
        from kafscale.metadata.etcd import BlockingLeaseKeeper

        keeper = BlockingLeaseKeeper(self.kv.endpoints)
        self._keeper = threading.Thread(target=self._keep_lease, args=(keeper,), name="lease-keepalive", daemon=True)
        self._keeper.start()

    def _keep_lease(self, keeper) -> None:
        """The keeper thread: refresh the lease every TTL/6, whatever the event loop is doing."""
        period = keepalive_period(self.ttl)
        next_at = time.monotonic() + period
        failing = False
        try:
            while not self._keeper_stop.wait(max(0.0, next_at - time.monotonic())):
                lease, sent = self.lease, time.monotonic()
                next_at = sent + period
                try:
                    # Past TTL/2 an answer cannot extend the deadline any more: try again.
                    alive = keeper.keepalive(lease, timeout=self.ttl * WRITE_MARGIN)
                except MetadataUnavailable as e:
                    if not failing:
                        log.warning("lease keepalive failed (writes stop %.1fs after the last accepted one): %s", self.ttl * WRITE_MARGIN, e)
                    failing = True
                    continue
                if failing:
                    log.info("lease keepalive answered again")
                    failing = False
                self._lease_refreshed(lease, sent, alive)
        except Exception:  # noqa: BLE001 - without refreshes writing stops by itself; say why
            log.exception("lease keepalive thread failed")
        finally:
            keeper.close()

    def _lease_refreshed(self, lease: int, sent: float, alive: bool) -> None:
        """etcd answered a keepalive for `lease` sent at monotonic time `sent`. It renewed
        the lease from when the request arrived (after `sent`), so the lease lives until at
        least sent + TTL: we may write until sent + TTL/2. An expired lease is never renewed."""
        with self._lease_lock:
            if lease != self.lease:
                return  # an answer about a lease we replaced meanwhile
            if alive:
                self._write_deadline = max(self._write_deadline, sent + self.ttl * WRITE_MARGIN)
            else:
                self._lease_gone = lease

    async def _lease_loop(self) -> None:
        """Acts on what the keeper thread found. Writing stops by the deadline owns() checks,
        not by this loop: a busy loop only delays the clean-up."""
        while True:
            await asyncio.sleep(keepalive_period(self.ttl))
            if self._lease_gone and self._lease_gone == self.lease:
                log.error("lease %x expired: dropping ownership and registering again", self.lease)
                await self._drop_all()
                try:
                    await self._register()
                except (MetadataUnavailable, BrokerIdInUse) as e:
                    log.error("re-registering failed: %s", e)
                self._wake()
            elif self._owned and not self.lease_alive():
                log.error("no lease keepalive accepted for %.1fs (etcd unreachable?): stopped writing", self.ttl * WRITE_MARGIN)
                await self._drop_all()

    async def _drop_all(self) -> None:
        """Our lease is (or may be) gone: others may own our partitions now. Never flush."""
        for key in list(self._owned):
            self._owned.discard(key)
            self._leaders_changed()
            if self.on_release is not None:
                await self.on_release(*key, False)
        self._wake()  # unsettled now: retried until the lease lets us take them back

    def _wake(self) -> None:
        self._changed.set()

    async def _reconcile_loop(self) -> None:
        """Reconcile on every watched change (one run per burst), else every resync
        interval; every UNSETTLED_RETRY_S while our share is not reached."""
        settled = True
        started = 0.0
        while True:
            interval = self.resync_interval_s if settled and not self._broken_watches else UNSETTLED_RETRY_S
            try:
                await asyncio.wait_for(self._changed.wait(), interval)
                await asyncio.sleep(max(COALESCE_S, started + MIN_RECONCILE_GAP_S - time.monotonic()))
            except asyncio.TimeoutError:
                pass
            self._changed.clear()  # changes from here on are seen by the reconcile below or cause another
            started = time.monotonic()
            settled = False
            try:
                settled = await self.reconcile()
            except MetadataUnavailable as e:
                log.warning("ownership reconcile: etcd unavailable: %s", e)
            except Exception:  # noqa: BLE001 - keep reconciling
                log.exception("ownership reconcile failed")

    async def _watch(self, prefix: str) -> None:
        """Wake the reconcile loop on every change under `prefix`, for good: a broken watch
        is set up again (after a pause) and then everything re-read, since changes made
        while it was down were not delivered."""
        pause = WATCH_RETRY_S[0]

        def created() -> None:
            nonlocal pause
            if prefix in self._broken_watches:
                log.info("watching %s again", prefix)
                self._broken_watches.discard(prefix)
            pause = WATCH_RETRY_S[0]
            self._wake()  # re-read: what changed before this moment was not delivered

        while True:
            try:
                async for _event in self.kv.watch_prefix(prefix, on_created=created):
                    self._wake()
                raise MetadataUnavailable(f"etcd watch {prefix}: ended")  # not expected: watches end by raising
            except MetadataUnavailable as e:
                if prefix not in self._broken_watches:
                    log.warning("etcd watch on %s broken (ownership re-read every %.1fs until it is back): %s", prefix, UNSETTLED_RETRY_S, e)
                self._broken_watches.add(prefix)
            except Exception:  # noqa: BLE001 - keep watching
                log.exception("etcd watch on %s failed", prefix)
                self._broken_watches.add(prefix)
            self._wake()  # the loop polls from now on, until the watch is back
            await asyncio.sleep(pause)
            pause = min(pause * 2, WATCH_RETRY_S[1])

    # -- ownership ------------------------------------------------------------------------

    async def refresh(self) -> None:
        live = {}
        for kv in await self.kv.range(keys.BROKERS):
            doc = json.loads(kv.value)
            node_id = keys.broker_id_of(kv.key)
            endpoints = tuple((str(n), str(h), int(p)) for n, h, p in doc.get("listeners") or ())
            live[node_id] = BrokerNode(node_id, doc["host"], doc["port"], doc.get("rack"), endpoints)
        if self.lease_alive() and not self._stopping:
            live.setdefault(self.local.node_id, self.local)
        membership = set(live) != set(self._live)
        if live != self._live:
            self._live = live
            self._leaders_changed()
        owners = {}
        for kv in await self.kv.range(keys.OWNERS):
            doc = json.loads(kv.value)
            owners[keys.owner_partition_of(kv.key)] = (doc["node"], doc["epoch"])
        changed = owners != self._owners
        self._owners = owners
        for key, (_node, epoch) in owners.items():
            if epoch > self._epochs.get(key, -1):
                self._epochs[key] = epoch
                changed = True
        if changed:
            self._leaders_changed()
        # Group coordinators move with the owners of __consumer_offsets: the group
        # listeners let go of the groups this broker no longer coordinates.
        offsets_owners = {p: node for (t, p), (node, _epoch) in owners.items() if t == OFFSETS_TOPIC}
        groups_moved = membership or offsets_owners != self._offsets_owners
        self._offsets_owners = offsets_owners
        if membership:
            log.info("live brokers: %s", sorted(live))
            for fn in self.listeners:
                fn(self)
        if groups_moved:
            for fn in self.group_listeners:
                fn(self)

    async def reconcile(self) -> bool:
        """Take and release partitions towards the desired assignment; True when this
        broker owns exactly its share afterwards (nothing to retry before a change)."""
        await self.refresh()
        if self._stopping or not self.lease_alive():
            return False
        me = self.local.node_id
        topics = await self.metadata.list_topics()
        self._partition_counts = {m.name: m.partitions for m in topics}
        if self.on_topics is not None:
            self.on_topics(topics)
        live_ids = sorted(self._live)
        current: dict[str, dict[int, int]] = {}
        for (t, p), (node, _epoch) in self._owners.items():
            current.setdefault(t, {})[p] = node
        desired = {m.name: assign_topic(m.name, m.partitions, live_ids, current.get(m.name)) for m in topics}
        if desired != self._desired:
            self._desired = desired
            self._leaders_changed()
        moves = []  # releases (each its own flush and etcd transaction) and the takeovers: run together
        takeovers: list[tuple[str, int]] = []
        for meta in topics:
            for p in range(meta.partitions):
                key = (meta.name, p)
                desired = self.desired_owner(*key)
                current = self._owners.get(key)
                if key in self._owned:
                    if current is None or current[0] != me:
                        # Someone removed our key (etcd restored, or a lease mix-up): stop.
                        self._owned.discard(key)
                        self._leaders_changed()
                        if self.on_release is not None:
                            await self.on_release(*key, False)
                    elif desired != me:
                        moves.append(self._release(*key, flush=True))
                elif desired == me and (current is None or current[0] == me):
                    # Free, or ours from before (etcd outage, or this id restarted): take it
                    # with a new epoch, so anything written under the old one is fenced.
                    takeovers.append(key)
        if takeovers:
            moves.append(self._acquire_all(takeovers))
        failures = [r for r in await asyncio.gather(*moves, return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]  # the reconcile loop logs it and tries again soon
        # Ownership of topics that were deleted (by another broker, if our logs still run).
        names = set(self._partition_counts)
        for key in [k for k in self._owned if k[0] not in names]:
            self._owned.discard(key)
            self._leaders_changed()
            if self.on_topic_deleted is not None:
                await self.on_topic_deleted(key[0])
        return all((owner == me) == ((topic, p) in self._owned) for topic, owners in self._desired.items() for p, owner in enumerate(owners))

    async def _acquire_all(self, wanted: list[tuple[str, int]]) -> None:
        """Take these partitions: per topic one read of its partition states and one of its
        owner keys, then one transaction per TAKEOVERS_PER_TXN partitions, each partition
        guarded by its own compares as in _acquire. A transaction refused (some partition
        changed meanwhile) goes again partition by partition. A takeover per partition,
        each three reads and a transaction, all at once, kept a loaded etcd and event loop
        from answering anything for half a minute when a topic of 1,024 partitions came."""
        by_topic: dict[str, list[int]] = {}
        for topic, p in wanted:
            by_topic.setdefault(topic, []).append(p)
        chunks = []
        for topic, parts in by_topic.items():
            if len(parts) == 1:
                chunks.append(self._acquire(topic, parts[0]))
                continue
            states = {keys.partition_of(kv.key)[1]: kv for kv in await self.kv.range(keys.topic_partitions_prefix(topic))}
            held = {keys.owner_partition_of(kv.key)[1]: kv for kv in await self.kv.range(keys.topic_owners_prefix(topic))}
            takes = []
            for p in parts:
                kv = states.get(p)
                st = PartitionState(topic, p, version=kv.version, **json.loads(kv.value)) if kv else PartitionState(topic, p)
                owner = held.get(p)
                if owner is not None and json.loads(owner.value).get("node") != self.local.node_id:
                    continue  # another live broker holds it: it releases when it sees it should
                takes.append(self._takeover(st, owner.version if owner else 0))
            for i in range(0, len(takes), TAKEOVERS_PER_TXN):
                chunks.append(self._commit_takeovers(takes[i : i + TAKEOVERS_PER_TXN]))
        failures = [r for r in await asyncio.gather(*chunks, return_exceptions=True) if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    def _takeover(self, st: PartitionState, owner_version: int) -> tuple[PartitionState, int, Txn]:
        """The takeover of `st` at the next epoch, guarded by the owner key's and the
        partition key's versions as read: (state, new epoch, transaction)."""
        epoch = st.leader_epoch + 1
        okey, pkey = keys.owner(st.topic, st.partition), keys.partition(st.topic, st.partition)
        state_doc = MetadataStore.state_doc(st)
        state_doc.update(leader_epoch=epoch, owner=self.local.node_id, epoch_start_offset=st.high_watermark)
        txn = Txn(
            compares=[(okey, owner_version), (pkey, st.version)],
            puts=[(pkey, codec.encode(state_doc))],
            leased_puts=[(okey, codec.encode({"node": self.local.node_id, "epoch": epoch}))],
            lease=self.lease,
        )
        return st, epoch, txn

    async def _commit_takeovers(self, takes: list[tuple[PartitionState, int, Txn]]) -> None:
        if len(takes) > 1:
            txn = Txn(lease=self.lease)
            for _st, _epoch, t in takes:
                txn.compares += t.compares
                txn.puts += t.puts
                txn.leased_puts += t.leased_puts
            if not await self.kv.commit(txn):
                # Some partition changed since the read: each on its own, read afresh.
                await asyncio.gather(*(self._acquire(st.topic, st.partition) for st, _e, _t in takes))
                return
        elif not await self.kv.commit(takes[0][2]):
            return
        for st, epoch, _txn in takes:
            self._took(st, epoch)

    def _took(self, st: PartitionState, epoch: int) -> None:
        key = (st.topic, st.partition)
        self._owned.add(key)
        self._owners[key] = (self.local.node_id, epoch)
        self._epochs[key] = epoch
        self._leaders_changed()
        log.info("took ownership of %s-%d at epoch %d (high watermark %d)", st.topic, st.partition, epoch, st.high_watermark)

    async def _acquire(self, topic: str, partition: int) -> None:
        st = await self.metadata.get_partition(topic, partition, with_segments=False)
        if st is None:
            return
        held = await self.kv.get(keys.owner(topic, partition))
        if held is not None and json.loads(held.value).get("node") != self.local.node_id:
            return  # another live broker holds it: it releases when it sees it should
        await self._commit_takeovers([self._takeover(st, held.version if held else 0)])

    async def _release(self, topic: str, partition: int, flush: bool, delete_owner_key: bool = True) -> None:
        if self.on_release is not None:
            await self.on_release(topic, partition, flush)
        self._owned.discard((topic, partition))
        self._leaders_changed()
        if delete_owner_key:
            okey = keys.owner(topic, partition)
            kv = await self.kv.get(okey)
            if kv is not None and json.loads(kv.value).get("node") == self.local.node_id:
                await self.kv.commit(Txn(compares=[(okey, kv.version)], deletes=[okey]))
        self._owners.pop((topic, partition), None)
        self._leaders_changed()
        log.info("released ownership of %s-%d", topic, partition)
