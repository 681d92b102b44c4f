"""Timestamp lookups (startingTimestamp and friends) over a partition's segment objects."""

from __future__ import annotations

from kafscale.pipeline.segments.errors import CorruptSegmentError
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore
from kafscale.storage.reader import first_record_at_or_after


async def offset_for_timestamp(store: ObjectStore, segs: list[tuple[int, str]], timestamp_ms: int) -> int | None:
    """First offset whose record timestamp is >= timestamp_ms (Kafka ListOffsets semantics), or None.

    Walks the partition's segments in order reading batch headers (storage's walk), and
    decodes only the first data batch whose max timestamp reaches the target (storage's
    first_record_at_or_after, as the broker's ListOffsets). Costs a read of every segment
    before the answer, so it suits recent timestamps and the modest segment counts of a
    partition.
    """
    covered = -1  # offsets up to here were looked at: a merged segment repeats its parts' offsets
    for _base, key in segs:
        try:
            data = await store.get(key)
        except ObjectNotFound:
            continue  # replaced by a merge since listing; its batches live on in the merged one
        floor = covered + 1

        def data_batches():
            nonlocal covered
            for pos, h in segment.walk(data, segment.HEADER_SIZE, len(data) - segment.FOOTER_SIZE, name=key):
                covered = max(covered, h.last_offset)
                if not h.is_control:
                    yield pos, h

        try:
            rec = first_record_at_or_after(data, data_batches(), timestamp_ms, floor)
        except segment.SegmentFormatError as e:
            raise CorruptSegmentError.of(key, e) from None
        if rec is not None:
            return rec.offset
    return None
