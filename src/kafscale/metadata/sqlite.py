"""The embedded backend of the KV contract (kv.py): one SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from kafscale.metadata.kv import KV, KeyValue, Txn


class SqliteKV(KV):
    """Embedded backend: one SQLite file in the data dir, in WAL mode.

    `synchronous=FULL`: every commit fsyncs the WAL before it returns, so what a commit
    says (a segment committed, hence a produce acknowledged) survives power loss, not only
    a process crash (NORMAL would sync at checkpoints only). Calls are short and run inline
    on the event loop.
    """

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
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
