"""What loading an owned partition log recovers: segments that reached the object store but
not the metadata (a crash between upload and commit), and the producers' state (idempotent
sequences, open transactions) from the log's tail.

Load order: the producer state is rebuilt from the committed segments first, then each
adopted segment is replayed into it, which also yields the aborted-transaction entries of
its ABORT markers (committed with it, as a flush would have)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Callable

from kafscale.errors import ErrorCode
from kafscale.metadata.store import MetadataStore, PartitionState
from kafscale.protocol import records
from kafscale.storage import segment, topic_marker
from kafscale.storage.failures import StorageError
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.storage.producers import ProducerStateTable

if TYPE_CHECKING:
    from kafscale.storage.reader import SegmentReader

log = logging.getLogger("kafscale.storage")

# Producer state is rebuilt from the batch headers of this much of the log's tail.
PRODUCER_STATE_REPLAY_BYTES = 64 * 1024 * 1024


def replay(producers: ProducerStateTable, data, positions, now_ms: int) -> tuple[tuple[int, int, int], ...]:
    """Feed stored batches (at `positions` in `data`) to the producer state, as their append
    did; returns the aborted-transaction entries of the ABORT markers among them."""
    aborted = []
    for pos in positions:
        h = records.read_header(data, pos)
        if h.producer_id < 0:
            continue
        if h.is_control:
            kind, coordinator_epoch = records.read_control(data, pos, h)
            if kind not in (records.CONTROL_ABORT, records.CONTROL_COMMIT):
                continue
            first = producers.end_txn(h.producer_id, h.producer_epoch, coordinator_epoch, h.base_offset, now_ms, 1 << 62)
            if first is not None and kind == records.CONTROL_ABORT:
                aborted.append((h.producer_id, first, h.base_offset))
        else:
            producers.record(h, h.base_offset, h.max_timestamp if h.max_timestamp > 0 else now_ms, 1 << 62)
    return tuple(aborted)


# What read_checked raises for an object that cannot be adopted.
UNUSABLE_SEGMENT = (segment.SegmentFormatError, ObjectNotFound, records.InvalidRecordError)


async def read_checked(store: ObjectStore, key: str) -> tuple[segment.DecodedSegment, list[int]]:
    """A segment object not (yet) in the metadata, read whole and checked before adoption:
    header, footer, the CRC32C of all batches and of each batch; (the decoded segment, the
    position of each batch in its `batches`). Raises one of UNUSABLE_SEGMENT."""
    decoded = segment.decode(await store.get(key), name=key)
    body = decoded.batches
    positions = []
    for pos, h in records.iter_batches(body):  # each batch must be intact too
        if records.crc32c(body[pos + records.CRC_START : pos + h.size]) != h.crc:
            raise segment.SegmentFormatError(f"{key}: batch at offset {h.base_offset} fails its CRC32C")
        positions.append(pos)
    return decoded, positions


async def recover(
    store: ObjectStore,
    metadata: MetadataStore,
    namespace: str,
    state: PartitionState,
    schedule_delete: Callable[[list[str]], None],
    producers: ProducerStateTable | None = None,
    topic_id: str | None = None,
) -> PartitionState:
    """Adopt segments that reached the object store but not the metadata (a crash
    between upload and commit): each must start exactly at the high watermark and pass
    its checks; anything else is ignored, so no offset is ever served twice. None is
    adopted or swept when the topic marker says the prefix is not the topic `topic_id`'s
    (objects of an earlier topic of the name: storage/topic_marker.py)."""
    st = state
    prefix = segment.partition_prefix(namespace, st.topic, st.partition)
    try:
        keys = await store.list(prefix + "segment-")
    except ObjectStoreError as e:
        raise StorageError(f"object store unavailable: {e}") from e
    bases = {b for k in keys if (b := segment.parse_segment_key(k)) is not None}
    listed = {s.base_offset for s in st.segments}
    orphans = sorted(b for b in bases if b < st.high_watermark and b not in listed)
    candidates = sorted(b for b in bases if b >= st.high_watermark)
    if (orphans or candidates) and topic_id is not None:
        try:
            ours, why = await topic_marker.owned_by(store, namespace, st.topic, topic_id)
        except ObjectStoreError as e:
            raise StorageError(f"object store unavailable: {e}") from e
        if not ours:
            log.error(
                "recovery: not adopting or sweeping %d uncommitted objects of %s-%d: %s",
                len(orphans) + len(candidates), st.topic, st.partition, why, extra={"topic": st.topic, "partition": st.partition},
            )
            return st
    if orphans:
        # Left behind by a merge (or an old failed flush): never served, swept after grace.
        schedule_delete(
            [k for b in orphans for k in (segment.segment_key(namespace, st.topic, st.partition, b), segment.index_key(namespace, st.topic, st.partition, b))]
        )
    for base in candidates:
        if base != st.high_watermark:
            break
        key = segment.segment_key(namespace, st.topic, st.partition, base)
        try:
            decoded, positions = await read_checked(store, key)
            body = decoded.batches
        except UNUSABLE_SEGMENT as e:
            log.warning("recovery: deleting unusable uncommitted segment %s: %s", key, e, extra={"topic": st.topic, "partition": st.partition})
            # Never acknowledged, and segments are created only where no object is:
            # left in place it would refuse every flush at the high watermark.
            try:
                await store.delete([key, segment.index_key(namespace, st.topic, st.partition, base)])
            except ObjectStoreError as de:
                raise StorageError(f"object store unavailable: {de}") from de
            break
        info = decoded.info
        if producers is not None:
            aborted = replay(producers, body, positions, int(time.time() * 1000))
            info = dataclasses.replace(info, aborted=aborted, open_txns=producers.open_at(info.last_offset + 1))
        st = await metadata.commit_segment(st, info)
        log.info("recovery: adopted uncommitted segment %s (offsets %d-%d)", key, base, decoded.info.last_offset)
    return st


async def rebuild_producer_state(reader: "SegmentReader", topic: str, partition: int, segments: list[segment.SegmentInfo], producers: ProducerStateTable) -> None:
    """Producer state comes back from the batch headers of the log's tail, so a producer
    retrying across a restart or ownership move gets no duplicate, and the transactions
    open in that tail are open again; those begun before the tail (more than
    PRODUCER_STATE_REPLAY_BYTES back) come from the open_txns of the segment before it."""
    tail, size = [], 0
    for seg in reversed(segments):
        if size >= PRODUCER_STATE_REPLAY_BYTES:
            break
        tail.append(seg)
        size += seg.size
    if len(tail) < len(segments):
        # The transactions open where the tail begins, as the segment before it recorded.
        for pid, epoch, first in segments[len(segments) - len(tail) - 1].open_txns:
            producers.seed_open(pid, epoch, first)
    now_ms = int(time.time() * 1000)
    for seg in reversed(tail):
        try:
            view = await reader.segment_view(topic, partition, seg)
        except StorageError as e:
            if e.error_code == ErrorCode.offset_out_of_range:
                continue  # deleted by retention meanwhile
            raise
        replay(producers, view.data, view.positions, now_ms)
