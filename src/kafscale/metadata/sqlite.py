"""The embedded backend of the KV contract (kv.py): one SQLite file."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kafscale.metadata.kv import KV, BeforeCommitFailed, KeyValue, Txn


log = logging.getLogger(__name__)

_KEYS_PER_SELECT = 500  # below SQLite's limit of bound parameters per statement (999 before 3.32)
_ROWS_PER_INSERT = 400  # two parameters a row
_CHECKPOINT_EVERY_S = 0.5  # a checkpoint between groups at most this often
_WAL_BOUND_PAGES = 4096  # SQLite's own checkpoint, inside a commit, only past 16 MiB of WAL
_COMPARES_PER_STATEMENT = 50  # a transaction guarded by more goes statement by statement
_STEPS_BESIDE = 8  # `before` steps run at once (partitions flushing at once), beside the writer thread


def _guarded_puts(txn: Txn) -> tuple[str, list] | None:
    """A transaction of puts of distinct keys guarded by compares (a segment's commit, an
    offset commit) as one statement and its parameters: the rows are written only if every
    compare holds, and the statement's row count says whether they were (0: a compare
    failed). None for any other transaction (deletes, a key twice, more rows than a
    statement takes): it goes statement by statement (_apply)."""
    puts = txn.puts + txn.leased_puts if txn.leased_puts else txn.puts
    if not puts or txn.deletes or txn.delete_prefixes or len(puts) > _ROWS_PER_INSERT or len(txn.compares) > _COMPARES_PER_STATEMENT:
        return None
    if len(puts) > 1 and len({key for key, _ in puts}) < len(puts):
        return None  # a key twice: the second write's version follows the first's
    guard = " AND ".join(["COALESCE((SELECT version FROM kv WHERE key = ?), 0) = ?"] * len(txn.compares)) or "1"
    # The guard reads the table the statement writes: SQLite evaluates the rows to insert
    # (and so the guard) in full before it writes any.
    # (It starts with INSERT: Python's sqlite3 gives a row count only to statements that do.)
    sql = (
        f"INSERT INTO kv (key, value, version) SELECT column1, column2, 1 FROM (VALUES {','.join(['(?, ?)'] * len(puts))}) "
        f"WHERE {guard} ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = kv.version + 1"
    )
    return sql, [v for kv in puts for v in kv] + [v for cmp in txn.compares for v in cmp]


def _run_guarded(db: sqlite3.Connection, guarded: tuple[str, list]):
    """True (written), False (a compare failed) or the exception it raised (this txn's
    failure, not its group's)."""
    try:
        return db.execute(*guarded).rowcount > 0
    except Exception as e:  # noqa: BLE001
        return e


class SqliteKV(KV):
    """Embedded backend: one SQLite file in the data dir, in WAL mode.

    `synchronous=FULL`: every commit fsyncs the WAL before it returns, so what a commit
    says (a segment committed, hence a produce acknowledged) survives power loss, not only
    a process crash (NORMAL would sync at checkpoints only).

    Reads are short and run inline on the event loop. Commits run on a writer thread with
    a connection of their own, so the loop does not stand still for the fsync, and as a
    group commit: the transactions that arrive while one commit is on disk go together in
    the next, each in a savepoint of its own (a failed compare undoes only its own), with
    one COMMIT and one fsync for all (the partitions flushing at once share it).
    """

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL)")
        self._writer = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._writer.execute("PRAGMA synchronous=FULL")  # a per-connection setting
        # SQLite checkpoints the WAL inside the COMMIT that takes it past wal_autocheckpoint
        # pages (1,000): a write of the database file and its fsync about every second at the
        # paced rate, inside a commit that the flushes of its group (and those queued behind
        # it) waited for. The checkpoint runs between groups instead, when none is queued
        # (_group_done); SQLite's own only past a bound, for a queue that never empties (#33).
        # On this connection, with no other writer: it completes, so the WAL starts over at
        # its beginning and stays small (a checkpoint beside the commits on a connection of
        # its own never caught up, and the WAL grew by 2 MiB a second).
        self._writer.execute(f"PRAGMA wal_autocheckpoint={_WAL_BOUND_PAGES}")
        self._closed = False
        self._last_checkpoint = time.monotonic()
        self.checkpoints = 0  # checkpoints run between groups
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-commit")
        self._beside = ThreadPoolExecutor(_STEPS_BESIDE, thread_name_prefix="sqlite-step")
        self._queued: list[tuple[Txn, asyncio.Future, object]] = []  # (txn, its future, its `before` step: running (a Future), to run, or None)
        self._committing = False

    async def get(self, key: str) -> KeyValue | None:
        row = self._db.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return KeyValue(key, bytes(row[0]), row[1]) if row else None

    async def get_many(self, keys: list[str]) -> list[KeyValue | None]:
        found: dict[str, KeyValue] = {}
        for i in range(0, len(keys), _KEYS_PER_SELECT):
            chunk = keys[i : i + _KEYS_PER_SELECT]
            rows = self._db.execute(f"SELECT key, value, version FROM kv WHERE key IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            found.update((k, KeyValue(k, bytes(v), ver)) for k, v, ver in rows)
        return [found.get(k) for k in keys]

    async def range(self, prefix: str) -> list[KeyValue]:
        # One SELECT is one read transaction: consistent across keys (read_all relies on it).
        rows = self._db.execute(
            "SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key",
            (prefix, prefix + "\U0010ffff"),
        ).fetchall()
        return [KeyValue(k, bytes(v), ver) for k, v, ver in rows]

    async def commit(self, txn: Txn) -> bool:
        return await self._enqueue(txn, None)

    async def commit_after(self, before, txn: Txn) -> bool:
        """`before` starts at once, on the writer thread when it is idle, else on a step
        thread; the txn joins the writer thread's next group, whose COMMIT waits for it to
        end (kv.py's contract): the step does not wait for the group before it (_enqueue)."""
        return await self._enqueue(txn, before)

    async def _enqueue(self, txn: Txn, before) -> bool:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        # With a group on the writer thread, the step (a flush's file write and fsyncs)
        # starts now, on a thread of its own, not when its group reaches the writer thread:
        # it runs while the group before commits, and the writer thread only waits for it to
        # end before its COMMIT. Queued behind a group of steps and a commit, a flush waited
        # about half a group for nothing (#33). With the writer thread idle, its group
        # starts now: the step runs there, first, with no thread hop of its own.
        step = self._beside.submit(before) if before is not None and self._committing else before
        self._queued.append((txn, done, step))
        if not self._committing:
            self._start_group(loop)
        return await done

    def _start_group(self, loop: asyncio.AbstractEventLoop) -> None:
        group, self._queued = self._queued, []
        self._committing = True
        work = self._thread.submit(self._commit_group, [(txn, step) for txn, _, step in group])
        work.add_done_callback(lambda w: self._hand_back(loop, group, w))

    def _hand_back(self, loop: asyncio.AbstractEventLoop, group: list, work) -> None:
        try:
            loop.call_soon_threadsafe(self._group_done, loop, group, work)
        except RuntimeError:  # the loop is closed: nobody waits for these any more
            self._committing = False

    def _group_done(self, loop: asyncio.AbstractEventLoop, group: list, work) -> None:
        self._committing = False
        try:
            results = work.result()
        except BaseException as e:  # noqa: BLE001 - the whole group's outcome
            results = [e] * len(group)
        for (_, done, _step), result in zip(group, results):
            if done.done():
                continue
            if isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(result)
        if self._queued:
            self._start_group(loop)
        elif not self._closed and time.monotonic() - self._last_checkpoint >= _CHECKPOINT_EVERY_S:
            self._last_checkpoint = time.monotonic()
            self._thread.submit(self._checkpoint)  # a group queued meanwhile runs after it

    def _checkpoint(self) -> None:
        """On the writer thread, between groups: copy what the WAL holds into the database
        file (PASSIVE: readers are not waited for; frames a reader still needs stay for the
        next one)."""
        try:
            self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as e:  # tried again after a later group
            log.warning("SQLite checkpoint failed: %s", e)

    def _commit_group(self, txns: list[tuple[Txn, object]]) -> list:
        """On the writer thread: each txn's outcome (True, False for a failed compare, or
        the exception it raised), all made durable by one COMMIT. Each txn's `before` step
        (a future of one already running, or the group's first, run here) has ended before
        the COMMIT that makes its txn durable; a txn whose step raised is left out
        (BeforeCommitFailed)."""
        db = self._writer
        outcomes: list = [None] * len(txns)
        # The steps (started when their txns were queued, _enqueue) run side by side: the
        # fsyncs of partitions flushing at once wait for the file system's journal together,
        # where one after another each waited for a journal commit of its own (on a busy
        # disk a round of four took 10 ms p50 against 2.6 ms side by side,
        # bench/bench_fsync_floor.py --parallel, #33). All have ended before the COMMIT.
        for i, (_txn, step) in enumerate(txns):
            if step is None:
                continue
            try:
                step.result() if isinstance(step, Future) else step()  # running on a step thread, or to run here
            except Exception as e:  # noqa: BLE001 - this txn's step, not the group's
                outcomes[i] = BeforeCommitFailed(e)
        pending = [i for i, outcome in enumerate(outcomes) if outcome is None]
        guarded = {i: _guarded_puts(txns[i][0]) for i in pending}
        if len(pending) == 1 and guarded[pending[0]] is not None:
            # One statement, its own transaction (autocommit), durable when it returns:
            # a flush's commit was six statements (BEGIN, SAVEPOINT, the compare, the
            # puts, RELEASE, COMMIT), and the writer thread takes the GIL back after each,
            # waiting up to the switch interval while the event loop is busy (#33).
            outcomes[pending[0]] = _run_guarded(db, guarded[pending[0]])
            return outcomes
        db.execute("BEGIN IMMEDIATE")
        try:
            for i in pending:
                txn = txns[i][0]
                if guarded[i] is not None:
                    # one statement: it applies all of its rows or none (SQLite undoes a
                    # failed statement's changes), so it needs no savepoint of its own
                    outcomes[i] = _run_guarded(db, guarded[i])
                    continue
                db.execute("SAVEPOINT txn")
                try:
                    ok = self._apply(db, txn)
                except Exception as e:  # noqa: BLE001 - this txn's failure, not the group's
                    ok = e
                if ok is not True:
                    db.execute("ROLLBACK TO txn")
                db.execute("RELEASE txn")
                outcomes[i] = ok
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return outcomes

    @staticmethod
    def _apply(db: sqlite3.Connection, txn: Txn) -> bool:
        for key, expected in txn.compares:
            row = db.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
            if (row[0] if row else 0) != expected:
                return False
        for prefix in txn.delete_prefixes:
            db.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (prefix, prefix + "\U0010ffff"))
        # Many keys a statement, not one: the writer thread takes the GIL back after every
        # statement, and with the event loop busy each of those waits up to the switch
        # interval. A merge's swap deleting 750 segment keys one by one held the commit thread
        # 260-790 ms (every flush queued behind it); chunked, a few statements (#33).
        deletes = txn.deletes
        for i in range(0, len(deletes), _KEYS_PER_SELECT):
            chunk = deletes[i : i + _KEYS_PER_SELECT]
            db.execute(f"DELETE FROM kv WHERE key IN ({','.join('?' * len(chunk))})", chunk)
        puts = txn.puts + txn.leased_puts
        for i in range(0, len(puts), _ROWS_PER_INSERT):
            chunk = puts[i : i + _ROWS_PER_INSERT]
            # Rows of one statement are applied in order: a key twice gets version 2, as two
            # statements gave it.
            db.execute(
                f"INSERT INTO kv (key, value, version) VALUES {','.join(['(?, ?, 1)'] * len(chunk))} "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = kv.version + 1",
                [v for kv in chunk for v in kv],
            )
        return True

    async def close(self) -> None:
        self._closed = True  # a group answered after this starts no checkpoint
        self._thread.shutdown(wait=True)  # commits under way end first
        self._beside.shutdown(wait=True)
        self._writer.close()
        self._db.close()
