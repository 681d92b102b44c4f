"""Share groups in a cluster of three brokers on a real etcd and S3 (moto): kill -9 of the
broker owning the partition while share consumers acknowledge. A record whose
acknowledgement was confirmed (commit_sync answered without error) is never delivered
again; records acquired but not acknowledged are delivered again by the new owner, so
every record is eventually acknowledged."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_cluster import KCluster

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import AcknowledgeType, KafkaException, Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(240),
]

RECORDS = 3_000
ARGS = ("--group-share-heartbeat-interval-ms", "300", "--group-share-min-heartbeat-interval-ms", "300",
        "--group-share-record-lock-duration-ms", "2000", "--group-share-min-record-lock-duration-ms", "1000")


class Ledger:
    """Deliveries and confirmed acknowledgements of every record, in one order."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seq = 0
        self.delivered: dict[bytes, list[int]] = {}
        self.acked: dict[bytes, int] = {}  # value -> sequence number of its confirmed acknowledgement
        self.errors: list[str] = []

    def deliver(self, value: bytes) -> None:
        with self.lock:
            self.seq += 1
            self.delivered.setdefault(value, []).append(self.seq)

    def ack(self, values: list[bytes]) -> None:
        with self.lock:
            self.seq += 1
            for v in values:
                self.acked.setdefault(v, self.seq)

    def late(self) -> dict[bytes, list[int]]:
        """Deliveries after a confirmed acknowledgement (must be none)."""
        with self.lock:
            return {v: [s for s in seqs if s > self.acked[v]] for v, seqs in self.delivered.items()
                    if v in self.acked and any(s > self.acked[v] for s in seqs)}


def share_reader(bootstrap: str, group: str, topic: str, ledger: Ledger, stop: threading.Event) -> None:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                       "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                       "topic.metadata.refresh.interval.ms": 1000})
    c.subscribe([topic])
    try:
        while not stop.is_set():
            try:
                msgs = [m for m in c.poll(0.3) if m.error() is None]
            except KafkaException as e:
                ledger.errors.append(repr(e))
                continue
            for m in msgs:
                ledger.deliver(m.value())
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            if not msgs:
                continue
            time.sleep(0.001 * len(msgs))  # some work (well within the lock), so the kill lands mid-stream
            try:
                result = c.commit_sync(10)
            except KafkaException as e:
                ledger.errors.append(repr(e))
                continue
            if result and all(err is None for err in result.values()):
                ledger.ack([m.value() for m in msgs])
    finally:
        try:
            c.close()
        except KafkaException:
            pass


def test_kill9_of_the_owner_keeps_acknowledged_records_acknowledged(etcd_server, moto_server):
    cluster = KCluster(etcd_server, moto_server, "share", ttl=3, broker_args=ARGS).start(3)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    ledger = Ledger()
    try:
        topic, group = f"sq-{uuid.uuid4().hex[:8]}", f"sg-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 1)
        cluster.wait_owned(topic, 1)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        for fut in admin.incremental_alter_configs([r]).values():
            fut.result(15)
        p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "batch.num.messages": 100})
        for i in range(RECORDS):
            p.produce(topic, value=b"s-%d" % i)
        assert p.flush(30) == 0
        threads = [threading.Thread(target=share_reader, args=(cluster.bootstrap, group, topic, ledger, stop), daemon=True)
                   for _ in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: len(ledger.acked) >= RECORDS // 4, 60, "a quarter of the records acknowledged")
        owner, _epoch = cluster.owners(topic)[0]
        cluster.brokers[owner].kill9()
        acked_before = len(ledger.acked)
        cluster.wait_owned(topic, 1, timeout=30, by=set(cluster.live()))
        wait_until(lambda: len(ledger.acked) >= RECORDS, 120,
                   lambda: f"every record acknowledged ({len(ledger.acked)} of {RECORDS})")
        assert acked_before < RECORDS, "the kill came after the end: nothing was tested"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        print(cluster.log_excerpt(grep=("ERROR", "Traceback", "share", "took ownership")))
        cluster.close()
    assert ledger.late() == {}
    assert set(ledger.acked) == {b"s-%d" % i for i in range(RECORDS)}


def test_a_member_leaving_a_group_coordinated_elsewhere_gives_its_records_back(etcd_server, moto_server):
    """The partition's owner is not the group's coordinator: it finds the member gone among
    the group's stored members and releases its records, long before their 60 s locks."""
    from tests.test_cluster import find_coordinator

    cluster = KCluster(etcd_server, moto_server, "share-leave", ttl=3, broker_args=ARGS).start(2)
    a = b = None
    try:
        topic = f"sl-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 1)
        [(owner, _epoch)] = cluster.wait_owned(topic, 1).values()
        any_broker = next(iter(cluster.live().values()))
        group = next(g for g in (f"sg-{uuid.uuid4().hex[:8]}" for _ in range(100)) if find_coordinator(any_broker, g) != owner)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("share.record.lock.duration.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
        for fut in admin.incremental_alter_configs([r]).values():
            fut.result(15)
        p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
        for i in range(10):
            p.produce(topic, value=b"l-%d" % i)
        assert p.flush(30) == 0
        a = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
        a.subscribe([topic])
        held: list = []
        wait_until(lambda: held.extend(m for m in a.poll(0.5) if m.error() is None) or len(held) >= 10, 60, "the records at a")
        a.unsubscribe()  # leaves the group at its coordinator; its share session at the owner stays open
        b = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
        b.subscribe([topic])
        again: dict[int, int] = {}
        wait_until(lambda: again.update({m.offset(): m.delivery_count() for m in b.poll(0.5) if m.error() is None})
                   or len(again) >= 10, 40, "a's records at b")
        assert again == {m.offset(): 2 for m in held}
        b.commit_sync(10)
    finally:
        for c in (a, b):
            if c is not None:
                c.close()
        print(cluster.log_excerpt(grep=("ERROR", "Traceback", "share")))
        cluster.close()
