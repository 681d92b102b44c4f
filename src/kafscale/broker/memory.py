"""Keeping the broker's resident memory close to what it actually holds (glibc malloc).

Measured with bench/bench_rss.py (10 MB/s produce+consume, --cache-bytes 32 MiB): Python
itself held about 60 MiB (tracemalloc), yet RSS was 130-170 MiB under load and grew further
once idle (the merger's transient buffers). The difference is memory malloc keeps after it
is freed: request frames, segment bodies and object reads of a few hundred KiB to a few MiB
come and go, and glibc keeps the freed space in its heaps (one per thread that allocated,
up to 8 per core: the object store's worker threads each get one) instead of returning it.

* `limit_arenas()`: at most two malloc heaps. The worker threads then share one instead of
  each keeping its own high-water mark (about 25-60 MiB less under that load).
* `trim()`: `malloc_trim(0)` returns the free pages of every heap to the OS. Run every
  second by the server's housekeeping. With the default 256 MiB cache, 3 minutes at
  10 MB/s: RSS 411-427 MiB under load and 420 MiB idle before; after, mostly 313-322 MiB
  (37 MiB of interpreter + the full cache + 20-30 MiB), 354-381 MiB at moments when the
  merger rewrites segments, and 315 MiB idle.

Both do nothing where glibc is not the C library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("kafscale.memory")

M_ARENA_MAX = -8  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
ARENA_MAX = 2
MMAP_THRESHOLD = 256 * 1024


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def limit_arenas(arenas: int = ARENA_MAX) -> bool:
    """Cap the number of malloc heaps (like MALLOC_ARENA_MAX); best before threads start."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_ARENA_MAX, arenas))


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of `threshold` bytes and more get their own mapping, unmapped when freed (like
    MALLOC_MMAP_THRESHOLD_). glibc's default threshold rises to the largest block freed (up
    to 32 MiB), after which request frames, segment bodies and responses of 1-4 MiB are cut
    from the heap, whose freed space stays resident until the next trim."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, threshold))


def trim() -> float:
    """Give free heap pages back to the OS; returns the seconds it took (0 without glibc)."""
    if _LIBC is None:
        return 0.0
    started = time.perf_counter()
    _LIBC.malloc_trim(0)
    return time.perf_counter() - started
