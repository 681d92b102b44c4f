"""StorageMetrics: the metrics sink the storage jobs report their events to.

Each counter is named for its event and counted where the event happens (a partition log's
append and flush, a merge's or compaction's upload, a reader's or rewrite's object read);
ops reads them at scrape time (kafscale_produce_*, kafscale_flush*, kafscale_segment_bytes,
kafscale_object_store_requests) and observes each durable flush through `flush_hooks`.
The compactor keeps its own counters (compactor.CompactionCounters).
"""

from __future__ import annotations

from kafscale.metadata.segments import SegmentInfo


class StorageMetrics:
    __slots__ = ("produce_bytes", "produce_records", "flushes", "flush_failures", "segment_bytes", "puts", "gets", "read_aheads", "flush_hooks")

    def __init__(self) -> None:
        self.produce_bytes = 0  # record-batch bytes appended to write buffers
        self.produce_records = 0
        self.flushes = 0  # segments uploaded and committed
        self.flush_failures = 0
        self.segment_bytes = 0  # bytes of the segments flushed
        self.puts = 0  # objects written (flushes, merges, compactions)
        self.gets = 0  # object reads (the read path and rewrites)
        self.read_aheads = 0  # segments loaded ahead of a sequential reader
        # hook(bytes, seconds, puts) after each durable flush (a segment, or a write-ahead
        # object with the pieces of many partitions): ops/metrics times and sizes them.
        self.flush_hooks: list = []

    def produced(self, nbytes: int, nrecords: int) -> None:
        self.produce_bytes += nbytes
        self.produce_records += nrecords

    def flushed(self, info: SegmentInfo, seconds: float, puts: int, observe: bool = True) -> None:
        """A segment durable and committed; `observe`: the hooks see it as a flush of its
        own (not a piece of a write-ahead object, which object_flushed reports)."""
        self.flushes += 1
        self.puts += puts
        self.segment_bytes += info.size
        if observe:
            for hook in self.flush_hooks:
                hook(info.size, seconds, puts)

    def object_flushed(self, nbytes: int, seconds: float) -> None:
        """A write-ahead object durable and its pieces committed (each counted by flushed):
        one flush for the hooks (two histogram observations a piece were 4% of a broker's
        time at 1,024 partitions)."""
        for hook in self.flush_hooks:
            hook(nbytes, seconds, 1)

    def flush_failed(self) -> None:
        self.flush_failures += 1

    def uploaded(self, puts: int) -> None:
        """Objects written other than by a flush (a merge's, a compaction's)."""
        self.puts += puts

    def read_objects(self, gets: int = 1) -> None:
        self.gets += gets

    def read_ahead(self) -> None:
        self.read_aheads += 1
