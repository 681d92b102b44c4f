"""Bad input as raw bytes: malformed and truncated frames, over-limit frames, garbage
bodies, corrupt / legacy / oversized record batches, unknown topics, partitions, API keys
and versions.

After each one the broker must still serve other connections (one opened before the bad
input, and a fresh one) and every previously acknowledged record must still be readable.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import zlib
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.raw import ConnectionClosed, RawClient, encode_request, error_code, req
from tests.support.versions import api_range, each_version

CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, MESSAGE_TOO_LARGE = 2, 3, 10
INVALID_TOPIC_EXCEPTION, UNSUPPORTED_FOR_MESSAGE_FORMAT, INVALID_RECORD = 17, 43, 87
LATEST = -1


def now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------
# fixtures: acknowledged records to re-read, and a bystander connection


CANARY = [(f"ck{i}".encode(), f"canary-{i}".encode()) for i in range(6)]


@pytest.fixture(scope="module")
def canary(broker):
    topic = f"bad-input-canary-{os.getpid()}-{now_ms() % 10_000_000}"
    with RawClient(broker.bootstrap) as c:
        assert error_code(c.metadata([topic]).topics[0].error_code) == 0
        r1 = c.produce(topic, 0, build_batch(CANARY[:3], timestamp=now_ms()))
        r2 = c.produce(topic, 0, build_batch(CANARY[3:], timestamp=now_ms()))
        assert (error_code(r1.error_code), r1.base_offset, error_code(r2.error_code), r2.base_offset) == (0, 0, 0, 3)
    return topic


def read_all(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    with RawClient(bootstrap) as c:
        hw = c.list_offsets(topic, partition, LATEST).offset
        out, offset = [], 0
        while offset < hw:
            p = c.fetch(topic, partition, offset)
            assert error_code(p.error_code) == 0, p
            for pos, h in iter_batches(p.records):
                out += [(r.offset, r.key, r.value) for r in decode_records(p.records, pos, h)]
                offset = h.last_offset + 1
        return out


def assert_canary(bootstrap: str, topic: str) -> None:
    assert read_all(bootstrap, topic) == [(i, k, v) for i, (k, v) in enumerate(CANARY)]


class Healthy:
    """Opened before the bad input; `check()` after it."""

    def __init__(self, broker, canary_topic: str):
        self.broker = broker
        self.canary = canary_topic
        self.bystander = RawClient(broker.bootstrap)
        self._api_versions(self.bystander)

    @staticmethod
    def _api_versions(c: RawClient):
        r = c.request(18, 3, req(18, 3, client_software_name="bystander", client_software_version="1"))
        assert error_code(r.error_code) == 0 and len(r.api_keys) > 5

    def check(self) -> None:
        self._api_versions(self.bystander)  # the open connection was not affected
        with RawClient(self.broker.bootstrap) as fresh:  # new connections are accepted
            self._api_versions(fresh)
        assert_canary(self.broker.bootstrap, self.canary)
        self.bystander.close()


@pytest.fixture
def healthy(broker, canary):
    h = Healthy(broker, canary)
    yield h
    h.bystander.close()


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(15)


def header(api_key: int, version: int, corr: int = 1, client_id: bytes = b"bad") -> bytes:
    return struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id


# ---------------------------------------------------------------------------------------
# framing


@pytest.mark.parametrize("data", [
    pytest.param(struct.pack(">i", -5), id="negative-length"),
    pytest.param(struct.pack(">i", -1) + b"\x00" * 16, id="minus-one-length"),
    pytest.param(struct.pack(">i", 0), id="zero-length"),
    pytest.param(struct.pack(">i", 5) + b"\x00\x03\x00\x0c\x00", id="shorter-than-header"),
    pytest.param(struct.pack(">i", 12) + header(3, 12, client_id=b"")[:8] + b"\x00\x32\x00\x00", id="client-id-past-end"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http-request"),
])
def test_malformed_frame_closes_connection(broker, healthy, data):
    with RawClient(broker.bootstrap) as c:
        c.send_raw(data)
        assert c.wait_closed(5), "broker kept the connection after a malformed frame"
    healthy.check()


def test_truncated_frame_then_eof(broker, healthy):
    """A frame announcing 100 bytes, 20 sent, then the client half-closes: the broker
    drops the connection instead of waiting forever."""
    with RawClient(broker.bootstrap) as c:
        c.send_raw(struct.pack(">i", 100) + header(18, 3) + b"\x00" * 11)
        c.sock.shutdown(socket.SHUT_WR)
        assert c.wait_closed(5)
    healthy.check()


def test_truncated_frame_keeps_waiting_while_open(broker, healthy):
    """Half a frame on a live connection is simply incomplete: the rest completes it."""
    body = req(18, 3, client_software_name="split", client_software_version="1")
    payload = encode_request(18, 3, body, correlation_id=77)
    frame = struct.pack(">i", len(payload)) + payload
    with RawClient(broker.bootstrap) as c:
        c.send_raw(frame[:7])
        time.sleep(0.3)
        c.send_raw(frame[7:])
        resp = c.recv_frame()
        assert struct.unpack_from(">ih", resp, 0) == (77, 0)
    healthy.check()


@pytest.mark.parametrize("api_key,version", [(0, 9), (1, 12), (3, 12), (2, 7), (19, 7), (18, 3)])
def test_truncated_body_closes_connection(broker, healthy, api_key, version):
    samples = {
        0: lambda: req(0, 9, transactional_id=None, acks=-1, timeout=1000, topic_data=(
            req(0, 9, "TopicProduceData", name="t", partition_data=(req(0, 9, "PartitionProduceData", index=0, records=build_batch([(b"k", b"v")])),)),)),
        1: lambda: req(1, 12, max_wait=10, min_bytes=1, max_bytes=1000, isolation_level=0, session_id=0, session_epoch=-1, topics=(
            req(1, 12, "FetchTopic", topic="t", partitions=(req(1, 12, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=100),)),),
            forgotten_topics_data=(), rack_id=""),
        3: lambda: req(3, 12, topics=(req(3, 12, "MetadataRequestTopic", name="some-topic"),), allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False),
        2: lambda: req(2, 7, replica_id=-1, isolation_level=0, topics=(
            req(2, 7, "ListOffsetsTopic", name="t", partitions=(req(2, 7, "ListOffsetsPartition", partition_index=0, timestamp=-1),)),)),
        19: lambda: req(19, 7, topics=(req(19, 7, "CreatableTopic", name="never-created-trunc", num_partitions=1, replication_factor=1,
                                            assignments=(), configs=()),), timeout=1000, validate_only=False),
        18: lambda: req(18, 3, client_software_name="truncated-client", client_software_version="1.2.3"),
    }
    payload = encode_request(api_key, version, samples[api_key](), correlation_id=9)
    hdr_len = len(header(api_key, version, client_id=b"raw-test")) + 1  # flexible: + tag byte
    assert len(payload) > hdr_len + 3
    cut = payload[: hdr_len + (len(payload) - hdr_len) // 2]
    with RawClient(broker.bootstrap) as c:
        c.send_frame(cut)
        assert c.wait_closed(5), f"api {api_key} v{version}: truncated body was not rejected"
    healthy.check()


@pytest.mark.parametrize("api_key,version", [(0, 9), (1, 12), (3, 12), (2, 7), (19, 7), (32, 4), (21, 2)])
def test_garbage_body_closes_connection(broker, healthy, api_key, version):
    rng = random.Random(api_key * 100 + version)
    flexible = version >= {0: 9, 1: 12, 3: 9, 2: 6, 19: 5, 32: 4, 21: 2}[api_key]
    payload = header(api_key, version) + (b"\x00" if flexible else b"") + bytes(rng.randrange(256) for _ in range(64)) + b"\xff" * 8
    with RawClient(broker.bootstrap) as c:
        c.send_frame(payload)
        try:
            frame = c.recv_frame()
        except ConnectionClosed:
            frame = None
        # garbage is either refused by closing, or (if it happens to parse) answered with the
        # right correlation id; never a hang, never a crash of the broker
        if frame is not None:
            assert struct.unpack_from(">i", frame, 0)[0] == 1
    healthy.check()


def test_random_garbage_on_many_connections(broker, healthy):
    rng = random.Random(1234)
    conns = []
    for i in range(20):
        c = RawClient(broker.bootstrap)
        n = rng.randrange(1, 200)
        junk = bytes(rng.randrange(256) for _ in range(n))
        if i % 2:
            junk = struct.pack(">i", len(junk)) + junk  # well framed garbage
        c.send_raw(junk)
        conns.append(c)
    try:
        healthy.check()
    finally:
        for c in conns:
            c.close()


def test_frame_over_limit_closes_connection(broker_factory):
    b = broker_factory(extra_args=["--max-frame-bytes", "1048576"])
    with RawClient(b.bootstrap) as c:
        started = time.monotonic()
        c.send_raw(struct.pack(">i", 2 * 1024 * 1024) + header(0, 9))  # claims 2 MiB, sends 14 bytes
        assert c.wait_closed(5), "an over-limit frame header must close the connection at once"
        assert time.monotonic() - started < 5
    with RawClient(b.bootstrap) as c:
        c.send_raw(struct.pack(">i", 1048577))
        assert c.wait_closed(5)
    assert "over the limit" in b.log_text()
    # a frame just under the limit is fine: a ~900 KiB produce is accepted
    topic = "frame-limit-ok"
    big = os.urandom(900 * 1024)
    with RawClient(b.bootstrap) as c:
        c.metadata([topic])
        r = c.produce(topic, 0, build_batch([(None, big)], timestamp=now_ms()))
        assert error_code(r.error_code) == 0 and r.base_offset == 0
    assert read_all(b.bootstrap, topic) == [(0, None, big)]


# ---------------------------------------------------------------------------------------
# record batches


def test_produce_bad_crc(broker, healthy, topic_name):
    create_topic(broker.bootstrap, topic_name)
    batch = bytearray(build_batch([(b"k", b"value")], timestamp=now_ms()))
    batch[-1] ^= 0x55  # a flipped bit in the record bytes, CRC left as it was
    with RawClient(broker.bootstrap) as c:
        r = c.produce(topic_name, 0, bytes(batch))
        assert error_code(r.error_code) == CORRUPT_MESSAGE and r.base_offset == -1
        # the same connection keeps working, and nothing was appended
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0
        good = c.produce(topic_name, 0, build_batch([(b"k", b"good")], timestamp=now_ms()))
        assert error_code(good.error_code) == 0 and good.base_offset == 0
        # one bad batch after a good one in the same record set: the whole set is refused
        mixed = build_batch([(b"k", b"ok")], timestamp=now_ms()) + bytes(batch)
        r = c.produce(topic_name, 0, mixed)
        assert error_code(r.error_code) == CORRUPT_MESSAGE
        assert c.list_offsets(topic_name, 0, LATEST).offset == 1
    assert read_all(broker.bootstrap, topic_name) == [(0, b"k", b"good")]
    healthy.check()


def test_produce_truncated_batch(broker, healthy, topic_name):
    create_topic(broker.bootstrap, topic_name)
    batch = build_batch([(b"k", b"v" * 100)], timestamp=now_ms())
    with RawClient(broker.bootstrap) as c:
        for cut in (batch[:-10], batch[:30], batch[:61]):
            r = c.produce(topic_name, 0, cut)
            assert error_code(r.error_code) == CORRUPT_MESSAGE, (len(cut), r)
        # a batch length that claims more than the record set holds
        lying = bytearray(batch)
        struct.pack_into(">i", lying, 8, len(batch) + 100)
        assert error_code(c.produce(topic_name, 0, bytes(lying)).error_code) == CORRUPT_MESSAGE
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0
    healthy.check()


def test_produce_empty_and_null_record_set(broker, healthy, topic_name):
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        for records in (b"", None):
            r = c.produce(topic_name, 0, records)
            assert error_code(r.error_code) != 0, records
            assert error_code(r.error_code) in (INVALID_RECORD, CORRUPT_MESSAGE)
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0
    healthy.check()


def _legacy_message_set(magic: int, key: bytes, value: bytes) -> bytes:
    """A one-message v0/v1 message set (pre-0.11 format)."""
    body = struct.pack(">bb", magic, 0)
    if magic == 1:
        body += struct.pack(">q", now_ms())
    body += struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value
    msg = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(msg)) + msg


@pytest.mark.parametrize("magic", [0, 1])
def test_produce_legacy_message_format(broker, healthy, topic_name, magic):
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        # Produce v3 is the oldest the broker accepts; a v0/v1 message set inside it is refused
        for version in (3, 9):
            r = c.produce(topic_name, 0, _legacy_message_set(magic, b"k", b"legacy value"), version=version)
            code = error_code(r.error_code)
            # Kafka documents both: UNSUPPORTED_FOR_MESSAGE_FORMAT (43) "the message format
            # version does not support the request", CORRUPT_MESSAGE (2) for what a v2 reader
            # cannot parse. KafScale answers 43.
            assert code == UNSUPPORTED_FOR_MESSAGE_FORMAT, code
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0
    healthy.check()


def test_produce_batch_over_max_message_bytes(broker, healthy, topic_name):
    create_topic(broker.bootstrap, topic_name, 1, {"max.message.bytes": "2000"})
    with RawClient(broker.bootstrap) as c:
        too_big = build_batch([(None, os.urandom(3000))], timestamp=now_ms())
        r = c.produce(topic_name, 0, too_big)
        assert error_code(r.error_code) == MESSAGE_TOO_LARGE
        ok = build_batch([(None, b"x" * 1500)], timestamp=now_ms())
        assert len(ok) <= 2000
        r = c.produce(topic_name, 0, ok)
        assert error_code(r.error_code) == 0 and r.base_offset == 0
        # several small batches are judged one by one, not as a whole
        r = c.produce(topic_name, 0, ok + ok)
        assert error_code(r.error_code) == 0 and r.base_offset == 1
    assert [o for o, _k, _v in read_all(broker.bootstrap, topic_name)] == [0, 1, 2]
    healthy.check()


# ---------------------------------------------------------------------------------------
# unknown topics, partitions, names


def test_unknown_topic_with_auto_create_off(broker_factory):
    b = broker_factory(extra_args=["--auto-create-topics", "false"])
    lo, hi = api_range(3)

    def metadata(v: int) -> None:
        topic = f"never-created-v{v}"
        with RawClient(b.bootstrap) as c:
            md = c.metadata([topic], version=v, allow_auto=True)  # the broker setting wins
            [t] = md.topics
            assert t.name == topic and error_code(t.error_code) == UNKNOWN_TOPIC_OR_PARTITION and len(t.partitions) == 0

    each_version(range(lo, hi + 1), metadata, b)
    topic = "never-created"
    with RawClient(b.bootstrap) as c:
        r = c.produce(topic, 0, build_batch([(None, b"x")], timestamp=now_ms()))
        assert error_code(r.error_code) == UNKNOWN_TOPIC_OR_PARTITION and r.base_offset == -1
        assert error_code(c.fetch(topic, 0, 0, max_wait_ms=10).error_code) == UNKNOWN_TOPIC_OR_PARTITION
        assert error_code(c.list_offsets(topic, 0, LATEST).error_code) == UNKNOWN_TOPIC_OR_PARTITION
        assert {t.name for t in c.metadata(None).topics if not t.is_internal} == set()
    assert not (Path(b.data_dir) / "objects" / "default" / topic).exists()


def test_produce_unknown_topic_with_auto_create_off_shares_connection(broker_factory):
    """Produce never auto-creates, even when Metadata would; the error is per partition."""
    b = broker_factory(extra_args=["--auto-create-topics", "false"])
    create_topic(b.bootstrap, "exists")
    ts = now_ms()
    with RawClient(b.bootstrap) as c:
        p_ok = req(0, 9, "PartitionProduceData", index=0, records=build_batch([(None, b"ok")], timestamp=ts))
        p_bad = req(0, 9, "PartitionProduceData", index=0, records=build_batch([(None, b"no")], timestamp=ts))
        body = req(0, 9, transactional_id=None, acks=-1, timeout=5000, topic_data=(
            req(0, 9, "TopicProduceData", name="exists", partition_data=(p_ok,)),
            req(0, 9, "TopicProduceData", name="missing", partition_data=(p_bad,)),
        ))
        resp = c.request(0, 9, body)
        by_name = {t.name: t.partition_responses[0] for t in resp.responses}
        assert error_code(by_name["exists"].error_code) == 0 and by_name["exists"].base_offset == 0
        assert error_code(by_name["missing"].error_code) == UNKNOWN_TOPIC_OR_PARTITION
    assert read_all(b.bootstrap, "exists") == [(0, None, b"ok")]


@pytest.mark.parametrize("name", ["bad/name", "white space", "x" * 250, ".."])
def test_invalid_topic_name_metadata(broker, healthy, name):
    lo, hi = api_range(3)

    def metadata(v: int) -> None:
        with RawClient(broker.bootstrap) as c:
            md = c.metadata([name], version=v)
            [t] = md.topics
            assert error_code(t.error_code) == INVALID_TOPIC_EXCEPTION and len(t.partitions) == 0

    each_version(range(lo, hi + 1), metadata, broker)
    healthy.check()


def test_invalid_topic_name_create_and_produce(broker, healthy):
    name = "bad/name"
    lo, hi = api_range(19)

    def create(v: int) -> None:
        with RawClient(broker.bootstrap) as c:
            ct = req(19, v, "CreatableTopic", name=name, num_partitions=1, replication_factor=1, assignments=(), configs=())
            resp = c.request(19, v, req(19, v, topics=(ct,), timeout=5000, validate_only=False))
            assert error_code(resp.topics[0].error_code) == INVALID_TOPIC_EXCEPTION

    each_version(range(lo, hi + 1), create, broker)
    with RawClient(broker.bootstrap) as c:
        r = c.produce(name, 0, build_batch([(None, b"x")], timestamp=now_ms()))
        assert error_code(r.error_code) in (UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION)
        assert name not in {t.name for t in c.metadata(None).topics}
    healthy.check()


def test_unknown_partition_every_version(broker, healthy, topic_name):
    """Produce (by name: v3-12), Fetch (by name: v4-12), ListOffsets, DeleteRecords,
    OffsetForLeaderEpoch: an unknown partition is error 3 in every version."""
    create_topic(broker.bootstrap, topic_name, 1)
    ts = now_ms()

    def produce(v):
        with RawClient(broker.bootstrap) as c:
            assert error_code(c.produce(topic_name, 4, build_batch([(None, b"x")], timestamp=ts), version=v).error_code) == UNKNOWN_TOPIC_OR_PARTITION

    def fetch(v):
        with RawClient(broker.bootstrap) as c:
            assert error_code(c.fetch(topic_name, 4, 0, version=v, max_wait_ms=10).error_code) == UNKNOWN_TOPIC_OR_PARTITION

    def list_offsets(v):
        with RawClient(broker.bootstrap) as c:
            p = req(2, v, "ListOffsetsPartition", partition_index=4, current_leader_epoch=-1, timestamp=LATEST)
            body = req(2, v, replica_id=-1, isolation_level=0, timeout=1000, topics=(req(2, v, "ListOffsetsTopic", name=topic_name, partitions=(p,)),))
            r = c.request(2, v, body)
            assert error_code(r.topics[0].partitions[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION

    def delete_records(v):
        with RawClient(broker.bootstrap) as c:
            p = req(21, v, "DeleteRecordsPartition", partition_index=4, offset=0)
            r = c.request(21, v, req(21, v, topics=(req(21, v, "DeleteRecordsTopic", name=topic_name, partitions=(p,)),), timeout=1000))
            assert error_code(r.topics[0].partitions[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION

    def epoch(v):
        with RawClient(broker.bootstrap) as c:
            p = req(23, v, "OffsetForLeaderPartition", partition=4, current_leader_epoch=-1, leader_epoch=0)
            r = c.request(23, v, req(23, v, replica_id=-1, topics=(req(23, v, "OffsetForLeaderTopic", topic=topic_name, partitions=(p,)),)))
            assert error_code(r.topics[0].partitions[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION

    for key, check, cap in ((0, produce, 12), (1, fetch, 12), (2, list_offsets, 99), (21, delete_records, 99), (23, epoch, 99)):
        lo, hi = api_range(key)
        each_version(range(lo, min(hi, cap) + 1), check, broker)
    with RawClient(broker.bootstrap) as c:
        assert c.list_offsets(topic_name, 0, LATEST).offset == 0
    healthy.check()


def test_unknown_partition(broker, healthy, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    with RawClient(broker.bootstrap) as c:
        for p in (2, 99, -1):
            r = c.produce(topic_name, p, build_batch([(None, b"x")], timestamp=now_ms()))
            assert error_code(r.error_code) == UNKNOWN_TOPIC_OR_PARTITION, p
            assert error_code(c.fetch(topic_name, p, 0, max_wait_ms=10).error_code) == UNKNOWN_TOPIC_OR_PARTITION
            assert error_code(c.list_offsets(topic_name, p, LATEST).error_code) == UNKNOWN_TOPIC_OR_PARTITION
        # the valid partitions are fine on the same connection
        assert error_code(c.produce(topic_name, 1, build_batch([(None, b"ok")], timestamp=now_ms())).error_code) == 0
    healthy.check()


# ---------------------------------------------------------------------------------------
# unknown API keys and versions


@pytest.mark.parametrize("api_key,version", [
    pytest.param(999, 0, id="key-999"),
    pytest.param(-1, 0, id="key-negative"),
    pytest.param(22, 4, id="InitProducerId-unregistered"),
    pytest.param(3, 99, id="Metadata-v99"),
    pytest.param(0, -1, id="Produce-v-1-below-min"),
    pytest.param(1, 99, id="Fetch-v99"),
])
def test_unknown_api_key_or_version_closes_connection(broker, healthy, api_key, version):
    with RawClient(broker.bootstrap) as c:
        c.send_frame(header(api_key, version) + b"\x00" * 16)
        assert c.wait_closed(5)
    healthy.check()


def test_pipelined_requests_after_error_response_still_answered_in_order(broker, healthy, topic_name):
    """Error responses are ordinary responses: later requests on the connection are
    answered, in order, with their own correlation ids."""
    create_topic(broker.bootstrap, topic_name)
    with RawClient(broker.bootstrap) as c:
        bad = bytearray(build_batch([(None, b"x")], timestamp=now_ms()))
        bad[-1] ^= 1
        bodies = [
            req(0, 9, transactional_id=None, acks=-1, timeout=5000, topic_data=(
                req(0, 9, "TopicProduceData", name=topic_name, partition_data=(req(0, 9, "PartitionProduceData", index=0, records=bytes(bad)),)),)),
            req(0, 9, transactional_id=None, acks=-1, timeout=5000, topic_data=(
                req(0, 9, "TopicProduceData", name=topic_name, partition_data=(req(0, 9, "PartitionProduceData", index=0,
                    records=build_batch([(None, b"fine")], timestamp=now_ms())),)),)),
        ]
        corrs = [c.send_request(0, 9, b) for b in bodies]
        from tests.support.raw import decode_response

        got = [decode_response(0, 9, c.recv_frame()) for _ in bodies]
        assert [g[0] for g in got] == corrs
        assert error_code(got[0][1].responses[0].partition_responses[0].error_code) == CORRUPT_MESSAGE
        ok = got[1][1].responses[0].partition_responses[0]
        assert error_code(ok.error_code) == 0 and ok.base_offset == 0
    healthy.check()


def test_canary_still_readable_by_a_real_client(broker, canary):
    """Last in this module: after all of the above, a fresh librdkafka consumer reads every
    acknowledged record back."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(canary, 0, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < len(CANARY) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    assert got == [(i, k, v) for i, (k, v) in enumerate(CANARY)]
