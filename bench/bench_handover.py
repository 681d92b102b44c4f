"""How fast partition ownership moves between brokers sharing etcd.

    .venv/bin/python bench/bench_handover.py                 # 5 rounds, 3 brokers, 12 partitions
    .venv/bin/python bench/bench_handover.py --rounds 10 --broker-arg=--ownership-resync-ms=60000

Starts a private etcd and three `kafscale broker` processes (etcd metadata, one shared
file:// store), creates a topic, then each round:

- SIGTERM: broker 2 gets SIGTERM; measured from the signal until the owner keys in etcd
  name only brokers 0 and 1 (`keys`), and until Metadata from both survivors names only
  them as leaders (`metadata`).
- join: broker 2 starts again; measured from the moment its registration appears in etcd
  (polled every few ms) until it owns its share in etcd (`keys`) and every broker's
  Metadata agrees with etcd (`metadata`).

Prints each round and the median/min/max, then one JSON line (for comparing runs).

Measured (2 cores, medians of 5 rounds; 12 partitions): with the 0.5 s ownership poll,
SIGTERM 502 ms (keys) / 496 ms (Metadata), join 521 / 694 ms; with the etcd watches
(#14.5), SIGTERM 63 / 52 ms, join 61 / 82 ms. With 60 partitions (3 rounds): poll 516 /
492 ms and 570 / 637 ms; watches 207 / 144 ms and 154 / 170 ms (the rest is one etcd
transaction per partition moved).
Since every cluster also has `__consumer_offsets` (50 partitions, #16), 3 rounds with the
12-partition topic: one release or takeover at a time, SIGTERM 233 / 137 ms and join 152 /
179 ms; releases and takeovers of one reconcile (and of a shutdown) run together: SIGTERM
86 / 67 ms, join 78 / 106 ms.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.raw import RawClient, req  # noqa: E402
from tests.support.servers import start_etcd  # noqa: E402

CREATE_TOPICS = 19
POLL_S = 0.005


def etcd_range(etcd, prefix: str) -> dict[str, bytes]:
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    body = json.dumps({"key": b64(prefix), "range_end": b64(end)}).encode()
    request = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=3) as resp:
        doc = json.load(resp)
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")) for kv in doc.get("kvs", [])}


def owner_keys(etcd, prefix: str, topic: str) -> dict[int, int]:
    base = f"{prefix}/owners/{topic}/"
    return {int(k[len(base) :]): json.loads(v)["node"] for k, v in etcd_range(etcd, base).items()}


def leaders(b: BrokerProcess, topic: str) -> dict[int, int]:
    with RawClient(b.bootstrap, timeout=5) as c:
        t = c.metadata([topic], version=12, allow_auto=False).topics[0]
    return {p.partition_index: p.leader_id for p in t.partitions}


def wait(cond, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return time.monotonic()
        except OSError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"{what} after {timeout}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--lease-ttl-s", type=int, default=10)
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag (repeatable)")
    args = ap.parse_args()

    etcd = start_etcd()
    tmp = Path(tempfile.mkdtemp(prefix="kafscale-handover-"))
    prefix, topic, parts = "/handover", "handover", args.partitions
    brokers: dict[int, BrokerProcess] = {}

    def make(node: int) -> BrokerProcess:
        return BrokerProcess(
            data_dir=str(tmp / f"b{node}"),
            extra_args=[
                "--broker-id", str(node), "--metadata", etcd.url, "--metadata-prefix", prefix,
                "--storage", f"file://{tmp / 'objects'}", "--lease-ttl-s", str(args.lease_ttl_s),
                "--merge-interval-ms", "0", *args.broker_arg,
            ],
        )  # fmt: skip

    def balanced(nodes: set[int]) -> bool:
        own = owner_keys(etcd, prefix, topic)
        if len(own) != parts or set(own.values()) != nodes:
            return False
        counts = [list(own.values()).count(n) for n in nodes]
        return max(counts) - min(counts) <= 1

    def metadata_agrees(nodes: set[int]) -> bool:
        own = owner_keys(etcd, prefix, topic)
        return len(own) == parts and set(own.values()) == nodes and all(leaders(brokers[n], topic) == own for n in nodes)

    results: dict[str, list[float]] = {"sigterm_keys": [], "sigterm_metadata": [], "join_keys": [], "join_metadata": []}
    try:
        for n in range(3):
            (tmp / f"b{n}").mkdir(parents=True)
            brokers[n] = make(n).start()
        with RawClient(brokers[0].bootstrap, timeout=10) as c:
            topic_req = req(CREATE_TOPICS, 5, "CreatableTopic", name=topic, num_partitions=parts, replication_factor=1, assignments=(), configs=())
            c.request(CREATE_TOPICS, 5, req(CREATE_TOPICS, 5, topics=(topic_req,), timeout_ms=10000, validate_only=False))
        wait(lambda: balanced({0, 1, 2}) and metadata_agrees({0, 1, 2}), 30, "initial assignment")

        for r in range(args.rounds):
            victim = brokers[2]
            t0 = time.monotonic()
            victim.proc.send_signal(signal.SIGTERM)
            seen: dict[str, float] = {}

            def watch_metadata():
                seen["metadata"] = wait(lambda: all(set(leaders(brokers[n], topic).values()) <= {0, 1} for n in (0, 1)), 30, "survivors' Metadata")

            th = threading.Thread(target=watch_metadata)
            th.start()
            keys_at = wait(lambda: set(owner_keys(etcd, prefix, topic).values()) <= {0, 1} and len(owner_keys(etcd, prefix, topic)) == parts, 30, "owner keys on survivors")
            th.join()
            victim.proc.wait(30)
            victim.stop()
            results["sigterm_keys"].append(keys_at - t0)
            results["sigterm_metadata"].append(seen["metadata"] - t0)

            wait(lambda: metadata_agrees({0, 1}), 30, "settled on two brokers")
            reg_key = f"{prefix}/brokers/2"
            registered: dict[str, float] = {}

            def watch_registration():
                registered["at"] = wait(lambda: reg_key in etcd_range(etcd, reg_key), 60, "registration of broker 2")

            th = threading.Thread(target=watch_registration)
            th.start()
            brokers[2] = make(2).start()
            th.join()
            keys_at = wait(lambda: balanced({0, 1, 2}), 30, "joined broker's share in etcd")
            md_at = wait(lambda: metadata_agrees({0, 1, 2}), 30, "Metadata everywhere")
            results["join_keys"].append(keys_at - registered["at"])
            results["join_metadata"].append(md_at - registered["at"])
            print(
                f"round {r + 1}: SIGTERM keys {results['sigterm_keys'][-1] * 1000:.0f} ms, Metadata {results['sigterm_metadata'][-1] * 1000:.0f} ms; "
                f"join keys {results['join_keys'][-1] * 1000:.0f} ms, Metadata {results['join_metadata'][-1] * 1000:.0f} ms",
                flush=True,
            )
    finally:
        for b in brokers.values():
            b.stop()
        etcd.cleanup()

    summary = {}
    for name, xs in results.items():
        if xs:
            summary[name] = {"median_ms": round(statistics.median(xs) * 1000), "min_ms": round(min(xs) * 1000), "max_ms": round(max(xs) * 1000)}
            print(f"{name:18s} median {summary[name]['median_ms']:5d} ms  min {summary[name]['min_ms']:5d}  max {summary[name]['max_ms']:5d}")
    print(json.dumps({"rounds": len(results["sigterm_keys"]), "partitions": parts, **summary}))


if __name__ == "__main__":
    main()
