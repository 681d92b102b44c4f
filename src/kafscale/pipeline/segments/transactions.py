"""read_committed from the segments alone: where the stable range ends, and which
transactions were aborted."""

from __future__ import annotations

from kafscale.pipeline.segments.planning import candidate_keys, cover
from kafscale.pipeline.segments.errors import ListingChanged
from kafscale.pipeline.segments.segment_meta import listed_metas
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore


END_OF_LOG = 1 << 62  # an end offset past every segment (transaction_outcomes to the end)


async def transaction_outcomes(
    store: ObjectStore, segs: list[tuple[int, str]], start: int, end: int, *, fail_on_corruption: bool = True
) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """What read_committed needs for offsets [start, end) of a partition, from its flushed
    segments alone (no broker): (stable end, aborted). Each transactional batch's fate is the
    next end-transaction marker of its producer; the stable end is the first offset of a
    transaction with no marker up to `end` (so nothing undecided is read), else `end`;
    aborted lists (producer id, first offset, marker offset) of the transactions aborted in
    the range. Costs a read of every segment from `start` to `end` (only for read_committed).
    """
    if end <= start:
        return end, ()
    metas = await listed_metas(store, candidate_keys(segs, start, end), fail_on_corruption=fail_on_corruption)
    open_first: dict[int, int] = {}  # producer id -> first offset of its undecided data in range
    aborted: list[tuple[int, int, int]] = []
    for m, a, b in cover(metas, start, end, fail_on_data_loss=False):
        if m.corrupt is not None:
            continue
        try:
            data = memoryview(await store.get(m.key))
        except ObjectNotFound:
            raise ListingChanged(f"{m.key} gone since the listing") from None
        body_end = len(data) - segment.FOOTER_SIZE
        for pos, h in records.iter_batches(data, segment.HEADER_SIZE, body_end):
            if h.last_offset < a or h.base_offset >= b or h.producer_id < 0 or not h.is_transactional:
                continue
            if not h.is_control and h.record_count == 0:
                # emptied by compaction, which cleans only below the last stable offset: its
                # transaction is decided, and its marker may be gone (past its horizon)
                continue
            if not h.is_control:
                open_first.setdefault(h.producer_id, h.base_offset)
                continue
            kind, _epoch = records.read_control(data, pos, h)
            first = open_first.pop(h.producer_id, None)
            if kind == records.CONTROL_ABORT and first is not None:
                aborted.append((h.producer_id, first, h.base_offset))
    stable = min([end, *open_first.values()])
    return stable, tuple(a for a in aborted if a[1] < stable)


def aborted_batch(aborted: tuple[tuple[int, int, int], ...], h: records.BatchHeader) -> bool:
    """Is this transactional batch part of one of the `aborted` transactions?"""
    if not aborted or not h.is_transactional:
        return False
    return any(pid == h.producer_id and first <= h.base_offset <= last for pid, first, last in aborted)
