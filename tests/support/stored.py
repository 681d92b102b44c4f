"""What a file object store holds of one partition, wherever its data lives: the
partition's own segment objects (`{namespace}/{topic}/{partition}/segment-{base}.kfs`) and
its pieces in write-ahead objects (`{namespace}/~wal/*.wal`, storage/write_ahead.py), each
piece a whole spec segment, byte-exact. For tests that look at what the broker stored
(codecs kept, sizes, segment counts) under either layout (--write-ahead-objects)."""

from __future__ import annotations

import struct
from pathlib import Path

from kafscale.storage import write_ahead

_FOOTER_LAST = struct.Struct(">q")  # a segment's last offset: 12 bytes before its end


def stored_segments(data_dir: str, topic: str, partition: int = 0, namespace: str = "default") -> list[tuple[int, bytes]]:
    """(base offset, spec segment bytes) of every segment of the partition, by offset: its
    own objects, and the write-ahead pieces no own object covers yet (a rewrite in between
    keeps both in the store for a while, the piece superseded)."""
    root = Path(data_dir) / "objects" / namespace
    pieces: list[tuple[int, int, bytes]] = []
    # the write-ahead objects first: a piece rewritten meanwhile is then found in its segment
    for f in sorted((root / write_ahead.WAL_DIR).glob("*.wal")):
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            continue  # deleted meanwhile (its pieces were rewritten first)
        _created, index = write_ahead.decode(data)
        pieces += [(pc.base_offset, pc.last_offset, data[pc.position : pc.position + pc.length])
                   for pc in index if pc.topic == topic and pc.partition == partition]
    own: list[tuple[int, int, bytes]] = []
    for f in (root / topic / str(partition)).glob("segment-*.kfs"):
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            continue  # merged away meanwhile
        (last,) = _FOOTER_LAST.unpack_from(data, len(data) - 12)
        own.append((int(f.stem.split("-", 1)[1]), last, data))
    uncovered = [p for p in pieces if not any(b <= p[0] <= last for b, last, _d in own)]
    return [(base, data) for base, _last, data in sorted(own + uncovered)]


def stored_bytes(data_dir: str, topic: str, partition: int = 0) -> int:
    """Bytes of the partition's segments wherever they live (what DescribeLogDirs reports)."""
    return sum(len(data) for _base, data in stored_segments(data_dir, topic, partition))
