"""Load generator processes for bench/run.py: librdkafka (confluent-kafka) producers and consumers.

Each function here is the body of one child process (multiprocessing, "spawn" context) and
reports a plain dict on a queue. Record values start with the produce time (8 bytes,
little-endian `time.time_ns()`), so a consumer can compute end-to-end latency; the rest is a
slice of a text-like pool that lz4 compresses about as well as log lines (about 2x).
"""

from __future__ import annotations

import array
import random
import struct
import time
import uuid

TS = struct.Struct("<q")
POOL_BYTES = 4 * 1024 * 1024
MAX_LATENCY_SAMPLES = 400_000  # per process; more are thinned evenly


def payload_pool(seed: int = 7) -> bytes:
    """Deterministic log-line-like text: repeated field names, words from a small vocabulary."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(400)]
    levels = ["INFO", "WARN", "DEBUG", "ERROR"]
    out = bytearray()
    while len(out) < POOL_BYTES:
        line = '{"ts":%d,"level":"%s","svc":"%s","user":%d,"msg":"%s"}\n' % (
            1_700_000_000_000 + rng.randint(0, 10**9),
            rng.choice(levels),
            rng.choice(words[:20]),
            rng.randint(0, 99999),
            " ".join(rng.choice(words) for _ in range(rng.randint(4, 14))),
        )
        out += line.encode()
    return bytes(out[:POOL_BYTES])


def _thin(values: array.array) -> array.array:
    if len(values) <= MAX_LATENCY_SAMPLES:
        return values
    step = len(values) / MAX_LATENCY_SAMPLES
    return array.array("f", (values[int(i * step)] for i in range(MAX_LATENCY_SAMPLES)))


def _values(size: int, seed: int) -> tuple[bytes, int, list[int]]:
    """(pool, body length, 4096 offsets into the pool): a different slice per message, so
    lz4 can't just reference the previous record."""
    body_len = max(0, size - TS.size)
    pool = payload_pool(seed + 1)
    span = len(pool) - body_len - 1
    rng = random.Random(seed)
    return pool, body_len, [rng.randrange(0, span) for _ in range(4096)]


def _delivery_reports() -> tuple[dict, object]:
    """(state, on_delivery): delivered, errors, the first error, latencies in ms."""
    st = {"delivered": 0, "errors": 0, "first_error": None, "lat": array.array("f")}

    def on_delivery(err, msg):
        if err is not None:
            st["errors"] += 1
            if st["first_error"] is None:
                st["first_error"] = str(err)
            return
        st["delivered"] += 1
        st["lat"].append(msg.latency() * 1000.0)

    return st, on_delivery


def _producer(cfg: dict, client_id: str, extra: dict | None = None):
    """A bench producer: acks=all, the case's compression and linger."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": cfg["bootstrap"],
            "acks": "all",
            "compression.type": cfg["compression"],
            "linger.ms": cfg.get("linger_ms", 5),
            "message.timeout.ms": 60_000,
            "client.id": client_id,
            "log_level": 3,
            **(extra or {}),
        }
    )


def producer_proc(idx: int, cfg: dict, start_evts, out_q) -> None:
    """Two phases, each reported on `out_q`: (1) saturate: produce as fast as the client
    allows for `cfg["seconds"]` or `cfg["messages"]` records; (2) paced: `cfg["rate"]`
    records/s for `cfg["paced_seconds"]`. Each phase ends with a flush (all acknowledged)."""
    from confluent_kafka import KafkaException

    pool, body_len, offsets = _values(cfg["size"], idx)
    st, on_delivery = _delivery_reports()
    p = _producer(cfg, f"bench-producer-{idx}", {
        "queue.buffering.max.kbytes": cfg.get("queue_kbytes", 16384),
        "queue.buffering.max.messages": cfg.get("queue_messages", 100_000),
    })
    # Connect and fetch metadata before the clock starts.
    p.list_topics(cfg["topic"], timeout=15)
    out_q.put({"kind": "producer-ready", "idx": idx})

    topic = cfg["topic"]
    produce = p.produce
    poll = p.poll
    pack = TS.pack
    now_ns = time.time_ns
    perf = time.perf_counter

    for phase, (n, seconds, rate) in enumerate(
        [(cfg["messages"], cfg["seconds"], None), (1 << 62, cfg["paced_seconds"], cfg["rate"])], start=1
    ):
        if not start_evts[phase - 1].wait(300):
            return
        st.update(errors=0, first_error=None, delivered=0, lat=array.array("f"))
        t0 = perf()
        deadline = t0 + seconds
        sent = 0
        overloaded = False
        # Paced phase: a broker that falls more than a second (of the rate) behind is
        # overloaded; stop adding to its queue so the phase ends in bounded time.
        max_in_flight = max(50, int(rate or 0))
        while sent < n:
            if rate is not None:
                due = int((perf() - t0) * rate) + 1
                if sent >= due:
                    if perf() > deadline:
                        break
                    poll(0.001)
                    continue
                if sent - st["delivered"] - st["errors"] > max_in_flight:
                    poll(0.01)
                    if sent - st["delivered"] - st["errors"] > max_in_flight:
                        overloaded = True
                        break
            off = offsets[sent & 4095]
            value = pack(now_ns()) + pool[off : off + body_len]
            try:
                produce(topic, value, on_delivery=on_delivery)
            except BufferError:
                poll(0.002)
                if perf() > deadline:
                    break
                continue
            except KafkaException as e:  # reported, not fatal
                st["errors"] += 1
                st["first_error"] = st["first_error"] or str(e)
                continue
            sent += 1
            if not sent & 255:
                poll(0)
                if perf() > deadline:
                    break
        t_sent = perf()
        left = p.flush(cfg.get("drain_seconds", 30))
        t_end = perf()
        out_q.put(
            {
                "kind": "producer",
                "phase": phase,
                "idx": idx,
                "sent": sent,
                "delivered": st["delivered"],
                "errors": st["errors"] + left,
                "first_error": st["first_error"],
                "elapsed": t_end - t0,
                "send_elapsed": t_sent - t0,
                "overloaded": overloaded,
                "lat_ms": _thin(st["lat"]).tobytes(),
            }
        )


def _consumer(bootstrap: str, topic: str):
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "client.id": "bench-consumer",
            "log_level": 3,
            # librdkafka stops fetching a partition for fetch.queue.backoff.ms (default 1 s)
            # once its local queue holds queued.min.messages (100,000): a broker that answers
            # fast fills that queue in ~0.1 s and then waits out the rest of the second, so the
            # default measures the client, not the broker. Same setting for every broker.
            "fetch.queue.backoff.ms": 20,
        }
    )


def _assign_all(c, topic: str, partitions: int) -> list:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
    c.assign(tps)
    return tps


def e2e_consumer_proc(cfg: dict, ready_evt, done_evt, total, progress, lat_from_ns, out_q) -> None:
    """Tail the topic while it is produced. `progress` is the number of records seen so far;
    end-to-end latency (receive time - produce time in the value) is kept for records
    produced at or after `lat_from_ns` (the paced phase)."""
    c = _consumer(cfg["bootstrap"], cfg["topic"])
    _assign_all(c, cfg["topic"], cfg["partitions"])
    c.consume(1, 0.5)  # connects, fetches metadata, starts fetching (the topic is empty)
    ready_evt.set()
    lat_ms = array.array("f")
    count = 0
    errors = 0
    unpack = TS.unpack_from
    now_ns = time.time_ns
    hard_deadline = time.monotonic() + cfg["seconds"] + cfg["paced_seconds"] + 2 * cfg.get("drain_seconds", 30) + 60
    idle_since = None
    while time.monotonic() < hard_deadline:
        # consume(n, timeout) returns when it has n messages or the timeout passes: a short
        # timeout keeps that wait out of the end-to-end latency measured here.
        msgs = c.consume(10_000, 0.005)
        t = now_ns()
        since = lat_from_ns.value
        got = 0
        for m in msgs:
            if m.error():
                errors += 1
                continue
            v = m.value()
            if v is not None and len(v) >= 8:
                ts = unpack(v)[0]
                if ts >= since:
                    lat_ms.append((t - ts) / 1e6)
            got += 1
        if got:
            count += got
            progress.value = count
        if done_evt.is_set():
            if count >= total.value:
                break
            if got:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 5:
                break
    c.close()
    out_q.put({"kind": "e2e", "count": count, "errors": errors, "lat_ms": _thin(lat_ms).tobytes()})


def catchup_consumer_proc(cfg: dict, out_q) -> None:
    """Read the whole topic from offset 0 as fast as possible."""
    from confluent_kafka import TopicPartition

    c = _consumer(cfg["bootstrap"], cfg["topic"])
    target = 0
    for p in range(cfg["partitions"]):
        lo, hi = c.get_watermark_offsets(TopicPartition(cfg["topic"], p), timeout=10)
        target += max(0, hi - lo)
    t0 = time.perf_counter()
    _assign_all(c, cfg["topic"], cfg["partitions"])
    count = 0
    nbytes = 0
    errors = 0
    first = None
    deadline = t0 + cfg["catchup_seconds"]
    while count < target and time.perf_counter() < deadline:
        # Ask for at most what is left: consume(n, timeout) waits for n messages or the
        # whole timeout, which would add up to 0.5 s to the time of the last record.
        msgs = c.consume(min(10_000, target - count), 0.5)
        for m in msgs:
            if m.error():
                errors += 1
                continue
            nbytes += len(m)
            count += 1
        if msgs and first is None:
            first = time.perf_counter() - t0
    elapsed = time.perf_counter() - t0
    c.close()
    out_q.put(
        {
            "kind": "catchup",
            "target": target,
            "count": count,
            "bytes": nbytes,
            "errors": errors,
            "elapsed": elapsed,
            "first_message_s": first,
            "complete": count >= target,
        }
    )


def single_producer_proc(cfg: dict, out_q) -> None:
    """One librdkafka producer sends `cfg["messages"]` records as fast as it may (acks=all,
    `linger_ms`, `compression`), each with a delivery report; reports msgs/s from the first
    produce() to the last report, and the reports' latency. With a bounded number of requests
    in flight per connection, acknowledgement latency is what bounds its throughput."""
    pool, body_len, offsets = _values(cfg["size"], 0)
    st, on_delivery = _delivery_reports()
    p = _producer(cfg, "bench-single-producer")
    p.list_topics(cfg["topic"], timeout=15)
    topic, produce, poll, pack, now_ns = cfg["topic"], p.produce, p.poll, TS.pack, time.time_ns
    n = cfg["messages"]
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        off = offsets[sent & 4095]
        try:
            produce(topic, pack(now_ns()) + pool[off : off + body_len], on_delivery=on_delivery)
        except BufferError:
            poll(0.001)
            continue
        sent += 1
        if not sent & 255:
            poll(0)
    left = p.flush(cfg.get("drain_seconds", 60))
    elapsed = time.perf_counter() - t0
    out_q.put(
        {
            "kind": "single",
            "sent": sent,
            "delivered": st["delivered"],
            "errors": st["errors"] + left,
            "first_error": st["first_error"],
            "elapsed": elapsed,
            "lat_ms": _thin(st["lat"]).tobytes(),
        }
    )
