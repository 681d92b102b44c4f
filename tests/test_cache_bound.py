"""--cache-bytes is the ceiling of what the segment cache holds, batch tables included.

Segments of one-record batches of 100 bytes are the worst case: as lists of Python ints
the batch table cost about as much as the bytes themselves, uncounted, so the cache held
nearly twice its budget. Measured with tracemalloc on real views of real batches.
"""

from __future__ import annotations

import tracemalloc

from kafscale.protocol.records import build_batch
from kafscale.storage.cache import SegmentCache, SegmentView

MiB = 1024 * 1024


def tiny_batch_segment(base: int, batches: int) -> bytes:
    return b"".join(build_batch([(None, b"v" * 100)], base_offset=base + i) for i in range(batches))


def test_cache_of_tiny_batches_stays_within_its_budget():
    budget = 4 * MiB
    segments = [tiny_batch_segment(i * 2000, 2000) for i in range(40)]  # 40 x 340 KB: 3x the budget
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = SegmentCache(budget)
        for i, seg in enumerate(segments):
            # The view's bytes are a copy made for the cache (as a flush's joined body is).
            cache.put(("t", 0, i * 2000), SegmentView(i * 2000, bytes(bytearray(seg))))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.bytes <= budget
    # Within 5% of the budget: what the cache counts is what it holds.
    assert held <= budget * 1.05, f"cache holds {held / MiB:.2f} MiB for a budget of {budget / MiB:.0f} MiB"
    view = cache.get(("t", 0, 39 * 2000))
    assert view is not None and view.read(39 * 2000 + 5, 1000, True)  # the table still finds batches
