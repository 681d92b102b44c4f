"""How long the embedded metadata store's commit thread is held by a merge's swap (#33).

    PYTHONPATH=src .venv/bin/python bench/bench_sqlite_swap.py [--keys 750] [--rounds 6]

A merge replaces N small segments by one: one SQLite transaction deleting N segment keys
and writing one. SqliteKV runs it on its commit thread, which every flush's commit (and, for
a small flush, its segment write) queues behind; that thread takes the GIL back after each
SQLite statement, and while the event loop is busy each of those waits up to the switch
interval. Here the loop is kept busy in 4 ms slices (as a loaded broker's is) while the swap
commits; prints each round's commit time in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time

from kafscale.metadata.kv import Txn
from kafscale.metadata.sqlite import SqliteKV


async def run(keys: int, rounds: int) -> list[float]:
    sys.setswitchinterval(0.0005)  # as the broker sets it (cli/main.py)
    d = tempfile.mkdtemp(prefix="bench-sqlite-swap-")
    kv = SqliteKV(d + "/m.sqlite")
    loop = asyncio.get_running_loop()
    stop = False

    def busy() -> None:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.004:
            pass
        if not stop:
            loop.call_soon(busy)

    loop.call_soon(busy)
    times = []
    try:
        for _ in range(rounds):
            await kv.commit(Txn(puts=[(f"/seg/{i:020d}", b"x" * 200) for i in range(keys)]))
            t = time.perf_counter()
            await kv.commit(Txn(puts=[("/merged", b"y" * 200)], deletes=[f"/seg/{i:020d}" for i in range(keys)]))
            times.append((time.perf_counter() - t) * 1e3)
    finally:
        stop = True
        await kv.close()
        shutil.rmtree(d, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=750, help="segment keys the swap deletes")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    times = asyncio.run(run(args.keys, args.rounds))
    print(f"swap deleting {args.keys} keys, ms per round:", ", ".join(f"{t:.1f}" for t in times))


if __name__ == "__main__":
    main()
