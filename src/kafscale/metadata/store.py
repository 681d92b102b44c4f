"""MetadataStore: topics, configs, partition state, segment lists, groups and offsets.

Typed records over the transactional KV (`kv.py`). Key layout (relative to the backend's
prefix, `/kafscale` on etcd; every key is built in `keys.py`, which escapes each name so
that no name's keys can be covered by another's, e.g. group `orders` vs `orders/eu`):

    /topics/{topic}                           TopicMeta (JSON)
    /partitions/{topic}/{p}                   PartitionState (JSON): log start, high watermark, epoch, owner
    /segments/{topic}/{p}/{base:020d}         SegmentInfo (JSON)
    /consumer-groups/{group}                  group state (JSON, owned by the coordinator)
    /committed-offsets/{group}/{topic}/{p}    CommittedOffset (JSON)
    /producer-ids                             next free producer id block
    /brokers/{id}                             live broker registration (etcd lease)
    /owners/{topic}/{p}                       current owner and leader epoch (owner's lease)
    /transactions/{transactional id}          transaction state (JSON, owned by its coordinator)
    /pending-offsets/{group}/{producer id}/{topic}/{p}
                                              CommittedOffset of a TxnOffsetCommit, until its transaction ends
    /share-states/{group}/{topic}/{p}         a share partition's durable state (JSON, share/partition.py
                                              `SharePartition.to_doc`): start offset, and the delivery counts
                                              and acknowledged/archived records in flight; written by the
                                              partition's owner with a compare on the version it read
    /group-configs/{group}                    the group's config overrides (JSON name -> value)

Older stores kept groups under /groups/{raw id} and /offsets/{raw id}/{topic}/{p};
`migrate_legacy_keys` (run at broker start) moves them.

Every change is one KV transaction. Changes that read state and write it back (topic
create/delete/configs/partitions, segment commits and partition state, producer-id blocks,
ownership in cluster/etcd_cluster.py) are guarded by compare conditions on the versions
they read. Group and offset writes (put_group, delete_group, commit_offsets,
delete_offsets) have no compare: each writes whole values without reading them first
(last writer wins per key, as Kafka's offset commits do), and a group's keys are written
only by its coordinator, in order (groups/group_writer.py: one write of a group's offsets and
document at a time; removals wait for it). They are not fenced: while a group's
coordinator moves between brokers, both may write its keys for a moment and the later
write wins. Transaction records are written with a compare on the
version their coordinator read (`put_transaction`), so a coordinator holding a stale copy
(the transactional id moved to another broker meanwhile) fails instead of overwriting; a
commit moves the transaction's pending offsets to the committed ones in the same
transaction that records CompleteCommit (`complete_transaction`). On etcd such a write larger than --max-txn-ops is
applied in chunks (etcd.py), each key still atomically.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field

from kafscale.metadata import keys
from kafscale.metadata.codec import decode_segment, encode, encode_segment
from kafscale.metadata.kv import KV, KeyValue, Txn
from kafscale.metadata.segments import SegmentInfo

log = logging.getLogger("kafscale.metadata")

# Partitions per transaction of commit_segments: each is one compare and two puts, and
# etcd's --max-txn-ops (128 by default) bounds a transaction's compares and its operations
# apart, so a transaction stays within it however many partitions a write-ahead flush commits.
COMMIT_CHUNK = 64
COMMIT_ATTEMPTS = 3
_WAO_KEY_FIELD = b'"wao_key":"'  # as codec.encode_segment writes it
# encode(state_doc(st)) formatted directly: log start, high watermark, epoch, owner, epoch start.
_STATE_VALUE = b'{"log_start_offset":%d,"high_watermark":%d,"leader_epoch":%d,"owner":%d,"epoch_start_offset":%d}'


@functools.lru_cache(maxsize=1 << 16)
def _partition_keys(topic: str, partition: int) -> tuple[str, str]:
    """(keys.partition, keys.segments_prefix) of a partition, for its commits: escaping the
    topic name twice a flush was a few percent of the flush's event-loop time (#33)."""
    return keys.partition(topic, partition), keys.segments_prefix(topic, partition)


class ConflictError(RuntimeError):
    """A compare condition failed: someone else changed the state first."""


class TopicExistsError(RuntimeError):
    pass


class UnknownTopicError(KeyError):
    pass


@dataclass(slots=True)
class TopicMeta:
    name: str
    partitions: int
    topic_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    configs: dict[str, str] = field(default_factory=dict)
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self.topic_id)


@dataclass(slots=True)
class PartitionState:
    topic: str
    partition: int
    log_start_offset: int = 0
    high_watermark: int = 0
    leader_epoch: int = 0
    owner: int = -1
    epoch_start_offset: int = 0  # first offset written under leader_epoch
    segments: list[SegmentInfo] = field(default_factory=list)
    version: int = 0  # KV version of the /partitions key, for compare-and-set


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    commit_ms: int = 0


def _later_commit(old_value: bytes, new_value: bytes) -> bool:
    """Whether the old-layout offset was committed after the one already migrated."""
    try:
        return json.loads(old_value).get("commit_ms", 0) > json.loads(new_value).get("commit_ms", 0)
    except (ValueError, AttributeError):
        return False


class MetadataStore:
    def __init__(self, kv: KV):
        self.kv = kv

    async def close(self) -> None:
        await self.kv.close()

    async def check(self) -> None:
        await self.kv.check()

    # -- topics ---------------------------------------------------------------------

    async def create_topic(self, meta: TopicMeta) -> TopicMeta:
        # Partition keys are written on their first commit (an absent key is an empty
        # partition), so creating a topic of any size is a one-key transaction; any partition
        # keys staged for a restore of the name that never published go with it.
        key = keys.topic(meta.name)
        txn = Txn(
            compares=[(key, 0)], puts=[(key, encode(asdict(meta)))],
            delete_prefixes=[keys.topic_partitions_prefix(meta.name), keys.topic_segments_prefix(meta.name)],
        )
        if not await self.kv.commit(txn):
            raise TopicExistsError(meta.name)
        return meta

    async def stage_partitions(self, topic: str, states: list[PartitionState]) -> None:
        """Partition states and segment lists of a topic not created yet (storage/
        topic_restore.py), replacing whatever an earlier attempt staged. Brokers see nothing
        of them until publish_topic writes the topic's key; unguarded, as nobody else writes
        a topic that does not exist (a create of the name in between wipes them, and the
        publish then fails)."""
        await self.kv.commit(Txn(delete_prefixes=[keys.topic_partitions_prefix(topic), keys.topic_segments_prefix(topic)]))
        for st in states:
            txn = Txn(puts=[(keys.partition(topic, st.partition), encode(self.state_doc(st)))])
            txn.puts += [(keys.segment(topic, st.partition, seg.base_offset), encode_segment(seg)) for seg in st.segments]
            await self.kv.commit(txn)

    async def publish_topic(self, meta: TopicMeta) -> TopicMeta:
        """Create the topic over the partitions staged for it: one guarded key, so every
        broker sees the whole topic or none of it. TopicExistsError if the name is taken."""
        key = keys.topic(meta.name)
        if not await self.kv.commit(Txn(compares=[(key, 0)], puts=[(key, encode(asdict(meta)))])):
            raise TopicExistsError(meta.name)
        return meta

    async def get_topic(self, name: str) -> TopicMeta | None:
        kv = await self.kv.get(keys.topic(name))
        return TopicMeta(**json.loads(kv.value)) if kv else None

    async def list_topics(self) -> list[TopicMeta]:
        return [TopicMeta(**json.loads(kv.value)) for kv in await self.kv.range(keys.TOPICS)]

    async def delete_topic(self, name: str, topic_id: str | None = None) -> TopicMeta:
        """Delete the topic (UnknownTopicError if absent, or if it is not `topic_id`: the
        name was created again meanwhile)."""
        kv = await self.kv.get(keys.topic(name))
        if kv is None or (topic_id is not None and json.loads(kv.value).get("topic_id") != topic_id):
            raise UnknownTopicError(name)
        txn = Txn(
            compares=[(kv.key, kv.version)],
            deletes=[kv.key],
            delete_prefixes=[keys.topic_partitions_prefix(name), keys.topic_segments_prefix(name)],
        )
        if not await self.kv.commit(txn):
            raise ConflictError(f"topic {name} changed concurrently")
        return TopicMeta(**json.loads(kv.value))

    async def _update_topic(self, name: str, change) -> TopicMeta:
        for _ in range(10):
            kv = await self.kv.get(keys.topic(name))
            if kv is None:
                raise UnknownTopicError(name)
            meta = TopicMeta(**json.loads(kv.value))
            change(meta)
            txn = Txn(compares=[(kv.key, kv.version)], puts=[(kv.key, encode(asdict(meta)))])
            if await self.kv.commit(txn):
                return meta
        raise ConflictError(f"topic {name} changed concurrently")

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicMeta:
        """Replace the topic's configs (AlterConfigs semantics)."""

        def change(meta: TopicMeta):
            meta.configs = dict(configs)

        return await self._update_topic(name, change)

    async def add_partitions(self, name: str, count: int) -> TopicMeta:
        def change(meta: TopicMeta):
            meta.partitions = count

        return await self._update_topic(name, change)

    # -- partitions and segments -------------------------------------------------------

    @staticmethod
    def state_doc(st: PartitionState) -> dict:
        return {
            "log_start_offset": st.log_start_offset,
            "high_watermark": st.high_watermark,
            "leader_epoch": st.leader_epoch,
            "owner": st.owner,
            "epoch_start_offset": st.epoch_start_offset,
        }

    @staticmethod
    def state_value(st: PartitionState) -> bytes:
        """encode(state_doc(st)), the same bytes formatted directly (a write-ahead flush
        writes one a partition)."""
        return _STATE_VALUE % (st.log_start_offset, st.high_watermark, st.leader_epoch, st.owner, st.epoch_start_offset)

    async def get_partition(self, topic: str, partition: int, with_segments: bool = True) -> PartitionState | None:
        """The partition's state, or None if the topic or partition does not exist."""
        kv = await self.kv.get(keys.partition(topic, partition))
        if kv is None:
            meta = await self.get_topic(topic)
            if meta is None or not 0 <= partition < meta.partitions:
                return None
            return PartitionState(topic, partition)  # never written: empty, version 0
        doc = json.loads(kv.value)
        st = PartitionState(topic, partition, version=kv.version, **doc)
        if with_segments:
            st.segments = [decode_segment(s.value) for s in await self.kv.range(keys.segments_prefix(topic, partition))]
        return st

    async def commit_segment(self, st: PartitionState, seg: SegmentInfo, before=None) -> PartitionState:
        """Append a flushed segment and advance the high watermark, if nobody else has.

        `st` is the caller's last known state; its version guards the write (fencing).
        `before`: a blocking call that writes the segment's objects, run by the backend just
        ahead of the commit (kv.KV.commit_after); when it raises, nothing is committed and
        this raises kv.BeforeCommitFailed.
        """
        result = (await self.commit_segments([(st, seg)], before))[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def commit_segments(self, commits: list[tuple[PartitionState, SegmentInfo]], before=None) -> list[PartitionState | Exception]:
        """`commit_segment` for many partitions at once (a write-ahead flush): for each
        (state, segment) the new state, or the error that kept it out (ConflictError when
        its partition changed meanwhile: fenced, ownership moved; any other when the store
        failed and its outcome is unknown). Each partition's commit is guarded by its own
        compare, as commit_segment's; COMMIT_CHUNK partitions share a transaction, and when
        one of them fails its compare the others are committed without it, so one moved
        partition fails only its own flush. The transactions run at once (each partition is
        in one only): a flush's commit takes about one round trip however many partitions."""
        results: list[PartitionState | Exception | None] = [None] * len(commits)
        if len(commits) <= COMMIT_CHUNK:
            # One transaction (every per-partition flush): awaited here, not in a task of its
            # own for gather (a task, a gather future and their callbacks a flush, #33).
            await self._commit_chunk_or_fail(commits, range(len(commits)), results, before)
        else:
            await asyncio.gather(*(
                self._commit_chunk_or_fail(commits, range(i, min(i + COMMIT_CHUNK, len(commits))), results)
                for i in range(0, len(commits), COMMIT_CHUNK)
            ))
        return results  # type: ignore[return-value]

    async def _commit_chunk_or_fail(self, commits, chunk: range, results: list, before=None) -> None:
        try:
            await self._commit_chunk(commits, chunk, results, before)
        except Exception as e:  # noqa: BLE001 - the store failed: these partitions' outcomes are unknown
            for i in chunk:
                if results[i] is None:
                    results[i] = e

    async def _commit_chunk(self, commits, chunk, results: list, before=None) -> None:
        for _ in range(COMMIT_ATTEMPTS):
            txn = Txn()
            compares, puts = txn.compares, txn.puts
            live = []
            for i in chunk:
                st, seg = commits[i]
                if seg.base_offset != st.high_watermark:
                    results[i] = ConflictError(f"segment base {seg.base_offset} != high watermark {st.high_watermark}")
                    continue
                key, segments_prefix = _partition_keys(st.topic, st.partition)
                compares.append((key, st.version))
                puts.append((key, _STATE_VALUE % (st.log_start_offset, seg.last_offset + 1, st.leader_epoch, st.owner, st.epoch_start_offset)))
                puts.append((f"{segments_prefix}{seg.base_offset:020d}", encode_segment(seg)))  # keys.segment
                live.append(i)
            if not live:
                return
            if before is not None:  # on the first attempt only: the objects are written once
                committed = await self.kv.commit_after(before, txn)
                before = None
            else:
                committed = await self.kv.commit(txn)
            if committed:
                for i in live:
                    st, seg = commits[i]
                    results[i] = PartitionState(
                        st.topic, st.partition, st.log_start_offset, seg.last_offset + 1, st.leader_epoch, st.owner,
                        st.epoch_start_offset, st.segments + [seg], st.version + 1,
                    )
                return
            # Some partition changed under us: those fail, the others go again.
            chunk = []
            for i in live:
                st = commits[i][0]
                kv = await self.kv.get(keys.partition(st.topic, st.partition))
                if (kv.version if kv else 0) != st.version:
                    results[i] = ConflictError(f"partition {st.topic}-{st.partition} changed concurrently")
                else:
                    chunk.append(i)
        for i in chunk:
            results[i] = ConflictError(f"partition {commits[i][0].topic}-{commits[i][0].partition} kept changing")

    async def write_ahead_keys_in_use(self) -> set[str]:
        """The keys of the write-ahead objects any partition's segment list refers to
        (SegmentInfo.wao_key): one consistent read of every segment key (the cleanup's
        fallback for an object whose index it cannot read; write_ahead_pieces_held else)."""
        used = set()
        for kv in await self.kv.range(keys.SEGMENTS):
            value = kv.value
            at = value.find(b'"wao_key"')
            if at < 0:
                continue
            # Cut out of the compact JSON codec.encode_segment writes (a metadata restore
            # writes the same): parsing every document was most of a broker's cleanup at
            # 1,024 partitions. Any other spelling, or a key the JSON escapes, is parsed.
            start = at + len(_WAO_KEY_FIELD)
            end = value.find(b'"', start)
            key = value[start:end]
            if value.startswith(_WAO_KEY_FIELD, at) and end > 0 and b"\\" not in key:
                used.add(key.decode())
            else:
                used.add(json.loads(value)["wao_key"])
        return used

    async def write_ahead_pieces_held(self, pieces: list[tuple[str, str, int, int]]) -> list[bool]:
        """For each (write-ahead object key, topic, partition, base offset) of a piece:
        whether the partition's segment list still holds it, i.e. its segment at that base
        offset lives in that object. A segment held in a write-ahead object sits at its
        piece's base offset (the flusher commits each piece as a segment of its own, a
        restore adopts it there; a rewrite makes a segment of its own). The keys are read
        in batches (KV.get_many), not as one consistent read: a piece no longer held once
        its object's commits are over is never held again, so each answer stays true."""
        found = await self.kv.get_many([keys.segment(t, p, base) for _key, t, p, base in pieces])
        return [kv is not None and b'"wao_key"' in kv.value and decode_segment(kv.value).wao_key == key for kv, (key, *_) in zip(found, pieces)]

    async def get_topics(self, names: list[str]) -> dict[str, TopicMeta]:
        """The topics of these names that exist, by name (one batched read)."""
        found = await self.kv.get_many([keys.topic(n) for n in names])
        return {n: TopicMeta(**json.loads(kv.value)) for n, kv in zip(names, found) if kv}

    async def update_partition(
        self,
        st: PartitionState,
        *,
        log_start_offset: int | None = None,
        leader_epoch: int | None = None,
        owner: int | None = None,
        remove_segments: list[int] = (),
        add_segments: list[SegmentInfo] = (),
    ) -> PartitionState:
        """Change the partition's state and segment list in one guarded transaction.

        Used by retention and DeleteRecords (log start), the merger (swap segments) and
        ownership changes (epoch, owner).
        """
        new = PartitionState(
            st.topic,
            st.partition,
            st.log_start_offset if log_start_offset is None else log_start_offset,
            st.high_watermark,
            st.leader_epoch if leader_epoch is None else leader_epoch,
            st.owner if owner is None else owner,
            st.epoch_start_offset if leader_epoch is None or leader_epoch == st.leader_epoch else st.high_watermark,
        )
        key = keys.partition(st.topic, st.partition)
        txn = Txn(compares=[(key, st.version)], puts=[(key, encode(self.state_doc(new)))])
        removed = set(remove_segments)
        txn.deletes = [keys.segment(st.topic, st.partition, b) for b in removed]
        txn.puts += [(keys.segment(st.topic, st.partition, s.base_offset), encode_segment(s)) for s in add_segments]
        if not await self.kv.commit(txn):
            raise ConflictError(f"partition {st.topic}-{st.partition} changed concurrently")
        new.version = st.version + 1
        new.segments = sorted(
            [s for s in st.segments if s.base_offset not in removed] + list(add_segments),
            key=lambda s: s.base_offset,
        )
        return new

    # -- consumer groups and offsets --------------------------------------------------

    async def get_group(self, group_id: str) -> dict | None:
        kv = await self.kv.get(keys.group(group_id))
        return json.loads(kv.value) if kv else None

    async def put_group(self, group_id: str, doc: dict) -> None:
        await self.write_group(group_id, doc, {})

    async def write_group(self, group_id: str, doc: dict | None, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        """A group's document (None: not this time) and committed offsets in one transaction."""
        puts = [(keys.offset(group_id, t, p), encode(asdict(o))) for (t, p), o in offsets.items()]
        if doc is not None:
            puts.append((keys.group(group_id), encode(doc)))
        await self.kv.commit(Txn(puts=puts))

    async def list_groups(self) -> dict[str, dict]:
        return await self._documents(keys.GROUPS, keys.group_id_of)

    async def _documents(self, prefix: str, name_of) -> dict:
        """The JSON documents under `prefix` by `name_of(key)`; keys this layout cannot have
        written are logged and passed over."""
        out = {}
        for kv in await self.kv.range(prefix):
            try:
                out[name_of(kv.key)] = json.loads(kv.value)
            except keys.MalformedKey as e:
                log.warning("ignoring a key this layout cannot have written: %s", e)
        return out

    async def delete_group(self, group_id: str) -> None:
        """The group, its offsets and its transactions' pending offsets (Kafka drops those
        with the group: an open transaction's commit then restores nothing of it)."""
        await self.kv.commit(Txn(
            deletes=[keys.group(group_id)],
            delete_prefixes=[keys.group_offsets_prefix(group_id), keys.group_pending_offsets_prefix(group_id)],
        ))

    # -- share groups -------------------------------------------------------------------

    async def get_share_state(self, group_id: str, topic: str, partition: int) -> tuple[dict | None, int]:
        """A share partition's state document and its version (0: none yet)."""
        kv = await self.kv.get(keys.share_state(group_id, topic, partition))
        return (json.loads(kv.value), kv.version) if kv else (None, 0)

    async def put_share_state(self, group_id: str, topic: str, partition: int, doc: dict, version: int) -> int:
        """Write a share partition's state over the version read (ConflictError if another
        owner wrote since); returns the new version."""
        key = keys.share_state(group_id, topic, partition)
        if not await self.kv.commit(Txn(compares=[(key, version)], puts=[(key, encode(doc))])):
            raise ConflictError(f"share state of {group_id} {topic}-{partition} changed concurrently")
        return version + 1

    async def list_share_states(self, group_id: str) -> dict[tuple[str, int], dict]:
        out = {}
        for kv in await self.kv.range(keys.share_states_prefix(group_id)):
            _g, topic, p = keys.share_state_of(kv.key)
            out[(topic, p)] = json.loads(kv.value)
        return out

    async def delete_share_states(self, group_id: str, partitions: list[tuple[str, int]] | None = None) -> None:
        """A share group's partition states: all of them, or those of `partitions`."""
        if partitions is None:
            await self.kv.commit(Txn(delete_prefixes=[keys.share_states_prefix(group_id)]))
        else:
            await self.kv.commit(Txn(deletes=[keys.share_state(group_id, t, p) for t, p in partitions]))

    async def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        await self.write_group(group_id, None, offsets)

    async def fetch_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        out = {}
        for kv in await self.kv.range(keys.group_offsets_prefix(group_id)):
            try:
                out[keys.offset_partition_of(kv.key)] = CommittedOffset(**json.loads(kv.value))
            except keys.MalformedKey as e:
                log.warning("ignoring a key this layout cannot have written: %s", e)
        return out

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        """The committed offsets of `partitions`, and any transaction's pending offsets of
        them (Kafka's OffsetDelete removes both)."""
        doomed = set(partitions)
        deletes = [keys.offset(group_id, t, p) for t, p in partitions]
        for kv in await self.kv.range(keys.group_pending_offsets_prefix(group_id)):
            try:
                _pid, topic, partition = keys.pending_offset_of(kv.key)
            except keys.MalformedKey:
                continue
            if (topic, partition) in doomed:
                deletes.append(kv.key)
        await self.kv.commit(Txn(deletes=deletes))

    # -- the layout before names were escaped ---------------------------------------------

    async def migrate_legacy_keys(self) -> int:
        """Move group and offset keys of the old layout (raw group ids under /groups/ and
        /offsets/) to their escaped keys; returns how many old keys this call removed.

        One guarded transaction per old key (old key unchanged, new key as read), so it is
        idempotent and brokers starting together cannot lose or double-apply a move. Where
        both layouts hold a value, the new layout's group doc wins and, for offsets, the
        later commit does (a not-yet-upgraded broker may still have written the old key).
        """
        moved = 0
        for old in await self.kv.range(keys.LEGACY_GROUPS):
            try:
                new_key = keys.group(keys.legacy_group_id_of(old.key))
            except keys.MalformedKey as e:
                log.warning("not migrating %s: %s", old.key, e)
                continue
            moved += await self._move_legacy(old, new_key, newer=lambda old_value, new_value: False)
        for old in await self.kv.range(keys.LEGACY_OFFSETS):
            try:
                group_id, topic, partition = keys.legacy_offset_of(old.key)
            except keys.MalformedKey as e:
                log.warning("not migrating %s: %s", old.key, e)
                continue
            moved += await self._move_legacy(old, keys.offset(group_id, topic, partition), newer=_later_commit)
        if moved:
            log.info("moved %d group and offset keys to the escaped key layout", moved)
        return moved

    async def _move_legacy(self, old: KeyValue, new_key: str, newer) -> int:
        """Move one old key to new_key; `newer(old_value, new_value)` says whether the old
        value replaces one already under new_key."""
        for _ in range(20):
            current = await self.kv.get(new_key)
            if current is None or newer(old.value, current.value):
                txn = Txn(
                    compares=[(old.key, old.version), (new_key, current.version if current else 0)],
                    puts=[(new_key, old.value)],
                    deletes=[old.key],
                )
            else:
                txn = Txn(compares=[(old.key, old.version), (new_key, current.version)], deletes=[old.key])
            if await self.kv.commit(txn):
                return 1
            # Someone changed either key meanwhile (another broker migrating, or writing).
            old = await self.kv.get(old.key)
            if old is None:
                return 0
        raise ConflictError(f"could not migrate {old.key}: it keeps changing")

    # -- group configs (GROUP config resources, metadata/group_config.py) --------------------

    async def get_group_config(self, group_id: str) -> dict[str, str]:
        """The group's config overrides ({} when it has none)."""
        kv = await self.kv.get(keys.group_config(group_id))
        return json.loads(kv.value) if kv else {}

    async def alter_group_config(self, group_id: str, change) -> dict[str, str]:
        """Apply `change(old overrides) -> new overrides` in one guarded transaction (retried
        when another broker changed them meanwhile); no overrides left deletes the key.
        `change` may raise to refuse (nothing is written)."""
        key = keys.group_config(group_id)
        for _ in range(10):
            kv = await self.kv.get(key)
            new = change(json.loads(kv.value) if kv else {})
            version = kv.version if kv else 0
            txn = Txn(compares=[(key, version)], puts=[(key, encode(new))]) if new else Txn(compares=[(key, version)], deletes=[key])
            if await self.kv.commit(txn):
                return new
        raise ConflictError(f"group config {key} keeps changing")

    # -- client quotas -------------------------------------------------------------------

    async def list_client_quotas(self) -> list[tuple[tuple, dict[str, float]]]:
        """(entity, values) of every entity with a quota; entity as metadata.quotas.Entity."""
        out = []
        for kv in await self.kv.range(keys.CLIENT_QUOTAS):
            doc = json.loads(kv.value)
            out.append((tuple((k, n) for k, n in doc["entity"]), doc["values"]))
        return out

    async def alter_client_quota(self, entity: tuple, change) -> dict[str, float]:
        """Apply `change(old values) -> new values` to one entity in one guarded
        transaction (retried when another broker changed it meanwhile); no values left
        deletes the entity, as Kafka drops an entity with no quotas."""
        key = keys.client_quota(entity)
        for _ in range(10):
            kv = await self.kv.get(key)
            old = json.loads(kv.value)["values"] if kv else {}
            new = change(old)
            version = kv.version if kv else 0
            if new:
                txn = Txn(compares=[(key, version)], puts=[(key, encode({"entity": [list(p) for p in entity], "values": new}))])
            else:
                txn = Txn(compares=[(key, version)], deletes=[key])
            if await self.kv.commit(txn):
                return new
        raise ConflictError(f"client quota {key} keeps changing")

    # -- transactions ------------------------------------------------------------------

    # -- SCRAM credentials (documents of kafscale.security.scram.ScramCredential.to_doc) ----

    async def get_scram_credential(self, user: str, mechanism: str) -> dict | None:
        kv = await self.kv.get(keys.scram_credential(user, mechanism))
        return json.loads(kv.value) if kv else None

    async def list_scram_credentials(self) -> dict[tuple[str, str], dict]:
        return await self._documents(keys.SCRAM_CREDENTIALS, keys.scram_credential_of)

    async def change_scram_credentials(self, puts: dict[tuple[str, str], dict], deletes: list[tuple[str, str]]) -> None:
        """Upsert and delete credentials in one transaction."""
        await self.kv.commit(Txn(
            puts=[(keys.scram_credential(u, m), encode(doc)) for (u, m), doc in puts.items()],
            deletes=[keys.scram_credential(u, m) for u, m in deletes],
        ))

    # -- ACL bindings (documents of kafscale.security.acl.AclBinding.to_doc) ----------------

    @staticmethod
    def _acl_key(doc: dict) -> str:
        return keys.acl(doc["resource_type"], doc["name"], doc["pattern_type"], doc["principal"], doc["host"], doc["operation"], doc["permission"])

    async def list_acls(self) -> list[dict]:
        return [json.loads(kv.value) for kv in await self.kv.range(keys.ACLS)]

    async def change_acls(self, puts: list[dict], deletes: list[dict]) -> None:
        """Create and delete bindings in one transaction."""
        await self.kv.commit(Txn(puts=[(self._acl_key(d), encode(d)) for d in puts], deletes=[self._acl_key(d) for d in deletes]))

    async def get_transaction(self, transactional_id: str) -> tuple[dict, int] | None:
        """(state doc, version) of a transactional id, or None."""
        kv = await self.kv.get(keys.transaction(transactional_id))
        return (json.loads(kv.value), kv.version) if kv else None

    async def list_transactions(self) -> dict[str, tuple[dict, int]]:
        out = {}
        for kv in await self.kv.range(keys.TRANSACTIONS):
            try:
                out[keys.transactional_id_of(kv.key)] = (json.loads(kv.value), kv.version)
            except keys.MalformedKey as e:
                log.warning("ignoring a key this layout cannot have written: %s", e)
        return out

    async def put_transaction(self, transactional_id: str, doc: dict, version: int) -> int:
        """Write the state if the stored version is still `version` (0: absent); returns the
        new version. ConflictError when another coordinator wrote it meanwhile."""
        key = keys.transaction(transactional_id)
        if not await self.kv.commit(Txn(compares=[(key, version)], puts=[(key, encode(doc))])):
            raise ConflictError(f"transaction {transactional_id!r} changed concurrently")
        return version + 1

    async def delete_transaction(self, transactional_id: str, version: int) -> None:
        key = keys.transaction(transactional_id)
        if not await self.kv.commit(Txn(compares=[(key, version)], deletes=[key])):
            raise ConflictError(f"transaction {transactional_id!r} changed concurrently")

    async def complete_transaction(
        self, transactional_id: str, doc: dict, version: int, producer_id: int, groups, commit: bool, commit_ms: int
    ) -> int:
        """Record the end of a transaction and, in the same store transaction, move its
        pending offsets of `groups` to the committed offsets (commit) or drop them (abort)."""
        key = keys.transaction(transactional_id)
        txn = Txn(compares=[(key, version)], puts=[(key, encode(doc))])
        for group_id in sorted(groups):
            prefix = keys.producer_pending_offsets_prefix(group_id, producer_id)
            if commit:
                for kv in await self.kv.range(prefix):
                    try:
                        _pid, topic, partition = keys.pending_offset_of(kv.key)
                    except keys.MalformedKey as e:
                        log.warning("ignoring a key this layout cannot have written: %s", e)
                        continue
                    offset = json.loads(kv.value)
                    offset["commit_ms"] = commit_ms
                    txn.puts.append((keys.offset(group_id, topic, partition), encode(offset)))
            txn.delete_prefixes.append(prefix)
        if not await self.kv.commit(txn):
            raise ConflictError(f"transaction {transactional_id!r} changed concurrently")
        return version + 1

    async def put_pending_offsets(self, group_id: str, producer_id: int, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        txn = Txn(puts=[(keys.pending_offset(group_id, producer_id, t, p), encode(asdict(o))) for (t, p), o in offsets.items()])
        await self.kv.commit(txn)

    async def pending_offsets(self, group_id: str, producer_id: int) -> dict[tuple[str, int], CommittedOffset]:
        """The group's transactional offsets held for `producer_id`'s open transaction."""
        out = {}
        for kv in await self.kv.range(keys.producer_pending_offsets_prefix(group_id, producer_id)):
            try:
                _pid, topic, partition = keys.pending_offset_of(kv.key)
            except keys.MalformedKey as e:
                log.warning("ignoring a key this layout cannot have written: %s", e)
                continue
            out[(topic, partition)] = CommittedOffset(**json.loads(kv.value))
        return out

    async def pending_offset_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions of the group with a transactional offset not yet committed or aborted."""
        out = set()
        for kv in await self.kv.range(keys.group_pending_offsets_prefix(group_id)):
            try:
                _pid, topic, partition = keys.pending_offset_of(kv.key)
            except keys.MalformedKey as e:
                log.warning("ignoring a key this layout cannot have written: %s", e)
                continue
            out.add((topic, partition))
        return out

    # -- producer ids -------------------------------------------------------------------

    async def allocate_producer_ids(self, count: int = 1000) -> int:
        """Reserve a block of `count` producer ids unique across brokers; returns the first."""
        key = keys.PRODUCER_IDS
        for _ in range(50):
            kv = await self.kv.get(key)
            start = int(kv.value) if kv else 0
            if await self.kv.commit(Txn(compares=[(key, kv.version if kv else 0)], puts=[(key, str(start + count).encode())])):
                return start
        raise ConflictError("could not allocate producer ids")
