"""Segments held in memory for the fetch path: just-flushed ones and recently read ones.

A `SegmentView` is the batches of one segment with a batch-offset table, so a fetch finds
its starting batch by bisection and returns a slice of the stored bytes (no re-encoding).
`SegmentCache` keeps views in LRU order within a byte budget. A view counts its bytes and
its batch table, so --cache-bytes bounds what the cache holds even when batches are tiny
(as Python lists of ints the table cost about 160 bytes a batch, uncounted: a cache of
one-record batches of 100 bytes held twice its budget).

The budget also covers segment data held outside the cache (`held_outside`: the broker
counts its produce requests waiting to become durable there): the cache gives way to them,
evicting its oldest views, so --cache-bytes bounds the segment data in memory, written or
read. On S3, saturated producers kept up to 221 MiB of requests next to a full 256 MiB cache
(peak RSS 657 MiB, bench/run.py 16 KiB records; docs/performance.md "Memory").
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from typing import Callable

from kafscale.protocol import records


# What a view costs besides its bytes: the object and its table's fixed parts, then four
# 8-byte entries a batch (arrays of int64, not lists of int objects).
VIEW_OVERHEAD_BYTES = 512
BATCH_TABLE_BYTES = 4 * 8


class SegmentView:
    __slots__ = ("base_offset", "last_offset", "data", "batch_offsets", "batch_last_offsets", "positions", "max_timestamps", "to_end", "start", "stands_for")

    def __init__(self, base_offset: int, data: bytes | memoryview, to_end: bool = True, start: int = 0):
        """`to_end`: the view reaches the end of its segment (a whole segment, or a byte
        range up to the segment's footer): past its last batch the segment holds no more
        batches, only offsets compaction removed (up to the segment's last offset).
        `start`: where `data` begins in the segment's object (a byte range's first byte)."""
        self.base_offset = base_offset
        self.to_end = to_end
        self.start = start
        # (size, last offset) of the committed segment this view was made for: a merge or a
        # compaction (by this broker or another) commits another segment under the same
        # base offset, and a view of the one before must not stand for it (reader.py).
        self.stands_for: tuple[int, int] | None = None
        self.data = memoryview(data)
        self.batch_offsets = offsets = array("q")
        self.batch_last_offsets = lasts = array("q")
        self.positions = positions = array("q")
        self.max_timestamps = stamps = array("q")
        for pos, base, last, max_ts, _count in records.batch_spans(self.data):
            offsets.append(base)
            lasts.append(last)
            positions.append(pos)
            stamps.append(max_ts)
        self.last_offset = lasts[-1] if lasts else base_offset - 1

    @property
    def nbytes(self) -> int:
        """Memory held: the segment's bytes (the buffer viewed is exactly these: a flushed or
        merged body, or a stored segment object less its header and footer) and the table."""
        return len(self.data) + VIEW_OVERHEAD_BYTES + BATCH_TABLE_BYTES * len(self.positions)

    def batch_index(self, offset: int) -> int:
        """Index of the batch holding `offset`, or of the first batch after it when `offset`
        is in a gap (offsets compaction removed: inside a batch, between batches, before the
        first); len(positions) when no batch of the view ends at or after `offset`."""
        i = bisect.bisect_right(self.batch_offsets, offset) - 1
        if i < 0:
            return 0
        if self.batch_last_offsets[i] < offset:
            return i + 1
        return i

    def read(self, offset: int, max_bytes: int, at_least_one: bool) -> memoryview:
        """Whole batches from the one holding `offset`, up to max_bytes (KIP-74: the first
        batch is returned whole even when larger, if `at_least_one`)."""
        i = self.batch_index(offset)
        if i >= len(self.positions):
            return self.data[0:0]
        start = self.positions[i]
        end = start
        for j in range(i, len(self.positions)):
            nxt = self.positions[j + 1] if j + 1 < len(self.positions) else len(self.data)
            if nxt - start > max_bytes and not (at_least_one and j == i):
                break
            end = nxt
        return self.data[start:end]


class SegmentCache:
    def __init__(self, max_bytes: int, held_outside: Callable[[], int] | None = None):
        self.max_bytes = max_bytes
        self.held_outside = held_outside  # bytes of segment data outside the cache, in its budget
        self.arriving = 0  # bytes of segments being loaded into it, in its budget from the start
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._views: OrderedDict[tuple, SegmentView] = OrderedDict()
        # The keys cached for each (topic, partition), the first two parts of a key: dropping
        # a partition's views (each load of a partition does) looks at its own keys, not at
        # every view (at 1,024 partitions the scans were 5% of a broker's time).
        self._by_partition: dict[tuple, set[tuple]] = {}

    def contains(self, key: tuple) -> bool:
        """Membership without touching LRU order or hit counters."""
        return key in self._views

    def get(self, key: tuple) -> SegmentView | None:
        view = self._views.get(key)
        if view is None:
            self.misses += 1
            return None
        self.hits += 1
        self._views.move_to_end(key)
        return view

    def put(self, key: tuple, view: SegmentView) -> None:
        old = self._views.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        self._views[key] = view
        group = self._by_partition.get(key[:2])
        if group is None:
            group = self._by_partition[key[:2]] = set()
        group.add(key)
        self.bytes += view.nbytes
        self.give_way()

    def give_way(self) -> None:
        """Evict the oldest views until they and the data held outside fit the budget (on
        each put, and as soon as the broker takes in more request memory)."""
        # (the newest view stays even over the budget: a fetch of it would otherwise read
        # the whole segment again from the store each time)
        limit = self.max_bytes - self.arriving - (self.held_outside() if self.held_outside is not None else 0)
        while self.bytes > limit and len(self._views) > 1:
            key, evicted = self._views.popitem(last=False)
            self.bytes -= evicted.nbytes
            self._unindex(key)

    def drop(self, key: tuple) -> None:
        old = self._views.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
            self._unindex(key)

    def _unindex(self, key: tuple) -> None:
        group = self._by_partition.get(key[:2])
        if group is not None:
            group.discard(key)
            if not group:
                del self._by_partition[key[:2]]

    def drop_prefix(self, prefix: tuple) -> None:
        if len(prefix) == 2:
            doomed = list(self._by_partition.get(prefix, ()))
        elif len(prefix) == 1:
            doomed = [k for group, keys in self._by_partition.items() if group[:1] == prefix for k in keys]
        else:
            doomed = [k for k in self._views if k[: len(prefix)] == prefix]
        for key in doomed:
            self.drop(key)
