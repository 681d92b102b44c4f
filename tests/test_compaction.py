"""Log compaction on a real broker (storage/compactor.py), with confluent-kafka: compacted
topics read back as the latest value per key at their original offsets, tombstones go after
delete.retention.ms, the stored bytes shrink, a reader during compaction sees every
surviving record once, and cleanup.policy switches between delete and compact live."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.support.broker import BrokerProcess
from tests.support.compaction import Model, broker_args, create_topic, metrics, partition_bytes, produce, read_all
from tests.support.wait import wait_until

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


@pytest.fixture(scope="module")
def compacting():
    args, port = broker_args()
    # write-ahead objects (the data of a flush before the merger or the compactor rewrites
    # it into segments) go 8 s after their last reference, for the shrink to be seen
    b = BrokerProcess(extra_args=[*args, "--retention-check-interval-ms", "200", "--write-ahead-orphan-age-ms", "8000"]).start()
    yield b, port
    b.stop()


def updates(keys: int, rounds: int, size: int = 100, tag: bytes = b"v") -> list[tuple[bytes, bytes]]:
    return [(b"key-%03d" % k, tag + b"-%d-%d-" % (k, r) + b"x" * size) for r in range(rounds) for k in range(keys)]


SENTINEL = [(b"sentinel", b"seals the updates into cleanable segments")]  # the newest segment is never cleaned


def test_latest_value_per_key_at_original_offsets_and_the_bytes_shrink(compacting, topic_name):
    b, port = compacting
    create_topic(b.bootstrap, topic_name, **COMPACT)
    model = Model()
    produce(b.bootstrap, topic_name, updates(50, 10), model, flush_every=25)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    before = partition_bytes(b.data_dir, topic_name)
    expected = model.latest()
    assert len(expected) == 51 and len(model.records) == 501
    wait_until(lambda: read_all(b.bootstrap, topic_name) == expected, 60, "a fresh read to see only the latest value per key", interval=0.3)
    # the compacted-away objects go after the grace period (write-ahead objects once old
    # enough, at a write-ahead round of the merger): a tenth of the data is left
    wait_until(lambda: partition_bytes(b.data_dir, topic_name) < before * 0.3, 60, "the partition's objects to shrink", interval=0.2)
    after = partition_bytes(b.data_dir, topic_name)
    assert after < before * 0.3, (before, after)
    m = metrics(port)
    assert m["kafscale_compaction_runs_total"] >= 1 and m["kafscale_compaction_records_removed_total"] >= 450
    assert m["kafscale_compaction_key_map_peak_entries"] >= 50
    assert m["kafscale_compaction_bytes_written_total"] > 0 and m["kafscale_compaction_bytes_read_total"] > m["kafscale_compaction_bytes_written_total"]


def test_tombstones_stay_until_delete_retention_ms_then_go(compacting, topic_name):
    b, _port = compacting
    items = updates(20, 3) + [(b"key-%03d" % k, None) for k in range(0, 20, 2)]  # half the keys deleted
    short, long_ = topic_name + "-short", topic_name + "-long"
    create_topic(b.bootstrap, short, **COMPACT, **{"delete.retention.ms": "500"})
    create_topic(b.bootstrap, long_, **COMPACT, **{"delete.retention.ms": "3600000"})
    models = {}
    for t in (short, long_):
        models[t] = m = Model()
        produce(b.bootstrap, t, items, m, flush_every=10)
        produce(b.bootstrap, t, SENTINEL, m)
    # kept for delete.retention.ms: the tombstones stand for their keys, older values gone
    with_tombstones = models[long_].latest()
    assert sum(1 for r in with_tombstones if r[2] is None) == 10
    wait_until(lambda: read_all(b.bootstrap, long_) == with_tombstones, 60, "the tombstones to replace their keys' values", interval=0.3)
    # past it: the deleted keys are gone altogether
    gone = models[short].compacted()
    assert len(gone) == 11
    wait_until(lambda: read_all(b.bootstrap, short) == gone, 60, "the tombstones to go after delete.retention.ms", interval=0.3)
    assert read_all(b.bootstrap, long_) == with_tombstones


def test_a_consumer_reading_while_segments_are_rewritten_gets_every_surviving_record_once(compacting, topic_name):
    b, port = compacting
    create_topic(b.bootstrap, topic_name, **COMPACT)
    model = Model()
    produce(b.bootstrap, topic_name, updates(40, 25, size=50), model, flush_every=20)
    runs_before = metrics(port)["kafscale_compaction_runs_total"]
    produce(b.bootstrap, topic_name, SENTINEL, model)
    reads: list = []
    errors: list = []

    def reader():
        try:
            while len(reads) < 3:  # a few slow reads from the start, while compaction runs
                reads.append(read_all(b.bootstrap, topic_name, fetch_max_bytes=1000))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    t.join(120)
    assert not errors, errors
    for got in reads:
        model.check_read(got)
    wait_until(lambda: read_all(b.bootstrap, topic_name) == model.latest(), 60, "compaction to finish", interval=0.3)
    assert metrics(port)["kafscale_compaction_runs_total"] > runs_before


def _alter(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin.incremental_alter_configs([res])[res].result(15)


def _rounds_pass(port: int, n: int = 3) -> None:
    """Until the compactor has looked at every partition n more times."""
    start = metrics(port)["kafscale_compaction_rounds_total"]
    wait_until(lambda: metrics(port)["kafscale_compaction_rounds_total"] >= start + n, 30, f"{n} compaction rounds", interval=0.05)


def test_switching_between_delete_and_compact_takes_effect_on_the_live_log(compacting, topic_name):
    b, port = compacting
    create_topic(b.bootstrap, topic_name, **{"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.01"})
    model = Model()
    produce(b.bootstrap, topic_name, updates(10, 5), model, flush_every=10)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    everything = sorted((off, k, v) for off, (k, v) in model.records.items())
    _rounds_pass(port)
    assert read_all(b.bootstrap, topic_name) == everything  # delete: never compacted
    _alter(b.bootstrap, topic_name, **{"cleanup.policy": "compact"})
    wait_until(lambda: read_all(b.bootstrap, topic_name) == model.latest(), 60, "compaction after the switch to compact", interval=0.3)
    compacted = model.latest()
    _alter(b.bootstrap, topic_name, **{"cleanup.policy": "delete"})
    produce(b.bootstrap, topic_name, updates(10, 3, tag=b"w"), model, flush_every=10)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    _rounds_pass(port)
    new = sorted((off, k, v) for off, (k, v) in model.records.items() if off > compacted[-1][0])
    assert read_all(b.bootstrap, topic_name) == compacted + new  # delete again: the new updates all stay


def test_aborted_transactions_records_go_and_committed_ones_are_compacted(compacting, topic_name):
    b, _port = compacting
    create_topic(b.bootstrap, topic_name, **COMPACT)
    committed, aborted = Model(), Model()
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{topic_name}", "linger.ms": 0})
    p.init_transactions(30)

    def send(model: Model, tag: bytes, r: int) -> None:
        p.begin_transaction()
        for k in range(10):
            p.produce(topic_name, key=b"key-%d" % k, value=tag + b"-%d-%d" % (r, k), on_delivery=lambda e, m, mm=model: mm.records.__setitem__(m.offset(), (m.key(), m.value())))
        assert p.flush(15) == 0

    for r in range(4):
        send(committed, b"committed", r)
        p.commit_transaction(30)
        send(aborted, b"aborted", r)  # written, then aborted
        p.abort_transaction(30)
    produce(b.bootstrap, topic_name, SENTINEL, committed)
    assert len(aborted.records) == 40  # written (acknowledged), then aborted
    assert not set(committed.records) & set(aborted.records)
    # compacted: a read_uncommitted consumer sees no aborted record any more, and each key's
    # latest committed value at its offset
    expected = committed.latest()
    wait_until(lambda: read_all(b.bootstrap, topic_name, isolation="read_uncommitted") == expected, 60, "aborted records to be compacted away", interval=0.3)
    assert read_all(b.bootstrap, topic_name) == expected  # read_committed: the same


def test_merger_and_compactor_together(broker_factory, topic_name):
    """Many tiny flushes merged while the partition is compacted: the merger keeps cleaned
    and dirty segments apart, and the log ends as the latest value per key."""
    args, port = broker_args(merge_interval_ms=100)
    b = broker_factory(extra_args=args)
    create_topic(b.bootstrap, topic_name, **COMPACT)
    model = Model()
    for r in range(4):
        produce(b.bootstrap, topic_name, updates(20, 5, size=20, tag=b"r%d" % r), model, flush_every=3)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    wait_until(lambda: read_all(b.bootstrap, topic_name) == model.latest(), 60, "the latest value per key", interval=0.3)
    assert metrics(port)["kafscale_compaction_runs_total"] >= 1


def test_compact_delete_compacts_and_applies_retention(compacting, topic_name):
    b, _port = compacting
    create_topic(b.bootstrap, topic_name, **{"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.01", "retention.ms": "4000"})
    model = Model()
    produce(b.bootstrap, topic_name, updates(10, 5), model, flush_every=10)
    produce(b.bootstrap, topic_name, SENTINEL, model)
    wait_until(lambda: read_all(b.bootstrap, topic_name) == model.latest(), 30, "compaction under compact,delete", interval=0.2)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "retention-check"})
    try:
        def expired() -> bool:
            low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=5, cached=False)
            return low == high == len(model.records)

        wait_until(expired, 30, "retention.ms to delete every segment", interval=0.2)
    finally:
        c.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_recompressed_for_clients(compacting, topic_name, codec):
    """Batches the producer compressed are rewritten compressed with their codec, and a
    client decompresses them (librdkafka's reader, not only cramjam's)."""
    b, port = compacting
    create_topic(b.bootstrap, topic_name, **COMPACT)
    model = Model()
    before = metrics(port)["kafscale_compaction_recompressions_total"]
    produce(b.bootstrap, topic_name, updates(20, 4, size=60), model, flush_every=40, **{"compression.type": codec, "linger.ms": 50})
    produce(b.bootstrap, topic_name, SENTINEL, model)
    wait_until(lambda: read_all(b.bootstrap, topic_name) == model.latest(), 60, f"the {codec} log compacted", interval=0.3)
    assert metrics(port)["kafscale_compaction_recompressions_total"] > before
