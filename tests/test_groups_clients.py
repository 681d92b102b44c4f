"""Consumer groups against a real broker process, with real clients.

confluent-kafka (librdkafka), kafka-python, aiokafka and kcat share groups; admin APIs
are checked through confluent_kafka.admin; bad input goes over raw Kafka frames built
with kio. The broker runs as a subprocess (module fixture) with a short initial rebalance
delay; consumers use 6 s session timeouts so a killed member expires quickly.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kafscale.broker.handlers.groups import build
from kafscale.protocol.codec import schema
from tests.support.servers import free_port
from tests.support.wait import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.timeout(240)

E = ErrorCode
SESSION_MS = 6000
KCAT = shutil.which("kcat") or "/usr/bin/kcat"


# -- the broker process -----------------------------------------------------------------------


class BrokerProcess:
    def __init__(self):
        self.port = free_port()
        self.data_dir = tempfile.mkdtemp(prefix="kafscale-groups-")
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.data_dir, "broker.log")
        self._log = None

    def start(self):
        cmd = [
            sys.executable, "-m", "kafscale", "broker",
            "--listen", self.bootstrap, "--data-dir", self.data_dir, "--http", "",
            "--group-initial-rebalance-delay-ms", "0", "--flush-interval-ms", "20",
        ]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("broker did not open its port\n" + self.log_tail())

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="module")
def broker():
    b = BrokerProcess()
    b.start()
    yield b
    b.stop()
    shutil.rmtree(b.data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(admin, name: str, partitions: int = 6):
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(15)


def produce(bootstrap: str, topic: str, values: list[str], partitions: int = 6) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failures = []

    def delivered(err, msg):
        if err is not None:
            failures.append(err)

    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % partitions, on_delivery=delivered)
    assert p.flush(20) == 0 and not failures, failures


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- consumers of three client libraries, each in its own thread -------------------------------


class Deliveries:
    """Every record any consumer received: (partition, offset, value, consumer)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items: list[tuple[int, int, str, str]] = []

    def add(self, partition, offset, value, who):
        with self.lock:
            self.items.append((partition, offset, value, who))

    def snapshot(self):
        with self.lock:
            return list(self.items)


class ConsumerThread(threading.Thread):
    """Polls continuously and commits synchronously after each batch it records."""

    def __init__(self, name: str, deliveries: Deliveries):
        super().__init__(name=name, daemon=True)
        self.stop_event = threading.Event()
        self.deliveries = deliveries
        self.assigned: frozenset[int] = frozenset()
        self.errors: list[str] = []
        self.started_ok = threading.Event()

    def run(self):
        try:
            self.loop()
        except Exception as e:  # surfaced by the test through .errors
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name} did not stop"


class ConfluentConsumer(ConsumerThread):
    def __init__(self, name, deliveries, bootstrap, topic, group, **extra):
        super().__init__(name, deliveries)
        self.conf = {
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 30000,
            **extra,
        }
        self.topic = topic
        self.assign_events: list[tuple[str, list[int]]] = []
        self.member_id = ""

    def loop(self):
        c = Consumer(self.conf)

        def on_assign(consumer, parts):
            self.assign_events.append(("assign", sorted(p.partition for p in parts)))

        def on_revoke(consumer, parts):
            self.assign_events.append(("revoke", sorted(p.partition for p in parts)))

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        self.started_ok.set()
        try:
            while not self.stop_event.is_set():
                m = c.poll(0.1)
                self.assigned = frozenset(tp.partition for tp in c.assignment())
                self.member_id = c.memberid() or ""
                if m is None or m.error():
                    continue
                self.deliveries.add(m.partition(), m.offset(), m.value().decode(), self.name)
                try:
                    c.commit(message=m, asynchronous=False)
                except Exception as e:
                    self.errors.append(f"commit: {e}")
        finally:
            c.close()


class KafkaPythonConsumer(ConsumerThread):
    def __init__(self, name, deliveries, bootstrap, topic, group):
        super().__init__(name, deliveries)
        self.args = dict(
            bootstrap_servers=bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
            max_poll_interval_ms=30000,
        )
        self.topic = topic

    def loop(self):
        from kafka import KafkaConsumer

        c = KafkaConsumer(self.topic, **self.args)
        self.started_ok.set()
        try:
            while not self.stop_event.is_set():
                batch = c.poll(timeout_ms=100)
                for tp, msgs in batch.items():
                    for m in msgs:
                        self.deliveries.add(tp.partition, m.offset, m.value.decode(), self.name)
                if batch:
                    try:
                        c.commit()
                    except Exception as e:
                        self.errors.append(f"commit: {e}")
                self.assigned = frozenset(tp.partition for tp in c.assignment())
        finally:
            c.close()


class AioKafkaConsumer(ConsumerThread):
    def __init__(self, name, deliveries, bootstrap, topic, group):
        super().__init__(name, deliveries)
        self.args = dict(
            bootstrap_servers=bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
            max_poll_interval_ms=30000, rebalance_timeout_ms=30000,
        )
        self.topic = topic

    def loop(self):
        asyncio.run(self._main())

    async def _main(self):
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(self.topic, **self.args)
        await c.start()
        self.started_ok.set()
        try:
            while not self.stop_event.is_set():
                batch = await c.getmany(timeout_ms=100)
                for tp, msgs in batch.items():
                    for m in msgs:
                        self.deliveries.add(tp.partition, m.offset, m.value.decode(), self.name)
                if batch:
                    try:
                        await c.commit()
                    except Exception as e:
                        self.errors.append(f"commit: {e}")
                self.assigned = frozenset(tp.partition for tp in c.assignment())
        finally:
            await c.stop()


KILLABLE_CONSUMER = r"""
import json, sys
from confluent_kafka import Consumer
bootstrap, topic, group, name = sys.argv[1:5]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 30000})
c.subscribe([topic])
last = None
while True:
    m = c.poll(0.1)
    assigned = sorted(tp.partition for tp in c.assignment())
    if assigned != last:
        print(json.dumps({"assigned": assigned}), flush=True)
        last = assigned
    if m is None or m.error():
        continue
    print(json.dumps({"p": m.partition(), "o": m.offset(), "v": m.value().decode()}), flush=True)
    c.commit(message=m, asynchronous=False)
"""


class KillableConsumer:
    """A confluent consumer in a child process, so it can die without leaving the group."""

    def __init__(self, name, deliveries, bootstrap, topic, group):
        self.name = name
        self.deliveries = deliveries
        self.assigned: frozenset[int] = frozenset()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", KILLABLE_CONSUMER, bootstrap, topic, group, name],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            event = json.loads(line)
            if "assigned" in event:
                self.assigned = frozenset(event["assigned"])
            else:
                self.deliveries.add(event["p"], event["o"], event["v"], self.name)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.reader.join(10)
        self.proc.stdout.close()
        self.assigned = frozenset()


def describe(admin, group: str):
    return admin.describe_consumer_groups([group])[group].result(15)


def wait_for_stable_split(admin, group: str, consumers, partitions: int = 6, timeout: float = 45):
    """Every consumer owns a share, the shares are disjoint and cover the topic, and the
    broker reports the group Stable with exactly these members."""
    from confluent_kafka import ConsumerGroupState

    def settled():
        shares = [c.assigned for c in consumers]
        if any(not s for s in shares) or sum(len(s) for s in shares) != partitions:
            return False
        if set().union(*shares) != set(range(partitions)):
            return False
        d = describe(admin, group)
        return d.state == ConsumerGroupState.STABLE and len(d.members) == len(consumers)

    wait_until(settled, timeout, f"a stable split of {group} over {[c.name for c in consumers]}", interval=0.3)


def committed_total(admin, group: str, topic: str, partitions: int = 6) -> int:
    from confluent_kafka import ConsumerGroupTopicPartitions

    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    res = admin.list_consumer_group_offsets([req])[group].result(15)
    return sum(max(tp.offset, 0) for tp in res.topic_partitions)


def produce_phase(broker, admin, deliveries, topic, group, phase, consumers, total_so_far, count=30, partitions=6):
    """Produce `count` records while membership is stable; each must reach exactly the one
    consumer that owns its partition, and be committed before membership changes again."""
    values = [f"{phase}-{i}" for i in range(count)]
    owners = {p: c.name for c in consumers for p in c.assigned}
    produce(broker.bootstrap, topic, values, partitions)
    wait_until(lambda: len(deliveries.snapshot()) >= total_so_far + count, 30, f"phase {phase} deliveries")
    wait_until(lambda: committed_total(admin, group, topic, partitions) == total_so_far + count, 20,
               f"phase {phase} commits")
    got = [d for d in deliveries.snapshot() if d[2].startswith(f"{phase}-")]
    assert sorted(d[2] for d in got) == sorted(values), "every record exactly once"
    for partition, _offset, _value, who in got:
        assert owners[partition] == who, f"partition {partition} owned by {owners[partition]} but read by {who}"
    return total_so_far + count


# -- tests ------------------------------------------------------------------------------------


def test_three_client_libraries_share_a_group_through_join_leave_and_kill(broker, admin):
    topic, group = unique_name("shared"), unique_name("mixed")
    create_topic(admin, topic)
    deliveries = Deliveries()
    total = 0

    first = ConfluentConsumer("confluent", deliveries, broker.bootstrap, topic, group)
    first.start()
    wait_for_stable_split(admin, group, [first])
    total = produce_phase(broker, admin, deliveries, topic, group, "alone", [first], total)

    # Two more client libraries join: the group rebalances across all three.
    second = KafkaPythonConsumer("kafka-python", deliveries, broker.bootstrap, topic, group)
    third = AioKafkaConsumer("aiokafka", deliveries, broker.bootstrap, topic, group)
    second.start()
    third.start()
    members = [first, second, third]
    wait_for_stable_split(admin, group, members)
    assert all(len(c.assigned) == 2 for c in members)
    d = describe(admin, group)
    assert d.partition_assignor == "roundrobin", "the only strategy all three clients support"
    assert {m.client_id for m in d.members} == {"confluent", "kafka-python", "aiokafka"}
    total = produce_phase(broker, admin, deliveries, topic, group, "three", members, total)

    # A fourth member that will die without leaving.
    doomed = KillableConsumer("doomed", deliveries, broker.bootstrap, topic, group)
    try:
        members = [first, second, third, doomed]
        wait_for_stable_split(admin, group, members)
        total = produce_phase(broker, admin, deliveries, topic, group, "four", members, total)
        orphaned = doomed.assigned
        doomed.kill()
        killed_at = time.time()
    finally:
        if doomed.proc.poll() is None:
            doomed.kill()
    members = [first, second, third]
    wait_for_stable_split(admin, group, members, timeout=SESSION_MS / 1000 + 30)
    assert time.time() - killed_at >= SESSION_MS / 1000 * 0.8, "the dead member expired by session timeout"
    assert orphaned <= set().union(*(c.assigned for c in members))
    total = produce_phase(broker, admin, deliveries, topic, group, "after-kill", members, total)

    # A graceful leave (kafka-python sends LeaveGroup on close).
    second.stop()
    members = [first, third]
    wait_for_stable_split(admin, group, members, timeout=20)
    total = produce_phase(broker, admin, deliveries, topic, group, "after-leave", members, total)

    first.stop()
    third.stop()
    everything = deliveries.snapshot()
    keys = [(p, o) for p, o, _, _ in everything]
    assert len(keys) == len(set(keys)) == total, "no committed record was delivered twice across rebalances"
    for c in (first, second, third):
        assert not [e for e in c.errors if "commit" not in e], c.errors


def test_cooperative_sticky_rebalances_incrementally(broker, admin):
    topic, group = unique_name("coop"), unique_name("coop-g")
    create_topic(admin, topic)
    deliveries = Deliveries()
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    a = ConfluentConsumer("coop-a", deliveries, broker.bootstrap, topic, group, **conf)
    a.start()
    wait_for_stable_split(admin, group, [a])
    total = produce_phase(broker, admin, deliveries, topic, group, "a", [a], 0)
    b = ConfluentConsumer("coop-b", deliveries, broker.bootstrap, topic, group, **conf)
    b.start()
    wait_for_stable_split(admin, group, [a, b])
    assert describe(admin, group).partition_assignor == "cooperative-sticky"
    # Incremental: a gave up only what b took, and never had everything revoked.
    revoked = [set(ps) for kind, ps in a.assign_events if kind == "revoke"]
    assert revoked and set().union(*revoked) == set(b.assigned)
    assert len(a.assigned) == 3 and len(b.assigned) == 3
    assert [kind for kind, _ in b.assign_events if kind == "revoke"] == []
    total = produce_phase(broker, admin, deliveries, topic, group, "ab", [a, b], total)
    a.stop()
    wait_for_stable_split(admin, group, [b], timeout=20)
    total = produce_phase(broker, admin, deliveries, topic, group, "b", [b], total)
    b.stop()
    keys = [(p, o) for p, o, _, _ in deliveries.snapshot()]
    assert len(keys) == len(set(keys)) == total


def current_generation(broker, group: str, member_id: str, instance_id: str | None = None) -> int:
    """Find the group's generation by probing Heartbeat (only the current one answers NONE)."""
    with RawClient(broker.port) as raw:
        for gen in range(1, 50):
            r = raw.call(12, 4, group_id=group, generation_id=gen, member_id=member_id, group_instance_id=instance_id)
            if r.error_code is E.none:
                return gen
            assert r.error_code is E.illegal_generation, r
    raise AssertionError("no generation answered")


def test_static_member_restarts_without_rebalance(broker, admin):
    from confluent_kafka import ConsumerGroupState

    topic, group = unique_name("static"), unique_name("static-g")
    create_topic(admin, topic)
    deliveries = Deliveries()
    static_conf = {"group.instance.id": "instance-x", "session.timeout.ms": 10000}
    x = ConfluentConsumer("static-x", deliveries, broker.bootstrap, topic, group, **static_conf)
    y = ConfluentConsumer("peer-y", deliveries, broker.bootstrap, topic, group)
    x.start()
    y.start()
    wait_for_stable_split(admin, group, [x, y])
    before = {m.group_instance_id: m for m in describe(admin, group).members}
    x_partitions = x.assigned
    y_events = list(y.assign_events)
    generation = current_generation(broker, group, y.member_id)

    x.stop()  # static members do not send LeaveGroup on close
    x2 = ConfluentConsumer("static-x", deliveries, broker.bootstrap, topic, group, **static_conf)
    x2.start()
    wait_until(lambda: x2.assigned, 20, "the restarted static member's assignment")
    assert x2.assigned == x_partitions, "it gets its old assignment back"
    after = describe(admin, group)
    assert after.state == ConsumerGroupState.STABLE and len(after.members) == 2
    by_instance = {m.group_instance_id: m for m in after.members}
    assert by_instance["instance-x"].member_id != before["instance-x"].member_id, "a new member id"
    assert {tp.partition for tp in by_instance["instance-x"].assignment.topic_partitions} == set(x_partitions)
    assert current_generation(broker, group, y.member_id) == generation, "no rebalance: same generation"
    assert y.assign_events == y_events, "the peer saw no rebalance"
    total = produce_phase(broker, admin, deliveries, topic, group, "after-restart", [x2, y], len(deliveries.snapshot()))
    x2.stop()
    y.stop()
    keys = [(p, o) for p, o, _, _ in deliveries.snapshot()]
    assert len(keys) == len(set(keys)) == total


def test_kcat_balanced_consumer(broker, admin):
    topic, group = unique_name("kcat"), unique_name("kcat-g")
    create_topic(admin, topic, 3)
    values = [f"k-{i}" for i in range(12)]
    produce(broker.bootstrap, topic, values, partitions=3)
    out = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-G", group, "-c", "12", "-q", "-f", "%p %o %s\n",
         "-X", "auto.offset.reset=earliest", topic],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines() if line.strip()]
    assert sorted(v for _, _, v in lines) == sorted(values)
    assert len({(p, o) for p, o, _ in lines}) == 12
    # kcat commits on exit: the group resumes after everything it read.
    wait_until(lambda: committed_total(admin, group, topic, 3) == 12, 15, "kcat's commits")
    from confluent_kafka import ConsumerGroupState

    assert describe(admin, group).state == ConsumerGroupState.EMPTY


def test_admin_describe_list_delete_field_by_field(broker, admin):
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions

    topic, group = unique_name("admin"), unique_name("admin-g")
    create_topic(admin, topic, 4)
    deliveries = Deliveries()
    a = ConfluentConsumer("admin-a", deliveries, broker.bootstrap, topic, group)
    b = ConfluentConsumer("admin-b", deliveries, broker.bootstrap, topic, group, **{"group.instance.id": "inst-b"})
    a.start()
    b.start()
    wait_for_stable_split(admin, group, [a, b], partitions=4)

    d = describe(admin, group)
    assert d.group_id == group
    assert d.state == ConsumerGroupState.STABLE
    assert d.is_simple_consumer_group is False
    assert d.partition_assignor == "range", "librdkafka's first choice when all members agree"
    assert d.coordinator.id == 0 and d.coordinator.port == broker.port
    members = {m.client_id: m for m in d.members}
    assert set(members) == {"admin-a", "admin-b"}
    assert members["admin-a"].member_id == a.member_id and members["admin-b"].member_id == b.member_id
    assert members["admin-a"].group_instance_id is None
    assert members["admin-b"].group_instance_id == "inst-b"
    assert members["admin-a"].host.lstrip("/") == "127.0.0.1"
    for name, consumer in (("admin-a", a), ("admin-b", b)):
        tps = members[name].assignment.topic_partitions
        assert {tp.topic for tp in tps} == {topic}
        assert {tp.partition for tp in tps} == set(consumer.assigned)

    listed = {g.group_id: g for g in admin.list_consumer_groups().result(15).valid}
    assert listed[group].state == ConsumerGroupState.STABLE and listed[group].is_simple_consumer_group is False
    stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(15).valid
    empty = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(15).valid
    assert group in {g.group_id for g in stable} and group not in {g.group_id for g in empty}

    # A live group cannot be deleted.
    with pytest.raises(confluent_kafka.KafkaException) as err:
        admin.delete_consumer_groups([group])[group].result(15)
    assert err.value.args[0].code() == confluent_kafka.KafkaError.NON_EMPTY_GROUP

    produce(broker.bootstrap, topic, [f"v{i}" for i in range(8)], partitions=4)
    wait_until(lambda: committed_total(admin, group, topic, 4) == 8, 20, "commits")
    a.stop()
    b.stop()
    # b is static: it stays until its session times out, unless removed by instance id.
    with RawClient(broker.port) as raw:
        r = raw.call(13, 4, group_id=group, members=[dict(member_id="", group_instance_id="inst-b")])
        assert r.error_code is E.none and r.members[0].error_code is E.none
    wait_until(lambda: describe(admin, group).state == ConsumerGroupState.EMPTY, 20, "the group to empty")
    d = describe(admin, group)
    assert d.members == [] and d.partition_assignor == ""

    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(4)])])[group].result(15)
    assert sum(tp.offset for tp in offsets.topic_partitions) == 8

    assert admin.delete_consumer_groups([group])[group].result(15) is None
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(15).valid}
    try:
        gone = describe(admin, group)
        assert gone.state == ConsumerGroupState.DEAD and gone.members == []
    except confluent_kafka.KafkaException as e:
        assert e.args[0].code() == confluent_kafka.KafkaError.GROUP_ID_NOT_FOUND
    with RawClient(broker.port) as raw:
        r = raw.call(9, 7, group_id=group, topics=None)
        assert r.error_code is E.none and r.topics == (), "the deleted group's offsets are gone"


# -- raw protocol ------------------------------------------------------------------------------


class RawClient:
    """One connection speaking kio-encoded requests (header v1/v2, response header v0/v1)."""

    def __init__(self, port: int, client_id: str = "raw"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.client_id = client_id.encode()
        self.correlation = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def call(self, api_key: int, version: int, **fields):
        req_cls = schema(api_key, version, "request")
        req = build(req_cls, **fields)
        self.correlation += 1
        header = struct.pack(">hhih", api_key, version, self.correlation, len(self.client_id)) + self.client_id
        if req_cls.__flexible__:
            header += b"\x00"
        body = io.BytesIO()
        entity_writer(req_cls)(body, req)
        payload = header + body.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._read(4))
        data = self._read(size)
        (correlation,) = struct.unpack_from(">i", data, 0)
        assert correlation == self.correlation
        resp_cls = schema(api_key, version, "response")
        offset = 4 + (1 if resp_cls.__flexible__ and api_key != 18 else 0)
        value, _ = entity_reader(resp_cls)(memoryview(data), offset)
        return value

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


RAW_SESSION = 30_000


def raw_join(port, group, member_id="", protocols=None, protocol_type="consumer", instance=None, version=5):
    protocols = protocols if protocols is not None else [("range", subscription("raw-topic"))]
    with RawClient(port) as raw:
        return raw.call(11, version, group_id=group, session_timeout=RAW_SESSION, rebalance_timeout=RAW_SESSION,
                        member_id=member_id, group_instance_id=instance, protocol_type=protocol_type,
                        protocols=[dict(name=n, metadata=m) for n, m in protocols])


def raw_form_group(port, group, topics=("raw-topic",), instances=(None, None)):
    """Two members, formed deterministically: the first forms generation 1 alone, then the
    second joins and the first rejoins, so both land in the next generation together.
    Dynamic members go through MEMBER_ID_REQUIRED; the leader assigns b"part-of-<id>"."""
    protocols = [("range", subscription(*topics))]

    def join(instance, member_id=""):
        r = raw_join(port, group, member_id, protocols, instance=instance)
        if r.error_code is E.member_id_required:
            assert r.member_id and instance is None
            r = raw_join(port, group, r.member_id, protocols, instance=instance)
        return r

    def sync(mid, instance, generation, leader, ids):
        # The follower sends assignments too; Kafka uses only the leader's.
        mine = "part-of-{}" if mid == leader else "FROM-FOLLOWER-{}"
        with RawClient(port) as raw:
            assignments = [dict(member_id=m, assignment=mine.format(m).encode()) for m in ids]
            return raw.call(14, 3, group_id=group, generation_id=generation, member_id=mid,
                            group_instance_id=instance, assignments=assignments)

    first = join(instances[0])
    assert first.error_code is E.none and first.leader == first.member_id
    assert sync(first.member_id, instances[0], first.generation_id, first.member_id, [first.member_id]).error_code is E.none
    with ThreadPoolExecutor(2) as pool:
        second_f = pool.submit(join, instances[1])
        # Rejoin only once the newcomer is parked, or the first would complete a generation alone.
        with RawClient(port) as raw:
            wait_until(lambda: raw.call(15, 5, groups=(group,)).groups[0].group_state == "PreparingRebalance",
                       10, "the second member to start a rebalance", interval=0.02)
        rejoin_f = pool.submit(join, instances[0], first.member_id)
        second, rejoin = second_f.result(60), rejoin_f.result(60)
    assert second.error_code is E.none and rejoin.error_code is E.none, (second, rejoin)
    gen = rejoin.generation_id
    assert second.generation_id == gen == first.generation_id + 1
    leader = rejoin.leader
    ids = [rejoin.member_id, second.member_id]
    with ThreadPoolExecutor(2) as pool:
        syncs = list(pool.map(lambda a: sync(a[0], a[1], gen, leader, ids), zip(ids, instances)))
    assert [(s.error_code, s.assignment) for s in syncs] == [(E.none, f"part-of-{m}".encode()) for m in ids], syncs
    return ids, leader, gen


def assert_group_usable(port, group, members, gen):
    with RawClient(port) as raw:
        for mid in members:
            assert raw.call(12, 3, group_id=group, generation_id=gen, member_id=mid).error_code is E.none
        d = raw.call(15, 5, groups=(group,))
        assert d.groups[0].group_state == "Stable" and len(d.groups[0].members) == len(members)


def test_raw_bad_input_gets_kafka_errors_and_group_stays_usable(broker, admin):
    port = broker.port
    topic = unique_name("raw-t")
    create_topic(admin, topic, 2)
    group = unique_name("raw-g")
    ids, leader, gen = raw_form_group(port, group, topics=(topic,))
    follower = next(m for m in ids if m != leader)

    with RawClient(port) as raw:
        # Heartbeat: stale generation, unknown member.
        assert raw.call(12, 3, group_id=group, generation_id=gen - 1, member_id=leader).error_code is E.illegal_generation
        assert raw.call(12, 3, group_id=group, generation_id=gen, member_id="ghost").error_code is E.unknown_member_id
        assert raw.call(12, 3, group_id="", generation_id=gen, member_id=leader).error_code is E.invalid_group_id

        def commit(member_id, generation, partition=0, name=topic):
            r = raw.call(8, 8, group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                         topics=[dict(name=name, partitions=[dict(partition_index=partition, committed_offset=5,
                                                                  committed_metadata="raw-md")])])
            return r.topics[0].partitions[0].error_code

        assert commit(leader, gen + 3) is E.illegal_generation
        assert commit("ghost", gen) is E.unknown_member_id
        assert commit("", -1) is E.unknown_member_id, "outsiders may not commit to a live group"
        assert commit(leader, gen, partition=7) is E.unknown_topic_or_partition
        assert commit(leader, gen, name=unique_name("missing")) is E.unknown_topic_or_partition
        assert commit(follower, gen) is E.none
        f = raw.call(9, 7, group_id=group, topics=[dict(name=topic, partition_indexes=(0, 1))])
        parts = {p.partition_index: p for p in f.topics[0].partitions}
        assert (parts[0].committed_offset, parts[0].metadata) == (5, "raw-md")
        assert (parts[1].committed_offset, parts[1].metadata, parts[1].error_code) == (-1, "", E.none)

        # Sync from a non-leader in a Stable group returns its assignment, ignoring what it sent.
        s = raw.call(14, 5, group_id=group, generation_id=gen, member_id=follower, protocol_type="consumer",
                     protocol_name="range", assignments=[dict(member_id=follower, assignment=b"MINE-NOW")])
        assert s.error_code is E.none and s.assignment == f"part-of-{follower}".encode()
        assert s.protocol_type == "consumer" and s.protocol_name == "range"
        s = raw.call(14, 5, group_id=group, generation_id=gen, member_id=follower, protocol_type="consumer",
                     protocol_name="roundrobin", assignments=[])
        assert s.error_code is E.inconsistent_group_protocol

        # OffsetDelete: a Stable consumer group subscribed to the topic keeps its offsets.
        r = raw.call(47, 0, group_id=group, topics=[dict(name=topic, partitions=[dict(partition_index=0)])])
        assert r.error_code is E.none and r.topics[0].partitions[0].error_code is E.group_subscribed_to_topic
        d = raw.call(42, 1, groups_names=(group,))
        assert d.results[0].error_code is E.non_empty_group

        # FindCoordinator for transactions and for groups names this broker.
        fc = raw.call(10, 4, key_type=1, coordinator_keys=("txn-1",))
        assert fc.coordinators[0].error_code is E.none and (fc.coordinators[0].node_id, fc.coordinators[0].port) == (0, port)
        fc = raw.call(10, 3, key=group, key_type=0)
        assert fc.error_code is E.none and (fc.node_id, fc.port) == (0, port)

    # JoinGroup with no protocol in common, or another protocol type.
    r = raw_join(port, group, protocols=[("roundrobin", subscription(topic))], version=4)
    assert r.error_code is E.inconsistent_group_protocol
    r = raw_join(port, group, protocol_type="connect", version=4)
    assert r.error_code is E.inconsistent_group_protocol
    # Oversized member metadata (over 1 MiB) is refused before it touches the group.
    r = raw_join(port, group, protocols=[("range", b"\x00" * (1024 * 1024 + 16))], version=4)
    assert r.error_code is E.invalid_request
    r = raw_join(port, group, member_id=follower, protocols=[("range", b"\x00" * (1024 * 1024 + 16))])
    assert r.error_code is E.invalid_request
    assert_group_usable(port, group, [leader, follower], gen)

    # A follower rejoining with unchanged metadata gets the current generation: no rebalance.
    r = raw_join(port, group, member_id=follower, protocols=[("range", subscription(topic))])
    assert r.error_code is E.none and r.generation_id == gen and r.leader == leader and r.members == ()
    assert_group_usable(port, group, [leader, follower], gen)

    # A graceful leave (v3+ batch with an unknown member) then a rejoin rebalance.
    with RawClient(port) as raw:
        r = raw.call(13, 3, group_id=group, members=[dict(member_id=follower), dict(member_id="ghost")])
        assert r.error_code is E.none
        assert [m.error_code for m in r.members] == [E.none, E.unknown_member_id]
        assert raw.call(12, 3, group_id=group, generation_id=gen, member_id=leader).error_code is E.rebalance_in_progress
    r = raw_join(port, group, member_id=leader, protocols=[("range", subscription(topic))])
    assert r.error_code is E.none and r.generation_id == gen + 1 and [m.member_id for m in r.members] == [leader]


def test_raw_static_member_keeps_generation_and_fences_old_id(broker):
    port = broker.port
    group = unique_name("raw-static")
    ids, leader, gen = raw_form_group(port, group, instances=("s1", "s2"))
    by_instance = dict(zip(("s1", "s2"), ids))
    follower_inst = next(i for i, m in by_instance.items() if m != leader)
    old_id = by_instance[follower_inst]
    # The static member restarts: empty member id, same instance id.
    r = raw_join(port, group, instance=follower_inst)
    assert r.error_code is E.none and r.generation_id == gen and r.member_id != old_id
    assert r.member_id.startswith(follower_inst + "-")
    with RawClient(port) as raw:
        s = raw.call(14, 3, group_id=group, generation_id=gen, member_id=r.member_id, group_instance_id=follower_inst,
                     assignments=[])
        assert s.error_code is E.none and s.assignment == f"part-of-{old_id}".encode(), "its old assignment"
        old = raw.call(12, 3, group_id=group, generation_id=gen, member_id=old_id, group_instance_id=follower_inst)
        assert old.error_code is E.fenced_instance_id
        new = raw.call(12, 3, group_id=group, generation_id=gen, member_id=r.member_id, group_instance_id=follower_inst)
        assert new.error_code is E.none
        assert raw.call(12, 3, group_id=group, generation_id=gen, member_id=leader,
                        group_instance_id=next(i for i in by_instance if i != follower_inst)).error_code is E.none
        d = raw.call(15, 5, groups=(group,))
        assert d.groups[0].group_state == "Stable"
        assert {m.group_instance_id for m in d.groups[0].members} == {"s1", "s2"}
        assert r.member_id in {m.member_id for m in d.groups[0].members}


def test_committed_offsets_and_group_survive_broker_restart(broker, admin):
    from confluent_kafka import ConsumerGroupState

    topic, group = unique_name("restart"), unique_name("restart-g")
    create_topic(admin, topic, 2)
    produce(broker.bootstrap, topic, [f"before-{i}" for i in range(10)], partitions=2)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": SESSION_MS})
    c.subscribe([topic])
    seen = []
    deadline = time.time() + 30
    while len(seen) < 10 and time.time() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            seen.append(m.value().decode())
    assert sorted(seen) == sorted(f"before-{i}" for i in range(10))
    positions = c.position([TopicPartition(topic, p) for p in range(2)])
    c.commit(offsets=[TopicPartition(topic, tp.partition, tp.offset, metadata=f"md-{tp.partition}")
                      for tp in positions], asynchronous=False)
    c.close()

    # A member that stays up across the restart, as across a Kafka coordinator failover.
    live_topic, live_group = unique_name("live"), unique_name("live-g")
    create_topic(admin, live_topic, 2)
    deliveries = Deliveries()
    live = ConfluentConsumer("live", deliveries, broker.bootstrap, live_topic, live_group)
    live.start()
    try:
        wait_for_stable_split(admin, live_group, [live], partitions=2)
        member_id = live.member_id
        total = produce_phase(broker, admin, deliveries, live_topic, live_group, "pre", [live], 0, count=10,
                               partitions=2)

        broker.stop()
        broker.start()
        restarted_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        wait_until(lambda: _safe(lambda: describe(restarted_admin, live_group).state == ConsumerGroupState.STABLE),
                   30, "the live group restored")
        total = produce_phase(broker, restarted_admin, deliveries, live_topic, live_group, "post", [live], total,
                              count=10, partitions=2)
        keys = [(p, o) for p, o, _, _ in deliveries.snapshot()]
        assert len(keys) == len(set(keys)) == total, "nothing committed before the restart came back"
        assert [m.member_id for m in describe(restarted_admin, live_group).members] == [member_id], (
            "the member kept its id: the restored group accepted its heartbeats")
    finally:
        live.stop()

    wait_until(lambda: _safe(lambda: describe(restarted_admin, group).state == ConsumerGroupState.EMPTY), 30,
               "the group after restart")
    assert group in {g.group_id for g in restarted_admin.list_consumer_groups().result(15).valid}
    c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                   "enable.auto.commit": False, "session.timeout.ms": SESSION_MS})
    committed = c2.committed([TopicPartition(topic, p) for p in range(2)], timeout=15)
    assert sorted((tp.partition, tp.offset, tp.metadata) for tp in committed) == [
        (tp.partition, tp.offset, f"md-{tp.partition}") for tp in sorted(positions, key=lambda t: t.partition)]
    produce(broker.bootstrap, topic, [f"after-{i}" for i in range(4)], partitions=2)
    c2.subscribe([topic])
    seen = []
    deadline = time.time() + 30
    while len(seen) < 4 and time.time() < deadline:
        m = c2.poll(0.2)
        if m is not None and not m.error():
            seen.append(m.value().decode())
    end = time.time() + 1
    while time.time() < end:  # nothing else may arrive: no redelivery of committed records
        m = c2.poll(0.1)
        if m is not None and not m.error():
            seen.append(m.value().decode())
    c2.close()
    assert sorted(seen) == sorted(f"after-{i}" for i in range(4))


def _safe(fn):
    try:
        return fn()
    except Exception:
        return False
