"""The floor under the embedded default's produce latency: its durable steps alone (#33).

    .venv/bin/python bench/bench_fsync_floor.py [--rate 360] [--seconds 8] [--bytes 8192] [--dir DIR] [--parallel] [--merge-mib 4] [--checkpoint-between 500]

What a small flush of the local directory and SQLite must do before a produce is
acknowledged (storage/local_store.py, metadata/sqlite.py), with no broker around it: a temp
file written and fsynced, renamed to its key (no replace), the directory fsynced, then one
SQLite transaction (WAL, synchronous=FULL). Requests arrive at a steady `--rate` a second, each for
the next of `--partitions` directories (the paced phase of bench/run.py had ~250-360 flushes
a second); a round serves every request that has arrived, a segment per partition then one
commit, on one thread as the broker's commit thread does (`--parallel`: the segments side by
side). Prints each step's latency and each request's from its arrival (queueing included)
to its commit: what a producer would wait for if the broker's own work cost nothing. An
in-memory peer waits for none of it. `--merge-mib` adds a merger's rewrite beside the
flushes; `--checkpoint-between` moves SQLite's checkpoints out of the commits. `--dir` should sit on the file system of the broker's data directory.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from kafscale.metadata import sqlite as sqlite_kv  # noqa: E402
from kafscale.metadata.kv import Txn  # noqa: E402
from kafscale.storage import local_store  # noqa: E402  (the merger's writes go through its own code)

STEPS = ["open + write", "fsync file", "rename (or link)", "fsync directory", "SQLite commit"]


def pct(values: list[float], q: float) -> float:  # nearest rank
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] if ordered else float("nan")


_dir_fds: dict[str, int] = {}  # the partition directories' kept descriptors, as the store keeps them


def write_segment(root: str, partition: int, seq: int, body: bytes) -> list[int]:
    """One partition's segment, as the local directory writes it (names relative to the
    directory's kept descriptor, renameat2 NOREPLACE where libc has it); each step's ns."""
    d = f"{root}/p{partition}"
    dfd = _dir_fds.get(d)
    if dfd is None:
        dfd = _dir_fds[d] = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    t0 = time.perf_counter_ns()
    tmp = f".tmp-{seq}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
    os.writev(fd, [body])
    t1 = time.perf_counter_ns()
    os.fsync(fd)
    os.close(fd)
    t2 = time.perf_counter_ns()
    if local_store._renameat2 is not None:
        if local_store._renameat2(dfd, tmp.encode(), dfd, f"{seq:020d}.kfs".encode(), local_store._RENAME_NOREPLACE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
    else:
        os.link(tmp, f"{seq:020d}.kfs", src_dir_fd=dfd, dst_dir_fd=dfd)
        os.unlink(tmp, dir_fd=dfd)
    t3 = time.perf_counter_ns()
    os.fsync(dfd)
    t4 = time.perf_counter_ns()
    return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]


_versions: dict[int, int] = {}  # each partition's state key's version: the compare holds


def commit(db: sqlite3.Connection, partitions: dict[int, int]) -> int:
    """One transaction for the flushes of a round (the broker's group commit): a segment key
    and the partition's state per partition, each partition's one guarded statement
    (metadata/sqlite.py), alone in autocommit when the round has one partition; its ns."""
    t0 = time.perf_counter_ns()
    statements = [
        sqlite_kv._guarded_puts(Txn(compares=[(f"p{p}/state", _versions.get(p, 0))], puts=[(f"p{p}/state", b"y" * 80), (f"p{p}/{seq:020d}", b"x" * 120)]))
        for p, seq in partitions.items()
    ]
    for p in partitions:
        _versions[p] = _versions.get(p, 0) + 1
    if len(statements) == 1:
        assert db.execute(*statements[0]).rowcount == 2
    else:
        db.execute("BEGIN IMMEDIATE")
        for statement in statements:
            db.execute(*statement)
        db.execute("COMMIT")
    return time.perf_counter_ns() - t0


def merge_writer(root: str, args, stop: threading.Event, written: list) -> None:
    """A merger's rewrite beside the flushes: a --merge-mib object created every
    --merge-every-ms by the local directory's own code (storage/local_store.py: temp file,
    written a piece at a time unless --merge-write-back-kib 0, fsync, link, directory fsync)."""
    store = local_store.LocalObjectStore(f"{root}/merged")
    body = os.urandom(args.merge_mib * 1024 * 1024)
    seq = 0
    while not stop.wait(args.merge_every_ms / 1000):
        t0 = time.perf_counter()
        path = store._create_sync(f"m/{seq:020d}", [body])
        store._sync_dirs([path])
        written.append((time.perf_counter() - t0) * 1e3)
        os.unlink(path)
        seq += 1


def run(args) -> None:
    root = tempfile.mkdtemp(prefix="fsync-floor-", dir=args.dir)
    for p in range(args.partitions):
        os.mkdir(f"{root}/p{p}")
    db = sqlite3.connect(f"{root}/meta.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL)")
    stop, merges, checkpoints = threading.Event(), [], []
    if args.checkpoint_between:
        # SQLite's own checkpoint runs inside the COMMIT that crosses wal_autocheckpoint pages;
        # as metadata/sqlite.py does, it runs between rounds instead, when no request waits
        # (and SQLite's own only past 4,096 pages).
        db.execute("PRAGMA wal_autocheckpoint=4096")
    last_checkpoint = time.perf_counter()
    n = int(args.rate * args.seconds)
    interval = 1.0 / args.rate
    body = os.urandom(args.bytes)
    steps: list[list[float]] = [[] for _ in STEPS]
    pool = ThreadPoolExecutor(args.partitions) if args.parallel else None
    rounds, sojourn = [], []
    if args.merge_write_back_kib >= 0:
        local_store.WRITE_BACK_BYTES = args.merge_write_back_kib * 1024
    merger = threading.Thread(target=merge_writer, args=(root, args, stop, merges), daemon=True) if args.merge_mib else None
    if merger is not None:
        merger.start()
    start = time.perf_counter()
    nxt = 0  # the next arrival not yet served
    while nxt < n:
        # Requests arrive at the steady rate, each for the next partition in turn; a round
        # serves every one that has arrived: a segment per partition, then one commit.
        now = time.perf_counter()
        due_next = start + nxt * interval
        if due_next > now:
            time.sleep(due_next - now)
            now = time.perf_counter()
        upto = min(n, int((now - start) / interval) + 1)
        began = time.perf_counter()
        touched = {i % args.partitions: i for i in range(nxt, upto)}
        if pool is None:
            written = [write_segment(root, p, seq, body) for p, seq in touched.items()]
        else:
            written = list(pool.map(lambda ps: write_segment(root, ps[0], ps[1], body), touched.items()))
        for w in written:
            for k, ns in enumerate(w):
                steps[k].append(ns / 1e6)
        steps[-1].append(commit(db, touched) / 1e6)
        ended = time.perf_counter()
        if args.checkpoint_between and ended - last_checkpoint >= args.checkpoint_between / 1000 and start + upto * interval > ended:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            last_checkpoint = time.perf_counter()
            checkpoints.append((last_checkpoint - ended) * 1e3)
        rounds.append((ended - began) * 1e3)
        sojourn += [(ended - (start + i * interval)) * 1e3 for i in range(nxt, upto)]
        nxt = upto
    elapsed = time.perf_counter() - start
    stop.set()
    if checkpoints:
        print(f"SQLite checkpoints between rounds, at most every {args.checkpoint_between:g} ms: {len(checkpoints)}, "
              f"p50 {pct(checkpoints, 50):.1f} ms, max {max(checkpoints):.1f} ms")
    if merger is not None:
        stop.set()
        merger.join()
        piece = local_store.WRITE_BACK_BYTES if local_store._write_back else 0
        print(f"beside them: {len(merges)} rewrites of {args.merge_mib} MiB, "
              f"{f'sent to disk {piece // 1024} KiB at a time' if piece else 'one write'} before the fsync, "
              f"p50 {pct(merges, 50):.1f} ms, max {max(merges, default=0):.1f} ms")
    db.close()
    if pool is not None:
        pool.shutdown()
    print(f"{'side by side' if args.parallel else 'one after another'}: {n} arrivals at {args.rate:g}/s over {args.partitions} directories, {len(rounds)} rounds "
          f"({n / len(rounds):.2f} arrivals a round), {args.bytes} B a segment, {elapsed:.1f} s, in {root}")
    print(f"{'step (ms)':<36}{'p50':>8}{'p90':>8}{'p99':>8}{'p99.9':>8}{'max':>8}{'mean':>8}")
    rows = list(zip(STEPS, steps)) + [("round: all steps", rounds), ("arrival -> committed (queueing too)", sojourn)]
    for name, vals in rows:
        print(f"{name:<36}" + "".join(f"{x:8.2f}" for x in (pct(vals, 50), pct(vals, 90), pct(vals, 99), pct(vals, 99.9), max(vals), statistics.fmean(vals))))
    if not args.keep:
        for p in range(args.partitions):
            d = f"{root}/p{p}"
            for f in os.listdir(d):
                os.unlink(f"{d}/{f}")
            os.rmdir(d)
        if merger is not None:
            shutil.rmtree(f"{root}/merged")
        for f in os.listdir(root):
            os.unlink(f"{root}/{f}")
        os.rmdir(root)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=360.0, help="flushes a second (default 360)")
    ap.add_argument("--seconds", type=float, default=8.0, help="how long (default 8)")
    ap.add_argument("--bytes", type=int, default=8192, help="bytes a flush writes (default 8192)")
    ap.add_argument("--partitions", type=int, default=4, help="directories written in turn (default 4)")
    ap.add_argument("--dir", default=str(REPO), help="where the temp directory goes (default: the repository's file system)")
    ap.add_argument("--repeat", type=int, default=1, help="runs, one after another (default 1)")
    ap.add_argument("--parallel", action="store_true", help="write a round's segments side by side, a thread each (default: one after another, as the broker's commit thread)")
    ap.add_argument("--merge-mib", type=int, default=0, help="a merger's rewrite beside the flushes: MiB a file (default 0: none)")
    ap.add_argument("--merge-every-ms", type=float, default=300.0, help="how often the rewrite starts (default 300)")
    ap.add_argument("--merge-write-back-kib", type=int, default=-1, help="the rewrite sent to disk N KiB at a time before its fsync (default: storage/local_store.py's WRITE_BACK_BYTES; 0: in one write)")
    ap.add_argument("--checkpoint-between", type=float, default=0, metavar="MS", help="SQLite's WAL checkpoints between rounds when no request waits, at most every MS, as metadata/sqlite.py (default 0: SQLite's automatic one, inside a commit)")
    ap.add_argument("--keep", action="store_true", help="leave the files")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for _ in range(args.repeat):
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
