"""Reading over offset gaps, as compaction leaves them (issue #16, docs/compaction.md
"Reading over gaps"): inside a batch, between batches, before a segment's first batch,
after its last one (up to its last offset), a segment with no batch at all, an emptied
batch kept for producer state, and a batch with Kafka's KIP-534 delete horizon.

The partitions are written straight into a broker's data directory (tests/support/gaps.py)
and read over TCP by confluent-kafka, kafka-python and raw Fetch / ListOffsets requests
from every interesting offset; a restart recovers a log from such segments.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.broker import BrokerProcess
from tests.support.gaps import PRODUCER_ID, Rec, Seg, gap_batch, gappy_layout, t0, ts, write_partition_sync
from tests.support.raw import RawClient, error_code
from tests.support.wait import wait_until

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
TOPIC = "gappy"
HW = 35
# every kind of place: log start, gaps inside a batch / between batches / at a segment's
# start and end, an emptied batch, a segment without batches, the newest segment
START_OFFSETS = [0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12, 14, 16, 19, 20, 25, 29, 30, 34]


@pytest.fixture(scope="module")
def gappy(tmp_path_factory):
    """A broker over a data dir holding topic `gappy`: partition 0 the layout of
    tests/support/gaps.py, partition 1 one segment ending in a gap (the end of its log)."""
    data_dir = tmp_path_factory.mktemp("gaps")
    t = t0()
    segs, survivors = gappy_layout(t)
    write_partition_sync(data_dir, TOPIC, 0, segs, partitions=2)
    tail = [Rec(0, ts(t, 0), b"a", b"first"), Rec(3, ts(t, 3), b"b", b"last")]
    write_partition_sync(data_dir, TOPIC, 1, [Seg(0, 9, [gap_batch(0, 4, tail)])])
    write_partition_sync(data_dir, TXN_TOPIC, 0, _compacted_transactions(t))
    write_partition_sync(data_dir, DEL_TOPIC, 0, segs)
    b = BrokerProcess(data_dir=str(data_dir), extra_args=["--merge-interval-ms", "0"]).start()
    yield b, t, survivors, tail
    b.stop()


TXN_TOPIC = "txgaps"
DEL_TOPIC = "gappy-deleted"  # the layout again, for DeleteRecords to move its log start


def _compacted_transactions(t: int) -> list[Seg]:
    """Transactions as compaction leaves them: producer 9's committed one thinned (0 and 2
    kept of 0-3) with its COMMIT marker at 4; producer 10's aborted one emptied (5-7) with
    its ABORT marker at 8; producer 11's committed one emptied (9-10), its marker at 11
    gone past its horizon; then a plain record at 12."""
    from kafscale.protocol.records import TRANSACTIONAL_MASK, build_control_batch

    def txn(base: int, last: int, recs: list[Rec], pid: int) -> bytes:
        return gap_batch(base, last, recs, base_timestamp=ts(t, base), producer_id=pid, producer_epoch=0, base_sequence=0, attributes=TRANSACTIONAL_MASK)

    batches = [
        txn(0, 3, [Rec(0, ts(t, 0), b"c0", b"yes"), Rec(2, ts(t, 2), b"c2", b"yes")], 9),
        build_control_batch(True, 9, 0, 0, ts(t, 4), base_offset=4),
        txn(5, 7, [], 10),
        build_control_batch(False, 10, 0, 0, ts(t, 8), base_offset=8),
        txn(9, 10, [], 11),
    ]
    return [Seg(0, 10, batches, aborted=((10, 5, 8),)), Seg(11, 12, [gap_batch(12, 12, [Rec(12, ts(t, 12), b"n", b"plain")])])]


def _as_tuples(recs) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp) for r in recs]


def _confluent_read(c: Consumer, partition: int, start: int, last: int, timeout: float = 15.0) -> list[tuple]:
    """Records from `start` until the one at `last` (offset, key, value, timestamp)."""
    c.assign([TopicPartition(TOPIC, partition, start)])
    out: list[tuple] = []
    deadline = time.monotonic() + timeout
    while (not out or out[-1][0] < last) and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            continue
        assert not m.error(), m.error()
        out.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
    return out


def test_confluent_reads_survivors_from_every_offset(gappy):
    b, _t, survivors, _ = gappy
    for conf in ({}, {"max.partition.fetch.bytes": 1, "fetch.max.bytes": 1000, "message.max.bytes": 1000}):  # one batch per fetch too
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gaps-confluent", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 50, "enable.partition.eof": False, **conf})
        try:
            for start in START_OFFSETS:
                want = [r for r in _as_tuples(survivors) if r[0] >= start]
                assert _confluent_read(c, 0, start, 34) == want, f"from offset {start} ({conf})"
        finally:
            c.close()


def _kafka_python_read(c, tp, start: int) -> list[tuple]:
    """(offset, key, value, timestamp) of what a kafka-python consumer reads from `start`
    up to the last offset, 34 (15 s at most)."""
    c.seek(tp, start)
    got: list[tuple] = []
    deadline = time.monotonic() + 15
    while (not got or got[-1][0] < 34) and time.monotonic() < deadline:
        for msgs in c.poll(timeout_ms=200).values():
            got += [(m.offset, m.key, m.value, m.timestamp) for m in msgs]
    return got


def test_kafka_python_reads_survivors_from_every_offset(gappy):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    b, _t, survivors, _ = gappy
    c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=50, max_partition_fetch_bytes=64)
    tp = KTP(TOPIC, 0)
    c.assign([tp])
    try:
        for start in START_OFFSETS:
            got = _kafka_python_read(c, tp, start)
            assert got == [r for r in _as_tuples(survivors) if r[0] >= start], f"from offset {start}"
            assert c.position(tp) == 35
    finally:
        c.close()


@pytest.mark.parametrize("api_version", [(0, 10, 1), (0, 9)])
def test_old_fetch_versions_read_survivors_from_every_offset(gappy, api_version):
    """Fetch v3 / v1 (message formats v1 / v0, down-converted): the emptied batch converts
    to no message and the gaps stay gaps; the consumer moves on over them, also one message
    a fetch (a read that would convert to nothing, the emptied batch or the removed tail of
    a batch, reads on past it; messages below the fetch offset are not sent)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    b, _t, survivors, _ = gappy
    for fetch_bytes in (1 << 20, 64):
        c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=50, api_version=api_version,
                          max_partition_fetch_bytes=fetch_bytes)
        tp = KTP(TOPIC, 0)
        c.assign([tp])
        try:
            for start in START_OFFSETS:
                got = [r[:3] for r in _kafka_python_read(c, tp, start)]
                assert got == [r[:3] for r in _as_tuples(survivors) if r[0] >= start], f"from offset {start}, {fetch_bytes} bytes a fetch"
        finally:
            c.close()


def _fetch_batches(c: RawClient, offset: int, max_bytes: int, partition: int = 0) -> list[tuple[int, int, int]]:
    p = c.fetch(TOPIC, partition, offset, max_bytes=max_bytes)
    assert error_code(p.error_code) == 0, p
    assert p.high_watermark == (HW if partition == 0 else 10) and p.log_start_offset == 0
    return [(h.base_offset, h.last_offset, h.record_count) for _pos, h in iter_batches(p.records or b"")]


def test_raw_fetch_returns_the_next_surviving_batch(gappy):
    b, *_ = gappy
    every = [(2, 5, 2), (7, 8, 2), (10, 12, 0), (13, 15, 2), (30, 34, 5)]
    with RawClient(b.bootstrap) as c:
        for offset in range(0, HW):
            got = _fetch_batches(c, offset, 1 << 20)
            assert got == [x for x in every if x[1] >= offset], f"fetch at {offset}"
        # the byte budget: the first batch whole (KIP-74), never a skip inside a segment
        assert _fetch_batches(c, 0, 1) == [(2, 5, 2)]
        assert _fetch_batches(c, 6, 1) == [(7, 8, 2)]
        assert _fetch_batches(c, 9, 1) == [(10, 12, 0)]  # the trailing gap hands on to the next segment
        assert _fetch_batches(c, 16, 1) == [(30, 34, 5)]  # across a segment without batches
        one = len(c.fetch(TOPIC, 0, 0, max_bytes=1).records)
        two = _fetch_batches(c, 0, one + 1)  # the second batch does not fit: stop in segment 0
        assert two == [(2, 5, 2)]
        assert c.fetch(TOPIC, 0, HW).records in (None, b"")  # at the high watermark: nothing
        p = c.fetch(TOPIC, 0, HW + 1)
        assert error_code(p.error_code) == 1  # OFFSET_OUT_OF_RANGE past the end, as before


def test_delete_horizon_and_tombstone_timestamps(gappy):
    b, t, _survivors, _ = gappy
    with RawClient(b.bootstrap) as c:
        p = c.fetch(TOPIC, 0, 13)
        pos, h = next((pos, h) for pos, h in iter_batches(p.records) if h.base_offset == 13)
        assert h.attributes & 0x40 and h.first_timestamp > ts(t, 15)  # the horizon, as stored
        recs = decode_records(p.records, pos, h)
        assert [(r.offset, r.value, r.timestamp) for r in recs] == [(13, None, ts(t, 13)), (15, b"v15", ts(t, 15))]


def test_list_offsets_over_gaps(gappy):
    b, t, _survivors, _ = gappy
    with RawClient(b.bootstrap) as c:
        assert c.list_offsets(TOPIC, 0, EARLIEST).offset == 0  # the log start, though compacted away
        assert c.list_offsets(TOPIC, 0, LATEST).offset == HW
        for asked, offset in [(0, 2), (ts(t, 0), 2), (ts(t, 3), 4), (ts(t, 5), 7), (ts(t, 9), 13), (ts(t, 14), 15), (ts(t, 16), 30), (ts(t, 34), 34)]:
            p = c.list_offsets(TOPIC, 0, asked)
            assert (p.offset, p.timestamp) == (offset, ts(t, offset)), f"timestamp {asked}"
        p = c.list_offsets(TOPIC, 0, ts(t, 35))
        assert (p.offset, p.timestamp) == (-1, -1)
        # the emptied batch's header claims a larger time than any record left: not an answer
        p = c.list_offsets(TOPIC, 0, MAX_TIMESTAMP)
        assert (p.offset, p.timestamp) == (34, ts(t, 34))
        assert c.list_offsets(TOPIC, 1, LATEST).offset == 10
        p = c.list_offsets(TOPIC, 1, MAX_TIMESTAMP)
        assert (p.offset, p.timestamp) == (3, ts(t, 3))


def test_consumer_waiting_in_a_trailing_gap_gets_new_records(gappy):
    """Partition 1 ends in a gap (offsets 4-9): a consumer there waits, then gets what is
    produced next at offset 10, the high watermark."""
    b, t, _survivors, tail = gappy
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gaps-tail", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 50, "enable.partition.eof": False})
    try:
        c.assign([TopicPartition(TOPIC, 1, 0)])
        got = []
        wait_until(lambda: got.extend(m for m in [c.poll(0.1)] if m is not None and not m.error()) or len(got) >= 2, 15, "the two records of partition 1")
        assert [(m.offset(), m.value()) for m in got] == [(0, b"first"), (3, b"last")]
        c.assign([TopicPartition(TOPIC, 1, 6)])  # in the trailing gap
        assert c.poll(0.5) is None
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        p.produce(TOPIC, key=b"c", value=b"next", partition=1)
        assert p.flush(15) == 0
        m = None
        deadline = time.monotonic() + 15
        while m is None and time.monotonic() < deadline:
            m = c.poll(0.2)
        assert m is not None and not m.error() and (m.offset(), m.value()) == (10, b"next")
    finally:
        c.close()


@pytest.fixture(params=["file", "s3"])
async def backend(request, tmp_path, monkeypatch):
    from tests.test_conditional_segments import _backend

    return await _backend(request.param, request, tmp_path, monkeypatch)


async def test_restart_recovers_a_gappy_log(tmp_path, backend):
    """Load after a restart over compacted segments: the end comes from the segments' last
    offsets, an adopted (uploaded, never committed) segment ending in a gap included;
    producer state comes back through an emptied batch and a thinned one."""
    import asyncio

    from tests.support.gaps import write_partition

    t = t0()
    segs, survivors = gappy_layout(t)
    await write_partition(tmp_path, TOPIC, 0, segs, storage=backend.url)
    # uploaded but not committed (a crash before the commit): batch 35-37 of the producer
    # (sequences 3-5) holding 35 and 37, then a gap to the segment's last offset 39
    adopted = [Rec(35, ts(t, 35), b"k35", b"v35"), Rec(37, ts(t, 37), b"k37", b"v37")]
    tail = gap_batch(35, 37, adopted, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=3)
    await write_partition(tmp_path, TOPIC, 0, [Seg(35, 39, [tail])], commit=False, storage=backend.url)
    b = BrokerProcess(data_dir=str(tmp_path), extra_args=["--merge-interval-ms", "0", "--storage", backend.url], env=backend.env)
    await asyncio.to_thread(_restart_checks, b, t, survivors, adopted)


def _restart_checks(b: BrokerProcess, t: int, survivors: list[Rec], adopted: list[Rec]) -> None:
    b.start()
    try:
        for attempt in range(2):  # the first load, then a restart over what it committed
            with RawClient(b.bootstrap) as c:
                assert c.list_offsets(TOPIC, 0, LATEST).offset == 40 + attempt
                assert c.list_offsets(TOPIC, 0, EARLIEST).offset == 0
                if attempt == 0:
                    # the producer's retries are answered from the rebuilt state: the
                    # emptied batch (sequences 0-2) and the thinned one (3-5) are known
                    def idem(base_seq: int, n: int) -> bytes:
                        return build_batch([(b"p", b"p%d" % (base_seq + i)) for i in range(n)], timestamp=ts(t, 40), producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=base_seq)

                    for seq, n, offset in [(0, 3, 10), (3, 3, 35)]:
                        r = c.produce(TOPIC, 0, idem(seq, n))
                        assert (error_code(r.error_code), r.base_offset) == (0, offset), f"retry of sequences {seq}..{seq + n - 1}"
                    r = c.produce(TOPIC, 0, idem(6, 1))  # the next sequence: appended at the end
                    assert (error_code(r.error_code), r.base_offset) == (0, 40)
                    r = c.produce(TOPIC, 0, idem(8, 1))  # a gap in sequences is still refused
                    assert error_code(r.error_code) == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
            c2 = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gaps-restart", "enable.auto.commit": False,
                           "fetch.wait.max.ms": 50, "enable.partition.eof": False})
            try:
                got = _confluent_read(c2, 0, 0, 40)
            finally:
                c2.close()
            want = _as_tuples(survivors + adopted) + [(40, b"p", b"p6", ts(t, 40))]
            assert got == want
            b.restart()
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------
# In process: large segments read by byte ranges over gaps, and producer state replay


def _manager(data_dir, storage: str | None = None):
    from kafscale.broker.config import BrokerConfig
    from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import MetadataStore
    from kafscale.storage.logs import LogManager
    from kafscale.storage.backends import open_store

    storage = storage or f"file://{data_dir}/objects"
    cfg = BrokerConfig(data_dir=str(data_dir), http="", merge_interval_ms=0, storage=storage)
    meta = MetadataStore(SqliteKV(data_dir / "metadata.sqlite"))
    return LogManager(meta, open_store(storage), cfg, SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092)))


async def test_ranged_reads_over_gaps(tmp_path, monkeypatch, backend):
    """A segment read by byte ranges whose sparse index is far apart: the range read first
    may end before the batch holding (or following) the offset; the reader reads on to it,
    and from a trailing gap on to the next segment."""
    from kafscale.storage import reader as reader_mod
    from tests.support.gaps import write_partition

    t = t0()
    big = b"x" * (1536 * 1024)  # a range is 2 MiB for a small budget: one of these fits, not two
    segs = [
        Seg(0, 99, [gap_batch(0, 0, [Rec(0, ts(t, 0), b"a", big)]), gap_batch(1, 5, [Rec(3, ts(t, 3), b"b", big)]), gap_batch(50, 50, [Rec(50, ts(t, 50), b"c", b"small")])]),
        Seg(100, 100, [gap_batch(100, 100, [Rec(100, ts(t, 100), b"d", b"next")])]),
    ]
    await write_partition(tmp_path, "ranged", 0, segs, index_interval=1000, storage=backend.url)  # one index entry a segment
    monkeypatch.setattr(reader_mod, "WHOLE_SEGMENT_READ_BYTES", 1000)  # every segment is "large"
    mgr = _manager(tmp_path, backend.url)
    try:
        lg = await mgr.get_log("ranged", 0)
        mgr.cache.drop_prefix(("ranged",))

        async def read(offset: int, max_bytes: int = 100) -> list[tuple[int, int]]:
            chunks = await lg.read(offset, max_bytes, True)
            return [(h.base_offset, h.last_offset) for c in chunks for _p, h in iter_batches(c)]

        assert await read(0) == [(0, 0)]
        assert await read(1) == [(1, 5)]
        assert await read(6) == [(50, 50)]  # past the first range: read on
        assert await read(10) == [(50, 50)]
        assert await read(51) == [(100, 100)]  # the trailing gap of a ranged segment
        assert await read(99, 1 << 20) == [(100, 100)]
        assert await read(4, 4 << 20) == [(1, 5), (50, 50), (100, 100)]
        assert not mgr.cache.contains(("ranged", 0, 0))
    finally:
        await mgr.stop()
        await mgr.metadata.close()
        await mgr.store.close()


def test_replay_of_an_emptied_transactional_batch_opens_no_transaction():
    """Compaction only empties batches below the last stable offset, so an emptied
    transactional batch belongs to a decided transaction (its marker may be gone): replaying
    it keeps the producer's sequence, and opens nothing (the LSO would never move again)."""
    from kafscale.protocol import records
    from kafscale.storage.producers import ProducerStateTable
    from kafscale.storage.recovery import replay

    emptied = gap_batch(10, 12, [], base_timestamp=1, producer_id=9, producer_epoch=2, base_sequence=0, attributes=records.TRANSACTIONAL_MASK)
    kept = gap_batch(13, 14, [Rec(14, 1, b"k", b"v")], producer_id=8, producer_epoch=0, base_sequence=0, attributes=records.TRANSACTIONAL_MASK)
    data = emptied + kept
    producers = ProducerStateTable()
    assert replay(producers, data, [0, len(emptied)], 1000) == ()
    assert producers.producers[9].last_seq == 2 and producers.producers[9].epoch == 2
    assert producers.open_txns == {8: 13}  # a batch with records still opens its transaction


async def test_byte_budget_never_skips_a_batch_that_does_not_fit(tmp_path):
    """The budget left after a segment does not fit the next segment's first batch: the read
    ends there, even though a later (smaller) batch would fit."""
    from tests.support.gaps import write_partition

    t = t0()
    small = [gap_batch(0, 1, [Rec(1, ts(t, 1), b"a", b"s")]), gap_batch(20, 20, [Rec(20, ts(t, 20), b"c", b"s")])]
    large = gap_batch(12, 12, [Rec(12, ts(t, 12), b"b", b"L" * 500)])
    last = gap_batch(40, 40, [Rec(40, ts(t, 40), b"d", b"s")])
    await write_partition(tmp_path, "budget", 0, [Seg(0, 9, [small[0]]), Seg(10, 19, [large]), Seg(20, 29, [small[1]]), Seg(30, 39, []), Seg(40, 40, [last])])
    mgr = _manager(tmp_path)
    try:
        lg = await mgr.get_log("budget", 0)
        for budget in (len(small[0]) + len(small[1]) + 1, len(small[0]) + len(large) - 1):
            chunks = await lg.read(0, budget, True)
            assert [h.base_offset for c in chunks for _p, h in iter_batches(c)] == [0], budget
        chunks = await lg.read(0, len(small[0]) + len(large), True)
        assert [h.base_offset for c in chunks for _p, h in iter_batches(c)] == [0, 12]
        # a segment without batches is passed over without a GET
        mgr.cache.drop_prefix(("budget",))
        gets = mgr.metrics.gets
        chunks = await lg.read(30, 1 << 20, True)
        assert [h.base_offset for c in chunks for _p, h in iter_batches(c)] == [40] and mgr.metrics.gets == gets + 1
    finally:
        await mgr.stop()
        await mgr.metadata.close()
        await mgr.store.close()


def test_read_committed_over_compacted_transactions(gappy):
    """The owner's last stable offset is the high watermark after loading the log (no
    transaction left open by an emptied batch whose marker is gone), and a read_committed
    consumer gets the committed survivors, nothing of the aborted transaction."""
    b, *_ = gappy
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gaps-txn", "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                      "enable.partition.eof": False, "isolation.level": isolation})
        try:
            c.assign([TopicPartition(TXN_TOPIC, 0, 0)])
            got = []
            deadline = time.monotonic() + 15
            while (not got or got[-1][0] < 12) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None and not m.error():
                    got.append((m.offset(), m.value()))
            assert got == [(0, b"yes"), (2, b"yes"), (12, b"plain")], isolation
        finally:
            c.close()


async def test_aiokafka_reads_survivors_from_every_offset(gappy):
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    b, _t, survivors, _ = gappy
    for fetch_bytes in (1 << 20, 64):
        consumer = AIOKafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=50, max_partition_fetch_bytes=fetch_bytes)
        await consumer.start()
        try:
            tp = ATP(TOPIC, 0)
            consumer.assign([tp])
            for start in START_OFFSETS:
                consumer.seek(tp, start)
                got: list[tuple] = []
                deadline = time.monotonic() + 15
                while (not got or got[-1][0] < 34) and time.monotonic() < deadline:
                    for msgs in (await consumer.getmany(timeout_ms=200)).values():
                        got += [(m.offset, m.key, m.value, m.timestamp) for m in msgs]
                assert got == [r for r in _as_tuples(survivors) if r[0] >= start], f"from offset {start}, {fetch_bytes} bytes a fetch"
        finally:
            await consumer.stop()


def test_delete_records_to_an_offset_in_a_gap(gappy):
    """DeleteRecords may put the log start offset where compaction left no record: ListOffsets
    EARLIEST says it, a fetch below it is OFFSET_OUT_OF_RANGE, a fetch at it returns the next
    surviving batch, and segments wholly below it go."""
    from confluent_kafka.admin import AdminClient

    b, _t, survivors, _ = gappy
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for start, first_batch in [(11, (10, 12, 0)), (25, (30, 34, 5))]:  # in the emptied batch; in a segment without batches
        [f] = admin.delete_records([TopicPartition(DEL_TOPIC, 0, start)]).values()
        assert f.result(15).low_watermark == start
        with RawClient(b.bootstrap) as c:
            assert c.list_offsets(DEL_TOPIC, 0, EARLIEST).offset == start
            assert c.list_offsets(DEL_TOPIC, 0, LATEST).offset == HW
            assert error_code(c.fetch(DEL_TOPIC, 0, start - 1).error_code) == 1  # OFFSET_OUT_OF_RANGE
            p = c.fetch(DEL_TOPIC, 0, start, max_bytes=1)
            assert error_code(p.error_code) == 0 and p.log_start_offset == start
            assert [(h.base_offset, h.last_offset, h.record_count) for _pos, h in iter_batches(p.records)] == [first_batch]
        c2 = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gaps-deleted", "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                       "enable.partition.eof": False, "auto.offset.reset": "earliest"})
        try:
            c2.assign([TopicPartition(DEL_TOPIC, 0, -2)])  # OFFSET_BEGINNING: the new log start
            got = []
            deadline = time.monotonic() + 15
            while (not got or got[-1][0] < 34) and time.monotonic() < deadline:
                m = c2.poll(0.2)
                if m is not None and not m.error():
                    got.append((m.offset(), m.key(), m.value(), m.timestamp()[1]))
            assert got == [r for r in _as_tuples(survivors) if r[0] >= start]
        finally:
            c2.close()
    objects = sorted(p.name for p in (Path(b.data_dir) / "objects" / "default" / DEL_TOPIC / "0").glob("*.kfs"))
    assert objects == [f"segment-{20:020d}.kfs", f"segment-{30:020d}.kfs"]  # 0-9 and 10-19 lie wholly below 25


def test_ownership_takeover_over_a_gappy_log(etcd_server, moto_server, tmp_path):
    """Two brokers on etcd and S3; the owner of a compacted partition is killed (-9): the
    broker that takes it over loads the log's end from the segments' last offsets and the
    producer state through the emptied batch, and serves every survivor."""
    import asyncio
    import signal
    import uuid

    from kafscale.storage.backends import open_store
    from tests.support.gaps import write_partition

    tag = uuid.uuid4().hex[:10]
    prefix, bucket = f"/gaps-{tag}", f"gaps-{tag}"
    storage = f"s3://{bucket}/gaps"
    t = t0()
    segs, survivors = gappy_layout(t)

    async def setup():
        store = open_store(f"s3://{bucket}")
        await store.create_bucket()
        await store.close()
        await write_partition(tmp_path, TOPIC, 0, segs, storage=storage, metadata=etcd_server.url, metadata_prefix=prefix)

    asyncio.run(setup())
    brokers = [
        BrokerProcess(extra_args=["--broker-id", str(i), "--metadata", etcd_server.url, "--metadata-prefix", prefix, "--storage", storage,
                                  "--lease-ttl-s", "2", "--merge-interval-ms", "0"], env=moto_server.env).start()
        for i in range(2)
    ]
    try:
        def leader() -> int:
            with RawClient(brokers[0].bootstrap if brokers[0].proc else brokers[1].bootstrap) as c:
                return c.metadata([TOPIC], allow_auto=False).topics[0].partitions[0].leader_id

        def idem(base_seq: int, n: int) -> bytes:
            return build_batch([(b"p", b"p%d" % (base_seq + i)) for i in range(n)], timestamp=ts(t, 40), producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=base_seq)

        wait_until(lambda: leader() in (0, 1), 20, "an owner of the partition")
        first = leader()
        with RawClient(brokers[first].bootstrap) as c:
            r = c.produce(TOPIC, 0, idem(3, 1))  # after the emptied batch's sequences 0-2
            assert (error_code(r.error_code), r.base_offset) == (0, HW)
        brokers[first].stop(signal.SIGKILL)
        other = 1 - first
        wait_until(lambda: leader() == other, 30, "the other broker to take the partition over")

        def latest() -> int:
            with RawClient(brokers[other].bootstrap) as c:
                return c.list_offsets(TOPIC, 0, LATEST).offset

        wait_until(lambda: latest() >= 0, 30, "the new owner to answer ListOffsets")
        with RawClient(brokers[other].bootstrap) as c:
            assert c.list_offsets(TOPIC, 0, LATEST).offset == HW + 1
            for seq, offset in [(0, 10), (3, HW)]:  # retries: answered from the rebuilt state
                r = c.produce(TOPIC, 0, idem(seq, 3 if seq == 0 else 1))
                assert (error_code(r.error_code), r.base_offset) == (0, offset)
            r = c.produce(TOPIC, 0, idem(4, 1))
            assert (error_code(r.error_code), r.base_offset) == (0, HW + 1)
        c2 = Consumer({"bootstrap.servers": brokers[other].bootstrap, "group.id": "gaps-takeover", "enable.auto.commit": False,
                       "fetch.wait.max.ms": 50, "enable.partition.eof": False})
        try:
            got = _confluent_read(c2, 0, 0, HW + 1)
        finally:
            c2.close()
        assert got == _as_tuples(survivors) + [(HW, b"p", b"p3", ts(t, 40)), (HW + 1, b"p", b"p4", ts(t, 40))]
    finally:
        for b in brokers:
            b.stop(signal.SIGKILL)


async def test_a_view_cached_before_a_compaction_elsewhere_is_not_served(tmp_path):
    """A broker caches a partition's segments; another broker (the owner) compacts them into
    one segment under the first key. With the new segment list, the cached view of the old
    first segment (same key, fewer offsets) must not stand for the new one: the reader
    loads the new object and serves its survivors, the one from the second segment too."""
    from kafscale.protocol import records as R
    from kafscale.storage import segment as S
    from tests.support.gaps import write_partition

    t = t0()
    recs = [Rec(o, ts(t, o), b"k%d" % (o % 10), b"v%d" % o) for o in range(20)]
    await write_partition(tmp_path, "stale", 0, [Seg(0, 9, [gap_batch(0, 9, recs[:10])]), Seg(10, 19, [gap_batch(10, 19, recs[10:])])])
    mgr = _manager(tmp_path)
    try:
        st = await mgr.metadata.get_partition("stale", 0)

        async def offsets(state) -> list[int]:
            chunks = await mgr.reader.read("stale", 0, state.segments, 0, state.high_watermark, 1 << 20, True)
            return [r.offset for c in chunks for pos, h in iter_batches(c) for r in R.decode_records(c, pos, h)]

        assert await offsets(st) == list(range(20))  # both segments cached now
        assert mgr.cache.contains(("stale", 0, 0)) and mgr.cache.contains(("stale", 0, 10))
        # the owner elsewhere: keys 0-9 updated in 10-19, so only 10-19 survive, and it
        # wrote them with a trailing gap: 10-12 and 15 kept of the second batch
        kept = [recs[10], recs[11], recs[12], recs[15]]
        enc = S.encode([gap_batch(10, 15, kept)], 0, last_offset=19, created_ms=st.segments[0].created_ms)
        await mgr.store.put(S.segment_key("default", "stale", 0, 0), enc.parts)
        st2 = await mgr.metadata.update_partition(st, remove_segments=[0, 10], add_segments=[enc.info])
        st2 = await mgr.metadata.get_partition("stale", 0)
        assert [(s.base_offset, s.last_offset) for s in st2.segments] == [(0, 19)]
        assert await offsets(st2) == [10, 11, 12, 15]
    finally:
        await mgr.stop()
        await mgr.metadata.close()
        await mgr.store.close()
