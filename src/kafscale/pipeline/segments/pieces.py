"""Segments that live in write-ahead objects, read as if they were segment objects.

With `--write-ahead-objects` a broker commits a flush's segments as pieces of one shared
object (storage/write_ahead.py): each piece is a whole spec segment at the byte range
[`wao_position`, `wao_position` + `size`) of the object `wao_key`, as the partition's
committed segment list in the metadata store says (metadata/segments.py SegmentInfo). The
broker rewrites them into `segment-*.kfs` objects later (`--segment-max-age-ms`).

This reader names such a piece by a *piece key*, `{object key}@{position}+{size}.kfs`, lists
it beside the partition's segment objects, and reads through `PieceStore`, which turns a read
of a piece key into the ranged read of its object. Everything downstream (footers, planning,
ranged and whole reads with their checks, transaction outcomes, timestamps) treats a piece as
a segment object of `size` bytes.

Which pieces are read: only those a partition's committed segment list in the metadata store
names. A write-ahead object whose commit never happened (uploaded, then a failed commit or a
kill -9 before the metadata transaction) is named by no partition, so it yields no record.
Without a metadata store (option `metadata` none, or S3 storage without it) there is no such
list: the reader sees segment objects only, and data still in write-ahead objects shows up
once the broker has rewritten it.

Where a segment object and a piece hold the same offsets (the rewrite committed between the
metadata read and the listing: the metadata is read first, so nothing falls between), a
piece at the base offset of a segment object is left out of the listing (the rewrite puts a
run of pieces under its first base offset), and planning's cover reads any offset once;
their batches are byte-identical anyway. A piece
whose object the cleanup deleted since is re-planned from the listing like a merged-away
segment: the rewrite committed its segment object before the object became deletable.
"""

from __future__ import annotations

import re

from kafscale.metadata.segments import SegmentInfo
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore, ObjectStoreError

_PIECE_KEY = re.compile(r"(.+\.wal)@([0-9]+)\+([0-9]+)\.kfs")


def piece_key(seg: SegmentInfo) -> str:
    """The piece key of a committed segment held in a write-ahead object."""
    return f"{seg.wao_key}@{seg.wao_position}+{seg.size}.kfs"


def parse_piece_key(key: str) -> tuple[str, int, int] | None:
    """(object key, position, size) of a piece key; None for any other key."""
    m = _PIECE_KEY.fullmatch(key)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


class PieceStore(ObjectStore):
    """The store the pipeline reads through: piece keys read their byte range of the
    write-ahead object, every other key goes to the store it wraps. Read-only for pieces."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # a backend's own extras (the S3 store's create_bucket)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        piece = parse_piece_key(key)
        if piece is None:
            return await self.inner.get(key, start, end)
        wao, pos, size = piece
        end = size if end is None else min(end, size)
        if start >= end:
            return b""
        data = await self.inner.get(wao, pos + start, pos + end)
        if len(data) != end - start:
            raise ObjectNotFound(f"{key}: the write-ahead object ends before the piece (got {len(data)} of {end - start} bytes)")
        return data

    async def get_many(self, requests: list[tuple[str, tuple[int, int] | None]], concurrency: int = 32) -> list[bytes | None]:
        mapped: list[tuple[str, tuple[int, int] | None]] = []
        for key, rng in requests:
            piece = parse_piece_key(key)
            if piece is None:
                mapped.append((key, rng))
            else:
                wao, pos, size = piece
                start, end = rng if rng is not None else (0, size)
                mapped.append((wao, (pos + start, pos + min(end, size))))
        return await self.inner.get_many(mapped, concurrency)

    async def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        piece = parse_piece_key(key)
        if piece is None:
            return await self.inner.get_tail(key, nbytes)
        _wao, _pos, size = piece
        return await self.get(key, max(0, size - nbytes), size), size

    async def get_tails(self, keys: list[str], nbytes: int, concurrency: int = 32) -> list[tuple[bytes, int] | None]:
        plain = [k for k in keys if parse_piece_key(k) is None]
        got = dict(zip(plain, await self.inner.get_tails(plain, nbytes, concurrency))) if plain else {}
        pieces = [k for k in keys if k not in got]
        if pieces:
            got.update(zip(pieces, await super().get_tails(pieces, nbytes, concurrency)))
        return [got[k] for k in keys]

    async def get_with_version(self, key: str) -> tuple[bytes, str]:
        self._refuse_piece(key)
        return await self.inner.get_with_version(key)

    async def list(self, prefix: str) -> list[str]:
        return await self.inner.list(prefix)

    async def list_sizes(self, prefix: str) -> dict[str, int]:
        return await self.inner.list_sizes(prefix)

    async def put(self, key: str, parts: list) -> None:
        self._refuse_piece(key)
        await self.inner.put(key, parts)

    async def create(self, key: str, parts: list) -> None:
        self._refuse_piece(key)
        await self.inner.create(key, parts)

    async def replace(self, key: str, parts: list, expected: str) -> None:
        self._refuse_piece(key)
        await self.inner.replace(key, parts, expected)

    async def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._refuse_piece(key)
        await self.inner.delete(keys)

    async def check(self) -> None:
        await self.inner.check()

    async def close(self) -> None:
        await self.inner.close()

    @staticmethod
    def _refuse_piece(key: str) -> None:
        if parse_piece_key(key) is not None:
            raise ObjectStoreError(f"{key} is a piece of a write-ahead object: it is read, never written")
