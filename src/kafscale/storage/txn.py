"""The marker contract between the transaction coordinator and the partitions (docs/transactions.md).

The coordinator decides a transaction's outcome; every partition in the transaction then gets one
end-transaction control batch (COMMIT or ABORT) for the producer, appended by the partition's owner
(`LogManager.write_txn_markers`, or WriteTxnMarkers from another broker).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.protocol import records


@dataclass(frozen=True)
class TxnMarker:
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool  # True: COMMIT control record, False: ABORT
    partitions: list[tuple[str, int]] = field(default_factory=list)


def aborted_in_range(segments, start: int, end: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions with records in [start, end),
    from the aborted entries (SegmentInfo.aborted) of the segments from `start` on: what a
    read_committed fetch of that range hands the consumer, which drops their records. An
    entry's marker may lie past `end` (a long transaction), so every later segment counts."""
    out = []
    for seg in segments:
        if seg.last_offset < start or not seg.aborted:
            continue
        for pid, first, last in seg.aborted:
            if last >= start and first < end:
                out.append((pid, first))
    out.sort(key=lambda a: a[1])
    return out


class AbortedIndex:
    """The segments of one partition that hold aborted entries, found again only when its
    segment list changes (a new list per commit): most partitions have none, and a
    read_committed consumer asks on every fetch, which scanned every segment before."""

    __slots__ = ("_segments", "_with_aborted")

    def __init__(self) -> None:
        self._segments: list | None = None
        self._with_aborted: list = []

    def of(self, segments: list) -> list:
        if segments is not self._segments:
            self._with_aborted = [s for s in segments if s.aborted]
            self._segments = segments
        return self._with_aborted

    def any_from(self, segments: list, start: int) -> bool:
        """Whether an aborted entry may concern offsets from `start` on."""
        return any(s.last_offset >= start for s in self.of(segments))


def cut_at(chunks: list, end: int) -> list:
    """The whole batches of `chunks` (buffers of stored batches) that end below offset `end`."""
    out = []
    for chunk in chunks:
        keep = 0
        for pos, h in records.iter_batches(chunk):
            if h.last_offset >= end:
                break
            keep = pos + h.size
        else:
            out.append(chunk)
            continue
        if keep:
            out.append(memoryview(chunk)[:keep])
        break
    return out
