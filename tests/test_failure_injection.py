"""Store failures under every data and group API are answered with the error a client
retries on, on the same connection, never by closing it (issue #20, defect 8).

Each failure is real: a private etcd stopped, a private moto S3 cut off behind a TCP proxy,
and a concurrent change of a partition's state written through the metadata store while the
broker recovers that partition (the proxy holds the broker's S3 request meanwhile, so the
change lands exactly between the broker's read of the state and its commit).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import socket
import threading
import time
import urllib.request
import uuid

import pytest
from kio.schema.errors import ErrorCode

from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.backends import open_store
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, decode_response, error_code, req
from tests.support.servers import ETCD_BIN, start_etcd, start_moto
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(240)

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_COMMIT, API_VERSIONS = 0, 1, 2, 8, 18
CREATE_TOPICS, DESCRIBE_CONFIGS, TOPIC_RESOURCE = 19, 32, 2
NONE = ErrorCode.none.value
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower.value
KAFKA_STORAGE_ERROR = ErrorCode.kafka_storage_error.value
LEADER_NOT_AVAILABLE = ErrorCode.leader_not_available.value
COORDINATOR_NOT_AVAILABLE = ErrorCode.coordinator_not_available.value
REQUEST_TIMED_OUT = ErrorCode.request_timed_out.value
LATEST = -1
# Each request below may wait out a store's whole retry budget (etcd 5 s, S3 5 s) twice.
SLOW_ANSWER_S = 40


def batch(value: bytes) -> bytes:
    return records.build_batch([(None, value)], timestamp=int(time.time() * 1000))


def fetch_v16(c: RawClient, topic_id: uuid.UUID, partition: int, offset: int):
    """Fetch v16 names the topic by id, as current clients do."""
    fp = req(FETCH, 16, "FetchPartition", partition=partition, current_leader_epoch=-1, fetch_offset=offset,
             last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    ft = req(FETCH, 16, "FetchTopic", topic_id=topic_id, partitions=(fp,))
    body = req(FETCH, 16, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=1 << 20,
               isolation_level=0, session_id=0, session_epoch=-1, topics=(ft,), forgotten_topics_data=(), rack_id="")
    return c.request(FETCH, 16, body).responses[0].partitions[0]


def offset_commit(c: RawClient, group: str, topic: str, partition: int, offset: int):
    p = req(OFFSET_COMMIT, 8, "OffsetCommitRequestPartition", partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata="")
    t = req(OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name=topic, partitions=(p,))
    body = req(OFFSET_COMMIT, 8, group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None, topics=(t,))
    return c.request(OFFSET_COMMIT, 8, body).topics[0].partitions[0]


def still_answers(c: RawClient) -> None:
    """The connection is open and served: ApiVersions on it is answered."""
    resp = c.request(API_VERSIONS, 3, req(API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
    assert error_code(resp.error_code) == NONE


def etcd_keys(etcd, prefix: str) -> list[str]:
    """Keys under `prefix`, read through etcd's JSON gateway (no broker code involved)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(), "range_end": base64.b64encode(end.encode()).decode()})
    request = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range", data=body.encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as resp:
        return [base64.b64decode(kv["key"]).decode() for kv in json.load(resp).get("kvs", [])]


def create_topic(b: BrokerProcess, topic: str) -> uuid.UUID:
    """Auto-created with --default-partitions; waits until every partition has a leader."""
    def ready():
        with RawClient(b.bootstrap, timeout=10) as c:
            t = c.metadata([topic]).topics[0]
            ok = error_code(t.error_code) == NONE and t.partitions and all(p.leader_id >= 0 for p in t.partitions)
            return t.topic_id if ok else None

    return wait_until(ready, 30, f"topic {topic} with leaders")


# ---------------------------------------------------------------------------------------
# a TCP proxy in front of S3 that can hold or cut the broker's traffic


class S3Proxy:
    """Forwards 127.0.0.1:port to the target port. hold(): what the broker sends next is
    kept (and `held` set) until release(); cut(): every connection is closed at once."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self._cut = False
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self) -> None:
        self.held.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.release()
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self._cut:
                    break
                if from_broker and not self._open.is_set():
                    self.held.set()
                    self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def s3_broker(monkeypatch):
    """A broker with embedded metadata whose S3 (a private moto) is reached through an
    S3Proxy. Yields (broker, proxy, storage URL, moto). Merging and retention stay off, so
    every S3 request the broker makes comes from the requests a test sends."""
    moto = start_moto()
    proxy = S3Proxy(moto.port)
    bucket = f"fi-{uuid.uuid4().hex[:10]}"
    storage = f"s3://{bucket}/fi"
    b = BrokerProcess(
        extra_args=["--storage", storage, "--default-partitions", "3", "--merge-interval-ms", "0",
                    "--retention-check-interval-ms", "3600000", "--flush-interval-ms", "50"],
        env={**moto.env, "KAFSCALE_S3_ENDPOINT": proxy.endpoint, "KAFSCALE_S3_CREATE_BUCKET": "true"},
    )
    for k, v in moto.env.items():  # the test's own S3 client goes to moto directly
        monkeypatch.setenv(k, v)
    try:
        b.start()
        yield b, proxy, storage, moto
    finally:
        b.stop()
        proxy.close()
        moto.cleanup()


def put_uncommitted_segment(storage: str, topic: str, partition: int, value: bytes) -> None:
    """A segment that reached S3 but not the metadata (a crash between upload and commit):
    the broker's recovery adopts it when it loads the partition."""
    enc = segment.encode([batch(value)], 0)

    async def put():
        store = open_store(storage)
        try:
            await store.create_bucket()  # if the broker has not written anything yet
            await store.put(segment.segment_key("default", topic, partition, 0), enc.parts)
        finally:
            await store.close()

    asyncio.run(put())


def change_partition_state(b: BrokerProcess, topic: str, partition: int) -> None:
    """Another owner's write to the partition state (a new leader epoch), through the store."""

    async def bump():
        store = MetadataStore(SqliteKV(os.path.join(b.data_dir, "metadata.sqlite")))
        try:
            st = await store.get_partition(topic, partition, with_segments=False)
            await store.update_partition(st, leader_epoch=st.leader_epoch + 1)
        finally:
            await store.close()

    asyncio.run(bump())


# ---------------------------------------------------------------------------------------
# the tests


def test_concurrent_partition_change_during_recovery_answers_not_leader(s3_broker):
    """The partition state changes between the broker's read of it and its recovery's
    commit (as in a failover): Produce, Fetch and ListOffsets are answered (Produce and
    ListOffsets with NOT_LEADER_OR_FOLLOWER), the same connection serves the retry, which
    finds the recovered record; Metadata and OffsetCommit on it are answered too."""
    b, proxy, storage, _ = s3_broker
    topic = f"conflict-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic)
    for p in range(3):
        put_uncommitted_segment(storage, topic, p, b"uncommitted-%d" % p)

    with RawClient(b.bootstrap, timeout=SLOW_ANSWER_S) as c:

        def during_recovery(send, partition: int):
            """Send a request that loads `partition` and change the partition's state while
            the broker's recovery waits for S3, then let S3 answer; the caller reads the reply."""
            proxy.hold()
            try:
                corr = send()
                assert proxy.held.wait(20), "the broker sent nothing to S3"
                change_partition_state(b, topic, partition)
            finally:
                proxy.release()
            return corr

        # Produce
        p = req(PRODUCE, 9, "PartitionProduceData", index=0, records=batch(b"new"))
        t = req(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(p,))
        body = req(PRODUCE, 9, transactional_id=None, acks=-1, timeout=10000, topic_data=(t,))
        during_recovery(lambda: c.send_request(PRODUCE, 9, body), 0)
        _, resp = decode_response(PRODUCE, 9, c.recv_frame())
        assert error_code(resp.responses[0].partition_responses[0].error_code) == NOT_LEADER_OR_FOLLOWER
        # The retry on the same connection: recovery adopts the segment, the record follows it.
        r = c.produce(topic, 0, batch(b"new"))
        assert (error_code(r.error_code), r.base_offset) == (NONE, 1)

        # Fetch: the partition's stored view answers (nothing committed yet) or NOT_LEADER.
        fp = req(FETCH, 12, "FetchPartition", partition=1, current_leader_epoch=-1, fetch_offset=0,
                 last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
        ft = req(FETCH, 12, "FetchTopic", topic=topic, partitions=(fp,))
        fbody = req(FETCH, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=1 << 20,
                    isolation_level=0, session_id=0, session_epoch=-1, topics=(ft,), forgotten_topics_data=(), rack_id="")
        during_recovery(lambda: c.send_request(FETCH, 12, fbody), 1)
        _, resp = decode_response(FETCH, 12, c.recv_frame())
        part = resp.responses[0].partitions[0]
        assert error_code(part.error_code) in (NONE, NOT_LEADER_OR_FOLLOWER)
        assert not part.records, "records served before recovery committed them"
        got = wait_until(lambda: c.fetch(topic, 1, 0).records, 20, "the recovered record")
        assert b"uncommitted-1" in bytes(got)

        # ListOffsets
        lp = req(LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=2, current_leader_epoch=-1, timestamp=LATEST)
        lt = req(LIST_OFFSETS, 7, "ListOffsetsTopic", name=topic, partitions=(lp,))
        lbody = req(LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=(lt,))
        during_recovery(lambda: c.send_request(LIST_OFFSETS, 7, lbody), 2)
        _, resp = decode_response(LIST_OFFSETS, 7, c.recv_frame())
        assert error_code(resp.topics[0].partitions[0].error_code) == NOT_LEADER_OR_FOLLOWER
        r = c.list_offsets(topic, 2, LATEST)
        assert (error_code(r.error_code), r.offset) == (NONE, 1)

        # Metadata and OffsetCommit touch no partition log: answered as usual.
        assert error_code(c.metadata([topic]).topics[0].error_code) == NONE
        assert error_code(offset_commit(c, "g-conflict", topic, 0, 1).error_code) == NONE
        still_answers(c)
    assert b.proc.poll() is None


def test_s3_down_answers_retriable_errors(s3_broker):
    """S3 unreachable: Produce, Fetch and ListOffsets answer KAFKA_STORAGE_ERROR (retriable,
    with a metadata refresh) on the same connection; Metadata and OffsetCommit, which need
    no S3, are served as usual."""
    b, proxy, _storage, _ = s3_broker
    topic = f"s3down-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic)
    with RawClient(b.bootstrap, timeout=SLOW_ANSWER_S) as c:
        assert error_code(c.produce(topic, 0, batch(b"before")).error_code) == NONE
        proxy.cut()
        assert error_code(c.produce(topic, 0, batch(b"during")).error_code) == KAFKA_STORAGE_ERROR
        assert error_code(c.fetch(topic, 1, 0).error_code) == KAFKA_STORAGE_ERROR  # loading it lists S3
        assert error_code(c.list_offsets(topic, 2, LATEST).error_code) == KAFKA_STORAGE_ERROR
        assert error_code(c.metadata([topic]).topics[0].error_code) == NONE
        assert error_code(offset_commit(c, "g-s3down", topic, 0, 1).error_code) == NONE
        still_answers(c)
    assert b.proc.poll() is None


@pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")
def test_etcd_down_answers_retriable_errors():
    """etcd stopped (the lease outlives the test, so the broker still owns its partitions
    and every request reaches the metadata store): each API answers a retriable error on
    the same connection; Metadata answers from what the broker knows."""
    with start_etcd() as etcd:
        prefix = f"/fi-{uuid.uuid4().hex[:8]}"
        b = BrokerProcess(extra_args=[
            "--metadata", etcd.url, "--metadata-prefix", prefix, "--lease-ttl-s", "600",
            # each request below waits out the etcd calls' budget (5 s by default): 2 s still
            # leaves a busy machine's etcd time to answer before the stop
            "--metadata-timeout-ms", "2000",
            "--default-partitions", "4", "--merge-interval-ms", "0", "--retention-check-interval-ms", "3600000",
        ]).start()  # fmt: skip
        try:
            topic = f"etcddown-{uuid.uuid4().hex[:8]}"
            topic_id = create_topic(b, topic)
            wait_until(lambda: len(etcd_keys(etcd, f"{prefix}/owners/{topic}/")) == 4, 30, "the broker to own all 4 partitions")
            with RawClient(b.bootstrap, timeout=SLOW_ANSWER_S) as c:
                assert error_code(c.produce(topic, 0, batch(b"before")).error_code) == NONE
                assert [t.name for t in c.metadata(None).topics if not t.is_internal] == [topic]
                etcd.stop()
                assert error_code(c.produce(topic, 1, batch(b"during")).error_code) == KAFKA_STORAGE_ERROR
                assert error_code(c.produce(topic, 0, batch(b"during")).error_code) == KAFKA_STORAGE_ERROR
                # By topic id: the id is known from before, the partition state is not.
                assert error_code(fetch_v16(c, topic_id, 2, 0).error_code) == KAFKA_STORAGE_ERROR
                assert error_code(c.list_offsets(topic, 3, LATEST).error_code) == KAFKA_STORAGE_ERROR
                assert error_code(offset_commit(c, "g-etcddown", topic, 0, 1).error_code) == COORDINATOR_NOT_AVAILABLE
                # Metadata: known topics from the broker's cache, an unknown one LEADER_NOT_AVAILABLE.
                assert [t.name for t in c.metadata(None).topics if not t.is_internal] == [topic]
                assert error_code(c.metadata([topic]).topics[0].error_code) == NONE
                unknown = c.metadata([f"other-{topic}"], allow_auto=False).topics[0]
                assert error_code(unknown.error_code) == LEADER_NOT_AVAILABLE
                # Admin APIs: REQUEST_TIMED_OUT, as Kafka answers when its controller is silent.
                ct = req(CREATE_TOPICS, 7, "CreatableTopic", name=f"new-{topic}", num_partitions=1, replication_factor=1, assignments=(), configs=())
                created = c.request(CREATE_TOPICS, 7, req(CREATE_TOPICS, 7, topics=(ct,), timeout=5000, validate_only=False))
                assert error_code(created.topics[0].error_code) == REQUEST_TIMED_OUT
                dc = req(DESCRIBE_CONFIGS, 4, "DescribeConfigsResource", resource_type=TOPIC_RESOURCE, resource_name=topic, configuration_keys=None)
                described = c.request(DESCRIBE_CONFIGS, 4, req(DESCRIBE_CONFIGS, 4, resources=(dc,), include_synonyms=False, include_documentation=False))
                assert error_code(described.results[0].error_code) == REQUEST_TIMED_OUT
                still_answers(c)
            assert b.proc.poll() is None
        finally:
            b.stop()
