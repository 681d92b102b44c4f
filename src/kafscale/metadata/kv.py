"""The transactional key-value contract under the MetadataStore.

Backends implement five calls with etcd's semantics (a key's `version` is 0 when absent
and grows by one on each write); the typed MetadataStore above builds every change as one
`txn` (with compare conditions where it writes back what it read), so embedded (SQLite)
and etcd behave alike.
"""

from __future__ import annotations

import abc
import asyncio
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path


class MetadataUnavailable(IOError):
    """The metadata backend cannot be reached; callers answer a retriable Kafka error."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    version: int


@dataclass(slots=True)
class Txn:
    """Applied atomically if every compare holds: key's current version == expected."""

    compares: list[tuple[str, int]] = field(default_factory=list)
    puts: list[tuple[str, bytes]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    delete_prefixes: list[str] = field(default_factory=list)
    # Puts tied to a lease (etcd): deleted when the lease ends. Backends without leases
    # (embedded: one broker, nothing to fence) store them as plain puts.
    leased_puts: list[tuple[str, bytes]] = field(default_factory=list)
    lease: int = 0


class KV(abc.ABC):
    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def range(self, prefix: str) -> list[KeyValue]:
        """Every key starting with prefix, sorted by key."""

    @abc.abstractmethod
    async def commit(self, txn: Txn) -> bool:
        """Apply txn atomically; False (and nothing applied) if a compare failed."""

    async def read_all(self) -> tuple[int, list[KeyValue]]:
        """(revision, every key of this store sorted by key) in ONE consistent read: what a
        metadata snapshot holds. The revision is the backend's (etcd's store revision; 0 on
        SQLite, which has none) and only labels the snapshot."""
        return 0, await self.range("")

    async def close(self) -> None:
        pass

    async def check(self) -> None:
        """Raise MetadataUnavailable when the backend is unreachable."""
        await self.get("/__health__")


class SqliteKV(KV):
    """Embedded backend: one SQLite file in the data dir, in WAL mode.

    `synchronous=NORMAL` in WAL mode survives a process crash (kill -9) without an fsync
    per commit; calls are short and run inline on the event loop.
    """

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL)")
        self._lock = asyncio.Lock()

    async def get(self, key: str) -> KeyValue | None:
        row = self._db.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return KeyValue(key, bytes(row[0]), row[1]) if row else None

    async def range(self, prefix: str) -> list[KeyValue]:
        # One SELECT is one read transaction: consistent across keys (read_all relies on it).
        rows = self._db.execute(
            "SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key",
            (prefix, prefix + "\U0010ffff"),
        ).fetchall()
        return [KeyValue(k, bytes(v), ver) for k, v, ver in rows]

    async def commit(self, txn: Txn) -> bool:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for key, expected in txn.compares:
                row = db.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
                if (row[0] if row else 0) != expected:
                    db.execute("ROLLBACK")
                    return False
            for prefix in txn.delete_prefixes:
                db.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (prefix, prefix + "\U0010ffff"))
            for key in txn.deletes:
                db.execute("DELETE FROM kv WHERE key = ?", (key,))
            for key, value in txn.puts + txn.leased_puts:
                db.execute(
                    "INSERT INTO kv (key, value, version) VALUES (?, ?, 1) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = kv.version + 1",
                    (key, value),
                )
            db.execute("COMMIT")
            return True
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        self._db.close()


def open_kv(url: str | None, data_dir: str | Path, prefix: str = "/kafscale") -> KV:
    """KV backend for a `--metadata` URL: None/`embedded` (SQLite in data dir) or `etcd://...`."""
    if url and url.startswith("etcd://"):
        from kafscale.metadata.etcd import EtcdKV

        return EtcdKV.from_url(url, prefix=prefix)
    if url and url.startswith("sqlite://"):
        return SqliteKV(url[len("sqlite://") :])
    if url not in (None, "", "embedded"):
        raise ValueError(f"unsupported metadata URL {url!r} (use embedded or etcd://host:port)")
    return SqliteKV(Path(data_dir) / "metadata.sqlite")
