"""What the metadata store knows of a sealed segment.

Lives in metadata/ because the store persists it and metadata must not import storage;
storage/segment.py re-exports it next to the segment file codec that produces it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the metadata store records about one sealed segment."""

    base_offset: int
    last_offset: int
    size: int  # bytes of the .kfs object
    record_count: int
    max_timestamp: int
    created_ms: int
    # The transactions aborted by the ABORT markers this segment holds, as (producer id,
    # first offset, last offset = the marker's offset); a read_committed fetch hands them to
    # the consumer so it drops their records. Absent in metadata written before transactions.
    aborted: tuple[tuple[int, int, int], ...] = ()
    # The transactions still open at the end of this segment, as (producer id, producer
    # epoch, first offset): where loading a log starts when its producer state is rebuilt
    # from a tail that begins after this segment (a transaction older than the tail).
    open_txns: tuple[tuple[int, int, int], ...] = ()
    # Written by the log compactor (storage/compactor.py): the segments before the first
    # one not marked are the cleaned part of a compacted log (Kafka's cleaner checkpoint).
    # Absent (False) in metadata written before compaction.
    cleaned: bool = False
    # The earliest delete horizon (KIP-534) of the tombstones and transaction markers the
    # compactor kept in this segment (-1: none): the partition is due for a pass then, dirty
    # or not, so they go. Absent (-1) in metadata written before compaction.
    delete_horizon_ms: int = -1
    # Where the segment's bytes are when they are not its own spec object: the range
    # [wao_position, wao_position + size) of the write-ahead object `wao_key`
    # (storage/write_ahead.py; that range is a whole spec segment). "" (absent in metadata
    # written before write-ahead objects): the segment's own key
    # ({namespace}/{topic}/{partition}/segment-{base}.kfs).
    wao_key: str = ""
    wao_position: int = 0

    def __post_init__(self) -> None:
        for name in ("aborted", "open_txns"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or (value and not isinstance(value[0], tuple)):  # loaded from JSON: lists
                object.__setattr__(self, name, tuple(tuple(a) for a in value))
