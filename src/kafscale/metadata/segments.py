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
