"""A member joining a busy group: how long until every partition is owned again, and how
much the other members read meanwhile, for the classic protocol's eager rebalance (range),
its cooperative one (cooperative-sticky) and KIP-848's consumer protocol (group.protocol=
consumer, the broker's uniform assignor).

    .venv/bin/python bench/bench_rebalance.py [--members 20] [--partitions 200] [--rate 2000]
                                              [--heartbeat-ms 1000] [--rounds 2]

One embedded broker (fresh process), one topic of `--partitions`, a producer thread at a
steady `--rate` records/s spread over every partition, and `--members` confluent-kafka
consumers, each a thread of this process, in one group. Once every member holds its share
(partitions counted from the members' assignment callbacks) and reads, one more member
joins. Measured from its subscribe() until the callbacks say every partition is owned
again and the joiner holds its share (all members within one partition of each other);
and the records the other members read in that time, against what they read in as long a
window just before the join. Both protocols heartbeat every `--heartbeat-ms` (the classic
clients' heartbeat.interval.ms, the broker's group.consumer.heartbeat.interval.ms): a
rebalance starts at a heartbeat in both. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import BrokerProcess  # noqa: E402

MODES = {
    "classic eager (range)": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "classic cooperative (cooperative-sticky)": {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"},
    "consumer (KIP-848, uniform)": {"group.protocol": "consumer"},
}


class Owners:
    """Who holds what (from the assignment callbacks) and when each member read how much."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.lock = threading.Lock()
        self.owner: dict[int, str] = {}
        self.reads: dict[str, list[tuple[float, int]]] = {}  # member -> (time, records) per batch
        self.changed_at = time.monotonic()

    def assigned(self, name: str, parts) -> None:
        with self.lock:
            for p in parts:
                self.owner[p.partition] = name
            self.changed_at = time.monotonic()

    def released(self, name: str, parts) -> None:
        with self.lock:
            for p in parts:
                if self.owner.get(p.partition) == name:
                    del self.owner[p.partition]
            self.changed_at = time.monotonic()

    def read(self, name: str, n: int) -> None:
        with self.lock:
            self.reads.setdefault(name, []).append((time.monotonic(), n))

    def balanced(self, members: int) -> float | None:
        """When the last callback ran, if every partition is owned and `members` members
        each hold their share (within one partition of each other); else None."""
        with self.lock:
            counts: dict[str, int] = {}
            for name in self.owner.values():
                counts[name] = counts.get(name, 0) + 1
            if len(self.owner) == self.partitions and len(counts) == members and max(counts.values()) - min(counts.values()) <= 1:
                return self.changed_at
            return None

    def read_between(self, t0: float, t1: float, names) -> int:
        with self.lock:
            return sum(n for name in names for t, n in self.reads.get(name, ()) if t0 <= t <= t1)


def member(name: str, bootstrap: str, group: str, topic: str, conf: dict, owners: Owners, stop: threading.Event,
           subscribed: list[float]) -> None:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name, "auto.offset.reset": "latest",
                  "fetch.wait.max.ms": 100, **conf})
    subscribed.append(time.monotonic())
    c.subscribe([topic], on_assign=lambda _c, ps: owners.assigned(name, ps), on_revoke=lambda _c, ps: owners.released(name, ps),
                on_lost=lambda _c, ps: owners.released(name, ps))
    try:
        while not stop.is_set():
            got = sum(1 for m in c.consume(500, 0.1) if m.error() is None)
            if got:
                owners.read(name, got)
    finally:
        c.close()


def producing(bootstrap: str, topic: str, partitions: int, rate: int, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    start, i = time.monotonic(), 0
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        while i < due:
            try:
                p.produce(topic, value=b"x" * 100, partition=i % partitions)
            except BufferError:
                break
            i += 1
        p.poll(0.01)
    p.flush(10)


def wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def run_mode(bootstrap: str, topic: str, args, mode: str) -> dict:
    base = dict(MODES[mode])
    if base["group.protocol"] == "classic":
        base |= {"heartbeat.interval.ms": args.heartbeat_ms, "session.timeout.ms": max(10_000, 3 * args.heartbeat_ms)}
    owners, stop = Owners(args.partitions), threading.Event()
    group = f"bench-rebalance-{uuid.uuid4().hex[:8]}"
    threads: list[threading.Thread] = []

    def start(name: str) -> list[float]:
        subscribed: list[float] = []
        t = threading.Thread(target=member, args=(name, bootstrap, group, topic, base, owners, stop, subscribed), daemon=True)
        threads.append(t)
        t.start()
        return subscribed

    try:
        names = [f"m{i:02d}" for i in range(args.members)]
        for name in names:
            start(name)
        wait(lambda: owners.balanced(args.members), 300, f"{args.members} members holding {args.partitions} partitions")
        # steady: no assignment change for 3 heartbeats, every member reading
        wait(lambda: time.monotonic() - owners.changed_at > 3 * args.heartbeat_ms / 1000 and owners.balanced(args.members)
             and all(owners.read_between(time.monotonic() - 1.0, time.monotonic(), [n]) for n in names), 120,
             "a steady group")
        subscribed = start("joiner")
        wait(lambda: subscribed, 10, "the joiner's subscribe")
        t0 = subscribed[0]
        done = wait(lambda: (lambda at: at if at is not None and at > t0 else None)(owners.balanced(args.members + 1)), 300,
                    "every partition owned again with the joiner holding its share")
        elapsed = done - t0
        time.sleep(0.5)  # (reads up to `done` recorded)
        during = owners.read_between(t0, done, names)
        before = owners.read_between(t0 - elapsed, t0, names)
        return {"seconds": elapsed, "during": during, "before": before}
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--rate", type=int, default=2000, help="records/s produced (100 B each)")
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="0,1,2",
                    help="which modes, by index: 0 eager, 1 cooperative, 2 consumer")
    args = ap.parse_args()
    from confluent_kafka.admin import AdminClient, NewTopic

    modes = [list(MODES)[int(i)] for i in args.modes.split(",")]
    hb = str(args.heartbeat_ms)
    broker = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0", "--group-consumer-heartbeat-interval-ms", hb,
                                       "--group-consumer-min-heartbeat-interval-ms", hb]).start()
    stop = threading.Event()
    try:
        topic = f"bench-rebalance-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(60)
        producer = threading.Thread(target=producing, args=(broker.bootstrap, topic, args.partitions, args.rate, stop), daemon=True)
        producer.start()
        print(f"{args.members} members + 1 joining, {args.partitions} partitions, {args.rate} records/s produced, "
              f"heartbeat {args.heartbeat_ms} ms; load: {uptime()}", flush=True)
        print(f"{'mode':42} {'round':>5} {'join->owned s':>14} {'read by the others':>19} {'same window before':>19}", flush=True)
        for r in range(args.rounds):
            for mode in modes:
                res = run_mode(broker.bootstrap, topic, args, mode)
                print(f"{mode:42} {r + 1:>5} {res['seconds']:>14.2f} {res['during']:>19} {res['before']:>19}", flush=True)
        print(f"load at the end: {uptime()}")
    finally:
        stop.set()
        broker.stop()


if __name__ == "__main__":
    main()
