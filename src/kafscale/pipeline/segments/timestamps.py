"""Timestamp lookups (startingTimestamp and friends) over a partition's segments."""

from __future__ import annotations

from kafscale.pipeline.segments.segment_meta import checked_header
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore


async def offset_for_timestamp(store: ObjectStore, segs: list[tuple[int, str]], timestamp_ms: int) -> int | None:
    """First offset whose record timestamp is >= timestamp_ms (Kafka ListOffsets semantics), or None.

    Walks the partition's segments in order reading batch headers, and decodes only the first
    batch whose max timestamp reaches the target. Costs a read of every segment before the
    answer, so it suits recent timestamps and the modest segment counts of a partition.
    """
    covered = -1
    for base, key in segs:
        try:
            data = await store.get(key)
        except ObjectNotFound:
            continue  # replaced by a merge since listing; its batches live on in the merged one
        body_end = len(data) - segment.FOOTER_SIZE
        pos = segment.HEADER_SIZE
        while pos < body_end:
            h = checked_header(key, data, pos, body_end)
            if h.last_offset > covered and not h.is_control and h.max_timestamp >= timestamp_ms:
                for rec in records.decode_records(data, pos, h):
                    if rec.offset > covered and rec.timestamp >= timestamp_ms:
                        return rec.offset
            covered = max(covered, h.last_offset)
            pos += h.size
    return None
