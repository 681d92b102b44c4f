"""One partition's segment list, reconciled with the objects in the bucket.

Input: the partition as the snapshot knew it (or nothing: restore from the bucket alone)
and the base offsets of its `segment-*.kfs` objects. In key order:

1. A segment the snapshot lists whose object is gone was deleted since (retention,
   DeleteRecords, a merge that absorbed it): dropped.
2. A listed segment whose object is still there with the size the snapshot recorded (the
   listing gives sizes: no request) is the committed object, kept as listed. Another size
   means a merge or compaction replaced it under the same key since (a merged object holds
   more batches, a compacted one fewer records): the object is read whole, checked, and
   describes the segment; listed segments it covers (a merge's leftovers not yet swept)
   are dropped.
   A listed segment held in a write-ahead object (`wao_key`, storage/write_ahead.py) is
   kept while that object is listed; once the object is gone the broker had rewritten the
   segment into its own object, taken as above.
3. After the last segment, objects are adopted as a chain from the high watermark, as a
   crash between upload and commit is recovered (storage/recovery.py, same checks: header,
   footer, CRC32C of all and of each batch). A link is a segment object starting there, or
   else a piece of a write-ahead object starting there (from the objects' indexes; of two
   at one offset the newer object's, the retry of a flush whose commit failed): records
   flushed with `--write-ahead-objects` and not yet rewritten are found this way. From the
   bucket alone a piece whose commit never happened is adopted like a segment object
   uploaded but never committed: it holds offsets nobody else holds, records its producer
   was told failed (and retried: Kafka's duplicate of an unacknowledged retry). The chain
   stops at a gap or an object that fails a check; that segment object and every later one
   are moved to `{namespace}/~quarantine/` (reported), where no flush at those offsets can
   run into them; write-ahead objects, shared by partitions, stay.
4. Transactions still open at the end are closed with markers (ABORT, or COMMIT where the
   snapshot's transaction state is PrepareCommit: the coordinator had decided) in one new
   segment, so no read_committed consumer waits for a last stable offset that never moves.
5. The leader epoch restarts above the snapshot's and every epoch in the batches read
   (on etcd; the embedded store's one broker has no other broker to fence).

Objects read whole are replayed into a producer state table, as recovery does, for their
aborted-transaction entries and the transactions open at their end.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from kafscale.metadata.store import PartitionState
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.producers import ProducerStateTable
from kafscale.storage.recovery import UNUSABLE_SEGMENT, read_checked, replay

log = logging.getLogger("kafscale.backup")

QUARANTINE_DIR = "~quarantine"


@dataclass(frozen=True, slots=True)
class HeldPiece:
    """A partition's segment inside a write-ahead object, from the object's index."""

    key: str  # the write-ahead object
    position: int
    length: int
    base_offset: int
    last_offset: int


class _PieceBytes:
    """The store as recovery's read_checked sees it for one piece: any key reads the
    piece's byte range of its write-ahead object (a whole spec segment)."""

    def __init__(self, store: ObjectStore, piece: HeldPiece):
        self.store, self.piece = store, piece

    async def get(self, _key: str) -> bytes:
        p = self.piece
        return await self.store.get(p.key, p.position, p.position + p.length)


@dataclass(slots=True)
class PartitionOutcome:
    state: PartitionState
    kept: int = 0  # listed in the snapshot, object unchanged
    replaced: int = 0  # listed, object replaced by a merge or compaction since
    dropped: int = 0  # listed, object gone (or absorbed by a merged object)
    adopted: int = 0  # committed after the snapshot, adopted from the chain
    quarantined: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    markers: list[tuple[int, int, bool]] = field(default_factory=list)  # (producer id, epoch, commit)
    producer_epochs: dict[int, int] = field(default_factory=dict)  # highest epoch seen per producer id
    requests: int = 0  # object-store requests made


class _Replayer:
    """Aborted entries and open transactions of the objects read whole, in offset order.
    A run of objects read one after another shares one table; a run that follows a segment
    kept as listed starts from that segment's open transactions."""

    def __init__(self, outcome: PartitionOutcome):
        self.outcome = outcome
        self.table: ProducerStateTable | None = None
        self.max_epoch = -1

    def describe(self, decoded: segment.DecodedSegment, positions: list[int], before: segment.SegmentInfo | None, continues: bool) -> segment.SegmentInfo:
        if self.table is None or not continues:
            self.table = ProducerStateTable()
            for pid, epoch, first in (before.open_txns if before is not None else ()):
                self.table.seed_open(pid, epoch, first)
        body = decoded.batches
        epochs = self.outcome.producer_epochs
        for pos in positions:
            h = records.read_header(body, pos)
            self.max_epoch = max(self.max_epoch, h.partition_leader_epoch)
            if h.producer_id >= 0 and h.producer_epoch > epochs.get(h.producer_id, -1):
                epochs[h.producer_id] = h.producer_epoch
        aborted = replay(self.table, body, positions, int(time.time() * 1000))
        info = decoded.info
        return dataclasses.replace(info, aborted=aborted, open_txns=self.table.open_at(info.last_offset + 1))


async def reconcile_partition(
    store: ObjectStore,
    namespace: str,
    topic: str,
    partition: int,
    snap: PartitionState | None,
    objects: dict[int, int],
    commit_decided: Callable[[int, int], bool],
    fence_epochs: bool = True,
    pieces: list[HeldPiece] = (),
    write_ahead_objects: set[str] = frozenset(),
) -> PartitionOutcome:
    """The partition's restored state (version 0, owner -1) and what was done to get it.
    `objects`: {base offset: size} of the partition's segment objects, from the listing.
    `commit_decided(producer id, epoch)`: whether the transaction coordinator had decided
    to commit that producer's open transaction (else it is aborted). `fence_epochs`: the
    leader epoch restarts above every one seen (etcd clusters, where a broker may survive
    the loss); the embedded store's single broker keeps epoch 0, as its cluster reports.
    `pieces`: the partition's pieces in the listed write-ahead objects `write_ahead_objects`."""
    out = PartitionOutcome(PartitionState(topic, partition))
    key = lambda base: segment.segment_key(namespace, topic, partition, base)  # noqa: E731
    bases = sorted(objects)
    listed = list(snap.segments) if snap is not None else []

    # 1, 2. Listed segments: gone, the same object (its size, from the listing), or
    # replaced by a merge or compaction (another size: a merged object holds more batches,
    # a compacted one fewer records).
    checked: list[tuple[int, segment.SegmentInfo | None]] = []
    for seg in listed:
        if seg.wao_key and seg.wao_key in write_ahead_objects:
            checked.append((seg.base_offset, seg))  # still in its write-ahead object
            continue
        size = objects.get(seg.base_offset)
        if size is None:
            out.dropped += 1
        elif seg.wao_key:
            # rewritten into its own object since: the same bytes when the run was this piece alone
            checked.append((seg.base_offset, dataclasses.replace(seg, wao_key="", wao_position=0) if size == seg.size else None))
        else:
            checked.append((seg.base_offset, seg if size == seg.size else None))

    replayer = _Replayer(out)
    final: list[segment.SegmentInfo] = []
    replayed_last = False
    stop_at: int | None = None  # base of the first object not adopted (and everything after)
    for base, info in checked:
        if final and base <= final[-1].last_offset:
            out.dropped += 1  # a merge's leftover: the object before it covers it now
            continue
        if info is not None:
            final.append(info)
            out.kept += 1
            replayed_last = False
            continue
        try:
            decoded, positions = await read_checked(store, key(base))
        except UNUSABLE_SEGMENT as e:
            out.requests += 1
            out.problems.append(f"{topic}-{partition}: listed segment {base} was replaced by an unusable object: {e}")
            stop_at = base
            break
        out.requests += 1
        final.append(replayer.describe(decoded, positions, final[-1] if final else None, replayed_last))
        replayed_last = True
        out.replaced += 1

    # 3. The chain after the last segment.
    end = final[-1].last_offset + 1 if final else 0
    if snap is not None:
        end = max(end, snap.high_watermark)  # offsets are never handed out twice
    held: dict[int, HeldPiece] = {}
    for piece in sorted(pieces, key=lambda pc: pc.key):  # keys sort by creation: the newer wins
        held[piece.base_offset] = piece
    after = sorted(b for b in set(bases) | set(held) if b >= end)
    if not final and after and after[0] > end:
        end = after[0]  # everything before was deleted since (retention): the log starts later
    if stop_at is None:
        for base in after:
            if base < end:
                continue  # covered by a merged object before it: its leftover
            if base != end:
                out.problems.append(f"{topic}-{partition}: no segment starts at offset {end}; the chain stops there (objects from {base} on quarantined)")
                stop_at = base
                break
            out.requests += 1
            piece = held.get(base) if base not in objects else None
            try:
                if piece is None:
                    decoded, positions = await read_checked(store, key(base))
                else:
                    decoded, positions = await read_checked(_PieceBytes(store, piece), f"{piece.key} at byte {piece.position}")
            except UNUSABLE_SEGMENT as e:
                out.problems.append(f"{topic}-{partition}: the chain stops at offset {base}: {e}")
                stop_at = base
                break
            info = replayer.describe(decoded, positions, final[-1] if final else None, replayed_last)
            if piece is not None:
                info = dataclasses.replace(info, wao_key=piece.key, wao_position=piece.position)
            replayed_last = True
            final.append(info)
            out.adopted += 1
            end = info.last_offset + 1
    if stop_at is not None:
        for base in sorted(b for b in bases if b >= stop_at):
            out.quarantined.append(await _quarantine(store, namespace, topic, partition, base))
            out.requests += 3

    high_watermark = end
    epoch = max(snap.leader_epoch if snap is not None else 0, replayer.max_epoch) + (1 if fence_epochs else 0)
    open_txns = final[-1].open_txns if final else ()
    if open_txns:
        marker_seg = await _close_transactions(store, namespace, topic, partition, high_watermark, epoch, open_txns, commit_decided, out)
        final.append(marker_seg)
        high_watermark = marker_seg.last_offset + 1
    log_start = snap.log_start_offset if snap is not None else 0
    log_start = max(log_start, final[0].base_offset) if final else high_watermark
    out.state = PartitionState(topic, partition, min(log_start, high_watermark), high_watermark, epoch, -1, high_watermark, final)
    return out


async def _close_transactions(store, namespace, topic, partition, base, epoch, open_txns, commit_decided, out: PartitionOutcome) -> segment.SegmentInfo:
    now_ms = int(time.time() * 1000)
    batches, aborted = [], []
    offset = base
    for pid, producer_epoch, first in open_txns:
        commit = commit_decided(pid, producer_epoch)
        # Coordinator epoch 0: the lowest, so no later marker of the real coordinator is fenced by it.
        buf = bytearray(records.build_control_batch(commit, pid, producer_epoch, 0, now_ms, offset))
        records.patch_batch(buf, 0, offset, epoch)
        batches.append(bytes(buf))
        if not commit:
            aborted.append((pid, first, offset))
        out.markers.append((pid, producer_epoch, commit))
        offset += 1
    enc = segment.encode(batches, base, created_ms=now_ms, aborted=tuple(aborted))
    await store.create(segment.segment_key(namespace, topic, partition, base), enc.parts)
    out.requests += 1
    return enc.info


async def _quarantine(store: ObjectStore, namespace: str, topic: str, partition: int, base: int) -> str:
    """Move one segment object (and its index) out of the partition's key space."""
    src = segment.segment_key(namespace, topic, partition, base)
    dst = f"{namespace}/{QUARANTINE_DIR}/{topic}/{partition}/{src.rsplit('/', 1)[-1]}"
    await store.put(dst, [await store.get(src)])
    await store.delete([src, segment.index_key(namespace, topic, partition, base)])
    log.warning("restore: moved %s to %s", src, dst)
    return dst
