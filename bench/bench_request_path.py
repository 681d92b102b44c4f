"""The broker's cost per request on the request path: raw ApiVersions, Metadata, Fetch and
Produce requests, pipelined over one connection, against a fresh `kafscale broker`
(embedded metadata, file store).

    .venv/bin/python bench/bench_request_path.py [--requests 20000] [--rounds 5]
    PYTHONPATH=/path/to/other/src .venv/bin/python bench/bench_request_path.py   # another tree

For each kind it sends `--requests` requests in windows of `--window` (all sent, then all
answers read) and prints, per round and as the median of the rounds, the broker's CPU time
per request (utime + stime of the broker process, /proc/PID/stat) and the wall time per
request seen by the client. Produce is acks=-1 with one 10-record batch (the answers wait
for the group commit, so its figure includes the flushes); Fetch reads from offset 0 with
max_wait 0 (records cached). Rounds alternate the kinds, so a busy machine spreads its
noise over all of them.

`--in-process` measures `KafkaServer.handle` alone instead: a Broker built (not started) in
this process, a connection object without a socket, and the wall time per request of
GetTelemetrySubscriptions (a constant answer: the request path's own cost dominates), and
Metadata without topics and of one topic of 1,024 partitions (v12, and v4 as older clients
ask) in CPU time of this process per request (a busy machine stretches
wall time, much less CPU time), median of `--rounds` runs of `--requests` each.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from brokers import cpu_seconds  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402
from tests.support.raw import RawClient, encode_request, frame, req  # noqa: E402

from kafscale.protocol.api_keys import ApiKey  # noqa: E402
from kafscale.protocol.records import build_batch  # noqa: E402

TOPIC = "bench-request-path"
BIG_TOPIC, BIG_PARTITIONS = "bench-big-topic", 1024


def bodies(topic: str) -> dict[str, tuple[int, int, object]]:
    """kind -> (api key, version, request body)."""
    api_versions = req(ApiKey.API_VERSIONS, 3, client_software_name="bench", client_software_version="1")
    metadata = req(ApiKey.METADATA, 12, topics=(req(ApiKey.METADATA, 12, "MetadataRequestTopic", name=topic),),
                   allow_auto_topic_creation=False, include_topic_authorized_operations=False,
                   include_cluster_authorized_operations=False)
    fp = req(ApiKey.FETCH, 12, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0,
             last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=64 * 1024)
    fetch = req(ApiKey.FETCH, 12, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=64 * 1024,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=(req(ApiKey.FETCH, 12, "FetchTopic", topic=topic, partitions=(fp,)),),
                forgotten_topics_data=(), rack_id="")
    batch = build_batch([(b"k%d" % i, b"v" * 100) for i in range(10)])
    pp = req(ApiKey.PRODUCE, 9, "PartitionProduceData", index=0, records=batch)
    produce = req(ApiKey.PRODUCE, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
                  topic_data=(req(ApiKey.PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(pp,)),))
    return {
        "ApiVersions v3": (ApiKey.API_VERSIONS, 3, api_versions),
        "Metadata v12": (ApiKey.METADATA, 12, metadata),
        "Fetch v12": (ApiKey.FETCH, 12, fetch),
        "Produce v9": (ApiKey.PRODUCE, 9, produce),
    }


def run_kind(client: RawClient, api_key: int, version: int, body, requests: int, window: int) -> float:
    """Wall seconds for `requests` requests, pipelined `window` at a time."""
    started = time.perf_counter()
    done = 0
    while done < requests:
        n = min(window, requests - done)
        client.send_raw(b"".join(frame(encode_request(api_key, version, body, done + i, "bench")) for i in range(n)))
        for _ in range(n):
            client.recv_frame()
        done += n
    return time.perf_counter() - started


def in_process(requests: int, rounds: int) -> None:
    import asyncio
    import tempfile

    from kafscale.broker import topics
    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig
    from kafscale.broker.server import KafkaConnection

    def metadata_of(version: int, *names: str):
        topics = tuple(req(ApiKey.METADATA, version, "MetadataRequestTopic", name=n) for n in names)
        return req(ApiKey.METADATA, version, topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False)

    kinds = {
        "GetTelemetrySubscriptions v0": (ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, req(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, client_instance_id=__import__("uuid").UUID(int=1))),
        "Metadata v12 (no topics)": (ApiKey.METADATA, 12, metadata_of(12)),
        # what librdkafka asks while it looks for the leaders of a big topic
        f"Metadata v12 ({BIG_PARTITIONS:,} partitions)": (ApiKey.METADATA, 12, metadata_of(12, BIG_TOPIC)),
        f"Metadata v4 ({BIG_PARTITIONS:,} partitions)": (ApiKey.METADATA, 4, metadata_of(4, BIG_TOPIC)),
    }

    async def run() -> dict[str, list[float]]:
        broker = Broker(BrokerConfig(data_dir=tempfile.mkdtemp(prefix="bench-request-path-"), listen="127.0.0.1:0", advertise="127.0.0.1:9092"))
        conn = KafkaConnection(broker.server)
        await topics.create(broker, BIG_TOPIC, BIG_PARTITIONS, {})
        out: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(rounds + 1):  # the first round warms up
            for kind, (key, version, body) in kinds.items():
                frame = encode_request(key, version, body, 1, "bench")
                started = time.process_time()
                for _ in range(requests):
                    await broker.server.handle(conn, bytearray(frame))
                out[kind].append((time.process_time() - started) / requests * 1e6)
        return {k: v[1:] for k, v in out.items()}

    import kafscale

    print(f"kafscale from {Path(kafscale.__file__).parent}; in process")
    per = asyncio.run(run())
    for kind, values in per.items():
        print(f"{kind:<32} {statistics.median(values):8.2f} us CPU per request (median; min {min(values):.2f}; rounds: {', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--in-process", action="store_true", help="time KafkaServer.handle alone (no socket, no client)")
    args = ap.parse_args()
    if args.in_process:
        in_process(args.requests, args.rounds)
        return
    broker = BrokerProcess().start()
    try:
        import kafscale

        print(f"kafscale from {Path(kafscale.__file__).parent}; broker pid {broker.proc.pid}")
        kinds = bodies(TOPIC)
        with RawClient(broker.bootstrap) as client:
            client.metadata([TOPIC])  # creates the topic
            for kind, (key, version, body) in kinds.items():
                run_kind(client, key, version, body, min(args.requests, 2000), args.window)  # warm-up
            cpu: dict[str, list[float]] = {k: [] for k in kinds}
            wall: dict[str, list[float]] = {k: [] for k in kinds}
            for r in range(args.rounds):
                for kind, (key, version, body) in kinds.items():
                    before = cpu_seconds(broker.proc.pid)
                    seconds = run_kind(client, key, version, body, args.requests, args.window)
                    cpu[kind].append((cpu_seconds(broker.proc.pid) - before) / args.requests * 1e6)
                    wall[kind].append(seconds / args.requests * 1e6)
                print(f"round {r + 1}: " + ", ".join(f"{k} {cpu[k][-1]:.1f}" for k in kinds) + " us broker CPU per request")
        print(f"\nmedian of {args.rounds} rounds, {args.requests} requests each, windows of {args.window}:")
        print(f"{'request':<16}{'broker CPU us/req':>20}{'client wall us/req':>20}")
        for kind in kinds:
            print(f"{kind:<16}{statistics.median(cpu[kind]):>20.1f}{statistics.median(wall[kind]):>20.1f}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
