"""The partition side of transactions with real storage: transactional batches, markers
written through `LogManager.write_txn_markers` (in process) and WriteTxnMarkers (over TCP),
the last stable offset, read_committed reads with their aborted transactions, ListOffsets by
isolation level, and all of it after a restart. The coordinator is played by the test (raw
requests with hand-built transactional batches)."""

from __future__ import annotations

import datetime
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafscale.broker.config import BrokerConfig
from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
from kafscale.errors import ErrorCode
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage.logs import LogManager
from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.txn import TxnMarker
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

E = ErrorCode
PID_A, PID_B = 9001, 9002
FETCH, LIST_OFFSETS, WRITE_TXN_MARKERS, PRODUCE = 1, 2, 27, 0


def txn_batch(values: list[bytes], pid: int, seq: int, epoch: int = 0) -> bytes:
    return records.build_batch(
        [(None, v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=int(time.time() * 1000), attributes=records.TRANSACTIONAL_MASK
    )


def plain_batch(value: bytes) -> bytes:
    """A non-transactional batch stamped now (a timestamp of 0 is past retention.ms)."""
    return records.build_batch([(None, value)], timestamp=int(time.time() * 1000))


def _manager(tmp_path, **config) -> LogManager:
    cfg = BrokerConfig(data_dir=str(tmp_path), http="", merge_interval_ms=0, **config)
    meta = MetadataStore(SqliteKV(tmp_path / "meta.sqlite"))
    return LogManager(meta, LocalObjectStore(tmp_path / "objects"), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


async def _produce(lg, batch: bytes) -> int:
    data = memoryview(bytearray(batch))
    base, _t, waiter = lg.append(data, records.validate_record_set(data), True)
    await waiter
    return base


def _values(chunks) -> list[bytes]:
    data = b"".join(chunks)
    out = []
    for pos, h in records.iter_batches(data):
        if not h.is_control:
            out += [r.value for r in records.decode_records(data, pos, h)]
    return out


# -- in process -------------------------------------------------------------------------


async def test_markers_lso_and_aborted_entries_in_process_and_after_a_restart(tmp_path):
    mgr = _manager(tmp_path)
    await mgr.metadata.create_topic(TopicMeta("tx", 1))
    lg = await mgr.get_log("tx", 0)
    await _produce(lg, plain_batch(b"plain"))  # 0
    assert await _produce(lg, txn_batch([b"a1", b"a2"], PID_A, 0)) == 1  # 1, 2: A opens at 1
    assert await _produce(lg, txn_batch([b"b1"], PID_B, 0)) == 3  # 3: B opens at 3
    assert (lg.high_watermark, lg.last_stable_offset) == (4, 1)
    assert _values(await lg.read(0, 1 << 20, upto=lg.last_stable_offset)) == [b"plain"]
    assert _values(await lg.read(0, 1 << 20)) == [b"plain", b"a1", b"a2", b"b1"]  # read_uncommitted

    got = await mgr.write_txn_markers(TxnMarker(PID_A, 0, 0, False, [("tx", 0), ("nope", 0), ("tx", 5)]))
    assert got == {("tx", 0): E.none, ("nope", 0): E.unknown_topic_or_partition, ("tx", 5): E.unknown_topic_or_partition}
    assert (lg.high_watermark, lg.last_stable_offset) == (5, 3)  # marker at 4 durable; B still open
    assert lg.state.segments[-1].aborted == ((PID_A, 1, 4),)
    assert lg.aborted_transactions(0, 3) == [(PID_A, 1)]

    got = await mgr.write_txn_markers(TxnMarker(PID_B, 0, 0, True, [("tx", 0)]))
    assert got == {("tx", 0): E.none}
    assert lg.last_stable_offset == lg.high_watermark == 6
    assert lg.aborted_transactions(0, 6) == [(PID_A, 1)]

    # A zombie coordinator's marker (older coordinator epoch than B's last) and a fenced epoch.
    await mgr.write_txn_markers(TxnMarker(PID_B, 1, 3, False, [("tx", 0)]))  # 6
    assert await mgr.write_txn_markers(TxnMarker(PID_B, 1, 2, True, [("tx", 0)])) == {("tx", 0): E.transaction_coordinator_fenced}
    assert await mgr.write_txn_markers(TxnMarker(PID_B, 0, 3, True, [("tx", 0)])) == {("tx", 0): E.invalid_producer_epoch}

    await _produce(lg, txn_batch([b"a3"], PID_A, 2))  # 7: A's next transaction, left open
    await _produce(lg, plain_batch(b"after"))  # 8
    assert (lg.high_watermark, lg.last_stable_offset) == (9, 7)
    await mgr.stop()

    again = _manager(tmp_path)  # a restart: open transactions from the tail, aborted entries from the metadata
    lg = await again.get_log("tx", 0)
    assert (lg.high_watermark, lg.last_stable_offset) == (9, 7)
    assert lg.producers.open_txns == {PID_A: 7}
    assert lg.aborted_transactions(0, 9) == [(PID_A, 1)]
    assert await again.write_txn_markers(TxnMarker(PID_A, 0, 0, False, [("tx", 0)])) == {("tx", 0): E.none}  # 9
    assert lg.last_stable_offset == 10
    assert lg.aborted_transactions(5, 10) == [(PID_A, 7)]
    await again.stop()


# The merger makes one segment of five small ones: segments of their own (a merge of small
# segments), or pieces of write-ahead objects due at once (their rewrite into a segment).
LAYOUTS = {"segments": dict(write_ahead_objects=False), "write-ahead": dict(write_ahead_objects=True, segment_max_age_ms=0)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
async def test_merged_segments_keep_their_aborted_entries(tmp_path, layout):
    mgr = _manager(tmp_path, **LAYOUTS[layout])
    await mgr.metadata.create_topic(TopicMeta("mg", 1))
    lg = await mgr.get_log("mg", 0)
    await _produce(lg, txn_batch([b"x"], PID_A, 0))
    await mgr.write_txn_markers(TxnMarker(PID_A, 0, 0, False, [("mg", 0)]))
    await _produce(lg, txn_batch([b"y"], PID_B, 0))
    await mgr.write_txn_markers(TxnMarker(PID_B, 0, 0, False, [("mg", 0)]))
    await _produce(lg, txn_batch([b"z"], PID_A, 1))  # 4: left open
    assert [bool(s.wao_key) for s in lg.state.segments] == [layout == "write-ahead"] * 5
    assert await mgr.merger.run_once() == 1
    (merged,) = lg.state.segments
    assert merged.wao_key == ""
    assert merged.aborted == ((PID_A, 0, 1), (PID_B, 2, 3))
    assert merged.open_txns == ((PID_A, 0, 4),)  # as the run's last segment recorded
    await mgr.stop()
    again = _manager(tmp_path, **LAYOUTS[layout])
    lg = await again.get_log("mg", 0)
    assert lg.aborted_transactions(0, 5) == [(PID_A, 0), (PID_B, 2)]
    assert lg.last_stable_offset == 4
    await again.stop()


# -- over TCP ---------------------------------------------------------------------------


def produce_txn(c: RawClient, topic: str, batch: bytes, version: int = 9):
    p = req(PRODUCE, version, "PartitionProduceData", index=0, records=batch)
    t = req(PRODUCE, version, "TopicProduceData", name=topic, partition_data=(p,))
    body = req(PRODUCE, version, transactional_id="tx-app", acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(t,))
    return c.request(PRODUCE, version, body).responses[0].partition_responses[0]


def write_markers(c: RawClient, topic: str, pid: int, commit: bool, epoch: int = 0, version: int = 1):
    t = req(WRITE_TXN_MARKERS, version, "WritableTxnMarkerTopic", name=topic, partition_indexes=(0,))
    m = req(WRITE_TXN_MARKERS, version, "WritableTxnMarker", producer_id=pid, producer_epoch=epoch, transaction_result=commit, topics=(t,), coordinator_epoch=0)
    resp = c.request(WRITE_TXN_MARKERS, version, req(WRITE_TXN_MARKERS, version, markers=(m,)))
    (mr,) = resp.markers
    assert mr.producer_id == pid
    return error_code(mr.topics[0].partitions[0].error_code)


def fetch(c: RawClient, topic: str, offset: int, isolation: int, version: int = 12):
    fp = req(FETCH, version, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    ft = req(FETCH, version, "FetchTopic", topic=topic, partitions=(fp,))
    body = req(FETCH, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1 << 20, isolation_level=isolation,
               session_id=0, session_epoch=-1, topics=(ft,), forgotten_topics_data=(), rack_id="")
    return c.request(FETCH, version, body).responses[0].partitions[0]


def latest(c: RawClient, topic: str, isolation: int, version: int = 7) -> int:
    p = req(LIST_OFFSETS, version, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1)
    t = req(LIST_OFFSETS, version, "ListOffsetsTopic", name=topic, partitions=(p,))
    resp = c.request(LIST_OFFSETS, version, req(LIST_OFFSETS, version, replica_id=-1, isolation_level=isolation, timeout=5000, topics=(t,)))
    return resp.topics[0].partitions[0].offset


def consume_all(bootstrap: str, topic: str, isolation: str, end: int) -> list[bytes]:
    """Every record a confluent-kafka consumer with `isolation.level` reads up to its end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and c.position([TopicPartition(topic, 0)])[0].offset >= end:  # _PARTITION_EOF
                    return out
                continue
            out.append(m.value())
        raise AssertionError(f"{isolation} consumer did not reach offset {end}; got {out}")
    finally:
        c.close()


def test_read_committed_over_tcp_and_after_a_broker_restart(broker_factory, topic_name):
    # Raw transactional batches without a coordinator transaction: verification off.
    b = broker_factory(extra_args=["--merge-interval-ms", "0", "--transaction-partition-verification-enable", "false"])
    topic = topic_name
    with RawClient(b.bootstrap) as c:
        c.metadata([topic])  # auto-create
        wait_until(lambda: error_code(c.produce(topic, 0, plain_batch(b"p0")).error_code) == 0, 10, "the topic")
        assert error_code(produce_txn(c, topic, txn_batch([b"c1", b"c2"], PID_A, 0)).error_code) == 0  # 1, 2
        assert error_code(produce_txn(c, topic, txn_batch([b"x1"], PID_B, 0)).error_code) == 0  # 3
        assert error_code(c.produce(topic, 0, plain_batch(b"p1")).error_code) == 0  # 4

        # Open transactions hold the LSO at the first one's first offset.
        committed = fetch(c, topic, 0, isolation=1)
        assert (committed.high_watermark, committed.last_stable_offset) == (5, 1)
        assert _values([committed.records or b""]) == [b"p0"]
        assert list(committed.aborted_transactions) == []
        uncommitted = fetch(c, topic, 0, isolation=0)
        assert uncommitted.last_stable_offset == 1 and uncommitted.aborted_transactions is None
        assert _values([uncommitted.records]) == [b"p0", b"c1", b"c2", b"x1", b"p1"]
        assert (latest(c, topic, 1), latest(c, topic, 0)) == (1, 5)

        assert write_markers(c, topic, PID_A, commit=True) == 0  # 5
        assert fetch(c, topic, 0, isolation=1).last_stable_offset == 3
        assert write_markers(c, topic, PID_B, commit=False) == 0  # 6
        assert write_markers(c, "no-such-topic-" + topic, PID_B, commit=False) == E.unknown_topic_or_partition
        done = fetch(c, topic, 0, isolation=1)
        assert (done.high_watermark, done.last_stable_offset) == (7, 7)
        assert [(a.producer_id, a.first_offset) for a in done.aborted_transactions] == [(PID_B, 3)]
        assert [(a.producer_id, a.first_offset) for a in fetch(c, topic, 4, isolation=1).aborted_transactions] == [(PID_B, 3)]  # B's records before 4, its marker after

        assert error_code(produce_txn(c, topic, txn_batch([b"open"], PID_A, 2)).error_code) == 0  # 7: left open
        assert error_code(c.produce(topic, 0, plain_batch(b"p2")).error_code) == 0  # 8

    assert consume_all(b.bootstrap, topic, "read_committed", 7) == [b"p0", b"c1", b"c2", b"p1"]
    assert consume_all(b.bootstrap, topic, "read_uncommitted", 9) == [b"p0", b"c1", b"c2", b"x1", b"p1", b"open", b"p2"]

    b.restart()
    with RawClient(b.bootstrap) as c:
        after = wait_until(lambda: fetch(c, topic, 0, isolation=1), 15, "the partition after the restart")
        assert (after.high_watermark, after.last_stable_offset) == (9, 7)
        assert [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(PID_B, 3)]
        assert latest(c, topic, 1) == 7
        assert write_markers(c, topic, PID_A, commit=False) == 0  # 9
        final = fetch(c, topic, 0, isolation=1)
        assert final.last_stable_offset == 10
        assert [(a.producer_id, a.first_offset) for a in final.aborted_transactions] == [(PID_B, 3), (PID_A, 7)]
    assert consume_all(b.bootstrap, topic, "read_committed", 10) == [b"p0", b"c1", b"c2", b"p1", b"p2"]


# -- end to end with the coordinator ----------------------------------------------------


def test_confluent_kafka_transactional_producer_commit_and_abort(broker_factory, topic_name):
    """The coordinator (--transactions) and the partition side together: a read_committed
    consumer sees exactly the committed records, a read_uncommitted one all of them."""
    from confluent_kafka import Producer

    b = broker_factory(extra_args=["--merge-interval-ms", "0", "--transactions", "true"])
    topic = topic_name
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "tx-" + topic, "transaction.timeout.ms": 60000})
    p.init_transactions(20)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, value=b"commit-%d" % i, partition=0)
    p.commit_transaction(20)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=b"abort-%d" % i, partition=0)
    p.flush(20)
    with RawClient(b.bootstrap) as c:  # the aborted records are written, their transaction open
        assert latest(c, topic, 1) < latest(c, topic, 0)
    p.abort_transaction(20)
    p.begin_transaction()
    p.produce(topic, value=b"commit-last", partition=0)
    p.commit_transaction(20)
    with RawClient(b.bootstrap) as c:
        # EndTxn is answered once the decision is durable; the markers follow (as Kafka).
        end = wait_until(lambda: (hw := latest(c, topic, 0)) == latest(c, topic, 1) and hw, 10, "the markers of the last commit")
        aborted = fetch(c, topic, 0, isolation=1).aborted_transactions
        assert len(aborted) == 1
    assert consume_all(b.bootstrap, topic, "read_committed", end) == [b"commit-0", b"commit-1", b"commit-2", b"commit-last"]
    assert consume_all(b.bootstrap, topic, "read_uncommitted", end) == [b"commit-0", b"commit-1", b"commit-2", b"abort-0", b"abort-1", b"commit-last"]


# -- other clients' read_committed consumers, DescribeProducers, bad input ---------------


@pytest.fixture(scope="module")
def raw_broker():
    """A broker taking raw transactional batches without a coordinator transaction
    (verification off), shared by the tests below."""
    b = BrokerProcess(extra_args=["--merge-interval-ms", "0", "--transaction-partition-verification-enable", "false"]).start()
    yield b
    b.stop()


def test_kafka_python_and_aiokafka_read_committed_and_describe_producers(raw_broker, topic_name):
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    topic = topic_name
    broker = raw_broker
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic])
        wait_until(lambda: error_code(c.produce(topic, 0, plain_batch(b"p0")).error_code) == 0, 10, "the topic")
        assert error_code(produce_txn(c, topic, txn_batch([b"a1", b"a2"], PID_A, 0)).error_code) == 0  # 1, 2
        assert error_code(produce_txn(c, topic, txn_batch([b"b1"], PID_B, 0)).error_code) == 0  # 3
        resp = c.request(61, 0, req(61, 0, topics=(req(61, 0, "TopicRequest", name=topic, partition_indexes=(0,)),)))
        states = {s.producer_id: s.current_txn_start_offset for s in resp.topics[0].partitions[0].active_producers}
        assert states == {PID_A: 1, PID_B: 3}
        assert write_markers(c, topic, PID_A, commit=False) == 0  # 4
        assert write_markers(c, topic, PID_B, commit=True) == 0  # 5
        assert error_code(c.produce(topic, 0, plain_batch(b"p1")).error_code) == 0  # 6
        # Transactional records without a transactional id: refused, as Kafka.
        refused = c.produce(topic, 0, txn_batch([b"sneaky"], 9999, 0))
        assert error_code(refused.error_code) == E.transactional_id_authorization_failed
        assert latest(c, topic, 1) == latest(c, topic, 0) == 7
    want = [b"p0", b"b1", b"p1"]

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed", enable_auto_commit=False, consumer_timeout_ms=5000)
    kc.assign([KTP(topic, 0)])
    kc.seek(KTP(topic, 0), 0)
    got = []
    for m in kc:
        got.append(m.value)
        if len(got) >= len(want) and m.offset >= 6:
            break
    kc.close()
    assert got == want

    async def aio() -> list[bytes]:
        ac = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, isolation_level="read_committed", enable_auto_commit=False, fetch_max_wait_ms=50)
        await ac.start()
        try:
            tp = ATP(topic, 0)
            ac.assign([tp])
            await ac.seek_to_beginning(tp)
            out = []
            while b"p1" not in out:
                out.append((await asyncio.wait_for(ac.getone(), 10)).value)
            return out
        finally:
            await ac.stop()

    assert asyncio.run(aio()) == want


async def test_a_transaction_older_than_the_replayed_tail_comes_back_from_the_segment_metadata(tmp_path, monkeypatch):
    from kafscale.storage import recovery

    mgr = _manager(tmp_path)
    await mgr.metadata.create_topic(TopicMeta("old", 1))
    lg = await mgr.get_log("old", 0)
    await _produce(lg, txn_batch([b"a1"], PID_A, 0))  # 0: A opens, in the first segment
    for i in range(3):
        await _produce(lg, plain_batch(b"x%d" % i))  # 1..3: later segments
    assert [s.open_txns for s in lg.state.segments] == [((PID_A, 0, 0),)] * 4
    await mgr.stop()

    monkeypatch.setattr(recovery, "PRODUCER_STATE_REPLAY_BYTES", 1)  # replay the last segment only
    again = _manager(tmp_path)
    lg = await again.get_log("old", 0)
    assert (lg.high_watermark, lg.last_stable_offset) == (4, 0)
    assert await again.write_txn_markers(TxnMarker(PID_A, 0, 0, False, [("old", 0)])) == {("old", 0): E.none}
    assert lg.last_stable_offset == 5
    assert lg.aborted_transactions(0, 5) == [(PID_A, 0)]
    assert lg.state.segments[-1].open_txns == ()
    await again.stop()


def offset_for(c: RawClient, topic: str, timestamp: int, isolation: int, version: int = 7) -> int:
    p = req(LIST_OFFSETS, version, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
    t = req(LIST_OFFSETS, version, "ListOffsetsTopic", name=topic, partitions=(p,))
    resp = c.request(LIST_OFFSETS, version, req(LIST_OFFSETS, version, replica_id=-1, isolation_level=isolation, timeout=5000, topics=(t,)))
    return resp.topics[0].partitions[0].offset


def test_list_offsets_by_timestamp_read_committed_finds_only_offsets_below_the_lso(raw_broker, topic_name):
    broker = raw_broker
    topic, now = topic_name, int(time.time() * 1000)
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic])
        old = records.build_batch([(None, b"old")], timestamp=now - 10_000)
        wait_until(lambda: error_code(c.produce(topic, 0, old).error_code) == 0, 10, "the topic")  # 0
        young = records.build_batch([(None, b"t")], producer_id=PID_A, producer_epoch=0, base_sequence=0, timestamp=now, attributes=records.TRANSACTIONAL_MASK)
        assert error_code(produce_txn(c, topic, young).error_code) == 0  # 1: open
        assert (offset_for(c, topic, now - 20_000, 1), offset_for(c, topic, now - 20_000, 0)) == (0, 0)
        assert (offset_for(c, topic, now - 5_000, 1), offset_for(c, topic, now - 5_000, 0)) == (-1, 1)
        assert write_markers(c, topic, PID_A, commit=True) == 0
        assert offset_for(c, topic, now - 5_000, 1) == 1
