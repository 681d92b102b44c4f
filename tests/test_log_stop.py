"""Every way a partition log stops answers every waiter (issue #20, defect 3), and the
merger keeps the number of merged-away objects bounded (issue #20, defect 8).

A produce waiting for its upload when its topic is deleted, its ownership moves, or the
broker stops gets an answer: acknowledged if the batch became durable, else a retriable
error (UNKNOWN_TOPIC_OR_PARTITION for a deleted topic, NOT_LEADER_OR_FOLLOWER otherwise).
Responses go out in request order, so an unanswered produce would stall its connection.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
import urllib.request
from pathlib import Path

import pytest
import pytest_asyncio
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from kafscale.broker.app import Broker
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.metadata.store import TopicMeta
from kafscale.protocol import records
from kafscale.storage import merger
from kafscale.storage.failures import StorageError
from kafscale.storage.objectstore import ObjectStoreError
from tests.support.broker import free_port, in_process_broker
from tests.support.raw import RawClient, decode_response, error_code, req
from tests.support.wait import wait_until, wait_until_async

NONE = ErrorCode.none.value
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition.value
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value

# Uploads happen only when due: a produce after the first flush waits this long for its ack.
# A flush per partition: each partition's first upload is due at once (with write-ahead
# objects the broker's next flush cycle, for every partition, would be 10 minutes away;
# the in-process tests below stop logs with write-ahead objects, the default).
SLOW_FLUSH_ARGS = ["--flush-interval-ms", "600000", "--min-flush-interval-ms", "600000", "--merge-interval-ms", "0", "--write-ahead-objects", "false"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metric(http: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _produced_records(http: str) -> float:
    return _metric(http, "kafscale_produce_records_total")


@pytest.fixture
def slow_flush_broker(broker_factory):
    http = f"127.0.0.1:{free_port()}"
    b = broker_factory(extra_args=[*SLOW_FLUSH_ARGS, "--http", http])
    b.http = http
    return b


# -- the regression: DeleteTopics while a produce waits ----------------------------------


def test_delete_topic_answers_waiting_produce_and_its_connection_keeps_working(slow_flush_broker, topic_name):
    b = slow_flush_broker
    with RawClient(b.bootstrap) as producer, RawClient(b.bootstrap) as admin:
        producer.metadata([topic_name])  # auto-creates the topic
        first = producer.produce(topic_name, 0, records.build_batch([(None, b"durable")], timestamp=_now_ms()))
        assert error_code(first.error_code) == NONE and first.base_offset == 0  # the first upload is due at once

        # The second waits for an upload ten minutes away.
        p = req(0, 9, "PartitionProduceData", index=0, records=records.build_batch([(None, b"waiting")], timestamp=_now_ms()))
        t = req(0, 9, "TopicProduceData", name=topic_name, partition_data=(p,))
        body = req(0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(t,))
        waiting = producer.send_request(0, 9, body)
        wait_until(lambda: _produced_records(b.http) >= 2, 10, "the second produce to be buffered")

        dt = req(20, 6, "DeleteTopicState", name=topic_name, topic_id=None)
        deleted = admin.request(20, 6, req(20, 6, topics=(dt,), timeout=datetime.timedelta(seconds=10)))
        assert error_code(deleted.responses[0].error_code) == NONE
        deleted_at = time.monotonic()

        corr, resp = decode_response(0, 9, producer.recv_frame())
        answered_after = time.monotonic() - deleted_at
        assert answered_after < 1.0, f"answered {answered_after:.2f}s after the delete, not at once"  # the flush is 10 min away
        assert corr == waiting
        answer = resp.responses[0].partition_responses[0]
        assert error_code(answer.error_code) == UNKNOWN_TOPIC_OR_PARTITION

        # The same connection keeps being answered.
        md = producer.metadata([topic_name], allow_auto=False)
        assert error_code(md.topics[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION
        producer.metadata([topic_name + "-next"])
        nxt = producer.produce(topic_name + "-next", 0, records.build_batch([(None, b"after")], timestamp=_now_ms()))
        assert error_code(nxt.error_code) == NONE and nxt.base_offset == 0


def test_delete_topic_fails_a_waiting_confluent_kafka_delivery_within_a_second(slow_flush_broker, topic_name):
    b = slow_flush_broker
    reports: list[tuple[float, KafkaError | None, int]] = []

    def report(err, msg):
        reports.append((time.monotonic(), err, msg.offset()))

    # retries=0 and no topic auto-creation: the delivery report carries the broker's answer
    # instead of a retry into a re-created topic.
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": False, "retries": 0, "linger.ms": 0,
                  "allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 100})
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1)])[topic_name].result(10)
    p.produce(topic_name, value=b"durable", on_delivery=report)
    assert p.flush(15) == 0
    assert reports[0][1] is None and reports[0][2] == 0

    p.produce(topic_name, value=b"waiting", on_delivery=report)
    wait_until(lambda: p.poll(0) >= 0 and _produced_records(b.http) >= 2, 10, "the produce to be buffered")
    admin.delete_topics([topic_name], operation_timeout=10)[topic_name].result(10)
    deleted_at = time.monotonic()
    while len(reports) < 2 and time.monotonic() - deleted_at < 5:
        p.poll(0.05)
    assert len(reports) == 2, "the waiting produce was never answered"
    at, err, _ = reports[1]
    # librdkafka reports the broker's UNKNOWN_TOPIC_OR_PARTITION as such or, having
    # refreshed its metadata first, as its local "unknown partition/topic".
    assert err is not None and err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC)
    assert at - deleted_at < 1.0

    # The producer's connection still works: a produce to another topic is acknowledged.
    other = topic_name + "-other"
    admin.create_topics([NewTopic(other, 1)])[other].result(10)
    p.produce(other, value=b"after", on_delivery=report)
    assert p.flush(15) == 0
    assert reports[2][1] is None and reports[2][2] == 0


# -- the stop transition, path by path, on a real in-process broker ----------------------


@pytest_asyncio.fixture(loop_scope="function")  # the test's own loop: the broker's tasks (its write-ahead flusher's) run on it
async def local_broker(tmp_path):
    async with in_process_broker(tmp_path, min_flush_interval_ms=600_000) as broker:
        yield broker


async def _log_with_first_segment(broker: Broker, topic: str):
    """A log whose first upload is done, so the next appends wait for a far-away flush."""
    await broker.metadata.create_topic(TopicMeta(topic, 1))
    lg = await broker.logs.get_log(topic, 0)
    _, _, first = _append(lg, b"first", producer_id=-1)
    await asyncio.wait_for(first, 10)
    assert lg.high_watermark == 1
    return lg


def _append(lg, value: bytes, producer_id: int = 7, sequence: int = 0):
    buf = memoryview(bytearray(records.build_batch([(None, value)], timestamp=_now_ms(), producer_id=producer_id,
                                                   producer_epoch=0 if producer_id >= 0 else -1,
                                                   base_sequence=sequence if producer_id >= 0 else -1)))
    return lg.append(buf, records.validate_record_set(buf), True)


def _waiters(lg):
    """A buffered idempotent batch, its retried duplicate, and a long-poll fetch waiter."""
    _, _, acked = _append(lg, b"buffered")
    _, _, duplicate = _append(lg, b"buffered")  # the producer retried: same pid/epoch/sequence
    fetch_waiter = asyncio.get_running_loop().create_future()
    lg.add_data_waiter(fetch_waiter)
    return acked, duplicate, fetch_waiter


async def _outcome(fut) -> int:
    await asyncio.wait_for(asyncio.gather(fut, return_exceptions=True), 5)
    exc = fut.exception()
    if exc is None:
        return NONE
    assert isinstance(exc, StorageError), exc
    return exc.error_code


@pytest.mark.parametrize(
    "how, expected",
    [
        ("drop_topic", UNKNOWN_TOPIC_OR_PARTITION),
        ("release_fenced", NOT_LEADER_OR_FOLLOWER),
        ("forget", NOT_LEADER_OR_FOLLOWER),
        ("release_graceful", NONE),
        ("shutdown", NONE),
    ],
)
async def test_every_stop_path_answers_every_waiter(local_broker, how, expected):
    logs = local_broker.logs
    topic = f"stop-{how.replace('_', '-')}"
    lg = await _log_with_first_segment(local_broker, topic)
    acked, duplicate, fetch_waiter = _waiters(lg)
    assert not acked.done() and not duplicate.done()

    if how == "drop_topic":
        await local_broker.metadata.delete_topic(topic)
        await logs.drop_topic(topic)
    elif how == "release_fenced":
        await logs.release(topic, 0, flush=False)
    elif how == "forget":
        logs.forget(topic, 0)
    elif how == "release_graceful":
        await logs.release(topic, 0, flush=True)
    else:
        await logs.stop()

    assert await _outcome(acked) == expected
    assert await _outcome(duplicate) == expected
    assert fetch_waiter.done()  # the long poll looks again at once
    assert (topic, 0) not in logs.logs
    with pytest.raises(StorageError) as refused:
        _append(lg, b"too late")
    assert refused.value.error_code in (expected, NOT_LEADER_OR_FOLLOWER) and refused.value.error_code != NONE
    if expected == NONE:  # flushed on the way out: durable under the offsets it was given
        st = await local_broker.metadata.get_partition(topic, 0)
        assert st.high_watermark == 2


async def test_a_log_being_stopped_refuses_new_work_with_its_reason(local_broker):
    """While a graceful stop flushes, no second log of the partition is opened here and
    appends are refused (the client retries at the next owner)."""
    logs = local_broker.logs
    lg = await _log_with_first_segment(local_broker, "stopping")
    _append(lg, b"buffered")
    stopping = asyncio.ensure_future(lg.stop(StorageError("moving", NOT_LEADER_OR_FOLLOWER), flush=True))
    await asyncio.sleep(0)  # the stop has begun: appends are closed
    with pytest.raises(StorageError) as refused:
        await logs.get_log("stopping", 0)
    assert refused.value.error_code == NOT_LEADER_OR_FOLLOWER
    await stopping


async def test_failed_final_flush_answers_with_the_stop_reason(local_broker, monkeypatch):
    """Shutdown flushes first; what cannot be made durable is answered NOT_LEADER_OR_FOLLOWER
    (retriable at the next owner), not the flush's own error."""
    logs = local_broker.logs
    lg = await _log_with_first_segment(local_broker, "flush-fails")
    _, _, waiter = _append(lg, b"buffered", producer_id=-1)

    async def metadata_down(*args, **kwargs):
        raise MetadataUnavailable("metadata store unavailable")

    async def commits_fail(commits):  # as commit_segments answers a failed store: the error for each
        return [MetadataUnavailable("metadata store unavailable")] * len(commits)

    monkeypatch.setattr(logs.metadata, "commit_segments", commits_fail)  # (commit_segment's too)
    monkeypatch.setattr(logs.metadata, "get_partition", metadata_down)  # the re-check after a failure
    await logs.stop()
    assert await _outcome(waiter) == NOT_LEADER_OR_FOLLOWER


# -- defect 8: merged-away objects stay bounded ------------------------------------------


def _objects_on_disk(data_dir: str, topic: str) -> int:
    return len(list((Path(data_dir) / "objects" / "default" / topic / "0").glob("segment-*.kfs")))


def test_merged_away_objects_stay_bounded_under_a_long_grace(broker_factory, topic_name):
    """Many tiny flushes with a 10-minute grace: the objects waiting for deletion are capped
    (--merge-max-pending-objects), not flush rate x grace."""
    cap = 20
    b = broker_factory(extra_args=["--merge-interval-ms", "100", "--merge-grace-ms", "600000",
                                   "--merge-max-pending-objects", str(cap), "--merge-min-grace-ms", "200"])
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    total = 600
    for i in range(total):
        p.produce(topic_name, value=b"m-%05d" % i)
        if i % 3 == 0:
            assert p.flush(10) == 0  # one tiny segment per flush: ~200 objects in all
    assert p.flush(10) == 0
    # Merges leave few live segments; of the merged-away ones at most `cap` may wait.
    wait_until(lambda: _objects_on_disk(b.data_dir, topic_name) <= cap + 5, 30, "merged-away objects to be deleted")
    from tests.test_merger import _consume

    assert _consume(b.bootstrap, topic_name, total) == [(i, b"m-%05d" % i) for i in range(total)]


def _keys(i: int) -> list[str]:
    return [f"default/t/0/segment-{i:020d}.kfs", f"default/t/0/segment-{i:020d}.index"]


def test_merger_deletes_the_oldest_early_only_over_the_cap_and_after_the_short_grace():
    m = merger.SegmentMerger(None, dict().values, None, interval_s=10, grace_s=60, max_pending=20, min_grace_s=5)
    for i in range(50):
        m.schedule_delete(_keys(i))
    assert m.pending_segments == 50
    now = time.monotonic()
    assert m._due(now + 1, force=False) == []  # younger than the short grace: kept for readers
    due = m._due(now + 6, force=False)
    assert due == [_keys(i) for i in range(30)]  # the 30 oldest, down to the cap
    assert m.pending_segments == 20
    assert m._due(now + 30, force=False) == []  # at the cap: the full grace applies
    assert m._due(now + 61, force=False) == [_keys(i) for i in range(30, 50)]
    assert m.pending_segments == 0


async def test_merger_retries_a_failed_delete(tmp_path):
    from kafscale.storage.local_store import LocalObjectStore

    class FailingOnce(LocalObjectStore):
        failures = 1

        async def delete(self, keys):
            if self.failures:
                self.failures -= 1
                raise ObjectStoreError("SlowDown")
            await super().delete(keys)

    store = FailingOnce(tmp_path)
    await store.put("default/t/0/segment-00000000000000000001.kfs", [b"x"])

    m = merger.SegmentMerger(store, dict().values, None, interval_s=10, grace_s=0.0, max_pending=20, min_grace_s=0.0)
    m.schedule_delete(_keys(1))
    await m.delete_expired()
    assert await store.list("default/t/") == ["default/t/0/segment-00000000000000000001.kfs"]
    assert m.pending_segments == 1  # kept, not forgotten
    await m.delete_expired()
    assert await store.list("default/t/") == []
    assert m.pending_segments == 0


def test_topic_deleted_through_another_broker_answers_the_owners_waiting_produce(etcd_server, broker_factory, tmp_path, topic_name):
    """In a cluster the broker handling DeleteTopics may not own the partition: the owner
    sees the topic gone on its next ownership round and answers its waiting produce."""
    prefix = f"/ks-stop-{uuid.uuid4().hex[:8]}"
    common = [*SLOW_FLUSH_ARGS, "--metadata", etcd_server.url, "--metadata-prefix", prefix,
              "--storage", f"file://{tmp_path}/objects", "--lease-ttl-s", "3"]
    http = f"127.0.0.1:{free_port()}"
    brokers = {i: broker_factory(extra_args=[*common, "--broker-id", str(i), "--http", http if i == 1 else ""]) for i in (0, 1)}
    with RawClient(brokers[0].bootstrap) as admin:
        ct = req(19, 7, "CreatableTopic", name=topic_name, num_partitions=2, replication_factor=1, assignments=(), configs=())
        created = admin.request(19, 7, req(19, 7, topics=(ct,), timeout_ms=10000, validate_only=False))
        assert error_code(created.topics[0].error_code) == NONE

        def leaders():
            md = admin.metadata([topic_name], allow_auto=False)
            return {p.partition_index: p.leader_id for p in md.topics[0].partitions}

        wait_until(lambda: set(leaders().values()) == {0, 1}, 20, "both brokers to own a partition")
        partition = next(p for p, node in leaders().items() if node == 1)
    with RawClient(brokers[1].bootstrap) as producer, RawClient(brokers[0].bootstrap) as admin:
        answers = []  # broker 1 may take a moment to act as the owner etcd names

        def first_produce_acknowledged():
            answers.append(producer.produce(topic_name, partition, records.build_batch([(None, b"durable")], timestamp=_now_ms())))
            return error_code(answers[-1].error_code) == NONE

        wait_until(first_produce_acknowledged, 15, "broker 1 to take the produce as owner")
        p = req(0, 9, "PartitionProduceData", index=partition, records=records.build_batch([(None, b"waiting")], timestamp=_now_ms()))
        t = req(0, 9, "TopicProduceData", name=topic_name, partition_data=(p,))
        waiting = producer.send_request(0, 9, req(0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(t,)))
        wait_until(lambda: _produced_records(http) >= 2, 10, "the second produce to be buffered by its owner")
        dt = req(20, 6, "DeleteTopicState", name=topic_name, topic_id=None)
        deleted = admin.request(20, 6, req(20, 6, topics=(dt,), timeout=datetime.timedelta(seconds=10)))
        assert error_code(deleted.responses[0].error_code) == NONE
        deleted_at = time.monotonic()
        corr, resp = decode_response(0, 9, producer.recv_frame())
        answered_after = time.monotonic() - deleted_at
        assert corr == waiting
        assert error_code(resp.responses[0].partition_responses[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION
        assert answered_after < 5.0, f"answered {answered_after:.2f}s after the delete"  # one ownership round, not the 10 min flush
        md = producer.metadata([topic_name], allow_auto=False)  # the connection goes on
        assert error_code(md.topics[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("commit_lands, expected", [(True, NONE), (False, UNKNOWN_TOPIC_OR_PARTITION)])
async def test_an_upload_in_flight_is_answered_by_its_outcome(local_broker, monkeypatch, commit_lands, expected):
    """Stopping does not cut an upload short: its batches are acknowledged if the commit
    lands, and get the stop reason if it fails."""
    logs = local_broker.logs
    topic = f"in-flight-{commit_lands}"
    lg = await _log_with_first_segment(local_broker, topic)
    _, _, in_flight = _append(lg, b"uploading", producer_id=-1)
    may_commit = asyncio.Event()
    original = logs.metadata.commit_segments  # (a write-ahead flush's and commit_segment's)

    async def slow_commit(commits, before=None):
        await may_commit.wait()
        if not commit_lands:  # as commit_segments answers a failed store: the error for each
            return [MetadataUnavailable("metadata store unavailable")] * len(commits)
        return await original(commits, before)

    monkeypatch.setattr(logs.metadata, "commit_segments", slow_commit)
    flushing = asyncio.ensure_future(lg.flush())
    await wait_until_async(lambda: lg.core.in_flight, 5, "the upload to take the batch", interval=0.01)
    _, _, buffered = _append(lg, b"buffered", producer_id=-1)

    stopping = asyncio.ensure_future(logs.stop_topic(topic))  # waits for the upload to end
    assert await _outcome(buffered) == UNKNOWN_TOPIC_OR_PARTITION  # at once
    assert not in_flight.done()
    may_commit.set()
    await asyncio.wait_for(stopping, 10)
    await asyncio.gather(flushing, return_exceptions=True)
    assert await _outcome(in_flight) == expected
