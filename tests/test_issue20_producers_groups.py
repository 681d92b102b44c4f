"""Issue #20, parts 1 and 5: idempotent producers that send InitProducerId with id 0 /
epoch 0 must not share a producer id (acknowledged records were dropped as duplicates),
and a group member that joins with rebalance timeout 0 must not be evicted before it syncs."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from kafscale.protocol import records
from kafscale.protocol.records import InvalidRecordError
from kafscale.storage.producers import ProducerStateTable
from tests.support.raw import RawClient, error_code, req

INIT_PRODUCER_ID = 22
NONE = ErrorCode.none.value
OUT_OF_ORDER_SEQUENCE_NUMBER = ErrorCode.out_of_order_sequence_number.value
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch.value


# -- part 1: producer ids and duplicate detection ------------------------------------------


def init_producer_id_v5(client: RawClient, producer_id: int, producer_epoch: int) -> tuple[int, int]:
    """InitProducerId v5 without a transactional id, as a pure-JavaScript client sends it."""
    body = req(INIT_PRODUCER_ID, 5, transactional_id=None, transaction_timeout=60000, producer_id=producer_id, producer_epoch=producer_epoch)
    resp = client.request(INIT_PRODUCER_ID, 5, body)
    assert error_code(resp.error_code) == NONE
    return resp.producer_id, resp.producer_epoch


def idempotent_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return records.build_batch([(None, v) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp=int(time.time() * 1000))


def read_all(client: RawClient, topic: str) -> list[tuple[int, bytes]]:
    data = client.fetch(topic, 0, 0).records or b""
    out = []
    for pos, h in records.iter_batches(data):
        out += [(r.offset, r.value) for r in records.decode_records(data, pos, h)]
    return out


def test_init_producer_id_without_transactional_id_ignores_sent_id_and_epoch(broker):
    with RawClient(broker.bootstrap) as c:
        given = [init_producer_id_v5(c, 0, 0) for _ in range(3)]
        first_pid, _ = init_producer_id_v5(c, -1, -1)
        given.append(init_producer_id_v5(c, first_pid, 0))  # would be a KIP-360 bump with a transactional id
    assert [epoch for _, epoch in given] == [0, 0, 0, 0]
    assert len({pid for pid, _ in given} | {first_pid}) == 5, f"producer ids handed out twice: {given}, {first_pid}"


def test_two_producers_initialised_with_id_0_epoch_0_keep_every_acknowledged_record(broker, topic_name):
    with RawClient(broker.bootstrap) as a, RawClient(broker.bootstrap) as b:
        a.metadata([topic_name])
        producers = [(a, *init_producer_id_v5(a, 0, 0), "a"), (b, *init_producer_id_v5(b, 0, 0), "b")]
        acknowledged: dict[int, bytes] = {}
        for seq in range(3):
            for client, pid, epoch, name in producers:  # interleaved: a0 b0 a1 b1 a2 b2
                value = f"{name}-{seq}".encode()
                r = client.produce(topic_name, 0, idempotent_batch([value], pid, epoch, seq))
                assert error_code(r.error_code) == NONE, f"{value!r} refused with {error_code(r.error_code)}"
                assert r.base_offset not in acknowledged, f"{value!r} acknowledged at the offset of {acknowledged.get(r.base_offset)!r}"
                acknowledged[r.base_offset] = value
        assert sorted(read_all(a, topic_name)) == sorted(acknowledged.items())
        assert len(acknowledged) == 6


def test_record_set_mixing_a_retried_and_a_new_batch_is_refused_not_half_dropped(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        c.metadata([topic_name])
        pid, epoch = init_producer_id_v5(c, -1, -1)
        first = idempotent_batch([b"one"], pid, epoch, 0)
        assert error_code(c.produce(topic_name, 0, first).error_code) == NONE
        mixed = c.produce(topic_name, 0, first + idempotent_batch([b"two"], pid, epoch, 1))
        assert error_code(mixed.error_code) == OUT_OF_ORDER_SEQUENCE_NUMBER
        # Two new consecutive batches of one producer in one set are both stored.
        both = c.produce(topic_name, 0, idempotent_batch([b"two"], pid, epoch, 1) + idempotent_batch([b"three", b"four"], pid, epoch, 2))
        assert (error_code(both.error_code), both.base_offset) == (NONE, 1)
        assert read_all(c, topic_name) == [(0, b"one"), (1, b"two"), (2, b"three"), (3, b"four")]


def _header(pid: int, epoch: int, seq: int, count: int = 1) -> records.BatchHeader:
    data = idempotent_batch([b"v"] * count, pid, epoch, seq)
    return records.read_header(memoryview(data), 0)


def _table_with(*batches: tuple[int, int, int, int]) -> ProducerStateTable:
    """A table holding (pid, epoch, first seq, record count) batches appended from offset 0."""
    table, offset = ProducerStateTable(), 0
    for pid, epoch, seq, count in batches:
        table.record(_header(pid, epoch, seq, count), offset, 0, 1 << 62)
        offset += count
    return table


def test_duplicate_needs_same_producer_epoch_first_and_last_sequence():
    table = _table_with((7, 0, 0, 3), (7, 0, 3, 2))
    assert table.check_record_set([_header(7, 0, 3, 2)]).base_offset == 3
    assert table.check_record_set([_header(7, 0, 0, 3)]).base_offset == 0
    with pytest.raises(InvalidRecordError) as e:
        table.check_record_set([_header(7, 0, 0, 2)])  # same first sequence, different last
    assert e.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(InvalidRecordError) as e:
        table.check_record_set([_header(7, 0, 3, 3)])
    assert e.value.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert table.check_record_set([_header(7, 1, 0, 3)]) is None  # new epoch: a new batch
    assert table.check_record_set([_header(8, 0, 0, 3)]) is None  # another producer: a new batch


def test_record_set_checks_each_batch_against_the_one_before_it():
    table = _table_with((7, 0, 0, 2))
    assert table.check_record_set([_header(7, 0, 2), _header(7, 0, 3, 2)]) is None
    assert table.check_record_set([_header(9, 0, 0, 2), _header(9, 0, 2)]) is None  # new producer, two batches
    assert table.check_record_set([_header(7, 0, 2), _header(7, 1, 0)]) is None  # epoch bump inside the set
    for bad, code in [
        ([_header(7, 0, 2), _header(7, 0, 4)], OUT_OF_ORDER_SEQUENCE_NUMBER),  # gap inside the set
        ([_header(7, 0, 2), _header(7, 0, 2)], OUT_OF_ORDER_SEQUENCE_NUMBER),  # the same new batch twice
        ([_header(7, 1, 0), _header(7, 0, 2)], INVALID_PRODUCER_EPOCH),
        ([_header(7, 0, 0, 2), _header(7, 0, 2)], OUT_OF_ORDER_SEQUENCE_NUMBER),  # retried + new
    ]:
        with pytest.raises(InvalidRecordError) as e:
            table.check_record_set(bad)
        assert e.value.error_code == code, bad


def test_retry_of_a_whole_record_set_is_a_duplicate_of_its_first_batch():
    table = _table_with((7, 0, 0, 2), (7, 0, 2, 1))
    assert table.check_record_set([_header(7, 0, 0, 2), _header(7, 0, 2)]).base_offset == 0
