"""Partitions with offset gaps, as compaction leaves them, written straight into a broker's
data directory (metadata store and object store), for the readers' tests.

`gap_batch` encodes a v2 record batch whose records sit at any offsets inside it (a batch
compaction has thinned keeps its base and last offset), with any timestamps, possibly no
record at all (an emptied batch kept for producer state) and possibly Kafka's KIP-534
delete horizon (attributes bit 0x40, base timestamp = the horizon, each record's timestamp
still base + delta). The encoding is done here with struct, independently of the broker's
codec; only segment.encode (the segment file format) and the metadata store are shared.

`GAPPY` is the layout the tests read (offsets 0-34, high watermark 35):

    segment  0- 9: gap 0-1 | batch 2-5 holding 2, 4 | gap 6 | batch 7-8 | gap 9 (trailing)
    segment 10-19: empty batch 10-12 (producer 7001, sequences 0-2) | batch 13-15 with a
                   delete horizon holding 13 (tombstone), 15 | gap 16-19 (trailing)
    segment 20-29: no batch at all (everything compacted away)
    segment 30-34: records 30-34 (the newest segment, never cleaned)

Record `o` has timestamp T0 + 1000 * o; the empty batch's header claims the largest
timestamp of the log (its record with it was removed), so MAX_TIMESTAMP must look further.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import crc32c

from kafscale.metadata.backends import open_kv
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.storage import segment
from kafscale.storage.backends import open_store
from kafscale.storage.local_store import LocalObjectStore

DELETE_HORIZON = 0x40  # KIP-534 attributes bit
PRODUCER_ID = 7001


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes(b: bytes | None) -> bytes:
    return _zigzag(-1) if b is None else _zigzag(len(b)) + b


@dataclass(frozen=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def gap_batch(
    base_offset: int,
    last_offset: int,
    recs: list[Rec],
    *,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A v2 batch covering offsets base..last holding `recs` (at their own offsets)."""
    if base_timestamp is None:
        base_timestamp = recs[0].timestamp if recs else (max_timestamp if max_timestamp is not None else 0)
    if max_timestamp is None:
        max_timestamp = max(r.timestamp for r in recs) if recs else base_timestamp
    body = bytearray()
    for r in recs:
        assert base_offset <= r.offset <= last_offset
        rec = b"\x00" + _zigzag(r.timestamp - base_timestamp) + _zigzag(r.offset - base_offset) + _bytes(r.key) + _bytes(r.value) + _zigzag(0)
        body += _zigzag(len(rec)) + rec
    after_crc = struct.pack(
        ">hiqqqhii", attributes, last_offset - base_offset, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, len(recs)
    ) + bytes(body)
    return struct.pack(">qiib", base_offset, 4 + 1 + 4 + len(after_crc), -1, 2) + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc


@dataclass(frozen=True)
class Seg:
    base: int
    last: int
    batches: list[bytes]
    aborted: tuple = ()  # (producer id, first offset, ABORT marker offset), as a flush records them


def t0() -> int:
    return (int(time.time() * 1000) // 1000 - 3600) * 1000  # an hour ago: no retention, no future check


def ts(t: int, offset: int) -> int:
    return t + 1000 * offset


def gappy_layout(t: int) -> tuple[list[Seg], list[Rec]]:
    """(segments, surviving records) of the layout in the module docstring."""

    def rec(o: int, value: bytes | None = b"") -> Rec:
        return Rec(o, ts(t, o), b"k%d" % o, b"v%d" % o if value == b"" else value)

    a1 = [rec(2), rec(4)]
    a2 = [rec(7), rec(8)]
    horizon = t + 86_400_000 * 2  # the delete horizon: past every record's own time
    b2 = [rec(13, None), rec(15)]
    d = [rec(o) for o in range(30, 35)]
    segs = [
        Seg(0, 9, [gap_batch(2, 5, a1), gap_batch(7, 8, a2)]),
        Seg(10, 19, [
            gap_batch(10, 12, [], base_timestamp=ts(t, 10), max_timestamp=ts(t, 99), producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=0),
            gap_batch(13, 15, b2, base_timestamp=horizon, attributes=DELETE_HORIZON),
        ]),
        Seg(20, 29, []),
        Seg(30, 34, [gap_batch(30, 34, d)]),
    ]
    return segs, a1 + a2 + b2 + d


async def write_partition(data_dir: str | Path, topic: str, partition: int, segs: list[Seg], *, partitions: int = 1, configs: dict | None = None, namespace: str = "default", commit: bool = True, index_interval: int = 1, storage: str | None = None,
                          metadata: str | None = None, metadata_prefix: str = "/kafscale") -> None:
    """Write `segs` as committed segments of a (new or existing) topic in a broker's data dir
    (embedded metadata store, file object store), the way a flush, merge or compaction
    leaves them: each object under its segment key with its index; with commit=False the
    objects only (a crash between upload and commit, which recovery adopts). `storage`: an
    object store URL (the broker's --storage) instead of the data dir's file store;
    `metadata`, `metadata_prefix`: the broker's --metadata (etcd://...) and --metadata-prefix."""
    data_dir = Path(data_dir)
    meta = MetadataStore(open_kv(metadata, data_dir, metadata_prefix) if metadata else SqliteKV(data_dir / "metadata.sqlite"))
    store = open_store(storage) if storage else LocalObjectStore(data_dir / "objects")
    try:
        if await meta.get_topic(topic) is None:
            await meta.create_topic(TopicMeta(topic, partitions, configs=dict(configs or {})))
        st = await meta.get_partition(topic, partition)
        for s in segs:
            enc = segment.encode(s.batches, s.base, last_offset=s.last, index_interval=index_interval, aborted=s.aborted)
            await store.create_many([
                (segment.segment_key(namespace, topic, partition, s.base), enc.parts),
                (segment.index_key(namespace, topic, partition, s.base), [enc.index]),
            ])
            if commit:
                st = await meta.commit_segment(st, enc.info)
                st = await meta.get_partition(topic, partition)
    finally:
        await store.close()
        await meta.close()


def write_partition_sync(*args, **kwargs) -> None:
    asyncio.run(write_partition(*args, **kwargs))
