"""The transaction coordinator over raw Kafka requests against a real broker (--transactions):
InitProducerId with a transactional id, FindCoordinator key type 1, fencing, EndTxn without a
transaction, AddPartitionsToTxn errors by version, TxnOffsetCommit held pending (OffsetFetch
require_stable -> UNSTABLE_OFFSET_COMMIT) until EndTxn commits or drops it, the timeout
abort, DescribeTransactions and ListTransactions, and state surviving a restart.

Transactions here touch no data partitions (only AddOffsetsToTxn), so they complete without
partition markers; transactions over data partitions are tested with real clients once the
partition side writes markers.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from kafscale.protocol import records
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

INIT_PRODUCER_ID, FIND_COORDINATOR, OFFSET_FETCH = 22, 10, 9
ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_TXNS, LIST_TXNS = 65, 66


@pytest.fixture(scope="module")
def txb():
    b = BrokerProcess(extra_args=[
        "--transactions", "true", "--merge-interval-ms", "0", "--group-initial-rebalance-delay-ms", "0",
        "--transaction-abort-timed-out-transaction-cleanup-interval-ms", "200",
        "--transaction-max-timeout-ms", "60000",
    ]).start()
    yield b
    b.stop()


def init(c: RawClient, tid: str, timeout_ms: int = 30000, pid: int = -1, epoch: int = -1, version: int = 4):
    r = c.request(INIT_PRODUCER_ID, version, req(INIT_PRODUCER_ID, version, transactional_id=tid,
                                                 transaction_timeout=timeout_ms, producer_id=pid, producer_epoch=epoch))
    return error_code(r.error_code), r.producer_id, r.producer_epoch


def end(c: RawClient, tid: str, pid: int, epoch: int, commit: bool, version: int = 3):
    r = c.request(END_TXN, version, req(END_TXN, version, transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit))
    return error_code(r.error_code)


def add_offsets(c: RawClient, tid: str, pid: int, epoch: int, group: str, version: int = 3):
    r = c.request(ADD_OFFSETS, version, req(ADD_OFFSETS, version, transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group))
    return error_code(r.error_code)


def add_partitions(c: RawClient, tid: str, pid: int, epoch: int, topic: str, parts=(0,), version: int = 3):
    t = req(ADD_PARTITIONS, version, "AddPartitionsToTxnTopic", name=topic, partitions=tuple(parts))
    r = c.request(ADD_PARTITIONS, version, req(ADD_PARTITIONS, version, v3_and_below_transactional_id=tid,
                                               v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                                               v3_and_below_topics=(t,)))
    return {(tr.name, pr.partition_index): error_code(pr.partition_error_code)
            for tr in r.results_by_topic_v3_and_below for pr in tr.results_by_partition}


def txn_offset_commit(c: RawClient, tid: str, pid: int, epoch: int, group: str, topic: str, offset: int, version: int = 3,
                      member_id: str = "", generation_id: int = -1):
    p = req(TXN_OFFSET_COMMIT, version, "TxnOffsetCommitRequestPartition", partition_index=0, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata="m")
    t = req(TXN_OFFSET_COMMIT, version, "TxnOffsetCommitRequestTopic", name=topic, partitions=(p,))
    r = c.request(TXN_OFFSET_COMMIT, version, req(TXN_OFFSET_COMMIT, version, transactional_id=tid, group_id=group,
                                                  producer_id=pid, producer_epoch=epoch, generation_id=generation_id, member_id=member_id,
                                                  group_instance_id=None, topics=(t,)))
    return error_code(r.topics[0].partitions[0].error_code)


def fetch_offset(c: RawClient, group: str, topic: str, require_stable: bool, version: int = 7):
    t = req(OFFSET_FETCH, version, "OffsetFetchRequestTopic", name=topic, partition_indexes=(0,))
    r = c.request(OFFSET_FETCH, version, req(OFFSET_FETCH, version, group_id=group, topics=(t,), require_stable=require_stable))
    p = r.topics[0].partitions[0]
    return error_code(p.error_code), p.committed_offset


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def describe(c: RawClient, tid: str):
    """DescribeTransactions v0 for one id, decoded by hand: kio's reader refuses the -1
    start time Kafka (and we) send for a transaction that has not started."""
    c.send_request(DESCRIBE_TXNS, 0, req(DESCRIBE_TXNS, 0, transactional_ids=(tid,)))
    buf = c.recv_frame()
    pos = 4 + 1 + 4  # correlation id, header tags, throttle time
    n, pos = _uvarint(buf, pos)
    assert n - 1 == 1

    def string(pos):
        size, pos = _uvarint(buf, pos)
        return buf[pos : pos + size - 1].decode(), pos + size - 1

    error = struct.unpack_from(">h", buf, pos)[0]
    txn_id, pos = string(pos + 2)
    state, pos = string(pos)
    timeout, start, pid, epoch = struct.unpack_from(">iqqh", buf, pos)
    pos += 4 + 8 + 8 + 2
    topics = []
    n, pos = _uvarint(buf, pos)
    for _ in range(n - 1):
        topic, pos = string(pos)
        count, pos = _uvarint(buf, pos)
        parts = list(struct.unpack_from(f">{count - 1}i", buf, pos))
        pos += 4 * (count - 1)
        _tags, pos = _uvarint(buf, pos)
        topics.append(SimpleNamespace(topic=topic, partitions=parts))
    return SimpleNamespace(error_code=error, transactional_id=txn_id, transaction_state=state, transaction_timeout_ms=timeout,
                           transaction_start_time_ms=start, producer_id=pid, producer_epoch=epoch, topics=topics)


def test_init_producer_id_new_id_then_bumps_and_find_coordinator(txb):
    with RawClient(txb.bootstrap) as c:
        for version in (0, 2, 4, 6):
            r = c.request(FIND_COORDINATOR, 3 if version < 4 else 4, req(
                FIND_COORDINATOR, 3 if version < 4 else 4, key="tx-find", key_type=1, coordinator_keys=("tx-find",)))
            node = r.coordinators[0] if hasattr(r, "coordinators") else r
            assert error_code(node.error_code) == 0 and node.port == txb.port
        err, pid, epoch = init(c, "tx-init")
        assert (err, epoch) == (0, 0) and pid >= 0
        err, pid2, epoch2 = init(c, "tx-init")
        assert (err, pid2, epoch2) == (0, pid, 1)
        # KIP-360: the current producer asks for a bump; a stale one is fenced (v3: INVALID_PRODUCER_EPOCH).
        assert init(c, "tx-init", pid=pid, epoch=1, version=4) == (0, pid, 2)
        assert init(c, "tx-init", pid=pid, epoch=0, version=4)[0] == ErrorCode.producer_fenced
        assert init(c, "tx-init", pid=pid, epoch=0, version=3)[0] == ErrorCode.invalid_producer_epoch
        assert init(c, "tx-init", timeout_ms=60001)[0] == ErrorCode.invalid_transaction_timeout
        assert init(c, "")[0] == ErrorCode.invalid_request


def test_end_txn_without_transaction_and_bad_producers(txb, topic_name):
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        err, pid, epoch = init(c, "tx-bad")
        assert end(c, "tx-bad", pid, epoch, True) == ErrorCode.invalid_txn_state
        assert end(c, "tx-bad", pid, epoch, False) == ErrorCode.invalid_txn_state
        assert end(c, "tx-unknown", pid, epoch, True) == ErrorCode.invalid_producer_id_mapping
        assert end(c, "tx-bad", pid + 1000, epoch, True) == ErrorCode.invalid_producer_id_mapping
        assert end(c, "tx-bad", pid, epoch + 1, True, version=2) == ErrorCode.producer_fenced
        assert end(c, "tx-bad", pid, epoch + 1, True, version=1) == ErrorCode.invalid_producer_epoch
        assert add_partitions(c, "tx-bad", pid, epoch + 1, topic_name, version=2) == {(topic_name, 0): ErrorCode.producer_fenced}
        assert add_partitions(c, "tx-bad", pid, epoch + 1, topic_name, version=1) == {(topic_name, 0): ErrorCode.invalid_producer_epoch}
        assert add_partitions(c, "tx-nope", pid, epoch, topic_name) == {(topic_name, 0): ErrorCode.invalid_producer_id_mapping}
        # One unknown partition fails the request; the others were not attempted.
        assert add_partitions(c, "tx-bad", pid, epoch, topic_name, parts=(0, 7)) == {
            (topic_name, 0): ErrorCode.operation_not_attempted, (topic_name, 7): ErrorCode.unknown_topic_or_partition}
        st = describe(c, "tx-bad")
        assert (st.transaction_state, st.transaction_start_time_ms, st.producer_id) == ("Empty", -1, pid)


def test_zombie_is_fenced_by_a_new_producer(txb, topic_name):
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        _, pid, old = init(c, "tx-zombie")
        assert add_partitions(c, "tx-zombie", pid, old, topic_name) == {(topic_name, 0): 0}
        st = describe(c, "tx-zombie")
        assert st.transaction_state == "Ongoing" and [(t.topic, list(t.partitions)) for t in st.topics] == [(topic_name, [0])]
        # A second producer with the same id: the ongoing transaction is aborted under a
        # bumped epoch, the new producer is told to retry.
        assert init(c, "tx-zombie")[0] == ErrorCode.concurrent_transactions
        st = describe(c, "tx-zombie")
        assert st.producer_epoch == old + 1 and st.transaction_state in ("PrepareAbort", "CompleteAbort")
        # The zombie can neither commit nor extend its transaction.
        assert end(c, "tx-zombie", pid, old, True) == ErrorCode.producer_fenced
        assert add_offsets(c, "tx-zombie", pid, old, "g") == ErrorCode.producer_fenced


def test_txn_offsets_pending_until_commit(txb, topic_name):
    group = f"g-{topic_name}"
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        _, pid, epoch = init(c, "tx-offsets")
        # TxnOffsetCommit before AddOffsetsToTxn: not in a transaction with this group.
        assert txn_offset_commit(c, "tx-offsets", pid, epoch, group, topic_name, 5) == ErrorCode.invalid_txn_state
        assert add_offsets(c, "tx-offsets", pid, epoch, group) == 0
        assert txn_offset_commit(c, "tx-offsets", pid, epoch + 1, group, topic_name, 5) == ErrorCode.producer_fenced
        assert txn_offset_commit(c, "tx-offsets", pid, epoch + 1, group, topic_name, 5, version=2) == ErrorCode.invalid_producer_epoch
        assert txn_offset_commit(c, "tx-offsets", pid, epoch, group, topic_name, 5) == 0
        assert fetch_offset(c, group, topic_name, require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
        assert fetch_offset(c, group, topic_name, require_stable=False) == (0, -1)
        assert end(c, "tx-offsets", pid, epoch, True) == 0
        wait_until(lambda: fetch_offset(c, group, topic_name, require_stable=True) == (0, 5), 10, "the committed offset")
        assert describe(c, "tx-offsets").transaction_state == "CompleteCommit"
        # The next transaction aborts: its offset is dropped.
        assert add_offsets(c, "tx-offsets", pid, epoch, group) == 0
        assert txn_offset_commit(c, "tx-offsets", pid, epoch, group, topic_name, 9) == 0
        assert end(c, "tx-offsets", pid, epoch, False) == 0
        wait_until(lambda: describe(c, "tx-offsets").transaction_state == "CompleteAbort", 10, "the abort")
        assert fetch_offset(c, group, topic_name, require_stable=True) == (0, 5)
        # A retried EndTxn after completion succeeds; the opposite outcome is refused.
        assert end(c, "tx-offsets", pid, epoch, False) == 0
        assert end(c, "tx-offsets", pid, epoch, True) == ErrorCode.invalid_txn_state


def test_timeout_aborts_and_fences(txb, topic_name):
    group = f"g-{topic_name}"
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        _, pid, epoch = init(c, "tx-timeout", timeout_ms=1000)
        assert add_offsets(c, "tx-timeout", pid, epoch, group) == 0
        assert txn_offset_commit(c, "tx-timeout", pid, epoch, group, topic_name, 3) == 0
        wait_until(lambda: describe(c, "tx-timeout").transaction_state == "CompleteAbort", 15, "the timeout abort")
        assert describe(c, "tx-timeout").producer_epoch == epoch + 1
        assert end(c, "tx-timeout", pid, epoch, True) == ErrorCode.producer_fenced
        assert fetch_offset(c, group, topic_name, require_stable=True) == (0, -1)


def test_describe_and_list(txb):
    with RawClient(txb.bootstrap) as c:
        _, pid, epoch = init(c, "tx-list")
        assert add_offsets(c, "tx-list", pid, epoch, "g-list") == 0
        st = describe(c, "tx-list")
        assert (error_code(st.error_code), st.producer_id, st.transaction_state) == (0, pid, "Ongoing")
        assert st.transaction_timeout_ms == 30000 and st.transaction_start_time_ms > 0
        assert error_code(describe(c, "tx-never").error_code) == ErrorCode.transactional_id_not_found
        r = c.request(LIST_TXNS, 1, req(LIST_TXNS, 1, state_filters=("Ongoing", "Bogus"), producer_id_filters=()))
        assert error_code(r.error_code) == 0 and list(r.unknown_state_filters) == ["Bogus"]
        assert ("tx-list", pid, "Ongoing") in [(s.transactional_id, s.producer_id, s.transaction_state) for s in r.transaction_states]
        r = c.request(LIST_TXNS, 0, req(LIST_TXNS, 0, state_filters=(), producer_id_filters=(pid,)))
        assert [s.transactional_id for s in r.transaction_states] == ["tx-list"]
        assert end(c, "tx-list", pid, epoch, False) == 0


def test_state_survives_restart(broker_factory):
    b = broker_factory(extra_args=["--transactions", "true", "--merge-interval-ms", "0"])
    with RawClient(b.bootstrap) as c:
        _, pid, epoch = init(c, "tx-restart")
        assert add_offsets(c, "tx-restart", pid, epoch, "g-r") == 0
    b.kill9()
    b.start()
    with RawClient(b.bootstrap) as c:
        st = describe(c, "tx-restart")
        assert (st.producer_id, st.producer_epoch, st.transaction_state) == (pid, epoch, "Ongoing")
        assert end(c, "tx-restart", pid, epoch, True) == 0
        assert init(c, "tx-restart")[1:] == (pid, epoch + 1)


def test_transaction_apis_advertised_unless_turned_off(broker, broker_factory):
    txn_apis = {ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT, DESCRIBE_TXNS, LIST_TXNS}
    with RawClient(broker.bootstrap) as c:
        r = c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1"))
        assert txn_apis <= {k.api_key for k in r.api_keys}
    off = broker_factory(extra_args=["--transactions", "false"])
    with RawClient(off.bootstrap) as c:
        r = c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1"))
        assert not txn_apis & {k.api_key for k in r.api_keys}
        assert init(c, "tx-off")[0] == ErrorCode.transactional_id_authorization_failed
        r = c.request(FIND_COORDINATOR, 3, req(FIND_COORDINATOR, 3, key="tx-off", key_type=1))
        assert error_code(r.error_code) == ErrorCode.invalid_request


def test_txn_offset_commit_checks_the_group_generation(txb, topic_name):
    group = f"g-{topic_name}"
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        j = c.request(11, 5, req(11, 5, group_id=group, session_timeout=30000, rebalance_timeout=30000, member_id="",
                                 group_instance_id="static-1", protocol_type="consumer",
                                 protocols=(req(11, 5, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
        assert error_code(j.error_code) == 0 and j.generation_id >= 1
        _, pid, epoch = init(c, "tx-gen")
        assert add_offsets(c, "tx-gen", pid, epoch, group) == 0
        # A consumer whose group moved on: its generation is refused, nothing is pending.
        assert txn_offset_commit(c, "tx-gen", pid, epoch, group, topic_name, 4, member_id=j.member_id,
                                 generation_id=j.generation_id - 1) == ErrorCode.illegal_generation
        assert txn_offset_commit(c, "tx-gen", pid, epoch, group, topic_name, 4, member_id="someone-else",
                                 generation_id=j.generation_id) == ErrorCode.unknown_member_id
        assert fetch_offset(c, group, topic_name, require_stable=True) == (0, -1)
        assert end(c, "tx-gen", pid, epoch, False) == 0


def test_add_partitions_v4_batched_and_verify_only(txb, topic_name):
    version = 4
    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        _, pid, epoch = init(c, "tx-v4")

        def call(verify_only: bool, parts=(0,), tid="tx-v4", ep=epoch):
            t = req(ADD_PARTITIONS, version, "AddPartitionsToTxnTopic", name=topic_name, partitions=tuple(parts))
            txn = req(ADD_PARTITIONS, version, "AddPartitionsToTxnTransaction", transactional_id=tid, producer_id=pid,
                      producer_epoch=ep, verify_only=verify_only, topics=(t,))
            r = c.request(ADD_PARTITIONS, version, req(ADD_PARTITIONS, version, transactions=(txn,)))
            assert error_code(r.error_code) == 0
            return {(res.transactional_id, tr.name, pr.partition_index): error_code(pr.partition_error_code)
                    for res in r.results_by_transaction for tr in res.topic_results for pr in tr.results_by_partition}

        # Verify-only (what a partition leader asks, KIP-890): not in the transaction yet.
        assert call(True) == {("tx-v4", topic_name, 0): ErrorCode.transaction_abortable}
        assert describe(c, "tx-v4").transaction_state == "Empty"
        assert call(False) == {("tx-v4", topic_name, 0): 0}
        assert call(True) == {("tx-v4", topic_name, 0): 0}
        assert call(True, ep=epoch + 1) == {("tx-v4", topic_name, 0): ErrorCode.producer_fenced}
        assert call(False, tid="tx-v4-unknown") == {("tx-v4-unknown", topic_name, 0): ErrorCode.invalid_producer_id_mapping}
        assert end(c, "tx-v4", pid, epoch, False) == 0


def test_end_txn_v5_bumps_the_epoch(txb):
    """EndTxn v5 (transactions v2, KIP-890): every end bumps the epoch and answers it."""
    with RawClient(txb.bootstrap) as c:
        _, pid, epoch = init(c, "tx-v5")
        assert add_offsets(c, "tx-v5", pid, epoch, "g-v5") == 0
        r = c.request(END_TXN, 5, req(END_TXN, 5, transactional_id="tx-v5", producer_id=pid, producer_epoch=epoch, committed=True))
        assert (error_code(r.error_code), r.producer_id, r.producer_epoch) == (0, pid, epoch + 1)
        # A retry of that EndTxn (still the old epoch) is recognised, not fenced.
        r = c.request(END_TXN, 5, req(END_TXN, 5, transactional_id="tx-v5", producer_id=pid, producer_epoch=epoch, committed=True))
        assert error_code(r.error_code) in (0, ErrorCode.concurrent_transactions)
        wait_until(lambda: describe(c, "tx-v5").transaction_state == "CompleteCommit", 10, "the commit")
        assert add_offsets(c, "tx-v5", pid, epoch, "g-v5") == ErrorCode.producer_fenced
        assert add_offsets(c, "tx-v5", pid, epoch + 1, "g-v5") == 0
        assert end(c, "tx-v5", pid, epoch + 1, False) == 0


def test_transactional_batch_outside_the_transaction_is_refused(txb, topic_name):
    """KIP-890 verification: the first transactional batch of a transaction on a partition
    is appended only if the coordinator has the partition in the producer's transaction."""
    from tests.test_txn_partition import plain_batch, txn_batch

    def produce(tid: str, pid: int, epoch: int, value: bytes):
        p = req(0, 9, "PartitionProduceData", index=0, records=txn_batch([value], pid, 0, epoch))
        t = req(0, 9, "TopicProduceData", name=topic_name, partition_data=(p,))
        r = c.request(0, 9, req(0, 9, transactional_id=tid, acks=-1, timeout=10000, topic_data=(t,)))
        return error_code(r.responses[0].partition_responses[0].error_code)

    with RawClient(txb.bootstrap) as c:
        c.metadata([topic_name])
        wait_until(lambda: error_code(c.produce(topic_name, 0, plain_batch(b"p0")).error_code) == 0, 10, "the topic")
        _, pid, epoch = init(c, "tx-verify")
        assert produce("tx-verify", pid, epoch, b"no-txn") == ErrorCode.invalid_txn_state  # no AddPartitionsToTxn
        assert produce("tx-verify-unknown", pid, epoch, b"unknown") == ErrorCode.invalid_producer_id_mapping
        assert add_partitions(c, "tx-verify", pid, epoch, topic_name) == {(topic_name, 0): 0}
        assert produce("tx-verify", pid, epoch + 1, b"stale") == ErrorCode.invalid_producer_epoch
        assert produce("tx-verify", pid, epoch, b"in-txn") == 0
        assert end(c, "tx-verify", pid, epoch, True) == 0
        values = lambda: [r.value for pos, h in records.iter_batches(c.fetch(topic_name, 0, 0).records or b"")
                          if not h.is_control for r in records.decode_records(c.fetch(topic_name, 0, 0).records, pos, h)]
        assert wait_until(lambda: values() == [b"p0", b"in-txn"] and values(), 10, "only the verified batch stored")
