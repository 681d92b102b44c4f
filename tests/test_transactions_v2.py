"""Transactions v2 (KIP-890 part 2, Apache Kafka 4.0) over raw Kafka requests against a real
broker, acting as a Java 4.x / franz-go style client that picks transactions v2 because
ApiVersions finalizes transaction.version 2: InitProducerId, Produce v12 with NO
AddPartitionsToTxn, TxnOffsetCommit v5 with NO AddOffsetsToTxn, EndTxn v5 that bumps the
epoch at every end. What a read_committed consumer (confluent-kafka) and OffsetFetch see
afterwards, fencing, and the old protocol (Produce v11, --transaction-version 0) unchanged.
The same in a 3-broker etcd cluster, where the partition's and the group's brokers are not
the transaction's coordinator."""

from __future__ import annotations

import os

import pytest
from kio.schema.errors import ErrorCode

from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_txn_coordinator import add_partitions, describe, fetch_offset, init, txn_offset_commit
from tests.test_txn_partition import consume_all, plain_batch, txn_batch

PRODUCE, API_VERSIONS, INIT_PRODUCER_ID, END_TXN, TXN_OFFSET_COMMIT, FIND_COORDINATOR = 0, 18, 22, 26, 28, 10
BROKER_ARGS = ["--transactions", "true", "--merge-interval-ms", "0", "--group-initial-rebalance-delay-ms", "0"]


@pytest.fixture(scope="module")
def tv2b():
    b = BrokerProcess(extra_args=BROKER_ARGS).start()
    yield b
    b.stop()


def produce(c: RawClient, tid: str | None, topic: str, batch: bytes, version: int = 12, partition: int = 0):
    p = req(PRODUCE, version, "PartitionProduceData", index=partition, records=batch)
    t = req(PRODUCE, version, "TopicProduceData", name=topic, partition_data=(p,))
    r = c.request(PRODUCE, version, req(PRODUCE, version, transactional_id=tid, acks=-1, timeout=10000, topic_data=(t,)))
    return error_code(r.responses[0].partition_responses[0].error_code)


def end_v5(c: RawClient, tid: str, pid: int, epoch: int, commit: bool):
    r = c.request(END_TXN, 5, req(END_TXN, 5, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit))
    return error_code(r.error_code), r.producer_id, r.producer_epoch


def commit_offset_v5(c: RawClient, tid: str, pid: int, epoch: int, group: str, topic: str, offset: int):
    p = req(TXN_OFFSET_COMMIT, 5, "TxnOffsetCommitRequestPartition", partition_index=0, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata="")
    t = req(TXN_OFFSET_COMMIT, 5, "TxnOffsetCommitRequestTopic", name=topic, partitions=(p,))
    r = c.request(TXN_OFFSET_COMMIT, 5, req(TXN_OFFSET_COMMIT, 5, transactional_id=tid, group_id=group, producer_id=pid,
                                            producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
                                            topics=(t,)))
    return error_code(r.topics[0].partitions[0].error_code)


def features(c: RawClient, version: int = 4):
    r = c.request(API_VERSIONS, version, req(API_VERSIONS, version, client_software_name="tv2-test", client_software_version="1"))
    supported = {f.name: (f.min_version, f.max_version) for f in r.supported_features}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in r.finalized_features}
    apis = {a.api_key: (a.min_version, a.max_version) for a in r.api_keys}
    return supported, finalized, apis


def make_topic(c: RawClient, topic: str) -> None:
    c.metadata([topic])
    wait_until(lambda: error_code(c.produce(topic, 0, plain_batch(b"p0")).error_code) == 0, 10, "the topic")


def test_api_versions_finalize_transaction_version_2(tv2b):
    with RawClient(tv2b.bootstrap) as c:
        supported, finalized, apis = features(c)
        assert supported == {"metadata.version": (7, 25), "transaction.version": (0, 2), "group.version": (0, 1), "share.version": (0, 1)}
        assert finalized == {"metadata.version": (25, 25), "transaction.version": (2, 2), "group.version": (1, 1), "share.version": (1, 1)}
        assert apis[PRODUCE][1] >= 12 and apis[END_TXN][1] == 5 and apis[TXN_OFFSET_COMMIT][1] == 5
        assert apis[INIT_PRODUCER_ID][1] == 5  # as Kafka 4.0: no KIP-939 (two-phase commit) v6
        # ApiVersions v3 leaves out supported features whose minimum is 0, as Kafka does.
        supported, finalized, _ = features(c, version=3)
        assert "transaction.version" not in supported and finalized["transaction.version"] == (2, 2)
    with RawClient(tv2b.bootstrap) as c:  # InitProducerId v6 (enable_2pc): unsupported, as Kafka 4.0
        c.send_request(INIT_PRODUCER_ID, 6, req(INIT_PRODUCER_ID, 6, transactional_id="x", transaction_timeout=1000,
                                                producer_id=-1, producer_epoch=-1, enable2_pc=True, keep_prepared_txn=False))
        assert c.wait_closed()


def test_commit_and_abort_without_add_requests(tv2b, topic_name):
    """One producer: a committed transaction (records and a consumer offset) and an aborted
    one, neither with AddPartitionsToTxn or AddOffsetsToTxn; read_committed sees exactly the
    committed records, OffsetFetch the committed offset; every end bumps the epoch."""
    tid, group = f"tx2-{topic_name}", f"g2-{topic_name}"
    with RawClient(tv2b.bootstrap) as c:
        make_topic(c, topic_name)
        err, pid, e = init(c, tid, version=5)
        assert err == 0
        # Produce v12: the partition joins the transaction with the batch.
        assert produce(c, tid, topic_name, txn_batch([b"c1", b"c2"], pid, 0, e)) == 0
        # TxnOffsetCommit v5: the group joins the transaction with the offsets.
        assert commit_offset_v5(c, tid, pid, e, group, topic_name, 5) == 0
        st = describe(c, tid)
        assert st.transaction_state == "Ongoing" and [(t.topic, t.partitions) for t in st.topics] == [(topic_name, [0])]
        assert fetch_offset(c, group, topic_name, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
        assert end_v5(c, tid, pid, e, True) == (0, pid, e + 1)
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteCommit", 10, "the commit")
        assert fetch_offset(c, group, topic_name, require_stable=True) == (0, 5)
        # A retry of that EndTxn (the epoch before the bump) is answered as done.
        assert end_v5(c, tid, pid, e, True) == (0, pid, e + 1)
        assert end_v5(c, tid, pid, e, False)[0] == ErrorCode.invalid_txn_state

        # The next transaction under the bumped epoch (new sequence), aborted.
        assert produce(c, tid, topic_name, txn_batch([b"a1"], pid, 0, e + 1)) == 0
        assert commit_offset_v5(c, tid, pid, e + 1, group, topic_name, 9) == 0
        assert end_v5(c, tid, pid, e + 1, False) == (0, pid, e + 2)
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteAbort", 10, "the abort")
        assert fetch_offset(c, group, topic_name, require_stable=True) == (0, 5)  # the aborted offset is dropped
        assert end_v5(c, tid, pid, e + 1, False) == (0, pid, e + 2)  # a retry
        assert end_v5(c, tid, pid, e + 2, True)[0] == ErrorCode.invalid_txn_state  # nothing to commit

        # The fenced epochs are refused; the current one goes on.
        assert produce(c, tid, topic_name, txn_batch([b"z1"], pid, 0, e)) == ErrorCode.invalid_producer_epoch
        assert produce(c, tid, topic_name, txn_batch([b"z2"], pid, 0, e + 1)) == ErrorCode.invalid_producer_epoch
        assert commit_offset_v5(c, tid, pid, e + 1, group, topic_name, 99) == ErrorCode.invalid_producer_epoch
        assert end_v5(c, tid, pid, e, True)[0] == ErrorCode.producer_fenced
        assert produce(c, tid, topic_name, txn_batch([b"c3"], pid, 0, e + 2)) == 0
        assert end_v5(c, tid, pid, e + 2, True) == (0, pid, e + 3)
        assert produce(c, None, topic_name, plain_batch(b"p1")) == 0
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteCommit", 10, "the second commit")
        end_offset = c.list_offsets(topic_name, 0, -1).offset

    # p0, c1, c2, marker, a1, marker, c3, marker, p1
    assert end_offset == 9
    assert consume_all(tv2b.bootstrap, topic_name, "read_committed", end_offset) == [b"p0", b"c1", b"c2", b"c3", b"p1"]
    assert consume_all(tv2b.bootstrap, topic_name, "read_uncommitted", end_offset) == [b"p0", b"c1", b"c2", b"a1", b"c3", b"p1"]


def test_back_to_back_transactions(tv2b, topic_name):
    """As a v2 client runs them: the next transaction's first produce right after EndTxn's
    answer, under the epoch it answered, while the last one's markers may still be written
    (the broker waits for them, or answers the retriable NOT_ENOUGH_REPLICAS)."""
    tid = f"tx2b-{topic_name}"
    with RawClient(tv2b.bootstrap) as c:
        make_topic(c, topic_name)
        _, pid, epoch = init(c, tid, version=5)
        committed = []
        for i in range(8):
            value = b"v-%d" % i
            err = wait_until(lambda: (lambda r: (r,) if r != ErrorCode.not_enough_replicas else None)(
                produce(c, tid, topic_name, txn_batch([value], pid, 0, epoch))), 10, "the implicit add")[0]
            assert err == 0, (i, err)
            commit = i % 3 != 1
            committed += [value] if commit else []
            err, got_pid, new_epoch = end_v5(c, tid, pid, epoch, commit)
            assert (err, got_pid, new_epoch) == (0, pid, epoch + 1), i
            epoch = new_epoch
        wait_until(lambda: describe(c, tid).transaction_state.startswith("Complete"), 10, "the last end")
        end_offset = c.list_offsets(topic_name, 0, -1).offset
    assert end_offset == 1 + 8 * 2
    assert consume_all(tv2b.bootstrap, topic_name, "read_committed", end_offset) == [b"p0", *committed]


def test_a_new_producer_fences_and_an_empty_abort_bumps(tv2b, topic_name):
    tid = f"tx2f-{topic_name}"
    with RawClient(tv2b.bootstrap) as c:
        make_topic(c, topic_name)
        _, pid, e = init(c, tid, version=5)
        assert produce(c, tid, topic_name, txn_batch([b"old"], pid, 0, e)) == 0
        # A second producer with the same id: the open transaction is aborted, the epoch bumped.
        wait_until(lambda: (lambda r: r if r[0] == 0 else None)(init(c, tid, version=5)), 10, "the new producer")
        st = describe(c, tid)
        assert st.producer_id == pid and st.producer_epoch > e
        e2 = st.producer_epoch
        assert produce(c, tid, topic_name, txn_batch([b"zombie"], pid, 1, e)) == ErrorCode.invalid_producer_epoch
        assert end_v5(c, tid, pid, e, True)[0] == ErrorCode.producer_fenced
        # Kafka 4.0: an abort with nothing added still ends a transaction, with a bump.
        assert end_v5(c, tid, pid, e2, False) == (0, pid, e2 + 1)
        wait_until(lambda: describe(c, tid).transaction_state == "CompleteAbort", 10, "the empty abort")
        end_offset = c.list_offsets(topic_name, 0, -1).offset
    assert consume_all(tv2b.bootstrap, topic_name, "read_committed", end_offset) == [b"p0"]


def test_produce_v11_and_below_still_verify_only(tv2b, topic_name):
    """Below Produce v12 a partition is not added by the batch: refused with Kafka's code for
    the version (TRANSACTION_ABORTABLE from v11, INVALID_TXN_STATE before); the same for a
    TxnOffsetCommit below v5 (TRANSACTION_ABORTABLE from v4)."""
    tid = f"tx2o-{topic_name}"
    with RawClient(tv2b.bootstrap) as c:
        make_topic(c, topic_name)
        _, pid, e = init(c, tid, version=5)
        assert produce(c, tid, topic_name, txn_batch([b"v11"], pid, 0, e), version=11) == ErrorCode.transaction_abortable
        assert produce(c, tid, topic_name, txn_batch([b"v10"], pid, 0, e), version=10) == ErrorCode.invalid_txn_state
        # TxnOffsetCommit below v5 does not add its group either: Kafka's codes by version.
        assert txn_offset_commit(c, tid, pid, e, "g-v4", topic_name, 1, version=4) == ErrorCode.transaction_abortable
        assert txn_offset_commit(c, tid, pid, e, "g-v4", topic_name, 1, version=3) == ErrorCode.invalid_txn_state
        assert describe(c, tid).transaction_state == "Empty"
        assert add_partitions(c, tid, pid, e, topic_name) == {(topic_name, 0): 0}
        assert produce(c, tid, topic_name, txn_batch([b"v11"], pid, 0, e), version=11) == 0


def test_transaction_version_0_keeps_the_old_protocol(broker_factory, topic_name):
    b = broker_factory(extra_args=[*BROKER_ARGS, "--transaction-version", "0"])
    tid = f"tx0-{topic_name}"
    with RawClient(b.bootstrap) as c:
        supported, finalized, _ = features(c)
        assert supported["transaction.version"] == (0, 2) and "transaction.version" not in finalized
        make_topic(c, topic_name)
        _, pid, e = init(c, tid, version=5)
        assert produce(c, tid, topic_name, txn_batch([b"x"], pid, 0, e)) == ErrorCode.transaction_abortable
        assert commit_offset_v5(c, tid, pid, e, "g0", topic_name, 1) == ErrorCode.transaction_abortable
        assert describe(c, tid).transaction_state == "Empty"


# -- a cluster: the partition's and the group's brokers ask the coordinator's ---------------------


@pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")
@pytest.mark.timeout(150)
def test_implicit_adds_across_brokers(cluster_factory):  # noqa: F811
    from tests.test_txn_cluster import _read_committed, coordinator_of

    cl = cluster_factory("tv2", broker_args=("--transactions", "true"))
    topic, parts = f"t-{cl.tag}", 6
    cl.create_topic(topic, parts)
    owners = cl.wait_owned(topic, parts)
    tid = f"tx-{cl.tag}"
    coord_id = coordinator_of(cl.brokers[0], tid, 1)
    assert {n for n, _ in owners.values()} - {coord_id}  # partitions the coordinator does not own
    # A group whose coordinator is not the transaction's.
    group = next(g for g in (f"g{i}-{cl.tag}" for i in range(100)) if coordinator_of(cl.brokers[0], g, 0) != coord_id)
    group_b = cl.brokers[coordinator_of(cl.brokers[0], group, 0)]
    with RawClient(cl.brokers[coord_id].bootstrap) as coord:
        _, pid, e = init(coord, tid, version=5)
        for epoch, values, commit in ((e, b"c", True), (e + 1, b"a", False)):
            seq = 0
            for p in range(parts):  # every broker owns some: most adds come from other brokers
                node, _ = owners[p]
                with RawClient(cl.brokers[node].bootstrap) as c:
                    err = wait_until(lambda: (lambda r: (r,) if r != ErrorCode.not_enough_replicas else None)(
                        produce(c, tid, topic, txn_batch([values + b"-%d" % p], pid, seq, epoch), partition=p)), 20, "the add")[0]
                    assert err == 0, (p, node, err)
            with RawClient(group_b.bootstrap) as c:
                assert commit_offset_v5(c, tid, pid, epoch, group, topic, 3 if commit else 4) == 0
            st = describe(coord, tid)
            assert st.transaction_state == "Ongoing" and [(t.topic, sorted(t.partitions)) for t in st.topics] == [(topic, list(range(parts)))]
            assert end_v5(coord, tid, pid, epoch, commit) == (0, pid, epoch + 1)
            wait_until(lambda: describe(coord, tid).transaction_state in ("CompleteCommit", "CompleteAbort"), 30, "the end")
    with RawClient(group_b.bootstrap) as c:
        assert fetch_offset(c, group, topic, require_stable=True) == (0, 3)
    assert sorted(_read_committed(cl.bootstrap, topic, parts, parts)) == sorted(b"c-%d" % p for p in range(parts))


from tests.test_cluster import backends, cluster_factory  # noqa: E402,F401  (fixtures)
