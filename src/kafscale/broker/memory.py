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

* `FramePool`: the buffers of large request frames, used again once nothing refers to them
  (#33). A fresh frame of a few hundred KiB is a fresh mapping (`map_large_blocks`): its
  pages fault in as the socket writes them and are unmapped when the frame is freed, which
  under a single producer of ~400 KB requests was about as much CPU as reading the bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import time
from collections import deque

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


# A bytearray of n bytes left as malloc gives them (bytearray(n) zero-fills them, touching
# every page before the socket writes them again).
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_new_bytearray.restype = ctypes.py_object

# Resizing a bytearray without filling the new bytes (the recv that follows writes them):
# bytearray.extend would need a zero-filled temporary and copy it. realloc moves a mapped
# block with mremap (no copy), and a size between half its allocation and all of it changes
# nothing but the length.
_resize_bytearray = ctypes.pythonapi.PyByteArray_Resize
_resize_bytearray.argtypes = (ctypes.py_object, ctypes.c_ssize_t)
_resize_bytearray.restype = ctypes.c_int  # errors (BufferError while a view exists) are raised


def uninitialized_bytearray(nbytes: int) -> bytearray:
    """A bytearray whose bytes are whatever the allocator left: every one must be written
    before it is read (a frame is dispatched once the socket wrote all its bytes)."""
    return _new_bytearray(None, nbytes)


def resize_bytearray(buf: bytearray, nbytes: int) -> None:
    """Set `buf`'s length; new bytes are not filled. `buf` must have no views."""
    _resize_bytearray(buf, nbytes)


FRAME_POOL_BYTES = 16 * 1024 * 1024
FRAME_POOL_BUFFERS = 32
# A free buffer serves a frame it holds with at most 1/FRAME_POOL_SLACK of it left over. A
# one-batch segment is cached as a view of its frame only if the batch fills 7/8 of the
# frame's allocation (storage/reader.py): more slack would have such frames copied.
FRAME_POOL_SLACK = 8


class FramePool:
    """Buffers for large request frames (up to `max_frame` bytes), each lent to one frame and
    taken back once nothing refers to it any more: the produce path keeps a frame (views of
    its batches) until its flush is written and cached, or longer when the cache keeps a view
    of it, so the pool does not get frames back, it sees when a lent buffer is only its own
    (its reference count). A buffer lent longest that is still in use is forgotten when room
    is needed: its holder frees it as any other bytearray.

    At most `max_bytes` (allocated sizes) and `max_buffers` are tracked, lent or free. Free
    ones stay resident until `release_idle` sees a second without a frame; `free_bytes` is
    theirs, counted in the segment cache's budget by the broker (broker/app.py) as lent ones
    are through their requests' reservations. Used from the event loop's thread only."""

    def __init__(self, max_frame: int, max_bytes: int = FRAME_POOL_BYTES, max_buffers: int = FRAME_POOL_BUFFERS):
        self.max_frame, self.max_bytes, self.max_buffers = max_frame, max_bytes, max_buffers
        self._free: list[bytearray] = []
        self._lent: deque[bytearray] = deque()
        self.free_bytes = 0  # allocated bytes of the free buffers
        self.reused = 0  # frames served by a buffer used before (counted for tests and benchmarks)
        self._taken_since_idle_check = 0

    def take(self, nbytes: int) -> bytearray:
        """A bytearray of `nbytes` whose contents are undefined (see uninitialized_bytearray)."""
        self._taken_since_idle_check += 1
        if nbytes > self.max_frame:
            return uninitialized_bytearray(nbytes)
        self._reclaim()
        buf = self._fitting_free(nbytes)
        if buf is not None:
            resize_bytearray(buf, nbytes)
            self.reused += 1
        else:
            buf = uninitialized_bytearray(nbytes)
        if self._make_room(buf.__alloc__()):
            self._lent.append(buf)
        return buf

    @property
    def tracked_bytes(self) -> int:
        """Allocated bytes of the buffers free and lent (summed: a holder may resize one)."""
        return sum(buf.__alloc__() for buf in self._free) + sum(buf.__alloc__() for buf in self._lent)

    def release_idle(self) -> None:
        """Free the idle buffers if no frame was taken since the last call (the server's
        housekeeping calls it every second). Lent buffers nothing refers to any more count
        as free first: only `take` looked for them, so while frames stayed under the direct
        read size (a paced producer) they stayed resident, counted nowhere (10-20 MiB over
        a 64 MiB cache's target, docs/performance.md "Memory on S3")."""
        self._reclaim()
        if not self._taken_since_idle_check:
            self._free.clear()
            self.free_bytes = 0
        self._taken_since_idle_check = 0

    def _reclaim(self) -> None:
        """Lent buffers nothing else refers to any more become free. Every view of a
        bytearray (a memoryview, a buffer export in C) holds a reference to it too."""
        lent = self._lent
        for _ in range(len(lent)):
            buf = lent.popleft()
            if _references(buf) == _REFERENCES_WHEN_ALONE:
                self._free.append(buf)
                self.free_bytes += buf.__alloc__()
            else:
                lent.append(buf)

    def _fitting_free(self, nbytes: int) -> bytearray | None:
        """The free buffer that serves `nbytes` best: the smallest that holds it with little
        left over, else the largest smaller mapped one (it grows in place with mremap: its
        pages stay, only the new ones fault in; a block from the heap would be copied)."""
        best, best_size, smaller, smaller_size = -1, 0, -1, MMAP_THRESHOLD - 1
        most = nbytes + 1 + nbytes // FRAME_POOL_SLACK
        for i, buf in enumerate(self._free):
            size = buf.__alloc__()
            if nbytes < size <= most:
                if best < 0 or size < best_size:
                    best, best_size = i, size
            elif smaller_size < size <= nbytes:
                smaller, smaller_size = i, size
        i = best if best >= 0 else smaller
        if i < 0:
            return None
        buf = self._free.pop(i)
        self.free_bytes -= buf.__alloc__()
        return buf

    def _make_room(self, size: int) -> bool:
        """Whether a buffer of `size` may be tracked, after freeing free buffers and
        forgetting the longest lent ones to make room for it."""
        if size > self.max_bytes:
            return False
        tracked = self.tracked_bytes
        while tracked + size > self.max_bytes or len(self._free) + len(self._lent) >= self.max_buffers:
            if self._free:
                dropped = self._free.pop(0).__alloc__()
                self.free_bytes -= dropped
            else:
                dropped = self._lent.popleft().__alloc__()
            tracked -= dropped
        return True


def _references(buf: bytearray) -> int:
    return sys.getrefcount(buf)


def _references_when_alone() -> int:
    """What `_references` says of a buffer held by nothing but the caller's local variable,
    asked as `FramePool._reclaim` asks (3.11 counts the local, the parameter and
    getrefcount's argument; later interpreters may skip some of these)."""
    lent = deque([bytearray(1)])
    buf = lent.popleft()
    return _references(buf)


_REFERENCES_WHEN_ALONE = _references_when_alone()
