"""Several brokers sharing a real etcd and a real S3 (moto): failover, outages, hand-over.

Each test starts its own brokers (three unless it says otherwise) on loopback, with its own
etcd key prefix (`--metadata-prefix`), bucket and topic; the etcd and moto servers are
private to this module, so tests may stop, restart or freeze them. Clients are
confluent-kafka (librdkafka) with acks=all, plus the raw client of tests/support/raw.py
where exact protocol answers matter. Ownership is read straight from etcd (the
`/owners/{topic}/{p}` keys) through etcd's JSON gateway, independent of the broker's code.

Every check of "nothing acknowledged is lost" is the same (`verify`): each record a
producer got a delivery report without error for is read back exactly once, at the
(partition, offset) the acknowledgement named. Where ownership moves gracefully (SIGTERM, a
joining broker) it also checks that no produce request is left unanswered for long: a
stalled request makes librdkafka's idempotent producer time out, bump its epoch and send
again, which is how records end up stored twice.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import threading
import time
import urllib.request
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol import records
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN, start_etcd, start_moto
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(150),
]

FIND_COORDINATOR, OFFSET_FOR_LEADER_EPOCH = 10, 23
NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH = 6, 74
RAW_OUTAGE_WAIT_S = 15  # S3 retry budget (5 s) + etcd commit + margin


# ---------------------------------------------------------------------------------------
# small utilities


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def etcd_range(etcd, prefix: str) -> dict[str, bytes]:
    """Keys under `prefix` in etcd, via the v3 JSON gateway (no broker code involved)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": _b64(prefix), "range_end": _b64(end)}).encode()
    request = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=3) as resp:
        doc = json.load(resp)
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")) for kv in doc.get("kvs", [])}


# ---------------------------------------------------------------------------------------
# the cluster under test


@pytest.fixture(scope="module")
def backends():
    """A private etcd and moto for this module (tests here stop, restart and freeze them)."""
    etcd = start_etcd()
    moto = start_moto()
    try:
        yield etcd, moto
    finally:
        moto.cleanup()
        etcd.cleanup()


class KCluster:
    """Broker processes sharing one etcd key prefix and one S3 bucket/prefix."""

    def __init__(self, etcd, moto, tag: str, ttl: int = 3, broker_args: tuple[str, ...] = ()):
        self.etcd, self.moto, self.ttl = etcd, moto, ttl
        self.broker_args = list(broker_args)
        uid = uuid.uuid4().hex[:8]
        self.tag = f"{tag}-{uid}"
        self.prefix = f"/ks-{self.tag}"
        self.bucket = f"ks-{self.tag}".lower()[:63]
        self.storage = f"s3://{self.bucket}/{tag}"
        self.brokers: dict[int, BrokerProcess] = {}

    def start_broker(self, node_id: int) -> BrokerProcess:
        b = BrokerProcess(
            extra_args=[
                "--broker-id", str(node_id),
                "--metadata", self.etcd.url,
                "--metadata-prefix", self.prefix,
                "--storage", self.storage,
                "--lease-ttl-s", str(self.ttl),
                "--group-initial-rebalance-delay-ms", "0",
                *self.broker_args,
            ],
            env={**self.moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true"},
        )  # fmt: skip
        self.brokers[node_id] = b
        b.start()
        return b

    def start(self, n: int = 3) -> "KCluster":
        for i in range(n):
            self.start_broker(i)
        ids = sorted(self.brokers)
        for b in self.brokers.values():
            wait_until(lambda b=b: sorted(self.metadata_brokers(b)) == ids, 15, f"broker at {b.bootstrap} to see brokers {ids}")
        return self

    def live(self) -> dict[int, BrokerProcess]:
        return {i: b for i, b in self.brokers.items() if b.proc is not None and b.proc.poll() is None}

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.live().values())

    def close(self) -> None:
        for b in self.brokers.values():
            if b.proc is not None:
                b.stop(signal.SIGKILL)

    def log_excerpt(self, n: int = 3000, grep: tuple[str, ...] = ("ERROR", "WARNING", "Traceback", "took ownership", "released", "live brokers")) -> str:
        out = []
        for i, b in sorted(self.brokers.items()):
            lines = [ln for ln in b.log_text().splitlines() if any(g in ln for g in grep)]
            out.append(f"--- broker {i} ({b.log_path}) ---\n" + "\n".join(lines)[-n:])
        return "\n".join(out)

    # -- topics and ownership --------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fs = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10)
        fs[topic].result(20)

    def owners(self, topic: str) -> dict[int, tuple[int, int]]:
        """partition -> (owner node, leader epoch), from the /owners keys in etcd."""
        base = f"{self.prefix}/owners/{topic}/"
        out = {}
        for key, value in etcd_range(self.etcd, base).items():
            doc = json.loads(value)
            out[int(key[len(base):])] = (doc["node"], doc["epoch"])
        return out

    def wait_owned(self, topic: str, partitions: int, timeout: float = 15.0, by: set[int] | None = None) -> dict[int, tuple[int, int]]:
        """Every partition owned by a live broker (or one of `by`); returns the owners."""
        allowed = by if by is not None else set(self.live())

        def done():
            own = self.owners(topic)
            return own if len(own) == partitions and all(n in allowed for n, _ in own.values()) else None

        return wait_until(done, timeout, f"all {partitions} partitions of {topic} owned by {sorted(allowed)}")

    def metadata(self, b: BrokerProcess, topic: str, version: int = 12):
        with RawClient(b.bootstrap, timeout=5) as c:
            return c.metadata([topic], version=version, allow_auto=False)

    def metadata_brokers(self, b: BrokerProcess) -> list[int]:
        with RawClient(b.bootstrap, timeout=5) as c:
            return [x.node_id for x in c.metadata([], version=12).brokers]

    def leaders(self, b: BrokerProcess, topic: str, version: int = 12) -> dict[int, tuple[int, int]]:
        """partition -> (leader id, leader epoch) as Metadata from broker `b` says."""
        t = self.metadata(b, topic, version).topics[0]
        assert error_code(t.error_code) == 0, f"metadata for {topic}: error {error_code(t.error_code)}"
        return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}


@pytest.fixture
def cluster_factory(backends):
    etcd, moto = backends
    made: list[KCluster] = []

    def make(tag: str, n: int = 3, ttl: int = 3, broker_args: tuple[str, ...] = ()) -> KCluster:
        c = KCluster(etcd, moto, tag, ttl, broker_args)
        made.append(c)
        return c.start(n)

    yield make
    for c in made:
        print(c.log_excerpt())  # shown by pytest when the test failed
        c.close()


# ---------------------------------------------------------------------------------------
# clients: a producer thread, a group consumer thread, a full read-back


class Load(threading.Thread):
    """Idempotent acks=all producer sending numbered, keyed records until stopped."""

    def __init__(self, bootstrap: str, topic: str, tag: str = "v", per_tick: int = 5, **conf):
        super().__init__(daemon=True, name=f"load-{topic}")
        self.topic, self.tag, self.per_tick = topic, tag, per_tick
        self.conf = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 20000,
            "retry.backoff.ms": 100,
            "retry.backoff.max.ms": 500,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "topic.metadata.refresh.interval.ms": 2000,
            **conf,
        }
        self.acked: dict[bytes, tuple[int, int, float]] = {}  # value -> (partition, offset, ack time)
        self.errors: list[tuple[bytes, str]] = []
        self.sent_at: list[float] = []  # produce() time of value number i
        self.unflushed = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _on_delivery(self, err, msg) -> None:
        with self._lock:
            if err is None:
                self.acked[msg.value()] = (msg.partition(), msg.offset(), time.monotonic())
            else:
                self.errors.append((msg.value(), str(err)))

    def run(self) -> None:
        p = Producer(self.conf)
        i = 0
        while not self._halt.is_set():
            for _ in range(self.per_tick):
                p.produce(self.topic, key=b"k%d" % i, value=b"%s-%d" % (self.tag.encode(), i), on_delivery=self._on_delivery)
                self.sent_at.append(time.monotonic())
                i += 1
            p.poll(0.01)
        self.unflushed = p.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
        assert not self.is_alive(), "producer thread did not finish"

    def index(self, value: bytes) -> int:
        return int(value.rsplit(b"-", 1)[1])

    def acked_since(self, t: float) -> list[bytes]:
        """Acknowledged values whose produce() call came at or after monotonic time t."""
        with self._lock:
            return [v for v in self.acked if self.sent_at[self.index(v)] >= t]

    def n_acked(self) -> int:
        with self._lock:
            return len(self.acked)

    def slowest(self, n: int = 5) -> list[tuple[float, bytes, int]]:
        """(seconds from produce() to acknowledgement, value, partition), slowest first."""
        with self._lock:
            lat = [(t - self.sent_at[self.index(v)], v, p) for v, (p, _o, t) in self.acked.items()]
        return sorted(lat, reverse=True)[:n]


def producing(cl: KCluster, topic: str, parts: int) -> Load:
    """`topic` created with `parts` partitions and owned, and a Load on it (stop it) past
    its first 300 acknowledgements."""
    cl.create_topic(topic, parts)
    cl.wait_owned(topic, parts)
    return started_load(cl, topic)


def started_load(cl: KCluster, topic: str) -> Load:
    """A Load on `topic` (stop it) past its first 300 acknowledgements."""
    load = Load(cl.bootstrap, topic)
    load.start()
    try:
        wait_until(lambda: load.n_acked() >= 300, 30, "the producer's first 300 acknowledgements")
    except BaseException:
        load.stop()
        raise
    return load


class GroupReader(threading.Thread):
    """A subscribed confluent-kafka consumer in a group, recording where it saw each value."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        super().__init__(daemon=True, name=f"group-{group}")
        self.topic = topic
        self.conf = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 2000,
            "reconnect.backoff.max.ms": 500,
        }
        self.seen: dict[bytes, set[tuple[int, int]]] = {}
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        c = Consumer(self.conf)
        c.subscribe([self.topic])
        try:
            while not self._halt.is_set():
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    self.errors.append(str(m.error()))
                    continue
                with self._lock:
                    self.seen.setdefault(m.value(), set()).add((m.partition(), m.offset()))
        finally:
            c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def missing(self, values) -> list[bytes]:
        with self._lock:
            return [v for v in values if v not in self.seen]


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 40.0) -> list[tuple[int, int, bytes]]:
    """Every record of the topic as (partition, offset, value), read group-less from the
    beginning up to the high watermarks."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        highs = {}
        for p in range(partitions):
            highs[p] = wait_until(lambda p=p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False), timeout / 2, f"high watermark of {topic}-{p}")[1]
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[tuple[int, int, bytes]] = []
        nxt = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + timeout
        while any(nxt[p] < highs[p] for p in nxt):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} back: reached {nxt}, high watermarks {highs}")
            for m in c.consume(500, 0.5):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        print("read_all:", m.error())
                    continue
                got.append((m.partition(), m.offset(), m.value()))
                nxt[m.partition()] = max(nxt[m.partition()], m.offset() + 1)
        return got
    finally:
        c.close()


def batch_at(cl: "KCluster", topic: str, partition: int, offset: int) -> str:
    """Producer id, epoch and sequence of the stored batch holding `offset` (diagnostics)."""
    owner = cl.owners(topic).get(partition, (None,))[0]
    b = cl.brokers.get(owner) or next(iter(cl.live().values()))
    try:
        with RawClient(b.bootstrap, timeout=5) as c:
            data = c.fetch(topic, partition, offset, max_bytes=1).records or b""
        h = records.read_header(data, 0)
        return f"offset {offset}: batch base {h.base_offset} pid {h.producer_id} epoch {h.producer_epoch} seq {h.base_sequence} n {h.record_count}"
    except Exception as e:  # noqa: BLE001
        return f"offset {offset}: ({e!r})"


def verify(cl: "KCluster", topic: str, partitions: int, *loads: Load, max_latency: float | None = None, bootstrap: str | None = None) -> list[tuple[int, int, bytes]]:
    """Read the topic back and check every load: each acknowledged value stored exactly
    once, at the acknowledged (partition, offset); every record acknowledged; and (if
    given) no acknowledgement slower than `max_latency` seconds. All problems are
    reported together."""
    got = read_all(bootstrap or cl.bootstrap, topic, partitions)
    problems = []
    positions = [(p, o) for p, o, _ in got]
    if len(positions) != len(set(positions)):
        problems.append("the same (partition, offset) was returned twice")
    where: dict[bytes, list[tuple[int, int]]] = {}
    for p, o, v in got:
        where.setdefault(v, []).append((p, o))
    acked = {v: a for load in loads for v, a in load.acked.items()}
    missing = [v for v in acked if v not in where]
    twice = {v: where[v] for v in acked if len(where.get(v, ())) > 1}
    no_offset = [v for v in acked if acked[v][1] is None]  # librdkafka acknowledged without an offset
    moved = {v: (acked[v][:2], where[v]) for v in acked if len(where.get(v, ())) == 1 and acked[v][1] is not None and where[v][0] != tuple(acked[v][:2])}
    if missing:
        problems.append(f"{len(missing)} of {len(acked)} acknowledged records lost, e.g. {sorted(missing)[:5]}")
    if twice:
        examples = list(twice.items())[:3]
        detail = "; ".join(f"{v!r} acked at {acked[v][:2]}: " + " / ".join(batch_at(cl, topic, p, o) for p, o in pos) for v, pos in examples)
        problems.append(f"{len(twice)} acknowledged records stored more than once, e.g. {detail}")
    if moved:
        problems.append(f"{len(moved)} records not at their acknowledged position, e.g. {list(moved.items())[:3]}")
    if no_offset and problems:
        problems.append(f"({len(no_offset)} records were acknowledged by librdkafka without an offset, e.g. {no_offset[:3]})")
    for load in loads:
        if load.unflushed:
            problems.append(f"{load.unflushed} records never acknowledged; delivery errors: {load.errors[:3]}")
        if max_latency is not None and load.acked:
            slow = load.slowest()
            if slow[0][0] > max_latency:
                problems.append(
                    "produce stalled: acknowledgements took up to "
                    + ", ".join(f"{lat:.1f}s ({v.decode()} to partition {p})" for lat, v, p in slow)
                    + f" (limit {max_latency}s)"
                )
    assert not problems, "\n".join(problems)
    return got


def raw_produce(b: BrokerProcess, topic: str, partition: int, value: bytes, timeout: float = 15.0):
    batch = records.build_batch([(None, value)], timestamp=int(time.time() * 1000))
    with RawClient(b.bootstrap, timeout=timeout) as c:
        return c.produce(topic, partition, batch, timeout_ms=int(timeout * 1000) - 2000)


def raw_fetch_partitions(b: BrokerProcess, topic: str, partitions: int, version: int = 12) -> dict[int, tuple[int, list[bytes]]]:
    """One Fetch for every partition of `topic` from offset 0: {partition: (error, values)}."""
    fps = tuple(
        req(1, version, "FetchPartition", partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20)
        for p in range(partitions)
    )  # fmt: skip
    body = req(1, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=50 << 20,
               isolation_level=0, session_id=0, session_epoch=-1, topics=(req(1, version, "FetchTopic", topic=topic, partitions=fps),),
               forgotten_topics_data=(), rack_id="")  # fmt: skip
    with RawClient(b.bootstrap, timeout=10) as c:
        resp = c.request(1, version, body)
    out = {}
    for pd in resp.responses[0].partitions:
        data = bytes(pd.records or b"")
        values = [r.value for pos, _h in records.iter_batches(data) for r in records.decode_records(data, pos)]
        out[pd.partition_index] = (error_code(pd.error_code), values)
    return out


def find_coordinator(b: BrokerProcess, group: str) -> int:
    with RawClient(b.bootstrap, timeout=5) as c:
        resp = c.request(FIND_COORDINATOR, 2, req(FIND_COORDINATOR, 2, key=group, key_type=0))
    assert error_code(resp.error_code) == 0, f"FindCoordinator: error {error_code(resp.error_code)}"
    return resp.node_id


# ---------------------------------------------------------------------------------------
# tests


def test_kill9_during_produce_and_group_consume(cluster_factory):
    """kill -9 of a broker (the group's coordinator, which also owns partitions) while an
    acks=all producer and a consumer group run: nothing acknowledged is lost, nothing is
    stored twice, and the group goes on consuming what is produced after the kill."""
    cl = cluster_factory("kill9")
    topic, group, parts = f"kill9-{cl.tag}", f"g-{cl.tag}", 6
    cl.create_topic(topic, parts)
    cl.wait_owned(topic, parts)

    reader = GroupReader(cl.bootstrap, topic, group)
    load = Load(cl.bootstrap, topic)
    reader.start()
    try:
        _kill9_run(cl, topic, group, parts, reader)
    finally:
        reader.stop()  # idempotent; also on failure, so no consumer outlives the test


def _kill9_run(cl: KCluster, topic: str, group: str, parts: int, reader: GroupReader) -> None:
    load = Load(cl.bootstrap, topic)
    load.start()
    try:
        wait_until(lambda: load.n_acked() >= 300 and reader.count() >= 200, 30, "producer and group to get going")
        victim = find_coordinator(cl.brokers[0], group)
        victim_parts = [p for p, (n, _) in cl.owners(topic).items() if n == victim]
        assert victim_parts, "the coordinator owns no partition; pick another victim"
        killed_at = time.monotonic()
        cl.brokers[victim].kill9()
        survivors = set(cl.live())
        owners = cl.wait_owned(topic, parts, timeout=cl.ttl + 10, by=survivors)
        takeover = time.monotonic() - killed_at
        wait_until(lambda: len(load.acked_since(killed_at + takeover)) >= 500, 30, "records produced after the takeover to be acknowledged")
    finally:
        load.stop()
    print(f"victim {victim} owned {victim_parts}; survivors own all after {takeover:.1f}s; {len(load.acked)} acked, {len(load.errors)} delivery errors")
    assert set(owners) == set(range(parts))

    after_kill = load.acked_since(killed_at)
    group_problem = None
    try:
        wait_until(lambda: not reader.missing(load.acked), 30, "the group to consume every acknowledged record")
    except AssertionError:
        group_problem = (
            f"group consumer: {len(reader.missing(load.acked))} acknowledged records never consumed, "
            f"{len(reader.missing(after_kill))} of {len(after_kill)} produced after the kill; consumer errors: {reader.errors[-5:]}"
        )
    finally:
        reader.stop()

    # The log itself first (a group problem must not hide lost records), then the group.
    got = verify(cl, topic, parts, load, max_latency=15)
    assert len({v for _, _, v in got}) == len(got), "a record was stored twice"
    assert group_problem is None, group_problem
    for v, where in reader.seen.items():
        assert len(where) == 1, f"group saw {v!r} at several positions {where}"


def test_etcd_restart_mid_run(cluster_factory, backends):
    """etcd stops for a few seconds (longer than half the lease TTL, so the owners stop
    writing) and comes back with its data: producing resumes and nothing acked is lost."""
    etcd, _ = backends
    cl = cluster_factory("etcdrestart")
    topic, parts = f"etcd-{cl.tag}", 3
    load = producing(cl, topic, parts)
    try:
        etcd.stop()
        try:
            time.sleep(4)  # the outage itself: > lease TTL / 2
        finally:
            etcd.start()
        restarted = time.monotonic()

        def per_partition():
            counts = dict.fromkeys(range(parts), 0)
            for v in load.acked_since(restarted):
                counts[load.acked[v][0]] += 1
            return counts

        try:
            wait_until(lambda: min(per_partition().values()) >= 50, 20, "records produced after the etcd restart to be acknowledged on every partition")
        except AssertionError as e:
            own = cl.owners(topic)
            answers = {q: error_code(raw_produce(cl.brokers[n], topic, q, b"probe").error_code) for q, (n, _) in own.items()}
            raise AssertionError(
                f"{e}; acknowledgements per partition since the restart: {per_partition()}; owner keys in etcd: {own}; "
                f"produce error code from each partition's owner: {answers}"
            ) from None
        recovery = min(load.acked[v][2] for v in load.acked_since(restarted)) - restarted
        print(f"first acknowledgement {recovery:.1f}s after etcd came back")
    finally:
        load.stop()
    verify(cl, topic, parts, load)


def test_s3_outage_rejects_then_recovers(cluster_factory, backends):
    """S3 frozen (SIGSTOP of moto; a restart would lose its in-memory objects): produce is
    not acknowledged during the outage; after it the brokers recover by themselves, new
    records are acknowledged and readable, and everything acknowledged before still is."""
    _, moto = backends
    cl = cluster_factory("s3outage")
    topic, parts = f"s3-{cl.tag}", 3
    cl.create_topic(topic, parts)
    cl.wait_owned(topic, parts)
    leader = cl.brokers[cl.owners(topic)[0][0]]

    def produce_all(tag: str, n: int, timeout: float, **conf):
        load = Load(cl.bootstrap, topic, tag=tag, **conf)
        p = Producer(load.conf)
        for i in range(n):
            p.produce(topic, key=b"k%d" % i, value=b"%s-%d" % (tag.encode(), i), on_delivery=load._on_delivery)
            load.sent_at.append(time.monotonic())
        load.unflushed = p.flush(timeout)
        return load

    before = produce_all("before", 300, 30)
    assert len(before.acked) == 300, f"before the outage: {len(before.acked)} acked, errors {before.errors[:3]}"

    moto.pause()
    try:
        paused_at = time.monotonic()
        during_box: list[Load] = []
        client = threading.Thread(target=lambda: during_box.append(produce_all("during", 50, 12, **{"message.timeout.ms": 8000, "enable.idempotence": False})))
        client.start()
        raw_answer = None  # (error code, seconds, message) of a raw acks=all produce; None: no answer
        with RawClient(leader.bootstrap, timeout=RAW_OUTAGE_WAIT_S) as c:
            batch = records.build_batch([(None, b"raw-during-outage")], timestamp=int(time.time() * 1000))
            try:
                resp = c.produce(topic, 0, batch, timeout_ms=8000)
                raw_answer = (error_code(resp.error_code), time.monotonic() - paused_at, resp.error_message)
            except TimeoutError:
                pass
        client.join(30)
        during = during_box[0]
    finally:
        moto.resume()
    resumed_at = time.monotonic()
    print(f"raw produce during the outage: {raw_answer}; client: {len(during.acked)} acked, {len(during.errors)} errors, e.g. {during.errors[:1]}")
    assert raw_answer is None or raw_answer[0] != 0, "a raw produce was acknowledged while S3 was down"
    assert not during.acked, f"{len(during.acked)} records acknowledged while S3 was down"
    assert len(during.errors) == 50, f"expected every record sent during the outage to fail, got {len(during.errors)} errors"

    after = produce_all("after", 300, 40)
    assert len(after.acked) == 300, f"after the outage: {len(after.acked)} of 300 acked, errors {after.errors[:3]}"
    first_ack = min(t for _, _, t in after.acked.values()) - resumed_at
    print(f"first acknowledgement {first_ack:.1f}s after S3 came back")

    verify(cl, topic, parts, before, after)

    # The broker must answer a produce during an S3 outage with a (retriable) error once
    # its S3 retry budget is spent (a few seconds, storage/s3.py), not hold it unanswered.
    assert raw_answer is not None, (
        f"no answer to an acks=all produce (timeout_ms 8000) within {RAW_OUTAGE_WAIT_S}s of S3 not answering: "
        "the upload hangs instead of failing within the S3 retry budget"
    )


def test_sigterm_hands_over_quickly(cluster_factory):
    """SIGTERM: the broker exits 0 and its partitions have new leaders in Metadata well
    within the lease TTL (10 s here), because it releases ownership instead of letting its
    lease expire; nothing acknowledged is lost."""
    cl = cluster_factory("sigterm", ttl=10)
    topic, parts = f"term-{cl.tag}", 6
    cl.create_topic(topic, parts)
    owners = cl.wait_owned(topic, parts)
    victim = 1
    victim_parts = sorted(p for p, (n, _) in owners.items() if n == victim)
    assert victim_parts
    survivors = [b for i, b in cl.brokers.items() if i != victim]

    load = started_load(cl, topic)
    try:
        proc = cl.brokers[victim].proc
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)

        def moved():
            for b in survivors:
                lead = cl.leaders(b, topic)
                if any(lead[p][0] in (victim, -1) for p in victim_parts):
                    return None
            return True

        wait_until(moved, 10, f"Metadata to name new leaders for {victim_parts}", interval=0.02)
        metadata_moved = time.monotonic() - t0
        cl.wait_owned(topic, parts, timeout=10, by={i for i in cl.brokers if i != victim})
        keys_moved = time.monotonic() - t0
        rc = proc.wait(20)
        exited = time.monotonic() - t0
        cl.brokers[victim].stop()
        wait_until(lambda: len(load.acked_since(t0 + keys_moved)) >= 300, 30, "acknowledgements after the hand-over")
    finally:
        load.stop()
    print(f"SIGTERM: exit {rc} after {exited:.2f}s; Metadata moved after {metadata_moved:.2f}s; owner keys after {keys_moved:.2f}s")
    assert rc == 0, f"broker exited with {rc}:\n{cl.brokers[victim].log_text()[-2000:]}"
    assert metadata_moved < 2.0, f"Metadata named new leaders only after {metadata_moved:.2f}s (lease TTL {cl.ttl}s)"
    assert keys_moved < 2.5, f"ownership in etcd moved only after {keys_moved:.2f}s"
    # A graceful hand-over flushes and answers what it holds: no producer waits long.
    verify(cl, topic, parts, load, max_latency=8)


def test_joining_broker_takes_its_share(cluster_factory):
    """A fourth broker joins: it takes its share of the partitions (8 partitions over 4
    brokers: 2 each), Metadata everywhere names it, and produce/consume keep working."""
    cl = cluster_factory("join")
    topic, parts = f"join-{cl.tag}", 8
    load = producing(cl, topic, parts)
    try:
        t0 = time.monotonic()
        new = cl.start_broker(3)

        def balanced():
            own = cl.owners(topic)
            counts = {n: sum(1 for o, _ in own.values() if o == n) for n in range(4)}
            return own if len(own) == parts and all(c == 2 for c in counts.values()) else None

        owners = wait_until(balanced, 20, "every broker to own exactly 2 of the 8 partitions")
        joined = time.monotonic() - t0
        mine = sorted(p for p, (n, _) in owners.items() if n == 3)
        for b in cl.live().values():
            lead = wait_until(lambda b=b: (lambda l: l if all(l[p][0] == owners[p][0] for p in l) else None)(cl.leaders(b, topic)), 10, f"Metadata from {b.bootstrap} to match etcd")
            assert sorted(p for p, (n, _) in lead.items() if n == 3) == mine
        t1 = time.monotonic()
        wait_until(lambda: len(load.acked_since(t1)) >= 300, 30, "acknowledgements after the join")
    finally:
        load.stop()
    print(f"broker 3 owns {mine} {joined:.1f}s after it started")
    late = load.acked_since(t1)
    assert any(load.acked[v][0] in mine for v in late), "nothing produced after the join went to the new broker's partitions"
    # Partitions moved by a graceful hand-over: no producer waits anywhere near its
    # message.timeout.ms (20 s), past which librdkafka would resend (a loaded 2-core machine
    # has seen 10 s while the new broker loads its partitions).
    verify(cl, topic, parts, load, max_latency=15, bootstrap=new.bootstrap)


def test_watches_see_hand_overs_long_before_the_resync(cluster_factory, backends):
    """With the periodic full re-read of ownership set to a minute, changes still arrive
    through etcd watches: a SIGTERM hand-over and a joining broker show in Metadata on
    every broker within seconds, also after etcd restarted (the watches are set up again)."""
    etcd, _ = backends
    resync_s = 60
    cl = cluster_factory("watch", ttl=10, broker_args=("--ownership-resync-ms", str(resync_s * 1000)))
    topic, parts = f"watch-{cl.tag}", 6
    cl.create_topic(topic, parts)
    cl.wait_owned(topic, parts)

    # etcd restarts (a short outage: well inside half the lease TTL, so nobody stops
    # writing); every broker's watches break and are set up again.
    etcd.stop()
    etcd.start()
    for i, b in cl.brokers.items():
        for prefix in ("/brokers/", "/owners/", "/topics/"):
            wait_until(lambda b=b, prefix=prefix: f"watching {prefix} again" in b.log_text(), 20, f"broker {i} to watch {prefix} again")
    owners = cl.wait_owned(topic, parts)
    wait_until(lambda: all(cl.leaders(b, topic) == owners for b in cl.brokers.values()), 10, "Metadata everywhere to match etcd")

    victim = 1
    victim_parts = sorted(p for p, (n, _) in owners.items() if n == victim)
    assert victim_parts
    survivors = {i: b for i, b in cl.brokers.items() if i != victim}
    t0 = time.monotonic()
    cl.brokers[victim].proc.send_signal(signal.SIGTERM)
    wait_until(
        lambda: all(cl.leaders(b, topic)[p][0] in survivors for b in survivors.values() for p in victim_parts),
        10, f"survivors' Metadata to name new leaders for {victim_parts}", interval=0.02,
    )  # fmt: skip
    handed_over = time.monotonic() - t0
    assert cl.brokers[victim].stop() == 0

    t1 = time.monotonic()
    cl.start_broker(victim)

    def rejoined():
        own = cl.owners(topic)
        if len(own) != parts or sum(1 for n, _ in own.values() if n == victim) != parts // 3:
            return None
        return all(cl.leaders(b, topic) == own for b in cl.brokers.values())

    wait_until(rejoined, 15, f"broker {victim} to take its share again, in every broker's Metadata", interval=0.02)
    joined = time.monotonic() - t1  # includes starting the broker process
    print(f"resync every {resync_s}s: SIGTERM hand-over in Metadata after {handed_over:.2f}s; rejoined (from process start) after {joined:.2f}s")
    assert handed_over < 3, f"SIGTERM hand-over took {handed_over:.2f}s"
    assert joined < 15


def test_metadata_names_owner_and_non_owner_rejects_produce(cluster_factory):
    """Metadata from every broker names the owner in etcd as leader (with its epoch); a
    produce to that broker succeeds, to any other it fails with NOT_LEADER_OR_FOLLOWER."""
    cl = cluster_factory("owner")
    topic, parts = f"owner-{cl.tag}", 6
    cl.create_topic(topic, parts)
    owners = cl.wait_owned(topic, parts)
    assert {n for n, _ in owners.values()} == {0, 1, 2}, f"6 partitions over 3 brokers should use them all: {owners}"

    for i, b in cl.brokers.items():
        md = cl.metadata(b, topic)
        assert sorted((x.node_id, x.host, x.port) for x in md.brokers) == sorted((j, "127.0.0.1", o.port) for j, o in cl.brokers.items())
        # Each broker re-reads the owner keys when its etcd watch reports a change: allow a little.
        seen = []
        try:
            wait_until(lambda b=b: seen.append(cl.leaders(b, topic)) or seen[-1] == owners, 3, f"Metadata from broker {i} to match etcd")
        except AssertionError:
            raise AssertionError(f"Metadata from broker {i}: {seen[-1:]}, etcd owners: {owners}") from None

    for p, (owner, _epoch) in owners.items():
        for i, b in cl.brokers.items():
            r = raw_produce(b, topic, p, b"to-%d-via-%d" % (p, i))
            if i == owner:
                assert error_code(r.error_code) == 0, f"produce to owner {i} of partition {p}: error {error_code(r.error_code)} {r.error_message}"
            else:
                assert error_code(r.error_code) == NOT_LEADER_OR_FOLLOWER, f"produce to non-owner {i} of partition {p}: error {error_code(r.error_code)}"
    got = read_all(cl.bootstrap, topic, parts)
    assert sorted(v for _, _, v in got) == sorted(b"to-%d-via-%d" % (p, n) for p, (n, _) in owners.items())
    # Reads need no owner: every broker serves every partition's flushed segments, all
    # partitions in one Fetch (the non-owned ones from the object store, loaded together).
    for i, b in cl.brokers.items():
        fetched = raw_fetch_partitions(b, topic, parts)
        assert fetched == {p: (0, [b"to-%d-via-%d" % (p, n)]) for p, (n, _) in owners.items()}, f"Fetch from broker {i}: {fetched}"


def test_failover_bumps_leader_epoch(cluster_factory):
    """After a kill -9 failover the partitions that moved have a higher leader epoch in
    Metadata (v7+), stored batches carry it, OffsetForLeaderEpoch for the old epoch ends
    where the new one started, and a fetch with the old epoch is fenced."""
    cl = cluster_factory("epoch")
    topic, parts = f"epoch-{cl.tag}", 6
    cl.create_topic(topic, parts)
    cl.wait_owned(topic, parts)
    p = Producer({"bootstrap.servers": cl.bootstrap, "acks": "all"})
    for i in range(60):
        p.produce(topic, value=b"e%d" % i, partition=i % parts)
    assert p.flush(20) == 0

    owners_before = cl.owners(topic)
    before = wait_until(lambda: (lambda v: v if v == owners_before else None)(cl.leaders(cl.brokers[0], topic, version=7)), 5, "Metadata to match etcd")
    victim = 2
    moved = sorted(q for q, (n, _) in before.items() if n == victim)
    assert moved
    cl.brokers[victim].kill9()
    survivors = [b for i, b in cl.brokers.items() if i != victim]
    views: list[dict[int, tuple[int, int]]] = []  # every Metadata answer seen during the failover

    def settled():
        own = cl.owners(topic)
        if len(own) != parts or any(n == victim for n, _ in own.values()):
            return None
        now = [cl.leaders(b, topic, version=7) for b in survivors]
        views.extend(now)
        return own if all(v == own for v in now) else None

    owners = wait_until(settled, cl.ttl + 10, "survivors to own every partition and say so in Metadata", interval=0.05)
    after = views[-1]
    for q in moved:
        assert after[q][1] > before[q][1], f"partition {q}: leader epoch {before[q][1]} -> {after[q][1]} after failover"
    assert all(after[q][1] >= before[q][1] for q in range(parts)), f"epochs before {before}, after {after}"

    q = moved[0]
    new_leader = cl.brokers[owners[q][0]]
    old_epoch, new_epoch = before[q][1], owners[q][1]
    r = raw_produce(new_leader, topic, q, b"after-failover")
    assert error_code(r.error_code) == 0
    with RawClient(new_leader.bootstrap) as c:
        data = c.fetch(topic, q, r.base_offset).records
        h = records.read_header(data, 0)
        assert h.partition_leader_epoch == new_epoch, f"batch written after failover carries epoch {h.partition_leader_epoch}, not {new_epoch}"

        def ofle(epoch: int, current: int = -1):
            part = req(OFFSET_FOR_LEADER_EPOCH, 4, "OffsetForLeaderPartition", partition=q, current_leader_epoch=current, leader_epoch=epoch)
            topic_req = req(OFFSET_FOR_LEADER_EPOCH, 4, "OffsetForLeaderTopic", topic=topic, partitions=(part,))
            resp = c.request(OFFSET_FOR_LEADER_EPOCH, 4, req(OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=(topic_req,)))
            return resp.topics[0].partitions[0]

        old = ofle(old_epoch)
        assert (error_code(old.error_code), old.end_offset) == (0, r.base_offset), f"old epoch {old_epoch}: {old}"
        cur = ofle(new_epoch, new_epoch)
        assert (error_code(cur.error_code), cur.leader_epoch, cur.end_offset) == (0, new_epoch, r.base_offset + 1)
        assert error_code(ofle(new_epoch, old_epoch).error_code) == FENCED_LEADER_EPOCH

        fp = req(1, 12, "FetchPartition", partition=q, current_leader_epoch=old_epoch, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
        ft = req(1, 12, "FetchTopic", topic=topic, partitions=(fp,))
        body = req(1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, topics=(ft,), forgotten_topics_data=(), rack_id="")
        fenced = c.request(1, 12, body).responses[0].partitions[0]
        assert error_code(fenced.error_code) == FENCED_LEADER_EPOCH

    # Leader epochs must never go backwards in Metadata (KIP-320: clients drop metadata
    # older than what they know), not even while a partition is between owners.
    regressions = sorted({(q, before[q][1], v[q][1], v[q][0]) for v in views for q in v if v[q][1] < before[q][1]})
    assert not regressions, (
        f"Metadata reported a leader epoch lower than before the failover (partition, epoch before, "
        f"epoch reported, leader reported): {regressions[:6]} out of {len(views)} answers"
    )


def test_assignment_is_balanced_and_moves_only_the_needed_share():
    from kafscale.cluster.etcd_cluster import assign_topic

    three = assign_topic("orders", 8, [0, 1, 2])
    assert sorted(three.count(n) for n in (0, 1, 2)) == [2, 3, 3]
    four = assign_topic("orders", 8, [0, 1, 2, 3], dict(enumerate(three)))
    assert all(four.count(n) == 2 for n in (0, 1, 2, 3))
    assert sum(a != b for a, b in zip(three, four)) == 2  # only what the new broker takes
    assert all(b == 3 for a, b in zip(three, four) if a != b)
    left = assign_topic("orders", 8, [0, 2, 3], dict(enumerate(four)))
    assert {p for p in range(8) if left[p] != four[p]} == {p for p in range(8) if four[p] == 1}  # only broker 1's


def test_write_ahead_objects_with_ownership_moving_mid_flush(cluster_factory, backends):
    """With --write-ahead-objects (one object per flush for all of a broker's partitions,
    issue #32): a broker killed -9 mid-load, then another stopped (SIGTERM, a graceful
    hand-over), while an acks=all producer writes to every partition; ownership moves
    under flushes in flight. Nothing acknowledged is lost, nothing is stored twice, and
    the data went through write-ahead objects, not per-partition segment flushes."""
    _etcd, moto = backends
    cl = cluster_factory("wao", broker_args=("--write-ahead-objects", "true", "--merge-interval-ms", "0"))
    topic, parts = f"wao-{cl.tag}", 12
    load = producing(cl, topic, parts)
    try:
        for how in ("kill9", "sigterm"):
            victim = cl.owners(topic)[0][0]
            moved_at = time.monotonic()
            cl.brokers[victim].kill9() if how == "kill9" else cl.brokers[victim].stop()
            cl.wait_owned(topic, parts, timeout=cl.ttl + 10, by=set(cl.live()))
            wait_until(lambda: len(load.acked_since(moved_at)) >= 300, 30, f"records acknowledged after the {how} hand-over")
    finally:
        load.stop()
    verify(cl, topic, parts, load)
    keys = _bucket_keys(cl, moto)
    assert any("/~wal/" in k and k.endswith(".wal") for k in keys)
    assert not [k for k in keys if k.endswith(".kfs") and f"/{topic}/" in k]  # no partition uploaded a segment of its own


def _bucket_keys(cl: KCluster, moto) -> list[str]:
    """Every key in the cluster's bucket, listed at moto."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    return [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cl.bucket) for o in page.get("Contents", [])]


def test_write_ahead_objects_with_a_broker_killed_and_one_joining_while_the_data_moves(cluster_factory, backends):
    """Write-ahead objects on (issue #32) with their rewrite into segment objects running
    (pieces rewritten after 1 s, objects deleted from 8 s on): while an acks=all producer
    writes to every partition, a broker is killed -9 (its partitions move to the survivors
    under flushes in flight, with pieces it wrote and never rewrote), then a new broker
    joins and takes its share from the owners (graceful hand-overs, the same). Every
    acknowledged record is read back once at its acknowledged offset, nothing is stored
    twice; the data went through write-ahead objects into segment objects, and every
    write-ahead object left when the producer stopped, the killed broker's included, is
    deleted by the brokers still running."""
    _etcd, moto = backends
    cl = cluster_factory("waj", broker_args=("--write-ahead-objects", "true", "--merge-interval-ms", "200", "--merge-grace-ms", "1000",
                                             "--segment-max-age-ms", "1000", "--write-ahead-orphan-age-ms", "8000"))  # fmt: skip
    topic, parts = f"waj-{cl.tag}", 12
    load = producing(cl, topic, parts)
    try:
        victim = cl.owners(topic)[0][0]
        killed_at = time.monotonic()
        cl.brokers[victim].kill9()
        cl.wait_owned(topic, parts, timeout=cl.ttl + 10, by=set(cl.live()))
        wait_until(lambda: len(load.acked_since(killed_at)) >= 300, 30, "records acknowledged after the kill -9 hand-over")
        joined_at = time.monotonic()
        cl.start_broker(3)
        owned = wait_until(lambda: (lambda own: own if sum(1 for n, _ in own.values() if n == 3) == parts // 3 else None)(cl.owners(topic)), 30,
                           "the joining broker to take its share")  # fmt: skip
        wait_until(lambda: len(load.acked_since(joined_at)) >= 300, 30, "records acknowledged after the join")
    finally:
        load.stop()
    late = load.acked_since(joined_at)
    assert any(load.acked[v][0] in {p for p, (n, _) in owned.items() if n == 3} for v in late), "nothing went to the joined broker's partitions"
    verify(cl, topic, parts, load)
    left = {k for k in _bucket_keys(cl, moto) if "/~wal/" in k}
    wait_until(lambda: not left & set(_bucket_keys(cl, moto)), 60, "every write-ahead object left at the end rewritten and deleted", interval=0.5)
    assert any(k.endswith(".kfs") and f"/{topic}/" in k for k in _bucket_keys(cl, moto))
    verify(cl, topic, parts, load)  # and read back from segment objects only
