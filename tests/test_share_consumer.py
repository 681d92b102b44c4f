"""Share groups (KIP-932) end to end with confluent-kafka's ShareConsumer (librdkafka
2.16) against a real broker: records shared by consumers of one partition and delivered
exactly once when all are accepted (implicit acknowledgement), released records going to
another consumer, locks of a consumer that stops polling timing out, the delivery count
limit and REJECT archiving records, and acknowledged state surviving kill -9.

Share partitions start at the log end (`share.auto.offset.reset` latest, Kafka's
default), so each test first produces probe records until a consumer sees one: from then
on the share partition exists and every record produced is for the group."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest

from tests.support.broker import REPO, BrokerProcess
from tests.support.wait import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

LOCK_MS = 2_000
DELIVERY_LIMIT = 3
# (below Kafka's least lock duration and heartbeat interval: the least lowered too, as Kafka requires;
# and the least session timeout, for a group of its own to time its members out sooner)
ARGS = ["--group-share-heartbeat-interval-ms", "300", "--group-share-min-heartbeat-interval-ms", "300",
        "--group-share-record-lock-duration-ms", str(LOCK_MS), "--group-share-min-record-lock-duration-ms", "1000",
        "--group-share-delivery-count-limit", str(DELIVERY_LIMIT), "--group-share-min-session-timeout-ms", "1000"]


@pytest.fixture(scope="module")
def sbroker():
    b = BrokerProcess(extra_args=ARGS).start()
    yield b
    b.stop()


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}-{tag}", f"sg-{prefix}-{tag}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(15)


def produce(bootstrap: str, topic: str, values: list[bytes], batch: int = 10_000) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch})
    failed = []
    for v in values:
        p.produce(topic, value=v, on_delivery=lambda err, _m: failed.append(err) if err is not None else None)
    assert p.flush(20) == 0 and not failed, failed


def consumer(bootstrap: str, group: str, topic: str, explicit: bool = False) -> ShareConsumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    c = ShareConsumer(conf)
    c.subscribe([topic])
    return c


def records(c: ShareConsumer, timeout: float = 0.3) -> list:
    out = []
    for m in c.poll(timeout):
        assert m.error() is None, m.error()
        out.append(m)
    return out


def accept_polled(c: ShareConsumer) -> bool:
    """One poll of an explicit-mode consumer, everything accepted and committed: read any?"""
    ms = records(c)
    for m in ms:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    if ms:
        c.commit_sync(10)
    return bool(ms)


def prime(bootstrap: str, topic: str, seen) -> None:
    """Produce probes until `seen()` says a consumer got one: the share partition exists."""
    n = 0

    def probed() -> bool:
        nonlocal n
        if seen():
            return True
        produce(bootstrap, topic, [f"probe-{n}".encode()])
        n += 1
        return False

    wait_until(probed, 60, "a consumer reading a probe record")


def primed(bootstrap: str, prefix: str) -> tuple[str, str, ShareConsumer]:
    """(topic, group, an explicit-mode consumer of them) on a new topic, once the consumer
    read a probe: from then on every record produced is for the group."""
    topic, group = names(prefix)
    create_topic(bootstrap, topic)
    c = consumer(bootstrap, group, topic, explicit=True)
    try:
        prime(bootstrap, topic, lambda: accept_polled(c))
    except BaseException:
        c.close()
        raise
    return topic, group, c


class Readers:
    """Share consumers polling in threads (implicit acknowledgement), recording what each read."""

    def __init__(self, bootstrap: str, group: str, topic: str, n: int, work_s: float = 0.0):
        self.work_s = work_s  # time each record takes to "process"
        self.consumers = [consumer(bootstrap, group, topic) for _ in range(n)]
        self.read: list[list[bytes]] = [[] for _ in range(n)]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        c = self.consumers[i]
        try:
            while not self.stop.is_set():
                got = [m.value() for m in records(c)]
                with self.lock:
                    self.read[i] += got
                time.sleep(self.work_s * len(got))
            c.commit_sync(10)  # librdkafka 2.16's close() does not accept the last poll's records
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        finally:
            c.close()

    def values(self) -> list[bytes]:
        with self.lock:
            return [v for r in self.read for v in r if not v.startswith(b"probe-")]

    def probes(self) -> int:
        with self.lock:
            return sum(1 for r in self.read for v in r if v.startswith(b"probe-"))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors


def test_three_consumers_share_a_partition_exactly_once(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = names("share3")
    create_topic(bootstrap, topic)
    # Each record takes a millisecond to process: while one consumer works on what it
    # acquired (whole stored batches of 100), the others acquire the next ones.
    readers = Readers(bootstrap, group, topic, 3, work_s=0.001)
    try:
        prime(bootstrap, topic, lambda: readers.probes() > 0)
        want = [f"r-{i}".encode() for i in range(3_000)]
        produce(bootstrap, topic, want, batch=100)
        wait_until(lambda: len(readers.values()) >= len(want), 120, "3,000 records read")
        # Past one lock duration more: a record whose acceptance was lost would come back now.
        time.sleep(LOCK_MS / 1000 + 1)
        got = readers.values()
        per_consumer = [sum(1 for v in r if not v.startswith(b"probe-")) for r in readers.read]
    finally:
        readers.close()
    dupes = [v for v, n in Counter(got).items() if n > 1]
    assert not dupes and sorted(got) == sorted(want), (len(got), dupes[:5])
    assert sum(1 for n in per_consumer if n) >= 2, per_consumer  # shared, not read by one


def test_released_records_go_to_another_consumer(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group, a = primed(bootstrap, "release")
    try:
        produce(bootstrap, topic, [f"x-{i}".encode() for i in range(20)])
        held: list = []
        wait_until(lambda: held.extend(m for m in records(a) if m.value().startswith(b"x-")) or len(held) >= 20, 30,
                   "the records at the first consumer")
        assert all(m.delivery_count() == 1 for m in held)
        for m in held:
            a.acknowledge(m, AcknowledgeType.RELEASE)
        a.commit_sync(10)
        released = sorted(m.offset() for m in held)
    finally:
        a.close()
    b = consumer(bootstrap, group, topic)
    try:
        again: dict[int, int] = {}
        wait_until(lambda: again.update({m.offset(): m.delivery_count() for m in records(b)}) or set(released) <= set(again),
                   30, "the released records at the second consumer")
    finally:
        b.close()
    assert all(again[o] == 2 for o in released), again


def test_locks_of_a_consumer_that_stops_polling_time_out(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group, a = primed(bootstrap, "locks")
    b = None
    try:
        produce(bootstrap, topic, [f"y-{i}".encode() for i in range(10)])
        held: list = []
        wait_until(lambda: held.extend(records(a)) or len(held) >= 10, 30, "the records at the first consumer")
        acquired_at = time.monotonic()
        # a stops polling (and never acknowledges); b reads its records once the locks time out
        b = consumer(bootstrap, group, topic)
        again: dict[int, int] = {}
        wait_until(lambda: again.update({m.offset(): m.delivery_count() for m in records(b)}) or len(again) >= 10, 30,
                   "the timed-out records at the second consumer")
        assert time.monotonic() - acquired_at >= LOCK_MS / 1000 * 0.9
        assert sorted(again) == sorted(m.offset() for m in held) and set(again.values()) == {2}
    finally:
        if b is not None:
            b.close()
        a.close()


def test_delivery_count_limit_and_reject_archive_records(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group, c = primed(bootstrap, "limit")
    try:
        produce(bootstrap, topic, [b"poison", b"bad"])
        deliveries: list[tuple[bytes, int]] = []

        def release_poison_reject_bad() -> bool:
            for m in records(c):
                deliveries.append((m.value(), m.delivery_count()))
                c.acknowledge(m, AcknowledgeType.REJECT if m.value() == b"bad" else
                              AcknowledgeType.RELEASE if m.value() == b"poison" else AcknowledgeType.ACCEPT)
                c.commit_sync(10)
            return sum(1 for v, _ in deliveries if v == b"poison") >= DELIVERY_LIMIT

        wait_until(release_poison_reject_bad, 30, f"{DELIVERY_LIMIT} deliveries of the released record")
        # archived now: neither comes back, while a new record still does
        produce(bootstrap, topic, [b"fresh"])
        late: list[bytes] = []

        def fresh_read() -> bool:
            for m in records(c):
                late.append(m.value())
                c.acknowledge(m)
                c.commit_sync(10)
            return b"fresh" in late

        wait_until(fresh_read, 30, "the new record")
        deadline = time.monotonic() + LOCK_MS / 1000 + 1
        while time.monotonic() < deadline:
            fresh_read()
    finally:
        c.close()
    assert [n for v, n in deliveries if v == b"poison"] == list(range(1, DELIVERY_LIMIT + 1))
    assert [n for v, n in deliveries if v == b"bad"] == [1]
    assert late == [b"fresh"]


def test_acknowledged_records_survive_kill9(tmp_path):
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=ARGS).start()
    c = None
    try:
        bootstrap = b.bootstrap
        topic, group, c = primed(bootstrap, "durable")
        produce(bootstrap, topic, [f"z-{i}".encode() for i in range(100)])
        held: list = []
        wait_until(lambda: held.extend(records(c)) or len(held) >= 100, 30, "the records")
        accepted = sorted(m.offset() for m in held)[:50]
        for m in held:
            if m.offset() in accepted:
                c.acknowledge(m)
        result = c.commit_sync(10)
        assert all(err is None for err in result.values()), result
        b.kill9()  # the other 50 are acquired, not acknowledged
        c = None
        b.start()
        c = consumer(bootstrap, group, topic)
        again: set[int] = set()
        wait_until(lambda: again.update(m.offset() for m in records(c)) or len(again) >= 50, 60,
                   "the unacknowledged records after the restart")
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            again.update(m.offset() for m in records(c))
        assert again == {m.offset() for m in held} - set(accepted)
    finally:
        if c is not None:
            c.close()
        b.stop()


def set_group_configs(bootstrap: str, group: str, **configs: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    for fut in admin.incremental_alter_configs([r]).values():
        fut.result(15)


def test_read_committed_share_group_skips_aborted_transactions(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = names("txn")
    create_topic(bootstrap, topic)
    # the group's own configs: from the log start, committed records only
    set_group_configs(bootstrap, group, share_auto_offset_reset="earliest", share_isolation_level="read_committed")
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{group}", "linger.ms": 5})
    p.init_transactions(15)
    for outcome, prefix in (("commit", b"ok-a"), ("abort", b"no"), ("commit", b"ok-b")):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=prefix + b"-%d" % i)
        p.flush(15)
        (p.commit_transaction if outcome == "commit" else p.abort_transaction)(15)
    produce(bootstrap, topic, [b"plain"])
    c = consumer(bootstrap, group, topic)
    got: list[bytes] = []
    try:
        wait_until(lambda: got.extend(m.value() for m in records(c)) or b"plain" in got, 30, "the records")
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            got.extend(m.value() for m in records(c))
    finally:
        c.close()
    want = [b"ok-a-%d" % i for i in range(10)] + [b"ok-b-%d" % i for i in range(10)] + [b"plain"]
    assert sorted(got) == sorted(want), got


def test_auto_offset_reset_by_duration_starts_at_recent_records(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = names("bydur")
    create_topic(bootstrap, topic)
    now_ms = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(5):
        p.produce(topic, value=b"old-%d" % i, timestamp=now_ms - 3_600_000)  # an hour ago
    for i in range(5):
        p.produce(topic, value=b"new-%d" % i, timestamp=now_ms)
    assert p.flush(15) == 0
    set_group_configs(bootstrap, group, share_auto_offset_reset="by_duration:PT10M")
    c = consumer(bootstrap, group, topic)
    got: list[bytes] = []
    try:
        wait_until(lambda: got.extend(m.value() for m in records(c)) or len(got) >= 5, 30, "the recent records")
        c.commit_sync(10)
    finally:
        c.close()
    assert got == [b"new-%d" % i for i in range(5)]


def test_a_topic_recreated_under_the_same_name_starts_a_new_share_partition(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = names("recreated")
    create_topic(bootstrap, topic)
    set_group_configs(bootstrap, group, share_auto_offset_reset="earliest")
    produce(bootstrap, topic, [b"first-%d" % i for i in range(5)])

    def read_all(n: int) -> list[bytes]:
        c = consumer(bootstrap, group, topic)
        got: list[bytes] = []
        try:
            wait_until(lambda: got.extend(m.value() for m in records(c)) or len(got) >= n, 30, f"{n} records")
            c.commit_sync(10)
        finally:
            c.close()
        return got

    assert read_all(5) == [b"first-%d" % i for i in range(5)]  # the share partition's start is now 5
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([topic]).values():
        fut.result(15)
    wait_until(lambda: create_topic(bootstrap, topic) is None, 30, "the topic created again")
    produce(bootstrap, topic, [b"second-%d" % i for i in range(3)])
    assert read_all(3) == [b"second-%d" % i for i in range(3)]


def test_a_member_leaving_the_group_gives_its_records_back_at_once(sbroker):
    """A member that leaves (ShareGroupHeartbeat -1: librdkafka's unsubscribe, its share
    session still open) or whose group session times out (a frozen process, its connections
    open) has its acquired records released at once, delivery counts kept, not after the
    lock duration (60 s here)."""
    import json
    import select
    import signal
    import subprocess
    import sys

    bootstrap = sbroker.bootstrap
    topic, group = names("leave")
    create_topic(bootstrap, topic)
    set_group_configs(bootstrap, group, share_auto_offset_reset="earliest", share_record_lock_duration_ms="60000",
                      share_session_timeout_ms="3000")
    produce(bootstrap, topic, [f"l-{i}".encode() for i in range(10)])
    # 1. a leaves the group with the 10 records acquired
    a = consumer(bootstrap, group, topic, explicit=True)
    b = None
    try:
        held: list = []
        wait_until(lambda: held.extend(records(a)) or len(held) >= 10, 30, "the records at a")
        b = consumer(bootstrap, group, topic)
        a.unsubscribe()
        again: dict[int, int] = {}
        wait_until(lambda: again.update({m.offset(): m.delivery_count() for m in records(b)}) or len(again) >= 10, 30,
                   "a's records at b")
        assert again == {m.offset(): 2 for m in held}
        b.commit_sync(10)
    finally:
        if b is not None:
            b.close()
        a.close()
    # 2. a frozen consumer (no heartbeats, connections open) times out of the group after 3 s
    produce(bootstrap, topic, [f"m-{i}".encode() for i in range(5)])
    frozen = subprocess.Popen([sys.executable, "-m", "tests.support.share_holder", bootstrap, group, topic, "5"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    c = None
    try:
        assert select.select([frozen.stdout], [], [], 60)[0], "the holder process holding 5 records"
        held_offsets = json.loads(frozen.stdout.readline())
        frozen.send_signal(signal.SIGSTOP)
        c = consumer(bootstrap, group, topic)
        again = {}
        wait_until(lambda: again.update({m.offset(): m.delivery_count() for m in records(c)}) or len(again) >= 5, 40,
                   "the frozen consumer's records at another")
        assert again == {o: 2 for o in held_offsets}
        c.commit_sync(10)
    finally:
        frozen.kill()
        frozen.wait(10)
        if c is not None:
            c.close()
