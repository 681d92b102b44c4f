"""Python allocations of a broker at its peak, for bench/run.py --tracemalloc (not loaded otherwise).

Put on the broker's PYTHONPATH with KAFSCALE_BENCH_TRACEMALLOC=<output file>: a thread takes a
tracemalloc snapshot whenever the traced total has grown by 4 MiB over the last snapshot, and
the last one (the peak) is written 5 s after it was taken and at exit, grouped by the innermost
frame in kafscale's own code, by the innermost frame, and by both. Tracing slows the broker
several times over: use it to see what is held, not for the other figures.
"""

import os

_OUT = os.environ.get("KAFSCALE_BENCH_TRACEMALLOC")

if _OUT:
    import atexit
    import threading
    import tracemalloc

    tracemalloc.start(int(os.environ.get("KAFSCALE_BENCH_TRACEMALLOC_FRAMES", "12")))
    _state = {"snapshot": None, "peak": 0}

    def _watch() -> None:
        import time

        taken = 0.0
        while True:
            time.sleep(0.25)
            current, _ = tracemalloc.get_traced_memory()
            if current >= _state["peak"] + (4 << 20):
                _state["peak"] = current
                _state["snapshot"] = tracemalloc.take_snapshot()
                taken = time.monotonic()
            elif taken and time.monotonic() - taken > 5:
                # No new peak for 5 s: write this one now (a broker stopped with SIGKILL
                # after a slow shutdown never runs its atexit hooks).
                taken = 0.0
                _dump()

    def _where(frame) -> str:
        return f"{'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno}"

    def _ours(tb) -> str:
        # A Traceback runs from the oldest frame kept to the most recent (the allocation).
        for frame in reversed(tb):
            if "/kafscale/" in frame.filename:
                return f"{frame.filename.rsplit('/kafscale/', 1)[1]}:{frame.lineno}"
        return f"(outside kafscale) {_where(tb[-1])}"

    def _dump() -> None:
        snap = _state["snapshot"]
        if snap is None:
            return
        by_ours: dict[str, list[int]] = {}
        by_inner: dict[str, list[int]] = {}
        by_both: dict[str, list[int]] = {}
        total = 0
        for stat in snap.statistics("traceback"):
            total += stat.size
            ours, inner = _ours(stat.traceback), _where(stat.traceback[-1])
            for table, key in ((by_ours, ours), (by_inner, inner), (by_both, f"{inner}  <-  {ours}")):
                row = table.setdefault(key, [0, 0])
                row[0] += stat.size
                row[1] += stat.count
        with open(_OUT, "w") as f:
            f.write(f"traced at the peak snapshot: {total / 2**20:.1f} MiB\n\nby the innermost frame in kafscale:\n")
            for key, (size, count) in sorted(by_ours.items(), key=lambda kv: -kv[1][0])[:40]:
                f.write(f"{size / 2**20:9.2f} MiB {count:9d} blocks  {key}\n")
            for title, table in (("the innermost frame", by_inner), ("the innermost frame and the innermost in kafscale", by_both)):
                f.write(f"\nby {title}:\n")
                for key, (size, count) in sorted(table.items(), key=lambda kv: -kv[1][0])[:40]:
                    f.write(f"{size / 2**20:9.2f} MiB {count:9d} blocks  {key}\n")

    threading.Thread(target=_watch, name="tracemalloc-peak", daemon=True).start()
    atexit.register(_dump)
