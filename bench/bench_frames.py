"""Broker CPU per byte of large Produce requests (#33), without a producer's CPU in the way.

    .venv/bin/python bench/bench_frames.py --tree base=/tmp/base/src --tree this=src --repeat 6

The single librdkafka producer of bench/run.py (1 KiB lz4, 4 partitions) sends requests of
70-430 KB: some carry one partition's batch (the segment cache then keeps a view of the
frame), others a batch for each of the 4. Here a raw client sends the same shapes, built
once before the clock starts, to a fresh embedded broker (`kafscale broker`, a file store
and SQLite under a temporary directory), acks=all with `--in-flight` requests outstanding,
and checks every answer. It prints the broker's CPU (utime + stime of every thread, from
/proc) and minor page faults over the `--requests` requests, per MB produced, and its peak
RSS (VmHWM). With several
`--tree`s each repeat runs each tree in turn (the order flips every repeat), then the
medians: a busy machine moves the figures by tens of percent between runs, less between
neighbours.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

from kafscale.protocol.records import build_batch  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.raw import RawClient, decode_response, error_code, produce_frame  # noqa: E402

PRODUCE = 0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def batch(nbytes: int, seed: int) -> bytes:
    """A batch of about `nbytes` of 1 KiB records (random values: as opaque as lz4 output)."""
    rng = os.urandom(nbytes + 1024)
    values = [rng[i : i + 1000] for i in range(0, nbytes - 1000, 1000)]
    return build_batch([(None, v) for v in values], timestamp=int(time.time() * 1000) + seed)


def frames(topic: str, n: int, one_partition_bytes: int, four_partition_bytes: int) -> list[bytes]:
    """Alternately a frame of one partition's batch and one of a batch for each of 4."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(produce_frame(topic, {i // 2 % 4: batch(one_partition_bytes, i)}, i))
        else:
            out.append(produce_frame(topic, {p: batch(four_partition_bytes // 4, i) for p in range(4)}, i))
    return out


def proc_stat(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / CLK_TCK, int(x[7])


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def run_once(src: str, args) -> dict:
    topic = "frames"
    bp = BrokerProcess(extra_args=["--auto-create-topics", "true", "--default-partitions", "4"], env={"PYTHONPATH": src})
    bp.start()
    try:
        with RawClient(bp.bootstrap) as c:  # auto-creates the topic
            assert error_code(c.metadata([topic]).topics[0].error_code) == 0
        with socket.create_connection(("127.0.0.1", bp.port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            warm = frames(topic, 4, 64 * 1024, 64 * 1024)  # warms the code
            todo = frames(topic, args.requests, args.one_partition_kb * 1024, args.four_partitions_kb * 1024)
            for fr in warm:
                s.sendall(fr)
                check(s)
            spy = None
            if args.py_spy:  # samples of every thread, C frames included, for the timed requests
                import subprocess

                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--native", "-r", "200", "-f", "raw", "-o", args.py_spy, "-p", str(bp.proc.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                time.sleep(1)
            cpu0, faults0 = proc_stat(bp.proc.pid)
            started = time.perf_counter()
            sent = answered = 0
            while answered < len(todo):
                while sent < len(todo) and sent - answered < args.in_flight:
                    s.sendall(todo[sent])
                    sent += 1
                check(s)
                answered += 1
            wall = time.perf_counter() - started
            cpu1, faults1 = proc_stat(bp.proc.pid)
            with open(f"/proc/{bp.proc.pid}/status") as f:
                peak_mib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
        mb = sum(len(f) for f in todo) / 1e6
        return {"mb": mb, "cpu_s": cpu1 - cpu0, "faults": faults1 - faults0, "wall_s": wall, "peak_mib": peak_mib}
    finally:
        bp.stop()


def check(s: socket.socket) -> None:
    (n,) = struct.unpack(">i", recv_exact(s, 4))
    _cid, resp = decode_response(PRODUCE, 9, recv_exact(s, n))
    for t in resp.responses:
        for p in t.partition_responses:
            if error_code(p.error_code) != 0:
                raise RuntimeError(f"partition {p.index}: error {error_code(p.error_code)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], help="name=path of a src/ to run the broker from (default: this one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--in-flight", type=int, default=5, help="requests outstanding (librdkafka's default)")
    ap.add_argument("--one-partition-kb", type=int, default=420)
    ap.add_argument("--four-partitions-kb", type=int, default=200)
    ap.add_argument("--py-spy", metavar="FILE", help="py-spy the broker during the timed requests into FILE (raw collapsed stacks; the figures are then off)")
    args = ap.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(REPO / "src")]]
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for rnd in range(args.repeat):
        for name, src in trees if rnd % 2 == 0 else trees[::-1]:
            r = run_once(src, args)
            results[name].append(r)
            print(f"round {rnd + 1} {name}: {r['mb']:.1f} MB, broker CPU {r['cpu_s']:.2f} s ({r['cpu_s'] / r['mb'] * 1000:.2f} ms/MB), "
                  f"{r['faults']} page faults ({r['faults'] / r['mb']:.0f}/MB), {r['mb'] / r['wall_s']:.0f} MB/s, peak RSS {r['peak_mib']:.0f} MiB, load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nmedians of {args.repeat}:")
    for name, rs in results.items():
        print(f"  {name}: broker CPU {statistics.median(r['cpu_s'] / r['mb'] * 1000 for r in rs):.2f} ms/MB, "
              f"page faults {statistics.median(r['faults'] / r['mb'] for r in rs):.0f}/MB, {statistics.median(r['mb'] / r['wall_s'] for r in rs):.0f} MB/s, peak RSS {statistics.median(r['peak_mib'] for r in rs):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
