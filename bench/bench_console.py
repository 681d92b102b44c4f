"""Page times of `kafscale console` on a cluster with many topics and groups (issue #30's
target: under 300 ms with 1,000 topics and 500 groups).

One embedded broker, TOPICS topics of 3 partitions with a few records each, GROUPS groups
with committed offsets; then each page is fetched ROUNDS times (after one warm-up) and the
median and worst times are printed. Run: python bench/bench_console.py [--topics N --groups N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.console import console_on  # noqa: E402


def seed(bootstrap: str, topics: int, groups: int) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [f"bench-topic-{i:04d}" for i in range(topics)]
    for i in range(0, topics, 100):
        futs = admin.create_topics([NewTopic(n, 3, 1) for n in names[i:i + 100]], request_timeout=120)
        for f in futs.values():
            f.result(180)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for n in names:
        for k in range(6):
            p.produce(n, key=str(k).encode(), value=b'{"n": %d}' % k)
    assert p.flush(120) == 0
    futs = []
    for g in range(groups):
        t = names[g % topics]
        futs.append(admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(f"bench-group-{g:03d}", [TopicPartition(t, p, 1) for p in range(3)])],
                                                       request_timeout=60))
    for f in futs:
        for v in f.values():
            v.result(120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    def seeded(bootstrap: str) -> None:
        t0 = time.monotonic()
        seed(bootstrap, args.topics, args.groups)
        print(f"seeded {args.topics} topics x 3 partitions and {args.groups} groups in {time.monotonic() - t0:.0f}s", flush=True)

    broker = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0"]).start()
    with console_on(broker, ["--metrics-port-offset", "-1"], seeded) as (_, console):
        pages = ["/", "/topics", "/topics?page=10", "/topics?q=0999", "/topics/bench-topic-0500", "/groups", "/groups?page=5",
                 "/groups/bench-group-250", "/groups/bench-group-250/lag.json"]
        s = requests.Session()
        print(f"{'page':40} {'median ms':>10} {'max ms':>8}")
        for page in pages:
            r = s.get(console.url + page, timeout=60)
            assert r.status_code == 200, (page, r.status_code, r.text[:300])
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                r = s.get(console.url + page, timeout=60)
                times.append((time.perf_counter() - start) * 1000)
                assert r.status_code == 200
            print(f"{page:40} {statistics.median(times):10.1f} {max(times):8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
