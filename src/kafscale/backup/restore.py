"""Rebuild an empty metadata store from the newest snapshot and the bucket itself.

`restore(...)` (behind `kafscale metadata restore`, and `kafscale broker
--metadata-auto-restore`):

1. refuses a store holding any key but the lease-bound ones, unless `force` (then they are
   deleted first); marks the store with RESTORING so no broker starts on half of it;
2. loads the newest snapshot that passes its checks (or the one asked for; a damaged one
   is reported and the previous one used), or none: restore from the bucket alone;
3. lists the namespace once and reconciles every partition of every topic with its
   objects and its pieces in write-ahead objects (reconcile.py, the objects' indexes read
   once; pieces count only under their topic's live marker, as a deleted topic's stay
   in the objects for a while); topics the snapshot does not know are discovered from
   the key layout (partition count from the keys, configs at their defaults: reported);
4. brings committed offsets up to date from the `__consumer_offsets` records in the bucket
   that are newer than the snapshot (latest per group/topic/partition; tombstones delete;
   records of aborted or unfinished transactions ignored);
5. moves the producer-id block past every id the bucket shows (and a margin for ids handed
   out but not yet used), and each transactional producer's epoch up to the highest the
   bucket shows, so no restored broker hands out an id or epoch twice;
6. writes it all, topics last, and removes the RESTORING mark.

Brokers must be stopped while it runs (a broker refuses to start while RESTORING is set).
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field

from kafscale.backup.reconcile import HeldPiece, PartitionOutcome, reconcile_partition
from kafscale.backup.snapshot import Snapshot, SnapshotStore, is_lease_bound
from kafscale.groups import offsets_topic
from kafscale.metadata import codec, keys
from kafscale.metadata.internal_topics import OFFSETS_TOPIC, offsets_topic_configs
from kafscale.metadata.kv import KV, Txn
from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.store import CommittedOffset, MetadataStore, PartitionState, TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment, write_ahead
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore
from kafscale.storage.topic_marker import MARKER_NAME, MarkerFormatError, TopicMarker, is_marker_key, marker_key

log = logging.getLogger("kafscale.backup")

RESTORING = "/restore-in-progress"
PUTS_PER_TXN = 100  # below etcd's default --max-txn-ops (128)
PARTITIONS_AT_ONCE = 16
PRODUCER_ID_MARGIN = 1_000_000  # ids possibly handed out after the snapshot, never written
# __consumer_offsets records are read from segments whose newest record is at most this
# much older than the snapshot: a transaction's offsets are written when it starts (up to
# Kafka's 15 min transaction.max.timeout.ms before its commit marker), clocks differ.
OFFSETS_LOOKBACK_MS = 20 * 60 * 1000


class RestoreRefused(RuntimeError):
    """Restore would change a store that is not empty (or one another restore is filling)."""


@dataclass(slots=True)
class RestoreReport:
    snapshot: str | None = None
    snapshot_created: str | None = None
    snapshot_problems: list[str] = field(default_factory=list)
    topics: int = 0
    topics_from_snapshot: int = 0
    topics_from_markers: list[str] = field(default_factory=list)  # id, partitions, configs from the topic marker
    topics_discovered: list[str] = field(default_factory=list)  # no marker, not in the snapshot: configs at defaults
    topics_deleted: list[str] = field(default_factory=list)  # in the snapshot or bucket, deleted since
    topics_grown: list[str] = field(default_factory=list)  # partitions added after the snapshot
    partitions: int = 0
    segments_kept: int = 0
    segments_replaced: int = 0
    segments_dropped: int = 0
    segments_adopted: int = 0
    quarantined: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    offsets_from_snapshot: int = 0
    offsets_recovered: int = 0  # from __consumer_offsets records newer than the snapshot
    offsets_deleted: int = 0  # by tombstones newer than the snapshot
    transactions_aborted: int = 0
    transactions_committed: int = 0
    keys_written: int = 0
    object_requests: int = 0
    seconds: float = 0.0
    unknown: list[str] = field(default_factory=list)  # what could not be known

    def lines(self) -> list[str]:
        src = f"snapshot {self.snapshot} ({self.snapshot_created})" if self.snapshot else "no snapshot: the bucket alone"
        out = [f"restored from {src} and the bucket in {self.seconds:.1f}s"]
        out += [f"  note: {p}" for p in self.snapshot_problems]
        out.append(
            f"topics: {self.topics} ({self.topics_from_snapshot} from the snapshot, {len(self.topics_from_markers)} from topic markers, "
            f"{len(self.topics_discovered)} discovered from segment keys alone)"
        )
        if self.topics_from_markers:
            out.append(f"  id, partitions and configs from their markers (created after the snapshot): {', '.join(self.topics_from_markers)}")
        if self.topics_discovered:
            out.append(f"  configs at defaults, new topic ids (no marker, not in the snapshot): {', '.join(self.topics_discovered)}")
        if self.topics_deleted:
            out.append(f"  deleted since, left deleted: {', '.join(self.topics_deleted)}")
        if self.topics_grown:
            out.append(f"  partitions added after the snapshot, counted from the keys: {', '.join(self.topics_grown)}")
        out.append(f"partitions: {self.partitions}")
        out.append(
            f"segments: {self.segments_kept} as listed, {self.segments_replaced} replaced by merged/compacted objects, "
            f"{self.segments_adopted} adopted from the bucket, {self.segments_dropped} dropped (deleted since)"
        )
        out.append(f"committed offsets: {self.offsets_from_snapshot} from the snapshot, {self.offsets_recovered} newer from __consumer_offsets, {self.offsets_deleted} deleted by newer tombstones")
        out.append(f"open transactions closed: {self.transactions_aborted} aborted, {self.transactions_committed} committed (coordinator had decided)")
        out += [f"  problem: {p}" for p in self.problems]
        out += [f"  quarantined: {q}" for q in self.quarantined]
        out += [f"  not known: {u}" for u in self.unknown]
        out.append(f"keys written: {self.keys_written}; object-store requests: {self.object_requests}")
        return out

    def to_doc(self) -> dict:
        return asdict(self)


def _split_partition_key(key: str, root: str) -> tuple[str, int, str]:
    """(topic, partition, rest) of a /partitions/ or /segments/ key."""
    parts = key[len(root) :].split("/")
    return keys.unescape(parts[0]), int(parts[1]), "/".join(parts[2:])


class _Loaded:
    """The snapshot's entries, sorted into what restore changes and what it passes through."""

    def __init__(self, snap: Snapshot | None):
        self.topics: dict[str, TopicMeta] = {}
        self.partitions: dict[tuple[str, int], PartitionState] = {}
        self.offsets: dict[tuple[str, str, int], CommittedOffset] = {}
        self.transactions: dict[str, dict] = {}
        self.producer_ids = 0
        self.other: list[tuple[str, bytes]] = []
        if snap is None:
            return
        segs: dict[tuple[str, int], list[SegmentInfo]] = {}
        for key, value in snap.entries:
            if is_lease_bound(key) or key == RESTORING:
                continue
            if key.startswith(keys.TOPICS):
                meta = TopicMeta(**json.loads(value))
                self.topics[meta.name] = meta
            elif key.startswith(keys.PARTITIONS):
                t, p, _ = _split_partition_key(key, keys.PARTITIONS)
                self.partitions[(t, p)] = PartitionState(t, p, **json.loads(value))
            elif key.startswith(keys.SEGMENTS):
                t, p, _ = _split_partition_key(key, keys.SEGMENTS)
                segs.setdefault((t, p), []).append(codec.decode_segment(value))
            elif key.startswith(keys.OFFSETS):
                group_id = keys.unescape(key[len(keys.OFFSETS) :].split("/", 1)[0])
                t, p = keys.offset_partition_of(key)
                self.offsets[(group_id, t, p)] = CommittedOffset(**json.loads(value))
            elif key.startswith(keys.TRANSACTIONS):
                self.transactions[keys.transactional_id_of(key)] = json.loads(value)
            elif key == keys.PRODUCER_IDS:
                self.producer_ids = int(value)
            else:
                self.other.append((key, value))
        for (t, p), infos in segs.items():
            st = self.partitions.setdefault((t, p), PartitionState(t, p))
            st.segments = sorted(infos, key=lambda s: s.base_offset)


async def check_store(kv: KV) -> list[str]:
    """The keys that make the store non-empty for a restore (lease-bound ones do not count)."""
    _rev, kvs = await kv.read_all()
    return [e.key for e in kvs if not is_lease_bound(e.key)]


async def namespace_holds_data(store: ObjectStore, namespace: str) -> bool:
    return bool(await store.list(f"{namespace}/"))


async def restore(
    kv: KV,
    store: ObjectStore,
    snapshots: SnapshotStore,
    namespace: str,
    *,
    snapshot_id: str | None = None,
    use_snapshots: bool = True,
    force: bool = False,
    fence_epochs: bool = True,
) -> RestoreReport:
    started = time.monotonic()
    report = RestoreReport()
    existing = await check_store(kv)
    if RESTORING in existing and not force:
        raise RestoreRefused("another restore is under way (or one was interrupted: run again with --force)")
    if existing and not force:
        raise RestoreRefused(f"the metadata store is not empty ({len(existing)} keys, e.g. {existing[0]}); nothing was changed (--force replaces them)")
    snap: Snapshot | None = None
    if snapshot_id is not None:
        snap = await snapshots.load(snapshot_id)  # ObjectNotFound / SnapshotCorrupt: the caller reports it
    elif use_snapshots:
        snap = await snapshots.load_newest(report.snapshot_problems)
    if existing:
        for i in range(0, len(existing), PUTS_PER_TXN):
            await kv.commit(Txn(deletes=existing[i : i + PUTS_PER_TXN]))
    if not await kv.commit(Txn(compares=[(RESTORING, 0)], puts=[(RESTORING, codec.encode({"started_ms": int(time.time() * 1000)}))])):
        raise RestoreRefused("another restore started at the same moment")
    try:
        puts = await _rebuild(store, namespace, snap, report, fence_epochs)
    except BaseException:
        # Nothing written to the metadata store yet: leave it as it was (empty).
        await kv.commit(Txn(deletes=[RESTORING]))
        raise
    for i in range(0, len(puts), PUTS_PER_TXN):
        await kv.commit(Txn(puts=puts[i : i + PUTS_PER_TXN]))  # a failure here leaves RESTORING: run again with --force
    report.keys_written = len(puts)
    await kv.commit(Txn(deletes=[RESTORING]))
    report.seconds = time.monotonic() - started
    for line in report.lines():
        log.info("restore: %s", line)
    return report


async def _rebuild(store: ObjectStore, namespace: str, snap: Snapshot | None, report: RestoreReport, fence_epochs: bool) -> list[tuple[str, bytes]]:
    """Reconcile the snapshot with the bucket; the keys to write. Changes only the bucket
    (transaction markers, quarantined objects), in ways a second run takes as they are."""
    loaded = _Loaded(snap)
    if snap is not None:
        report.snapshot, report.snapshot_created = snap.info.id, snap.info.created_iso
    else:
        report.unknown += [
            "ACLs, SCRAM users, client quotas, group membership and transactional ids (no snapshot holds them)",
        ]

    # One listing of the namespace: every partition's segment objects.
    sizes = await store.list_sizes(f"{namespace}/")
    listing = sorted(sizes)
    report.object_requests += 1 + len(listing) // 1000
    pattern = segment.segment_key_pattern(namespace)
    bases: dict[tuple[str, int], dict[int, int]] = {}
    for k in listing:
        m = pattern.fullmatch(k)
        if m:
            bases.setdefault((m.group(1), int(m.group(2))), {})[int(m.group(3))] = sizes[k]

    write_ahead_objects, held = await _write_ahead_pieces(store, namespace, listing, report)
    markers = await _read_markers(store, namespace, listing, report)
    # Pieces in write-ahead objects show a topic only under its live marker naming their
    # topic id: a deleted topic's pieces stay in the objects (until the write-ahead cleanup
    # deletes them) after its marker went, and must not bring it back. A live topic's
    # pieces always have one: a create writes the marker before it is answered, and brokers
    # write the missing ones at start, before they serve.
    shown = {
        tp: {} for tp, found in held.items()
        if (m := markers.get(tp[0])) is not None and not m.deleted and any(tid == m.topic_id for tid, _pc in found)
    }
    topics = _topics(loaded, {**shown, **bases}, markers, report)
    pieces: dict[tuple[str, int], list[HeldPiece]] = {}
    for (t, p), found in held.items():
        meta = topics.get(t)
        if meta is None:
            continue
        if t in report.topics_discovered:
            meta.topic_id = found[-1][0]  # known from the objects alone: the newest piece's id
        pieces[(t, p)] = [piece for topic_id, piece in found if topic_id == meta.topic_id]  # not an older topic of that name

    txn_docs = {doc["producer_id"]: doc for doc in loaded.transactions.values()}

    def commit_decided(pid: int, epoch: int) -> bool:
        # Only PrepareCommit is a decision about the transaction open now: CompleteCommit (or
        # any other state) at this epoch is an earlier transaction, and one open in the
        # bucket began after the snapshot. Transactions v2 bump the epoch at the end, so the
        # prepared state may carry the epoch after the batches'.
        doc = txn_docs.get(pid)
        return doc is not None and doc.get("state") == "PrepareCommit" and doc.get("producer_epoch") in (epoch, epoch + 1)

    sem = asyncio.Semaphore(PARTITIONS_AT_ONCE)

    async def one(t: str, p: int) -> PartitionOutcome:
        async with sem:
            return await reconcile_partition(
                store, namespace, t, p, loaded.partitions.get((t, p)), bases.get((t, p), {}), commit_decided, fence_epochs,
                pieces.get((t, p), []), write_ahead_objects,
            )

    # A topic deleted and created again since the snapshot: the snapshot's partitions
    # describe the old topic, whose objects are gone.
    for t, meta in topics.items():
        old = loaded.topics.get(t)
        if old is not None and old.topic_id != meta.topic_id:
            for p in range(old.partitions):
                loaded.partitions.pop((t, p), None)
    work = [(m.name, p) for m in topics.values() for p in range(m.partitions)]
    outcomes = await asyncio.gather(*(one(t, p) for t, p in work))
    producer_epochs: dict[int, int] = {}
    for o in outcomes:
        report.partitions += 1
        report.segments_kept += o.kept
        report.segments_replaced += o.replaced
        report.segments_dropped += o.dropped
        report.segments_adopted += o.adopted
        report.quarantined += o.quarantined
        report.problems += o.problems
        report.object_requests += o.requests
        for _pid, _epoch, commit in o.markers:
            if commit:
                report.transactions_committed += 1
            else:
                report.transactions_aborted += 1
        for pid, epoch in o.producer_epochs.items():
            producer_epochs[pid] = max(producer_epochs.get(pid, -1), epoch)

    # Committed offsets newer than the snapshot, from __consumer_offsets.
    offsets = dict(loaded.offsets)
    report.offsets_from_snapshot = len(offsets)
    offsets_parts = [o.state for o in outcomes if o.state.topic == OFFSETS_TOPIC]
    since = snap.info.created_ms - OFFSETS_LOOKBACK_MS if snap is not None else None
    latest, reads = await _latest_offset_records(store, namespace, offsets_parts, since)
    report.object_requests += reads
    for k, (value, when) in latest.items():
        current = offsets.get(k)
        if value is None:
            if current is not None and when >= current.commit_ms:
                del offsets[k]
                report.offsets_deleted += 1
        elif current is None or value.commit_ms > current.commit_ms or (value.commit_ms == current.commit_ms and value != current):
            offsets[k] = value
            report.offsets_recovered += 1

    # Producer ids and epochs: never hand one out twice.
    next_pid = max([loaded.producer_ids, *(pid + 1 for pid in producer_epochs)]) + PRODUCER_ID_MARGIN
    for doc in loaded.transactions.values():
        seen = producer_epochs.get(doc.get("producer_id", -1))
        if seen is not None and seen > doc.get("producer_epoch", -1):
            doc["producer_epoch"] = seen

    puts: list[tuple[str, bytes]] = list(loaded.other)
    for o in outcomes:
        st = o.state
        puts.append((keys.partition(st.topic, st.partition), codec.encode(MetadataStore.state_doc(st))))
        puts += [(keys.segment(st.topic, st.partition, s.base_offset), codec.encode_segment(s)) for s in st.segments]
    puts += [(keys.offset(g, t, p), codec.encode(asdict(o))) for (g, t, p), o in offsets.items()]
    puts += [(keys.transaction(tid), codec.encode(doc)) for tid, doc in loaded.transactions.items()]
    puts.append((keys.PRODUCER_IDS, str(next_pid).encode()))
    # Topics last: a store without topic keys is an empty store to a starting broker.
    puts += [(keys.topic(m.name), codec.encode(asdict(m))) for m in topics.values()]
    return puts


async def _write_ahead_pieces(store: ObjectStore, namespace: str, listing: list[str], report: RestoreReport):
    """(the write-ahead objects listed, {(topic, partition): [(topic id, piece)] in object
    order}) from each object's index (storage/write_ahead.py; unreadable ones reported)."""
    keys = [k for k in listing if k.startswith(write_ahead.wal_prefix(namespace)) and write_ahead.created_ms_of_key(k) is not None]
    sem = asyncio.Semaphore(PARTITIONS_AT_ONCE)

    async def index(key: str):
        async with sem:
            try:
                return await write_ahead.read_index(store, key)
            except (ObjectNotFound, write_ahead.WriteAheadFormatError) as e:
                report.problems.append(f"write-ahead object {key}: unreadable index ({e}); its pieces are not restored")
                return []

    held: dict[tuple[str, int], list[tuple[str, HeldPiece]]] = {}
    for key, found in zip(keys, await asyncio.gather(*(index(k) for k in keys))):
        report.object_requests += 1
        for pc in found:
            held.setdefault((pc.topic, pc.partition), []).append((pc.topic_id, HeldPiece(key, pc.position, pc.length, pc.base_offset, pc.last_offset)))
    return set(keys), held


async def _read_markers(store: ObjectStore, namespace: str, listing: list[str], report: RestoreReport) -> dict[str, TopicMarker]:
    """The topic markers in the listing, by topic name (unreadable ones reported)."""
    names = [k[len(namespace) + 1 : -len(MARKER_NAME) - 1] for k in listing if k.count("/") == namespace.count("/") + 2 and is_marker_key(k)]
    found = await store.get_many([(marker_key(namespace, n), None) for n in names])
    report.object_requests += len(names)
    out = {}
    for name, data in zip(names, found):
        if data is None:
            continue
        try:
            out[name] = TopicMarker.decode(data)
        except MarkerFormatError as e:
            report.problems.append(f"topic {name}: unreadable marker {marker_key(namespace, name)} ({e}); treated as absent")
    return out


def _topics(loaded: _Loaded, bases: dict[tuple[str, int], dict[int, int]], markers: dict[str, TopicMarker], report: RestoreReport) -> dict[str, TopicMeta]:
    """The topics to restore. A topic's marker (storage/topic_marker.py) is its newest
    description: its id, partition count and configs win over the snapshot's; a marker
    saying deleted keeps the topic deleted. Without a marker: the snapshot's topic (unless
    the bucket holds nothing of it: deleted since, its marker removed last), or, for a
    topic only the keys show, its partition count from the keys and default configs."""
    counts: dict[str, int] = {}
    for t, p in bases:
        counts[t] = max(counts.get(t, 0), p + 1)
    topics: dict[str, TopicMeta] = {}
    for name in sorted(set(loaded.topics) | set(counts) | set(markers)):
        snap_meta, marker, n = loaded.topics.get(name), markers.get(name), counts.get(name, 0)
        if marker is not None and marker.deleted:
            report.topics_deleted.append(name)
            continue
        if marker is not None:
            meta = TopicMeta(name=name, partitions=marker.partitions, topic_id=marker.topic_id, configs=dict(marker.configs), created_ms=marker.created_ms)
            if snap_meta is not None and snap_meta.topic_id == marker.topic_id:
                report.topics_from_snapshot += 1
            else:
                report.topics_from_markers.append(name)
        elif snap_meta is not None:
            if not n and name != OFFSETS_TOPIC and markers:
                report.topics_deleted.append(name)  # markers exist, this one is gone: deleted
                continue
            meta = snap_meta
            report.topics_from_snapshot += 1
        else:
            configs = offsets_topic_configs() if name == OFFSETS_TOPIC else {}
            meta = TopicMeta(name=name, partitions=n, topic_id=str(uuid.uuid4()), configs=configs)
            report.topics_discovered.append(name)
        if n > meta.partitions:
            meta.partitions = n
            report.topics_grown.append(name)
        topics[name] = meta
    report.topics = len(topics)
    return topics


async def _latest_offset_records(store: ObjectStore, namespace: str, parts: list[PartitionState], since_ms: int | None):
    """{(group, topic, partition): (CommittedOffset or None for a tombstone, time)} from the
    segments of `__consumer_offsets` with records from `since_ms` on (all: None); records
    of transactions not committed in the log are left out. Returns (that, object reads)."""
    latest: dict[tuple[str, str, int], tuple[CommittedOffset | None, int]] = {}
    reads = 0
    for st in parts:
        pending: dict[int, list] = {}  # producer id -> its open transaction's records
        for seg in st.segments:
            if since_ms is not None and seg.max_timestamp < since_ms:
                continue
            key, start, end = segment.stored_at(namespace, st.topic, st.partition, seg)  # its own object or a write-ahead object's range
            try:
                decoded = segment.decode(await store.get(key, start, end), name=key)
            except (ObjectNotFound, segment.SegmentFormatError) as e:
                log.warning("restore: cannot read %s for committed offsets: %s", key, e)
                continue
            finally:
                reads += 1
            body = decoded.batches
            for pos, h in records.iter_batches(body):
                if h.is_control:
                    kind, _ = records.read_control(body, pos, h)
                    done = pending.pop(h.producer_id, [])
                    if kind == records.CONTROL_COMMIT:
                        for k, v in done:
                            latest[k] = v
                    continue
                found = []
                try:
                    for rec in records.decode_records(body, pos, h):
                        if rec.key is None:
                            continue
                        gtp = offsets_topic.read_offset_commit_key(rec.key)
                        if gtp is None:
                            continue
                        value = offsets_topic.read_offset_commit_value(rec.value) if rec.value is not None else None
                        found.append((gtp, (value, value.commit_ms if value is not None else h.max_timestamp)))
                except (ValueError, struct.error, records.InvalidRecordError) as e:
                    log.warning("restore: skipping an unreadable batch of %s at offset %d: %s", key, h.base_offset, e)
                    continue
                if h.is_transactional:
                    pending.setdefault(h.producer_id, []).extend(found)
                else:
                    for k, v in found:
                        latest[k] = v
    return latest, reads
