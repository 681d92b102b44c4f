"""Metadata snapshots: one consistent read of the whole metadata store, kept as an object.

A snapshot holds every key of the store (topics, partitions and segment lists, groups and
committed offsets, producer-id blocks, transactions, ACLs, SCRAM credentials, quotas) as
one read at one revision (`KV.read_all`), except the lease-bound keys (/brokers/,
/owners/: they belong to live processes and mean nothing after a loss).

Object: `{namespace}/~metadata/snapshot-{id}.kms` in the data store, or in the separate
store of `--metadata-backup`. Kafka topic names are [a-zA-Z0-9._-] only, so no topic's
objects can ever be under `~metadata/`. The id is the UTC creation time and the writer,
`20261128T001500123Z-1`, so key order is time order.

    header (48 bytes, big-endian)
      magic "KMSN" | format version u16 | flags u16 (1: body is zstd) | created ms i64 |
      revision i64 | writer broker i32 (-1: the CLI) | key count i32 | body length i64 |
      CRC32C of the body u32 | CRC32C of the header before this field u32
    body: zstd of, per key in key order, key length u32 | key (UTF-8) | value length u32 | value

Both checksums are checked on load: a damaged or truncated snapshot is detected, reported,
and the next older one used (`SnapshotStore.load_newest`).
"""

from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import cramjam

from kafscale.metadata import keys
from kafscale.metadata.kv import KV
from kafscale.protocol.records import crc32c
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.backup")

MAGIC = b"KMSN"
FORMAT_VERSION = 1
FLAG_ZSTD = 1
HEADER = struct.Struct(">4sHHqqiiqII")
HEADER_SIZE = HEADER.size
_LEN = struct.Struct(">I")
SNAPSHOT_DIR = "~metadata"
SUFFIX = ".kms"
CLI_WRITER = -1

# Keys bound to a live process's etcd lease: never in a snapshot, never restored.
LEASE_BOUND = (keys.BROKERS, keys.OWNERS)

assert HEADER_SIZE == 48


class SnapshotCorrupt(ValueError):
    """The object is not a whole, undamaged snapshot."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    id: str
    created_ms: int
    revision: int
    writer: int
    key_count: int
    size: int  # bytes of the object

    @property
    def created_iso(self) -> str:
        return datetime.fromtimestamp(self.created_ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class Snapshot:
    info: SnapshotInfo
    entries: list[tuple[str, bytes]] = field(default_factory=list)  # (key, value), key order


def snapshot_prefix(namespace: str) -> str:
    return f"{namespace}/{SNAPSHOT_DIR}/"


def snapshot_key(namespace: str, snapshot_id: str) -> str:
    return f"{snapshot_prefix(namespace)}snapshot-{snapshot_id}{SUFFIX}"


def snapshot_id_of(key: str) -> str | None:
    name = key.rsplit("/", 1)[-1]
    if not (name.startswith("snapshot-") and name.endswith(SUFFIX)):
        return None
    return name[len("snapshot-") : -len(SUFFIX)]


def new_id(created_ms: int, writer: int) -> str:
    stamp = datetime.fromtimestamp(created_ms / 1000, timezone.utc).strftime("%Y%m%dT%H%M%S") + f"{created_ms % 1000:03d}Z"
    return f"{stamp}-{'cli' if writer == CLI_WRITER else writer}"


def is_lease_bound(key: str) -> bool:
    return key.startswith(LEASE_BOUND)


def encode(entries: list[tuple[str, bytes]], *, created_ms: int, revision: int, writer: int) -> bytes:
    parts = []
    for key, value in entries:
        raw = key.encode()
        parts += [_LEN.pack(len(raw)), raw, _LEN.pack(len(value)), value]
    body = bytes(cramjam.zstd.compress(b"".join(parts), level=3))
    head = HEADER.pack(MAGIC, FORMAT_VERSION, FLAG_ZSTD, created_ms, revision, writer, len(entries), len(body), crc32c(body), 0)
    head = head[:-4] + struct.pack(">I", crc32c(head[:-4]))
    return head + body


def decode_header(data, snapshot_id: str = "?") -> tuple[SnapshotInfo, int, int]:
    """(info, body length, body CRC) from the first HEADER_SIZE bytes."""
    if len(data) < HEADER_SIZE:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: {len(data)} bytes is too short for a header")
    magic, version, _flags, created, revision, writer, count, body_len, body_crc, head_crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: bad magic {magic!r}")
    if crc32c(bytes(data[: HEADER_SIZE - 4])) != head_crc:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: header checksum does not match")
    if version != FORMAT_VERSION:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: unsupported format version {version}")
    return SnapshotInfo(snapshot_id, created, revision, writer, count, HEADER_SIZE + body_len), body_len, body_crc


def decode(data, snapshot_id: str = "?") -> Snapshot:
    info, body_len, body_crc = decode_header(data, snapshot_id)
    body = memoryview(data)[HEADER_SIZE:]
    if len(body) != body_len:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: body is {len(body)} bytes, the header says {body_len} (truncated?)")
    if crc32c(body) != body_crc:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: body checksum does not match")
    try:
        raw = memoryview(bytes(cramjam.zstd.decompress(bytes(body))))
    except Exception as e:  # noqa: BLE001 - cramjam's DecompressionError and friends
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: body does not decompress: {e}") from e
    entries, pos = [], 0
    try:
        while pos < len(raw):
            (n,) = _LEN.unpack_from(raw, pos)
            key = bytes(raw[pos + 4 : pos + 4 + n]).decode()
            pos += 4 + n
            (n,) = _LEN.unpack_from(raw, pos)
            value = bytes(raw[pos + 4 : pos + 4 + n])
            if len(value) != n:
                raise SnapshotCorrupt(f"snapshot {snapshot_id}: entry of key {key!r} is cut short")
            pos += 4 + n
            entries.append((key, value))
    except (struct.error, UnicodeDecodeError) as e:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: malformed body: {e}") from e
    if len(entries) != info.key_count:
        raise SnapshotCorrupt(f"snapshot {snapshot_id}: {len(entries)} keys, the header says {info.key_count}")
    return Snapshot(info, entries)


class SnapshotStore:
    """The snapshots of one namespace in one object store."""

    def __init__(self, store: ObjectStore, namespace: str):
        self.store = store
        self.namespace = namespace

    async def take(self, kv: KV, writer: int) -> SnapshotInfo:
        """Read the whole metadata store once and write it as a new snapshot."""
        revision, kvs = await kv.read_all()
        created_ms = int(time.time() * 1000)
        entries = [(e.key, e.value) for e in kvs if not is_lease_bound(e.key)]
        data = encode(entries, created_ms=created_ms, revision=revision, writer=writer)
        snapshot_id = new_id(created_ms, writer)
        await self.store.put(snapshot_key(self.namespace, snapshot_id), [data])
        return SnapshotInfo(snapshot_id, created_ms, revision, writer, len(entries), len(data))

    async def ids(self) -> list[str]:
        """Every snapshot id, oldest first."""
        return sorted(i for k in await self.store.list(snapshot_prefix(self.namespace)) if (i := snapshot_id_of(k)) is not None)

    async def list(self) -> list[SnapshotInfo | str]:
        """Each snapshot's info, oldest first; for one whose header is damaged, a line saying so."""
        ids = await self.ids()
        heads = await self.store.get_many([(snapshot_key(self.namespace, i), (0, HEADER_SIZE)) for i in ids])
        out: list[SnapshotInfo | str] = []
        for snapshot_id, head in zip(ids, heads):
            if head is None:
                continue  # pruned meanwhile
            try:
                out.append(decode_header(head, snapshot_id)[0])
            except SnapshotCorrupt as e:
                out.append(str(e))
        return out

    async def load(self, snapshot_id: str) -> Snapshot:
        """Raises ObjectNotFound or SnapshotCorrupt."""
        return decode(await self.store.get(snapshot_key(self.namespace, snapshot_id)), snapshot_id)

    async def load_newest(self, problems: list[str]) -> Snapshot | None:
        """The newest snapshot that loads; each one skipped (damaged) is added to `problems`."""
        for snapshot_id in reversed(await self.ids()):
            try:
                return await self.load(snapshot_id)
            except ObjectNotFound:
                continue
            except SnapshotCorrupt as e:
                problems.append(f"{e}; using an older snapshot")
                log.warning("%s; using an older snapshot", e)
        return None

    async def newest_ms(self) -> int | None:
        """Creation time of the newest snapshot (from its id), None when there is none."""
        ids = await self.ids()
        return created_ms_of(ids[-1]) if ids else None

    async def prune(self, keep: int) -> list[str]:
        """Delete all but the newest `keep` snapshots; returns the ids deleted."""
        ids = await self.ids()
        doomed = ids[: max(0, len(ids) - max(1, keep))]
        if doomed:
            await self.store.delete([snapshot_key(self.namespace, i) for i in doomed])
        return doomed


def created_ms_of(snapshot_id: str) -> int | None:
    try:
        stamp = snapshot_id.split("-", 1)[0]
        dt = datetime.strptime(stamp[:15], "%Y%m%dT%H%M%S").replace(tzinfo=timezone.utc)
        return int(dt.timestamp()) * 1000 + int(stamp[15:18])
    except (ValueError, IndexError):
        return None
