"""Broker CPU per Produce request and per tailing Fetch answer for small records (#33).

    .venv/bin/python bench/bench_small_produce.py                       # this checkout's src
    .venv/bin/python bench/bench_small_produce.py --tree base=/tmp/base/src --tree this=src --rounds 5

The shape of bench/run.py's saturated 100 B lz4 case, from raw sockets so that the client
costs nothing to the broker and every run sends the same requests: `--producers`
connections each send `--inflight` Produce v9 requests (acks=-1) at once a step, each carrying one batch of
`--records` x `--size` B records (lz4 by default) for each of `--partitions` partitions,
while a consumer connection keeps one Fetch (v16 by default, by topic id, as librdkafka
2.x asks; max_wait 500 ms, min_bytes 1) waiting at the end of the log, answered by the
flush that makes the step's records durable; the step ends when both producers are
answered and the consumer has caught up. The broker runs as `kafscale broker` (embedded
SQLite, file:// store under `--dir`, /dev/shm by default: the disk is out of the figures,
the syscalls are in).

Prints per round the broker's CPU (utime + stime of every thread, /proc/PID/stat) per step,
per Produce request and per record, and the Produce/Fetch requests and broker-side flushes a
step took. With `--tree`s a broker of each tree is started and the rounds alternate between
them (A/B/A/B in one window); the medians come last.

`--in-process` measures the request path alone, without a socket or a consumer: a `Broker`
started in this process (data on `--dir`), a `KafkaConnection` a producer, each with a
transport that only counts answers; each step feeds `--inflight` Produce frames to every
producer's connection (framing, request memory, task, decode, handler, append, the flush
they wait for, answer, write: everything but the syscalls) and waits for the answers.
`--acks 0`: the requests without their flushes and answers (a timed flush now and then).
Prints the process's CPU per Produce request (every thread) and the event-loop thread's
(time.thread_time). With `--tree`s each round runs every tree in a child process in turn.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from brokers import cpu_seconds  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.raw import RawClient, decode_response, encode_request, frame, req  # noqa: E402

TOPIC = "small-produce"
_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length
_LAST_DELTA = struct.Struct(">i")


def next_offset(records: bytes | None, current: int) -> int:
    """The offset after the last batch of a fetched record set."""
    pos, out = 0, current
    while records is not None and pos + 27 <= len(records):
        base, length = _BATCH_HEAD.unpack_from(records, pos)
        if pos + 12 + length > len(records):
            break  # a partial batch at the end
        (delta,) = _LAST_DELTA.unpack_from(records, pos + 23)
        out = base + delta + 1
        pos += 12 + length
    return out


class Case:
    def __init__(self, args, bootstrap: str):
        self.args = args
        self.producers = [RawClient(bootstrap, client_id=f"producer-{i}") for i in range(args.producers)]
        self.consumer = RawClient(bootstrap, client_id="consumer")
        meta = self.producers[0].metadata([TOPIC])
        self.topic_id = meta.topics[0].topic_id
        self.offsets = [0] * args.partitions
        self.produce_frames = produce_frames(args)
        self.fetches = 0

    def fetch_frame(self) -> bytes:
        v = self.args.fetch_version
        parts = tuple(req(1, v, "FetchPartition", partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1,
                          log_start_offset=-1, partition_max_bytes=1 << 20) for p, o in enumerate(self.offsets))
        topic = req(1, v, "FetchTopic", topic=TOPIC, topic_id=self.topic_id, partitions=parts)
        body = req(1, v, replica_id=-1, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1, max_bytes=50 << 20,
                   isolation_level=0, session_id=0, session_epoch=-1, topics=(topic,), forgotten_topics_data=(), rack_id="")
        return frame(encode_request(1, v, body, 1, "consumer"))

    def read_fetch(self) -> None:
        _, resp = decode_response(1, self.args.fetch_version, self.consumer.recv_frame())
        self.fetches += 1
        for p in resp.responses[0].partitions:
            self.offsets[p.partition_index] = next_offset(p.records, self.offsets[p.partition_index])

    def step(self) -> None:
        """One Produce per producer with a Fetch waiting; ends with the consumer caught up."""
        self.consumer.send_raw(self.fetch_frame())
        inflight = self.args.inflight
        for c, f in zip(self.producers, self.produce_frames):
            c.send_raw(f * inflight)
        for c in self.producers:
            for _ in range(inflight):
                c.recv_frame()
        target = [o + self.args.records * self.args.producers * inflight for o in self.offsets]
        self.read_fetch()
        while self.offsets != target:
            self.consumer.send_raw(self.fetch_frame())
            self.read_fetch()

    def close(self) -> None:
        for c in self.producers + [self.consumer]:
            c.close()


def produce_frames(args) -> list[bytes]:
    """One Produce v9 frame (length prefix included) per producer."""
    from kafscale.protocol import records

    codec = {"none": records.COMPRESSION_NONE, "lz4": records.COMPRESSION_LZ4}[args.compression]
    out = []
    for i in range(args.producers):
        now = int(time.time() * 1000)
        parts = tuple(
            req(0, 9, "PartitionProduceData", index=p, records=records.build_batch(
                [(None, os.urandom(args.size // 2) * 2)] * args.records, timestamp=now, codec=codec))
            for p in range(args.partitions)
        )
        body = req(0, 9, transactional_id=None, acks=args.acks, timeout=datetime.timedelta(seconds=30),
                   topic_data=(req(0, 9, "TopicProduceData", name=TOPIC, partition_data=parts),))
        out.append(frame(encode_request(0, 9, body, 1, f"producer-{i}")))
    return out


class _CountingTransport:
    """What a KafkaConnection writes to: answers counted, nothing sent."""

    def __init__(self, index: int):
        self.peer = ("127.0.0.1", 40000 + index)
        self.answers = 0
        self.waiting: tuple[int, object] | None = None  # (answers awaited, future)

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def writelines(self, buffers) -> None:
        self.answers += len(buffers)  # a Produce answer is one buffer
        if self.waiting is not None and self.answers >= self.waiting[0]:
            self.waiting[1].set_result(None)
            self.waiting = None

    def wait_for(self, answers: int):
        import asyncio

        fut = asyncio.get_running_loop().create_future()
        self.waiting = (answers, fut)
        return fut

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def measure_in_process(args) -> dict:
    import asyncio

    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig
    from kafscale.broker.server import KafkaConnection
    from kafscale.metadata.store import TopicMeta

    data_dir = tempfile.mkdtemp(prefix="bench-small-produce-", dir=args.dir)
    sys.setswitchinterval(0.0005)  # as the broker's __main__ sets it
    broker = Broker(BrokerConfig(listen="127.0.0.1:0", data_dir=data_dir, http="", merge_interval_ms=0, write_ahead_objects=False))
    await broker.start()
    gc.collect()  # as `kafscale broker` does once started (cli/main.py)
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)
    try:
        await broker.metadata.create_topic(TopicMeta(TOPIC, args.partitions))
        frames = [f * args.inflight for f in produce_frames(args)]
        conns = []
        for i in range(args.producers):
            conn, transport = KafkaConnection(broker.server), _CountingTransport(i)
            conn.connection_made(transport)
            conns.append((conn, transport))

        async def step() -> None:
            waits = []
            for (conn, transport), data in zip(conns, frames):
                if args.acks:
                    waits.append(transport.wait_for(transport.answers + args.inflight))
                view = memoryview(data)
                while view:
                    buf = conn.get_buffer(len(view))
                    n = min(len(buf), len(view))
                    buf[:n] = view[:n]
                    del buf
                    conn.buffer_updated(n)
                    view = view[n:]
            await asyncio.gather(*waits)
            while any(conn._pending for conn, _ in conns):  # acks=0: no answer to wait for
                await asyncio.sleep(0)

        for _ in range(args.warmup):
            await step()
        cpu0, main0 = time.process_time(), time.thread_time()
        for _ in range(args.steps):
            await step()
        cpu1, main1 = time.process_time(), time.thread_time()
    finally:
        await broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    requests = args.steps * args.producers * args.inflight
    return {"cpu_us": (cpu1 - cpu0) / requests * 1e6, "main_us": (main1 - main0) / requests * 1e6}


def in_process(args) -> None:
    if not args.tree:
        import uvloop

        r = uvloop.run(measure_in_process(args))
        print(json.dumps(r) if args.json else f"{r['cpu_us']:.1f} us CPU a Produce request, event-loop thread {r['main_us']:.1f}", flush=True)
        return
    print(f"in process, acks={args.acks}: {args.producers} connections x {args.inflight} requests a step x {args.partitions} partitions x "
          f"{args.records} x {args.size} B {args.compression}; {args.steps} steps a round; load {os.getloadavg()[0]:.1f}", flush=True)
    child = [sys.executable, __file__, "--in-process", "--json", "--acks", str(args.acks), "--producers", str(args.producers), "--inflight", str(args.inflight),
             "--partitions", str(args.partitions), "--records", str(args.records), "--size", str(args.size),
             "--compression", args.compression, "--steps", str(args.steps), "--warmup", str(args.warmup), "--dir", args.dir]
    results: dict[str, list[dict]] = {}
    trees = [t.split("=", 1) for t in args.tree]
    for r in range(args.rounds):
        for name, src in trees if r % 2 == 0 else reversed(trees):
            out = subprocess.run(child, env=dict(os.environ, PYTHONPATH=os.path.abspath(src)), check=True, capture_output=True, text=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault(name, []).append(res)
            print(f"round {r + 1} {name:>8}: {res['cpu_us']:6.1f} us CPU a Produce request, event-loop thread {res['main_us']:6.1f}", flush=True)
    # A shared machine slows a round by up to 2x (caches, hyperthreads): the least of many
    # alternating rounds says more than their median there.
    print(f"median of {args.rounds} rounds (load {os.getloadavg()[0]:.1f}):")
    for name, rs in results.items():
        print(f"{name:>8}: {statistics.median(x['cpu_us'] for x in rs):6.1f} us CPU a Produce request, event-loop thread "
              f"{statistics.median(x['main_us'] for x in rs):6.1f}; least of a round {min(x['cpu_us'] for x in rs):6.1f} / "
              f"{min(x['main_us'] for x in rs):6.1f} (event-loop rounds: {', '.join(format(x['main_us'], '.1f') for x in rs)})")


def run(args) -> None:
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(REPO / "src")]]
    brokers, cases = {}, {}
    try:
        for name, src in trees:
            data_dir = tempfile.mkdtemp(prefix=f"bench-small-produce-{name}-", dir=args.dir)
            env = {"PYTHONPATH": str(Path(src).resolve())}
            b = brokers[name] = BrokerProcess(data_dir=data_dir, extra_args=["--default-partitions", str(args.partitions)], env=env).start()
            cases[name] = Case(args, b.bootstrap)
            for _ in range(args.warmup):
                cases[name].step()
        requests = args.producers * args.inflight
        print(f"{args.producers} producers x {args.inflight} requests x {args.partitions} partitions x {args.records} x {args.size} B {args.compression}, "
              f"a Fetch v{args.fetch_version} tailing; {args.steps} steps a round; load {os.getloadavg()[0]:.1f}")
        per: dict[str, list[float]] = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            for name, _ in trees if r % 2 == 0 else reversed(trees):
                case, pid = cases[name], brokers[name].proc.pid
                fetches0 = case.fetches
                before = cpu_seconds(pid)
                for _ in range(args.steps):
                    case.step()
                us = (cpu_seconds(pid) - before) / args.steps * 1e6
                per[name].append(us)
                print(f"round {r + 1} {name:>8}: {us:7.0f} us broker CPU a step, {us / requests:6.0f} a Produce, "
                      f"{us / (requests * args.partitions * args.records) * 1000:6.0f} ns a record; "
                      f"{(case.fetches - fetches0) / args.steps:.2f} Fetch answers a step")
        print(f"median of {args.rounds} rounds, broker CPU us per step ({requests} Produce + the tail's Fetch); load {os.getloadavg()[0]:.1f}:")
        for name, values in per.items():
            m = statistics.median(values)
            print(f"{name:>8}: {m:7.0f} us a step, {m / requests:6.0f} us a Produce, "
                  f"{m / (requests * args.partitions * args.records) * 1000:6.0f} ns a record (rounds: {', '.join(f'{v:.0f}' for v in values)})")
    finally:
        for case in cases.values():
            case.close()
        for b in brokers.values():
            b.stop()
            shutil.rmtree(b.data_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=50, help="records per batch (one batch a partition a request)")
    ap.add_argument("--size", type=int, default=100, help="bytes per record value")
    ap.add_argument("--compression", choices=["none", "lz4"], default="lz4")
    ap.add_argument("--acks", type=int, choices=[-1, 0], default=-1, help="with --in-process: 0 leaves the flushes out (a timed flush every flush interval)")
    ap.add_argument("--inflight", type=int, default=4, help="Produce requests each producer sends at once a step")
    ap.add_argument("--fetch-version", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1000, help="steps a round")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dir", default="/dev/shm", help="where the brokers' data dirs go")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=SRC", help="a checkout's src to run a broker of (repeatable: A/B)")
    ap.add_argument("--in-process", action="store_true", help="the request path alone, in this process (see above)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # an in-process child's answer to its parent
    args = ap.parse_args()
    in_process(args) if args.in_process else run(args)


if __name__ == "__main__":
    main()
