"""What goes wrong reading segments, and the report of what a read skipped (failOnCorruption=false)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafscale.storage.segment import SegmentFormatError

log = logging.getLogger("kafscale.pipeline")


class PipelineError(RuntimeError):
    """Base class for errors of the segment reader."""


class TopicNotFoundError(PipelineError):
    pass


class CorruptSegmentError(PipelineError):
    """A segment object that cannot be read as written; the message names object and offset."""

    def __init__(self, key: str, what: str, *, byte: int | None = None, offset: int | None = None):
        where = []
        if offset is not None:
            where.append(f"offset {offset}")
        if byte is not None:
            where.append(f"byte {byte}")
        at = f" at {', '.join(where)}" if where else ""
        super().__init__(
            f"corrupt KafScale segment {key}{at}: {what} "
            "(set option failOnCorruption=false to skip damaged data)"
        )
        self.key, self.what, self.byte, self.offset = key, what, byte, offset

    @classmethod
    def of(cls, key: str, e: SegmentFormatError) -> "CorruptSegmentError":
        """storage's SegmentFormatError for the object at `key`, as the reader reports it."""
        return cls(key, e.what, byte=e.byte, offset=e.offset)


class DataLossError(PipelineError):
    pass


class ListingChanged(PipelineError):
    """A listed object is gone: its offsets moved since the listing (a merge, a rewrite of
    write-ahead objects or a retention past its grace period). Plan again from a new listing."""


@dataclass(slots=True)
class SkipReport:
    """What a read skipped because of damage (only with failOnCorruption=false).

    Each entry names the object, the first offset and byte affected, and how many offsets
    were not delivered because of it.
    """

    entries: list[dict] = field(default_factory=list)

    @property
    def offsets(self) -> int:
        return sum(e["offsets_skipped"] for e in self.entries)

    def add(self, err: CorruptSegmentError, offsets_skipped: int, **extra: Any) -> None:
        entry = {"object": err.key, "offset": err.offset, "byte": err.byte, "error": err.what, "offsets_skipped": max(0, offsets_skipped), **extra}
        self.entries.append(entry)
        log.warning("skipped damaged data: %s", entry)

    def write(self, directory: str | None) -> None:
        """Leave the entries as one JSON file in `directory` (summed by `read_skip_log`)."""
        if not directory or not self.entries:
            return
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"skipped-{uuid.uuid4().hex}.json")
        with open(path, "w") as f:
            json.dump(self.entries, f)


def read_skip_log(directory: str) -> dict:
    """Sum what readers given `corruptionLog=<directory>` skipped: {"offsets_skipped": n, "entries": [...]}."""
    entries: list[dict] = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.startswith("skipped-") and name.endswith(".json"):
                with open(os.path.join(directory, name)) as f:
                    entries.extend(json.load(f))
    return {"offsets_skipped": sum(e["offsets_skipped"] for e in entries), "entries": entries}
