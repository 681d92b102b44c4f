"""The transaction coordinator in a cluster (3 brokers, real etcd, S3 on moto): one broker
coordinates a transactional id (FindCoordinator key type 1), the others answer
NOT_COORDINATOR; TxnOffsetCommit goes to the group's coordinator, possibly another broker;
after a kill -9 of the transaction's coordinator another broker takes the id over with its
state from etcd and finishes the transaction."""

from __future__ import annotations

import os

import pytest
from kio.schema.errors import ErrorCode

from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_cluster import backends, cluster_factory  # noqa: F401  (fixtures)
from tests.test_txn_coordinator import add_offsets, describe, end, fetch_offset, init, txn_offset_commit

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(150),
]

FIND_COORDINATOR = 10


def coordinator_of(b, key: str, key_type: int) -> int:
    with RawClient(b.bootstrap, timeout=5) as c:
        r = c.request(FIND_COORDINATOR, 3, req(FIND_COORDINATOR, 3, key=key, key_type=key_type))
    assert error_code(r.error_code) == 0
    return r.node_id


def test_coordinator_moves_with_its_state_after_kill9(cluster_factory):  # noqa: F811
    cl = cluster_factory("txn", broker_args=("--transactions", "true"))
    topic, group, tid = f"t-{cl.tag}", f"g-{cl.tag}", f"tx-{cl.tag}"
    cl.create_topic(topic, 1)
    cl.wait_owned(topic, 1)
    views = {i: coordinator_of(b, tid, 1) for i, b in cl.brokers.items()}
    assert len(set(views.values())) == 1, views  # every broker names the same coordinator
    coord_id = views[0]
    coord = cl.brokers[coord_id]
    other = next(b for i, b in cl.brokers.items() if i != coord_id)
    with RawClient(other.bootstrap) as c:
        assert init(c, tid)[0] == ErrorCode.not_coordinator
    with RawClient(coord.bootstrap) as c:
        err, pid, epoch = init(c, tid)
        assert err == 0
        assert add_offsets(c, tid, pid, epoch, group) == 0
    group_coord = cl.brokers[coordinator_of(coord, group, 0)]
    with RawClient(group_coord.bootstrap) as c:
        assert txn_offset_commit(c, tid, pid, epoch, group, topic, 11) == 0
        assert fetch_offset(c, group, topic, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)

    coord.kill9()
    survivors = {i: b for i, b in cl.brokers.items() if i != coord_id}
    views: list = []

    def moved():
        views.append({i: coordinator_of(b, tid, 1) for i, b in survivors.items()})
        ids = set(views[-1].values())
        return (ids.pop(),) if len(ids) == 1 and coord_id not in ids else None  # node 0 is falsy

    try:
        [new_id] = wait_until(moved, 30, "a surviving broker to coordinate the transactional id")
    except AssertionError:
        raise AssertionError(f"killed {coord_id}; last views {views[-3:]}")
    with RawClient(survivors[new_id].bootstrap) as c:
        st = describe(c, tid)
        assert (st.producer_id, st.producer_epoch, st.transaction_state) == (pid, epoch, "Ongoing")
        assert end(c, tid, pid, epoch, True) == 0
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteCommit", 20, "the commit")
    [group_id] = wait_until(lambda: (lambda n: (n,) if n in survivors else None)(
        coordinator_of(survivors[new_id], group, 0)), 30, "the group's coordinator")
    group_coord = survivors[group_id]
    with RawClient(group_coord.bootstrap) as c:
        assert fetch_offset(c, group, topic, require_stable=True) == (0, 11)


def _read_committed(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 60.0) -> list[bytes]:
    import time
    import uuid

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "topic.metadata.refresh.interval.ms": 1000})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    if len(eof) == partitions and len(out) >= expect:
                        return out
                continue
            eof.discard(m.partition())
            out.append(m.value())
        raise AssertionError(f"read {len(out)} committed records of {topic}, expected {expect}: {out}")
    finally:
        c.close()


def test_markers_reach_partitions_of_other_brokers_and_survive_coordinator_kill9(cluster_factory):  # noqa: F811
    """Partitions owned by every broker in one transaction: the coordinator writes the
    markers of the others with WriteTxnMarkers. Then kill -9 of the coordinator right after
    EndTxn was answered: the next coordinator finishes the transaction exactly once."""
    from confluent_kafka import Producer

    cl = cluster_factory("txnm", broker_args=("--transactions", "true"))
    topic, parts = f"t-{cl.tag}", 6
    cl.create_topic(topic, parts)
    owners = cl.wait_owned(topic, parts)
    assert len({n for n, _ in owners.values()}) == 3  # every broker owns some
    tid = f"tx-{cl.tag}"
    p = Producer({"bootstrap.servers": cl.bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "topic.metadata.refresh.interval.ms": 1000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(parts * 2):
        p.produce(topic, b"c-%d" % i, partition=i % parts)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(parts):
        p.produce(topic, b"a-%d" % i, partition=i)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(parts):
        p.produce(topic, b"k-%d" % i, partition=i)
    p.commit_transaction(30)  # answered once PrepareCommit is persisted
    coord_id = coordinator_of(cl.brokers[0], tid, 1)
    cl.brokers[coord_id].kill9()  # markers may be written, partly written or not at all
    expected = sorted([b"c-%d" % i for i in range(parts * 2)] + [b"k-%d" % i for i in range(parts)])
    got = _read_committed(cl.bootstrap, topic, parts, len(expected), timeout=90)
    assert sorted(got) == expected  # every committed record once, no aborted one
    survivor = next(b for i, b in cl.brokers.items() if i != coord_id)
    [new_id] = wait_until(lambda: (lambda n: (n,) if n != coord_id else None)(coordinator_of(survivor, tid, 1)), 30,
                          "a new coordinator")
    with RawClient(cl.brokers[new_id].bootstrap) as c:
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteCommit", 30, "the commit completed")
