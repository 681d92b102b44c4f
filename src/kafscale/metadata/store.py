"""MetadataStore: topics, configs, partition state, segment lists, groups and offsets.

Typed records over the transactional KV (`kv.py`). Key layout (relative to the backend's
prefix, `/kafscale` on etcd):

    /topics/{topic}                      TopicMeta (JSON)
    /partitions/{topic}/{p}              PartitionState (JSON): log start, high watermark, epoch, owner
    /segments/{topic}/{p}/{base:020d}    SegmentInfo (JSON)
    /groups/{group}                      group state (JSON, owned by the coordinator)
    /offsets/{group}/{topic}/{p}         CommittedOffset (JSON)
    /producer-ids                        next free producer id block
    /brokers/{id}                        live broker registration (etcd lease)
    /owners/{topic}/{p}                  current owner and leader epoch (owner's lease)

Every change that touches several keys is one transaction guarded by compare conditions.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field

from kafscale.metadata.kv import KV, KeyValue, Txn
from kafscale.storage.segment import SegmentInfo


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


def _dump(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _segment_from(kv: KeyValue) -> SegmentInfo:
    return SegmentInfo(**json.loads(kv.value))


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
        # partition), so creating a topic of any size is a one-key transaction.
        txn = Txn(compares=[(f"/topics/{meta.name}", 0)], puts=[(f"/topics/{meta.name}", _dump(asdict(meta)))])
        if not await self.kv.commit(txn):
            raise TopicExistsError(meta.name)
        return meta

    async def get_topic(self, name: str) -> TopicMeta | None:
        kv = await self.kv.get(f"/topics/{name}")
        return TopicMeta(**json.loads(kv.value)) if kv else None

    async def list_topics(self) -> list[TopicMeta]:
        return [TopicMeta(**json.loads(kv.value)) for kv in await self.kv.range("/topics/")]

    async def delete_topic(self, name: str) -> TopicMeta:
        kv = await self.kv.get(f"/topics/{name}")
        if kv is None:
            raise UnknownTopicError(name)
        txn = Txn(
            compares=[(kv.key, kv.version)],
            deletes=[kv.key],
            delete_prefixes=[f"/partitions/{name}/", f"/segments/{name}/"],
        )
        if not await self.kv.commit(txn):
            raise ConflictError(f"topic {name} changed concurrently")
        return TopicMeta(**json.loads(kv.value))

    async def _update_topic(self, name: str, change) -> TopicMeta:
        for _ in range(10):
            kv = await self.kv.get(f"/topics/{name}")
            if kv is None:
                raise UnknownTopicError(name)
            meta = TopicMeta(**json.loads(kv.value))
            change(meta)
            txn = Txn(compares=[(kv.key, kv.version)], puts=[(kv.key, _dump(asdict(meta)))])
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
    def _state_doc(st: PartitionState) -> dict:
        return {
            "log_start_offset": st.log_start_offset,
            "high_watermark": st.high_watermark,
            "leader_epoch": st.leader_epoch,
            "owner": st.owner,
            "epoch_start_offset": st.epoch_start_offset,
        }

    async def get_partition(self, topic: str, partition: int, with_segments: bool = True) -> PartitionState | None:
        """The partition's state, or None if the topic or partition does not exist."""
        kv = await self.kv.get(f"/partitions/{topic}/{partition}")
        if kv is None:
            meta = await self.get_topic(topic)
            if meta is None or not 0 <= partition < meta.partitions:
                return None
            return PartitionState(topic, partition)  # never written: empty, version 0
        doc = json.loads(kv.value)
        st = PartitionState(topic, partition, version=kv.version, **doc)
        if with_segments:
            st.segments = [_segment_from(s) for s in await self.kv.range(f"/segments/{topic}/{partition}/")]
        return st

    async def commit_segment(self, st: PartitionState, seg: SegmentInfo) -> PartitionState:
        """Append a flushed segment and advance the high watermark, if nobody else has.

        `st` is the caller's last known state; its version guards the write (fencing).
        """
        if seg.base_offset != st.high_watermark:
            raise ConflictError(f"segment base {seg.base_offset} != high watermark {st.high_watermark}")
        new = PartitionState(st.topic, st.partition, st.log_start_offset, seg.last_offset + 1, st.leader_epoch, st.owner, st.epoch_start_offset)
        key = f"/partitions/{st.topic}/{st.partition}"
        txn = Txn(
            compares=[(key, st.version)],
            puts=[
                (key, _dump(self._state_doc(new))),
                (f"/segments/{st.topic}/{st.partition}/{seg.base_offset:020d}", _dump(asdict(seg))),
            ],
        )
        if not await self.kv.commit(txn):
            raise ConflictError(f"partition {st.topic}-{st.partition} changed concurrently")
        new.version = st.version + 1
        new.segments = st.segments + [seg]
        return new

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
        key = f"/partitions/{st.topic}/{st.partition}"
        seg_prefix = f"/segments/{st.topic}/{st.partition}/"
        txn = Txn(compares=[(key, st.version)], puts=[(key, _dump(self._state_doc(new)))])
        removed = set(remove_segments)
        txn.deletes = [f"{seg_prefix}{b:020d}" for b in removed]
        txn.puts += [(f"{seg_prefix}{s.base_offset:020d}", _dump(asdict(s))) for s in add_segments]
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
        kv = await self.kv.get(f"/groups/{group_id}")
        return json.loads(kv.value) if kv else None

    async def put_group(self, group_id: str, doc: dict) -> None:
        await self.kv.commit(Txn(puts=[(f"/groups/{group_id}", _dump(doc))]))

    async def list_groups(self) -> dict[str, dict]:
        return {kv.key[len("/groups/") :]: json.loads(kv.value) for kv in await self.kv.range("/groups/")}

    async def delete_group(self, group_id: str) -> None:
        await self.kv.commit(Txn(deletes=[f"/groups/{group_id}"], delete_prefixes=[f"/offsets/{group_id}/"]))

    async def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        txn = Txn(puts=[(f"/offsets/{group_id}/{t}/{p}", _dump(asdict(o))) for (t, p), o in offsets.items()])
        await self.kv.commit(txn)

    async def fetch_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        prefix = f"/offsets/{group_id}/"
        out = {}
        for kv in await self.kv.range(prefix):
            topic, p = kv.key[len(prefix) :].rsplit("/", 1)
            out[(topic, int(p))] = CommittedOffset(**json.loads(kv.value))
        return out

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        await self.kv.commit(Txn(deletes=[f"/offsets/{group_id}/{t}/{p}" for t, p in partitions]))

    # -- producer ids -------------------------------------------------------------------

    async def allocate_producer_ids(self, count: int = 1000) -> int:
        """Reserve a block of `count` producer ids unique across brokers; returns the first."""
        key = "/producer-ids"
        for _ in range(50):
            kv = await self.kv.get(key)
            start = int(kv.value) if kv else 0
            if await self.kv.commit(Txn(compares=[(key, kv.version if kv else 0)], puts=[(key, str(start + count).encode())])):
                return start
        raise ConflictError("could not allocate producer ids")
