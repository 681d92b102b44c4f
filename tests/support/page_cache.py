"""Whether a file's pages are in the page cache (mincore(2)), for tests of the file store's
page-cache advice (storage/local_store.py): an object leaves the page cache once durable."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest


def resident_pages(path) -> int:
    """How many of the file's pages are in the page cache, by mincore(2) over a private
    mapping that touches none of them."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE) as mm:
        start = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert mincore(ctypes.addressof(start), size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            del start
    return sum(v & 1 for v in vec)


def skip_unless_pages_can_be_dropped(directory) -> None:
    """Skip where there is nothing to check: no posix_fadvise or mincore, or a file system
    that keeps pages it is told to drop (tmpfs). A file written and fsynced the plain way in
    `directory` must show cached pages (the check sees them where there are some), and none
    once told to drop them."""
    if not hasattr(os, "posix_fadvise") or not hasattr(mmap, "MAP_PRIVATE"):
        pytest.skip("needs posix_fadvise and mincore")
    probe = Path(directory) / ".page-cache-probe"
    with open(probe, "wb") as f:
        f.write(os.urandom(256 * 1024))
        os.fsync(f.fileno())
    try:
        assert resident_pages(probe) > 0  # written pages stay cached unless dropped
        with open(probe, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        if resident_pages(probe):
            pytest.skip("this file system keeps pages it is told to drop (tmpfs)")
    finally:
        probe.unlink()
