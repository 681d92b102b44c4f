"""Point-in-time topic restore (`kafscale topics restore TOPIC --to-time T --as NEW`): a new
topic holding TOPIC's records up to a time or an offset, made inside the object store; the
source topic is only read.

Where each partition is cut (`end`: the first offset the new partition does not hold):
  --to-time T    the first offset whose record has a timestamp after T, as Kafka's
                 ListOffsets for T+1 finds it (so the new partition holds the longest
                 prefix of the log whose timestamps are all <= T: with non-monotonic
                 CreateTime timestamps a record stamped <= T after that point is not
                 taken). A LogAppendTime batch's records all have the batch's time. The
                 end-transaction markers count like records.
  --to-offset N  offset N (the partition's high watermark when it ends before).
Whole segments below the cut are copied inside the store (ObjectStore.copy: S3 CopyObject,
a file copy on the local store); the segment the cut falls into is rewritten with its
batches before the cut as they are and the batch the cut falls into cut exactly
(storage/cleaner.truncate_batch: the records kept byte for byte, at their offsets, with the
batch's timestamps and producer fields, recompressed with its codec). Offsets are kept; the
new partition's log start offset is the source's. Transactions still open at the cut
(their markers come after it) are aborted by ABORT markers appended at the cut, so no
read_committed reader waits for them: the new partition then ends that many offsets after
the cut.

Safe while brokers run, on etcd too: the new topic's partition states and segment lists are
staged under its name first, then its topic key is created (one guarded write): brokers see
the whole topic or none of it. Until then its topic marker says deleted, so a restore cut
short leaves objects that a retry, or any create of the name, removes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from kafscale.errors import ErrorCode
from kafscale.metadata.store import MetadataStore, PartitionState, TopicExistsError, TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment, topic_marker
from kafscale.storage.cleaner import truncate_batch
from kafscale.storage.failures import StorageError
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.reader import WHOLE_SEGMENT_READ_BYTES, SegmentReader
from kafscale.storage.recovery import replay

log = logging.getLogger("kafscale.storage")

COPY_CONCURRENCY = 16
ATTEMPTS = 3  # per partition: its segment list re-read when the store changed under the copy


class RestoreError(Exception):
    """The restore was refused or failed; the message says whether anything was created."""


@dataclass(slots=True)
class PartitionRestored:
    partition: int
    log_start_offset: int
    end: int  # the cut: offsets below it hold the source's records
    high_watermark: int = 0  # end plus the ABORT markers appended
    segments_copied: int = 0
    segments_rewritten: int = 0  # the cut segment, and copies that had to be made again
    bytes_copied: int = 0
    aborted_transactions: int = 0


@dataclass(slots=True)
class TopicRestored:
    source: str
    topic: TopicMeta
    partitions: list[PartitionRestored] = field(default_factory=list)


def _now_ms() -> int:
    return int(time.time() * 1000)


class TopicRestore:
    def __init__(self, metadata: MetadataStore, store: ObjectStore, namespace: str, progress=None):
        self.metadata = metadata
        self.store = store
        self.namespace = namespace
        self.reader = SegmentReader(store, namespace, 64 << 20, StorageMetrics())
        self.progress = progress or (lambda done, total: None)
        self._copies = asyncio.Semaphore(COPY_CONCURRENCY)
        self._done = 0
        self._total = 0

    async def run(self, source: str, target: str, *, to_time_ms: int | None = None, to_offset: int | None = None) -> TopicRestored:
        if (to_time_ms is None) == (to_offset is None):
            raise ValueError("give exactly one of to_time_ms and to_offset")
        src = await self.metadata.get_topic(source)
        if src is None:
            raise RestoreError(f"topic {source!r} does not exist; nothing created")
        if await self.metadata.get_topic(target) is not None:
            raise RestoreError(f"topic {target!r} already exists; nothing created")
        states = [await self._state(source, p) for p in range(src.partitions)]
        ends = [await self._end(st, to_time_ms, to_offset) for st in states]
        await self._check_not_before_log_start(source, states, ends, to_time_ms, to_offset)
        try:
            await topic_marker.clear_for_create(self.store, self.namespace, target)
        except topic_marker.ForeignObjectsError as e:
            raise RestoreError(f"{e}; nothing created") from None
        meta = TopicMeta(name=target, partitions=src.partitions, configs=dict(src.configs))
        staging = topic_marker.TopicMarker.of(meta, deleted_ms=_now_ms())
        await topic_marker.write_marker(self.store, self.namespace, staging)
        self._total = sum(len(self._whole(st, end)) + 1 for st, end in zip(states, ends))
        marker_ts = to_time_ms if to_time_ms is not None else _now_ms()
        done = await asyncio.gather(*(self._partition(source, target, st, end, to_time_ms, to_offset, marker_ts) for st, end in zip(states, ends)))
        new_states = [d[0] for d in done]
        await self.metadata.stage_partitions(target, new_states)
        try:
            await self.metadata.publish_topic(meta)
        except TopicExistsError:
            raise RestoreError(
                f"topic {target!r} was created by someone else during the restore; the restore is not published "
                f"(its copies under {topic_marker.topic_prefix(self.namespace, target)} are marked deleted unless that topic's create removed them)"
            ) from None
        await topic_marker.write_marker(self.store, self.namespace, topic_marker.TopicMarker.of(meta))
        log.info("restored topic %s from %s (%s)", target, source, f"to time {to_time_ms}" if to_time_ms is not None else f"to offset {to_offset}")
        return TopicRestored(source, meta, [d[1] for d in done])

    async def _state(self, topic: str, partition: int) -> PartitionState:
        st = await self.metadata.get_partition(topic, partition)
        if st is None:
            raise RestoreError(f"topic {topic!r} changed during the restore (partition {partition} is gone); nothing published")
        return st

    async def _end(self, st: PartitionState, to_time_ms: int | None, to_offset: int | None) -> int:
        """Where the partition is cut: see the module docstring."""
        if to_offset is not None:
            return min(max(to_offset, 0), st.high_watermark)
        live = [s for s in st.segments if s.last_offset >= st.log_start_offset]
        offset, _ts = await self.reader.offset_for_timestamp(st.topic, st.partition, live, st.log_start_offset, to_time_ms + 1)
        return st.high_watermark if offset < 0 else offset

    async def _check_not_before_log_start(self, source: str, states, ends, to_time_ms, to_offset) -> None:
        """Refused (nothing created) when records up to the point asked for are gone from a
        partition (its log starts after them: retention, DeleteRecords), or none is kept."""
        for st, end in zip(states, ends):
            if to_offset is not None and to_offset < st.log_start_offset:
                raise RestoreError(f"--to-offset {to_offset} is before the log start of {source}-{st.partition} (offset {st.log_start_offset}); nothing created")
            if to_time_ms is not None and end == st.log_start_offset and st.log_start_offset > 0 and st.high_watermark > end:
                first = await self._first_record(st)
                raise RestoreError(
                    f"--to-time {topic_marker.iso(to_time_ms)} is before the log start of {source}-{st.partition} "
                    f"(offset {st.log_start_offset}, first record at {topic_marker.iso(first)}; the records before were deleted); nothing created"
                )
        if all(end <= st.log_start_offset for st, end in zip(states, ends)):
            if to_time_ms is not None:
                firsts = [await self._first_record(st) for st in states if st.high_watermark > st.log_start_offset]
                since = f" (its first record is at {topic_marker.iso(min(firsts))})" if firsts else " (it holds no records)"
                raise RestoreError(f"--to-time {topic_marker.iso(to_time_ms)} is before the log start of {source}: no record at or before it{since}; nothing created")
            raise RestoreError(f"--to-offset {to_offset} keeps no record of {source}; nothing created")

    async def _first_record(self, st: PartitionState) -> int:
        live = [s for s in st.segments if s.last_offset >= st.log_start_offset]
        _offset, ts = await self.reader.offset_for_timestamp(st.topic, st.partition, live, st.log_start_offset, -(1 << 62))
        return ts

    @staticmethod
    def _whole(st: PartitionState, end: int) -> list[segment.SegmentInfo]:
        """The segments copied whole: within the log (not wholly before its start) and the cut."""
        return [s for s in st.segments if st.log_start_offset <= s.last_offset < end]

    def _tick(self) -> None:
        self._done += 1
        self.progress(self._done, self._total)

    async def _partition(self, source: str, target: str, st: PartitionState, end: int, to_time_ms, to_offset, marker_ts: int) -> tuple[PartitionState, PartitionRestored]:
        for attempt in range(ATTEMPTS):
            try:
                return await self._copy_partition(source, target, st, end, marker_ts)
            except ObjectNotFound as e:
                # Retention, a merge's or compaction's clean-up removed an object since the
                # segment list was read: read it again.
                if attempt == ATTEMPTS - 1:
                    raise RestoreError(f"{source}-{st.partition}: segments keep disappearing during the restore ({e}); nothing published") from None
                log.info("%s-%d: %s is gone; reading the segment list again", source, st.partition, e)
                st = await self._state(source, st.partition)
                end = await self._end(st, to_time_ms, to_offset)
                if end < st.log_start_offset or (to_offset is not None and to_offset < st.log_start_offset):
                    raise RestoreError(f"the log start of {source}-{st.partition} moved past the point asked for during the restore; nothing published") from None
        raise AssertionError("unreachable")

    async def _copy_partition(self, source: str, target: str, st: PartitionState, end: int, marker_ts: int) -> tuple[PartitionState, PartitionRestored]:
        p = st.partition
        out = PartitionRestored(p, st.log_start_offset, end)
        whole = self._whole(st, end)
        infos = list(await asyncio.gather(*(self._copy_segment(source, target, p, seg, out) for seg in whole)))
        before = [s for s in st.segments if s.last_offset < end]
        boundary = next((s for s in st.segments if s.base_offset < end <= s.last_offset and s.last_offset >= st.log_start_offset), None)
        tail = await self._tail(source, target, p, boundary, before[-1] if before else None, end, marker_ts, out)
        if tail is not None:
            infos.append(tail)
        self._tick()
        out.high_watermark = tail.last_offset + 1 if tail is not None else end
        new = PartitionState(
            target, p, st.log_start_offset, out.high_watermark, st.leader_epoch, -1, min(st.epoch_start_offset, end), segments=infos,
        )
        return new, out

    async def _copy_segment(self, source: str, target: str, p: int, seg: segment.SegmentInfo, out: PartitionRestored) -> segment.SegmentInfo:
        if seg.wao_key:
            # Inside a write-ahead object: the new topic gets it as a segment of its own.
            async with self._copies:
                body = await self._batches(source, p, seg)
                info = await self._write(target, p, [body], seg.base_offset, seg.created_ms, seg.last_offset, seg.aborted, seg.open_txns, seg.cleaned, seg.delete_horizon_ms)
            out.segments_rewritten += 1
            self._tick()
            return info
        src = segment.segment_key(self.namespace, source, p, seg.base_offset)
        dst = segment.segment_key(self.namespace, target, p, seg.base_offset)
        async with self._copies:
            await self.store.copy(src, dst)
            footer, size = await self.store.get_tail(dst, segment.FOOTER_SIZE)
            _crc, last, _magic = segment.FOOTER.unpack(footer) if len(footer) == segment.FOOTER_SIZE else (0, -1, 0)
            if size == seg.size and last == seg.last_offset:
                if seg.size > WHOLE_SEGMENT_READ_BYTES:  # read by ranges: its index too
                    try:
                        await self.store.copy(segment.index_key(self.namespace, source, p, seg.base_offset), segment.index_key(self.namespace, target, p, seg.base_offset))
                    except ObjectNotFound:
                        pass  # written without one: readers read it whole
                out.segments_copied += 1
                out.bytes_copied += size
                self._tick()
                return seg
            # A merge or compaction replaced the object since the segment list was read (or
            # one that never committed left a longer object): the segment is made again
            # from the copy, through its committed last offset, as readers take it.
            info = await self._rewrite_copy(target, p, seg, dst)
        out.segments_rewritten += 1
        self._tick()
        return info

    async def _rewrite_copy(self, target: str, p: int, seg: segment.SegmentInfo, key: str) -> segment.SegmentInfo:
        try:
            decoded = segment.decode(await self.store.get(key), name=key)
        except segment.SegmentFormatError as e:
            raise RestoreError(f"{e}; nothing published") from None
        if decoded.info.created_ms != seg.created_ms or decoded.info.last_offset < seg.last_offset:
            raise RestoreError(f"{key}: the object is not the committed segment {seg.base_offset}-{seg.last_offset}; nothing published")
        body = segment.batches_through(decoded.batches, seg.last_offset)
        return await self._write(target, p, [body], seg.base_offset, seg.created_ms, seg.last_offset, seg.aborted, seg.open_txns, seg.cleaned, seg.delete_horizon_ms)

    async def _write(self, target, p, batches, base, created_ms, last_offset, aborted, open_txns, cleaned, delete_horizon_ms) -> segment.SegmentInfo:
        enc = segment.encode(batches, base, created_ms=created_ms, last_offset=last_offset, aborted=aborted, open_txns=open_txns, cleaned=cleaned, delete_horizon_ms=delete_horizon_ms)
        objects = [(segment.segment_key(self.namespace, target, p, base), enc.parts)]
        if enc.info.size > WHOLE_SEGMENT_READ_BYTES:
            objects.append((segment.index_key(self.namespace, target, p, base), [enc.index]))
        await self.store.put_many(objects)
        return enc.info

    async def _tail(self, source, target, p, boundary, before, end: int, marker_ts: int, out: PartitionRestored) -> segment.SegmentInfo | None:
        """The segment at the cut: the boundary segment's batches before `end` (the one the
        cut falls into cut exactly), then an ABORT marker per transaction still open at
        `end`. None when the cut is at a segment's end and no transaction is open there.
        `before`: the last segment ending before the cut (its open transactions seed the
        producer state)."""
        kept: list[bytes] = []
        if boundary is not None:
            body = await self._batches(source, p, boundary)
            for pos, h in records.iter_batches(body):
                if h.base_offset >= end:
                    break
                if h.last_offset < end:
                    kept.append(bytes(body[pos : pos + h.size]))
                    continue
                cut = truncate_batch(body, pos, h, end)
                if cut is not None:
                    kept.append(cut)
                break
        producers = self._producers_before(before)
        _replay(producers, kept)
        markers = []
        for i, (pid, epoch, _first) in enumerate(producers.open_at(end)):
            coordinator_epoch = max(producers.producers[pid].coordinator_epoch, 0)
            markers.append(records.build_control_batch(False, pid, epoch, coordinator_epoch, marker_ts, base_offset=end + i))
        if boundary is None and not markers:
            return None
        producers = self._producers_before(before)
        aborted = _replay(producers, kept + markers)
        out.aborted_transactions = len(markers)
        out.segments_rewritten += 1
        base = boundary.base_offset if boundary is not None else end
        return await self._write(
            target, p, kept + markers, base,
            boundary.created_ms if boundary is not None else _now_ms(),
            None if markers else end - 1,  # a cut past the last kept record keeps its offsets
            aborted, producers.open_at(end + len(markers)),
            boundary.cleaned if boundary is not None else False,
            boundary.delete_horizon_ms if boundary is not None else -1,
        )

    async def _batches(self, source: str, p: int, seg: segment.SegmentInfo) -> memoryview:
        """The committed segment's batches: through the reader (checked as any read is,
        and usually cached by the timestamp lookup that found the cut), or, for a segment
        the reader reads by ranges, the whole object."""
        if seg.size <= WHOLE_SEGMENT_READ_BYTES:
            try:
                view = await self.reader.segment_view(source, p, seg)
            except StorageError as e:
                if e.error_code == ErrorCode.offset_out_of_range:  # deleted meanwhile
                    raise ObjectNotFound(segment.segment_key(self.namespace, source, p, seg.base_offset)) from None
                raise RestoreError(f"{e}; nothing published") from None
            return segment.batches_through(view.data, seg.last_offset)
        key, start, end = segment.stored_at(self.namespace, source, p, seg)
        try:
            decoded = segment.decode(await self.store.get(key, start, end), name=key)
        except segment.SegmentFormatError as e:
            raise RestoreError(f"{e}; nothing published") from None
        return segment.batches_through(decoded.batches, seg.last_offset)

    @staticmethod
    def _producers_before(seg: segment.SegmentInfo | None) -> ProducerStateTable:
        """Producer state with the transactions open after `seg`, as its metadata says."""
        producers = ProducerStateTable()
        for pid, epoch, first in (seg.open_txns if seg is not None else ()):
            producers.seed_open(pid, epoch, first)
        return producers


def _replay(producers: ProducerStateTable, batches: list[bytes]) -> tuple:
    data = b"".join(batches)
    return replay(producers, data, [pos for pos, _h in records.iter_batches(data)], _now_ms())

