"""A KIP-848 consumer group across a kill -9 of its coordinator: three brokers on a real
etcd and S3 (moto), an acks=all producer running, three confluent-kafka members
(group.protocol=consumer; or one classic member and two consumer-protocol members, a mixed
group) reading a 6-partition topic and committing after each batch. The broker owning the
group's __consumer_offsets partition (FindCoordinator's answer) is killed; another loads
the group from the metadata store.

Checked: the group's members and their epochs carry on at the new coordinator
(ConsumerGroupDescribe: the group epoch and each member's epoch never go back), every
partition is owned again, every acknowledged record is read, no record is read again
after a commit past it was confirmed, and no partition is read by two members at once (the
members' assignment callbacks, and every record read by the member holding its partition)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_cluster import KCluster, Load, find_coordinator

confluent_kafka = pytest.importorskip("confluent_kafka")
from tests.support.group_members import Ledger, Member  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(240),
]

PARTITIONS = 6
DESCRIBE = 69
# Heartbeats every 300 ms (Kafka's least, 5 s, lowered with it) so assignments settle in a
# second; the session stays Kafka's 45 s, far longer than the failover.
ARGS = ("--group-consumer-heartbeat-interval-ms", "300", "--group-consumer-min-heartbeat-interval-ms", "300")
CLASSIC = {"heartbeat.interval.ms": 300, "session.timeout.ms": 10_000, "partition.assignment.strategy": "cooperative-sticky"}
CLIENT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "topic.metadata.refresh.interval.ms": 1000}


def describe(cl: KCluster, group: str):
    """The group as its coordinator's ConsumerGroupDescribe v1 has it."""
    node = find_coordinator(next(iter(cl.live().values())), group)
    with RawClient(cl.brokers[node].bootstrap, timeout=5) as c:
        [g] = c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=(group,), include_authorized_operations=False)).groups
    assert error_code(g.error_code) == 0, f"ConsumerGroupDescribe: error {error_code(g.error_code)}"
    return g


def members_of(g) -> dict[str, tuple[int, int, int]]:
    """member id -> (member epoch, member type, partitions assigned)."""
    return {m.member_id: (m.member_epoch, m.member_type, sum(len(t.partitions) for t in m.assignment.topic_partitions))
            for m in g.members}


def settled(cl: KCluster, group: str, ledger: Ledger, types: list[int]):
    """The group Stable with its three members and every partition assigned, as the
    coordinator and the members' callbacks say; the description then."""
    g = describe(cl, group)
    ms = members_of(g)
    if g.group_state != "Stable" or sorted(t for _e, t, _n in ms.values()) != types:
        return None
    if sum(n for _e, _t, n in ms.values()) != PARTITIONS or ledger.split() != [2, 2, 2]:
        return None
    return g


@pytest.mark.parametrize("protocols", [("consumer",) * 3, ("classic", "consumer", "consumer")], ids=["consumer", "mixed"])
def test_consumer_group_survives_a_kill9_of_its_coordinator(etcd_server, moto_server, protocols):
    cl = KCluster(etcd_server, moto_server, "cgfail", ttl=3, broker_args=ARGS).start(3)
    topic, group = f"cgf-{cl.tag}", f"cgf-{cl.tag}"
    ledger = Ledger(PARTITIONS)
    load = Load(cl.bootstrap, topic)
    members: list[Member] = []
    types = sorted(0 if p == "classic" else 1 for p in protocols)
    try:
        cl.create_topic(topic, PARTITIONS)
        cl.wait_owned(topic, PARTITIONS)
        load.start()
        for i, protocol in enumerate(protocols):
            extra = {**CLIENT, **(CLASSIC if protocol == "classic" else {})}
            members.append(Member(f"{protocol}-{i}", cl.bootstrap, group, topic, ledger, protocol=protocol, extra=extra))
            members[-1].start()
        wait_until(lambda: settled(cl, group, ledger, types), 60, "the group Stable, two partitions a member")
        # What the members' joining did is test_consumer_group_protocol's; from here on the
        # failover's. (At the join, under load, librdkafka 2.16 can take partitions it has
        # just given up: its first assignment arrives before the topic's metadata, it
        # heartbeats an empty owned list (a release, as Kafka reads it), then applies that
        # first assignment anyway while the broker gives the partitions to the others.)
        joined = (len(ledger.violations), len(ledger.unheld_reads), len(ledger.read))
        wait_until(lambda: ledger.commits and len(ledger.read) >= 300, 30, "the members reading and committing")

        victim = find_coordinator(cl.brokers[0], group)
        before = describe(cl, group)  # (the last description before the kill)
        cl.brokers[victim].kill9()
        killed_at, killed_wall = time.monotonic(), time.time()
        survivors = set(cl.live())
        wait_until(lambda: find_coordinator(next(iter(cl.live().values())), group) in survivors, 30,
                   "a surviving broker coordinating the group")
        after = wait_until(lambda: settled(cl, group, ledger, types), 60, "the group Stable again at the new coordinator")
        failover = time.monotonic() - killed_at
        # Reading goes on: records produced after the failover are read.
        later = load.n_acked()
        wait_until(lambda: load.n_acked() >= later + 300, 30, "records acknowledged after the failover")
        load.stop()
        acked = {(p, o) for p, o, _t in load.acked.values()}
        wait_until(lambda: acked <= set(ledger.offsets_read()), 60, f"each of the {len(acked)} acknowledged records read")
    finally:
        if load.is_alive():
            load.stop()
        for m in members:
            if m.is_alive():
                m.leave()
        print(cl.log_excerpt(grep=("ERROR", "Traceback", "consumer group", "took ownership", "coordinat")))
        cl.close()

    print(f"coordinator {victim} killed; group Stable again after {failover:.1f}s; {len(load.acked)} records acknowledged, "
          f"{len(ledger.read)} read, {len(ledger.commits)} partition commits; epochs {before.group_epoch} -> {after.group_epoch}; "
          f"client errors: {ledger.errors[:5]}")
    # The group carried on: its epochs never went back, the members kept theirs or moved on.
    assert after.group_epoch >= before.group_epoch and after.assignment_epoch >= before.assignment_epoch
    was, now = members_of(before), members_of(after)
    for member_id, (epoch, _t, _n) in was.items():
        if member_id in now:
            assert now[member_id][0] >= epoch, f"member {member_id}'s epoch went back: {epoch} -> {now[member_id][0]}"
    assert set(now) == set(was) or after.group_epoch > before.group_epoch, "members replaced without a new group epoch"
    for t, name, what, parts in ledger.events:
        print(f"{t - killed_wall:+8.3f}s {name} {what} {parts}")
    print(f"while joining: {ledger.violations[:joined[0]]}, {len(ledger.unheld_reads[:joined[1]])} records read by a member not holding them")
    assert not ledger.violations[joined[0]:], ledger.violations[joined[0]:]
    unheld = ledger.unheld_reads[joined[1]:]
    assert not unheld, f"records read by a member not holding their partition: {unheld[:10]}"
    again = ledger.read_after_commit(since=joined[2])
    assert not again, f"records read again after their commit was confirmed: {again[:10]}"
    assert not load.errors and not load.unflushed, (load.errors[:5], load.unflushed)
