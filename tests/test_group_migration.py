"""Online migration between the classic and the consumer group protocol (KIP-848) with real
clients over TCP: confluent-kafka consumers with group.protocol=classic and
group.protocol=consumer in one group, rolled from classic to consumer one member at a time
and back while a producer runs, and the migration policy refusing it."""

from __future__ import annotations

import json
import logging
import threading
import uuid

import pytest
from kio.schema.errors import ErrorCode

from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.support.group_members import Ledger, Member  # noqa: E402
from tests.test_admin_cli import cli, ok  # noqa: E402

PARTITIONS = 4
HEARTBEAT, DESCRIBE = 68, 69
# Classic members: rebalances within a second or two (their heartbeats say REBALANCE_IN_PROGRESS)
CLASSIC = {"heartbeat.interval.ms": 300, "session.timeout.ms": 6000}


def broker_args(policy: str) -> list[str]:
    # Consumer-protocol members heartbeat every 300 ms (Kafka's least is 5 s, lowered with it).
    return ["--group-consumer-heartbeat-interval-ms", "300", "--group-consumer-min-heartbeat-interval-ms", "300",
            "--group-initial-rebalance-delay-ms", "0", "--group-consumer-migration-policy", policy]


@pytest.fixture(scope="module")
def migrating_broker():
    b = BrokerProcess(extra_args=broker_args("bidirectional")).start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
        fut.result(15)


class Producing(threading.Thread):
    """Produces to every partition in turn until stopped; `acked[p]`: records acknowledged."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.stopping = threading.Event()
        self.acked = [0] * PARTITIONS
        self.failed: list[str] = []

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked[msg.partition()] += 1

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.producer.produce(self.topic, value=str(i).encode(), partition=i % PARTITIONS, on_delivery=self._delivered)
            i += 1
            if i % 20 == 0:
                self.producer.poll(0.05)
        self.producer.flush(30)

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join(60)
        self.producer = None  # (destroyed now, not after its broker stopped)
        return list(self.acked)


def group_type(bootstrap: str, group: str) -> str | None:
    with RawClient(bootstrap) as c:
        r = c.request(16, 5, req(16, 5, states_filter=(), types_filter=()))
    return next((g.group_type for g in r.groups if g.group_id == group), None)


def member_types(bootstrap: str, group: str) -> list[int]:
    """ConsumerGroupDescribe's member types of a consumer group (0 classic, 1 consumer)."""
    with RawClient(bootstrap) as c:
        [g] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)).groups
    return sorted(m.member_type for m in g.members) if error_code(g.error_code) == 0 else []


def committed(bootstrap: str, group: str, topic: str) -> list[int]:
    with RawClient(bootstrap) as c:
        topics = (req(9, 8, "OffsetFetchRequestTopics", name=topic, partition_indexes=tuple(range(PARTITIONS))),)
        r = c.request(9, 8, req(9, 8, groups=(req(9, 8, "OffsetFetchRequestGroup", group_id=group, topics=topics),),
                                require_stable=False))
    return [p.committed_offset for p in sorted(r.groups[0].topics[0].partitions, key=lambda p: p.partition_index)]


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_rolling_upgrade_to_the_consumer_protocol_and_back(migrating_broker, assignor):
    """Two classic members become consumer-protocol members one at a time (the group turns
    into a consumer group at the first), then classic again one at a time (a classic group
    again when the last consumer-protocol member leaves), while a producer runs: every
    record read, no partition held by two members at once, committed offsets at the end of
    every partition. Classic members eager (range: they give up everything on a rebalance)
    or cooperative (they list what they own and give up only what moves)."""
    bootstrap = migrating_broker.bootstrap
    topic, group = f"migrate-{uuid.uuid4().hex[:8]}", f"mg-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic)
    ledger = Ledger(PARTITIONS)
    producing = Producing(bootstrap, topic)
    members: list[Member] = []

    def start(name: str, protocol: str) -> Member:
        extra = {**CLASSIC, "partition.assignment.strategy": assignor} if protocol == "classic" else None
        m = Member(name, bootstrap, group, topic, ledger, protocol=protocol, extra=extra)
        members.append(m)
        m.start()
        return m

    def split_between(*names: str) -> bool:
        return ledger.split() == [2, 2] and set(ledger.owner.values()) == set(names)

    def reading(name: str) -> bool:
        with ledger.lock:
            return sum(1 for _p, _o, n in ledger.read if n == name) >= 20

    try:
        producing.start()
        a, b = start("a-classic", "classic"), start("b-classic", "classic")
        wait_until(lambda: split_between(a.member, b.member) and reading(a.member) and reading(b.member), 60,
                   "two classic members reading two partitions each")
        assert group_type(bootstrap, group) == "classic"

        a.leave()
        a2 = start("a-consumer", "consumer")  # the first consumer-protocol member converts the group
        wait_until(lambda: split_between(b.member, a2.member) and reading(a2.member), 60,
                   "the classic and the consumer-protocol member sharing the partitions")
        assert group_type(bootstrap, group) == "consumer" and member_types(bootstrap, group) == [0, 1]
        # kafscale groups describe tells the two kinds of member apart.
        doc = json.loads(ok(cli(migrating_broker, "groups", "describe", group, "--json")))
        assert sorted(m["member_protocol"] for m in doc["members"]) == ["classic", "consumer"]

        b.leave()  # a classic member leaving a consumer group
        b2 = start("b-consumer", "consumer")
        wait_until(lambda: split_between(a2.member, b2.member) and reading(b2.member), 60, "two consumer-protocol members")
        assert member_types(bootstrap, group) == [1, 1]

        b2.leave()  # and back: a classic member joins the consumer group
        b3 = start("b-classic-again", "classic")
        wait_until(lambda: split_between(a2.member, b3.member) and reading(b3.member), 60,
                   "a classic member inside the consumer group")
        assert group_type(bootstrap, group) == "consumer" and member_types(bootstrap, group) == [0, 1]

        a2.leave()  # the last consumer-protocol member leaves: a classic group again
        wait_until(lambda: group_type(bootstrap, group) == "classic", 30, "the group classic again")
        a3 = start("a-classic-again", "classic")
        wait_until(lambda: split_between(b3.member, a3.member) and reading(a3.member), 60, "two classic members again")
        assert group_type(bootstrap, group) == "classic"

        acked = producing.stop()
        assert not producing.failed, producing.failed[:5]
        total = sum(acked)
        wait_until(lambda: len(ledger.offsets_read()) >= total, 60, "every record read")
        wait_until(lambda: committed(bootstrap, group, topic) == acked, 30, "the offsets committed up to the end")
    finally:
        if producing.is_alive():
            producing.stop()
        for m in members:
            if m.is_alive():
                m.leave()
    assert not ledger.violations, ledger.violations
    assert not ledger.errors, ledger.errors[:10]
    seen = ledger.offsets_read()
    assert set(seen) == {(p, o) for p in range(PARTITIONS) for o in range(acked[p])}
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"records read more than once: {sorted(twice.items())[:10]}"


def test_policy_refuses_the_upgrade():
    """group.consumer.migration.policy=disabled: a consumer-protocol member cannot join a
    classic group with members (GROUP_ID_NOT_FOUND, as Kafka), and the classic member keeps
    reading undisturbed."""
    b = BrokerProcess(extra_args=broker_args("disabled")).start()
    try:
        bootstrap = b.bootstrap
        topic, group = f"migrate-off-{uuid.uuid4().hex[:8]}", f"mo-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic)
        ledger = Ledger(PARTITIONS)
        producing = Producing(bootstrap, topic)
        producing.start()
        classic = Member("classic", bootstrap, group, topic, ledger, protocol="classic", extra=CLASSIC)
        classic.start()
        try:
            wait_until(lambda: ledger.split() == [4] and len(ledger.read) >= 20, 60, "the classic member reading")
            with RawClient(bootstrap) as c:
                r = c.request(HEARTBEAT, 0, req(HEARTBEAT, 0, group_id=group, member_id="", member_epoch=0, instance_id=None,
                                                rack_id=None, rebalance_timeout=30_000, subscribed_topic_names=(topic,),
                                                server_assignor=None, topic_partitions=()))
            assert error_code(r.error_code) == ErrorCode.group_id_not_found.value
            assert r.error_message == f"Group {group} is not a consumer group."
            # librdkafka takes it, as from Kafka, as a fatal error for the application.
            refused = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
                                "logger": logging.getLogger("librdkafka")})
            refused.subscribe([topic])
            try:
                def fatal():
                    m = refused.poll(0.2)
                    return m.error() if m is not None and m.error() is not None else None

                err = wait_until(fatal, 30, "the consumer-protocol member's error")
                assert err.code() == confluent_kafka.KafkaError._FATAL and "group id does not exist" in err.str()
                assert not refused.assignment()
            finally:
                refused.close()
            before = len(ledger.read)
            wait_until(lambda: len(ledger.read) >= before + 20, 30, "the classic member still reading")
            assert group_type(bootstrap, group) == "classic" and ledger.split() == [4]
        finally:
            producing.stop()
            classic.leave()
        assert not ledger.violations and not ledger.errors, (ledger.violations, ledger.errors[:5])
    finally:
        b.stop()
