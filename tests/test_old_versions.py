"""Request versions older than kio's (every version Apache Kafka 3.9 still accepted):
protocol/legacy.py and protocol/legacy_records.py.

Bytes are checked against independent implementations: message sets written here with
`struct` and `zlib.crc32` from Kafka's spec (message format v0/v1), v2 batches read with
the broker's own reader and with confluent-kafka, old request bodies encoded by
kafka-python and compared with kio's encoding where the layouts are the same.
"""

from __future__ import annotations

import io
import struct
import time
import zlib

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.old import admin as old_admin
from kafka.protocol.old import api_versions as old_api_versions
from kafka.protocol.old import commit as old_commit
from kafka.protocol.old import fetch as old_fetch
from kafka.protocol.old import find_coordinator as old_fc
from kafka.protocol.old import group as old_group
from kafka.protocol.old import list_offsets as old_lo
from kafka.protocol.old import metadata as old_md
from kafka.protocol.old import produce as old_produce
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kafscale.errors import ErrorCode
from kafscale.protocol import legacy_records, records
from kafscale.protocol.records import InvalidRecordError
from tests.support.broker import BrokerProcess, free_port
from tests.support.raw import RawClient, encode_request, req

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3}


# ---------------------------------------------------------------------------------------
# Message format v0/v1 written from the spec (an implementation independent of kafka-python)


def spec_message(magic: int, offset: int, key: bytes | None, value: bytes | None, timestamp: int = -1, attributes: int = 0) -> bytes:
    """offset int64, size int32, crc uint32, magic int8, attributes int8, [timestamp int64],
    key bytes, value bytes (Kafka's message format v0/v1)."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    crc = zlib.crc32(body) & 0xFFFFFFFF
    return struct.pack(">qiI", offset, len(body) + 4, crc) + body


def parse_message_set(buf: bytes) -> list[tuple[int, int, int, int, bytes | None, bytes | None]]:
    """(offset, magic, attributes, timestamp, key, value) of each message, CRCs checked."""
    out, pos = [], 0
    while pos + 12 <= len(buf):
        offset, size = struct.unpack_from(">qi", buf, pos)
        msg = buf[pos + 12 : pos + 12 + size]
        (crc,) = struct.unpack_from(">I", msg, 0)
        assert zlib.crc32(msg[4:]) & 0xFFFFFFFF == crc, "message CRC"
        magic, attrs = msg[4], msg[5]
        p = 6
        ts = -1
        if magic == 1:
            (ts,) = struct.unpack_from(">q", msg, p)
            p += 8
        fields = []
        for _ in range(2):
            (n,) = struct.unpack_from(">i", msg, p)
            p += 4
            fields.append(None if n < 0 else bytes(msg[p : p + n]))
            p += max(n, 0)
        out.append((offset, magic, attrs, ts, fields[0], fields[1]))
        pos += 12 + size
    return out


def kp_message_set(magic: int, codec: str, msgs, base_ts: int) -> bytes:
    """A (possibly compressed) message set from kafka-python's builder, as its producer sends."""
    b = LegacyRecordBatchBuilder(magic, CODECS[codec], 1 << 30)
    for i, (k, v) in enumerate(msgs):
        b.append(i, base_ts + i, k, v)
    return bytes(b.build())


MSGS = [(None, b"v0"), (b"k1", b"v1" * 50), (b"k2", None), (b"", b"")]


def test_kafka_python_builder_matches_the_spec():
    """The builder the broker converts with writes what Kafka's spec says (uncompressed)."""
    for magic in (0, 1):
        expected = b"".join(spec_message(magic, i, k, v, 1000 + i if magic else -1) for i, (k, v) in enumerate(MSGS))
        assert kp_message_set(magic, "none", MSGS, 1000) == expected


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("magic", [0, 1])
def test_up_convert(magic, codec):
    before = legacy_records.up_conversions
    data = kp_message_set(magic, codec, MSGS, 1_700_000_000_000) if codec != "none" else \
        b"".join(spec_message(magic, 0, k, v, 1_700_000_000_000 + i) for i, (k, v) in enumerate(MSGS))
    batch = legacy_records.up_convert(memoryview(bytearray(data)), 1 << 20)
    [h] = records.validate_record_set(memoryview(bytearray(batch)))
    assert h.compression == CODECS[codec] and h.record_count == len(MSGS)
    got = records.decode_records(bytes(batch), 0, h)
    assert [(r.offset, r.key, r.value) for r in got] == [(i, k, v) for i, (k, v) in enumerate(MSGS)]
    assert [r.timestamp for r in got] == ([1_700_000_000_000 + i for i in range(len(MSGS))] if magic else [-1] * len(MSGS))
    assert legacy_records.up_conversions == before + 1


def test_up_convert_refuses_what_kafka_refuses():
    good = spec_message(1, 0, b"k", b"v", 5)
    bad = bytearray(good)
    bad[-1] ^= 1  # value byte: the CRC no longer matches
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(bad), None)
    assert e.value.error_code == ErrorCode.corrupt_message
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(bytearray(good + good[:20])), None)  # truncated second message
    assert e.value.error_code == ErrorCode.corrupt_message
    big = spec_message(0, 0, None, b"x" * 200)
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(bytearray(big)), 100)
    assert e.value.error_code == ErrorCode.message_too_large
    # a gzip wrapper (CRC right) whose compressed payload is garbled
    gz = bytearray(kp_message_set(1, "gzip", [(b"k", b"v")], 5))
    gz[-3] ^= 0xFF
    struct.pack_into(">I", gz, 12, zlib.crc32(bytes(gz[16:])) & 0xFFFFFFFF)
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(gz), None)
    assert e.value.error_code == ErrorCode.corrupt_message
    # a gzip wrapper whose inner message's CRC is wrong
    inner = bytearray(spec_message(1, 0, b"k", b"v", 5))
    inner[-1] ^= 1
    import gzip

    wrapper = spec_message(1, 0, None, gzip.compress(bytes(inner)), 5, attributes=1)
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(bytearray(wrapper)), None)
    assert e.value.error_code == ErrorCode.corrupt_message
    # a zstd wrapper: no such thing in message format v0/v1
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.up_convert(memoryview(bytearray(spec_message(1, 0, None, b"zz", 5, attributes=4))), None)
    assert e.value.error_code == ErrorCode.unsupported_compression_type


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("magic", [0, 1])
def test_down_convert(magic, codec):
    before = legacy_records.down_conversions
    batch = bytearray(records.build_batch([(b"a", b"1"), (None, b"2"), (b"c", None)], base_offset=40, timestamp=1234, codec=CODECS[codec]))
    marker = records.build_control_batch(True, 7, 0, 0, 99, base_offset=43)
    out = legacy_records.down_convert([bytes(batch) + marker], magic, 1 << 20)
    assert legacy_records.down_conversions == before + 1
    msgs = parse_message_set(out)
    if codec == "none":
        assert [(m[0], m[1], m[4], m[5]) for m in msgs] == [(40, magic, b"a", b"1"), (41, magic, None, b"2"), (42, magic, b"c", None)]
        assert [m[3] for m in msgs] == ([1234] * 3 if magic else [-1] * 3)
    else:
        [(offset, m, attrs, ts, key, value)] = msgs  # one wrapper: the transaction marker is left out
        assert (offset, m, attrs & 7, key) == (42, magic, CODECS[codec], None)
        if magic == 1:
            assert ts == 1234
        # the inner messages, read by kafka-python's reader (a second implementation)
        from kafka.record.legacy_records import LegacyRecordBatch

        inner = [(r.offset, r.key, r.value) for r in LegacyRecordBatch(out, magic)]
        assert inner == [(40, b"a", b"1"), (41, None, b"2"), (42, b"c", None)]


def test_down_convert_honours_max_bytes_and_moves_on():
    batch = records.build_batch([(None, b"x" * 100) for _ in range(5)], base_offset=0, timestamp=1)
    one = len(spec_message(1, 0, None, b"x" * 100, 1))
    assert len(parse_message_set(legacy_records.down_convert([batch], 1, 2 * one + 10))) == 2
    assert len(parse_message_set(legacy_records.down_convert([batch], 1, 5))) == 1  # at least one


def test_same_layout_versions_encode_alike():
    """OffsetFetch v0 is v1's bytes (kafka-python v0 against kio v1)."""
    old = old_commit.OffsetFetchRequest_v0(group_id="g", topics=[("t", [0, 1])]).encode()
    new = encode_request(9, 1, req(9, 1, group_id="g", topics=(req(9, 1, "OffsetFetchRequestTopic", name="t", partition_indexes=(0, 1)),)), 1)
    assert new.endswith(old)


# ---------------------------------------------------------------------------------------
# Against a broker


@pytest.fixture(scope="module")
def kb():
    http = free_port()
    b = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0", "--merge-interval-ms", "0", "--http", f"127.0.0.1:{http}"]).start()
    b.http = http
    yield b
    b.stop()


def metrics(kb) -> dict[str, float]:
    """The broker's /metrics samples: 'name{labels}' -> value."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{kb.http}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def requests_count(m: dict, api: str, version: int) -> float:
    return sum(v for k, v in m.items() if k.startswith("kafscale_requests_total{") and f'api="{api}"' in k and f'version="{version}"' in k)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})], operation_timeout=10)[topic].result(15)


class OldClient(RawClient):
    """Requests and responses encoded by kafka-python's old definitions."""

    def old(self, request, response_cls):
        corr = self.next_correlation_id()
        request.with_header(correlation_id=corr, client_id="old-test")
        self.send_raw(request.encode(header=True, framed=True))
        payload = self.recv_frame()
        (got,) = struct.unpack_from(">i", payload, 0)
        assert got == corr
        buf = io.BytesIO(payload[4:])
        resp = response_cls.decode(buf)
        assert buf.read() == b"", "trailing bytes in the response"
        return resp


def consume_all(bootstrap: str, topic: str, n: int):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"x-{topic}", "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out, deadline = [], time.monotonic() + 20
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m)
        return out
    finally:
        c.close()


def test_api_versions_from_kafka_39s_lowest(kb):
    """ApiVersions v0 (kafka-python's): the APIs below kio's start are advertised from v0."""
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_api_versions.ApiVersionsRequest_v0(), old_api_versions.ApiVersionsResponse_v0)
    got = {k: (lo, hi) for k, lo, hi in r.api_keys}
    from kafscale.protocol.codec import kio_versions

    # Kafka 3.9 accepted every API it had from v0, and the APIs newer than 3.9 start at 0 too,
    # but the share group APIs (76-79): Kafka 4.1 removed their early-access v0 (KIP-932)
    assert r.error_code == 0 and {k: lo for k, (lo, _hi) in got.items() if lo != 0} == {76: 1, 77: 1, 78: 1, 79: 1}
    # kio's newest versions, but InitProducerId v6 (KIP-939 two-phase commit), which Kafka 4.0 lacks
    older = {22: 5}
    assert {k: hi for k, (_lo, hi) in got.items() if hi != kio_versions(k)[1]} == older
    for key in (0, 1, 2, 8, 9, 19, 20, 23, 27, 29, 30, 31, 32, 34, 35):
        assert kio_versions(key)[0] > 0, key  # the ones below kio's start


@pytest.mark.parametrize("version,magic", [(0, 0), (1, 0), (2, 1)])
@pytest.mark.parametrize("codec", list(CODECS))
def test_raw_produce_old_read_by_confluent(kb, topic_name, version, magic, codec):
    create_topic(kb.bootstrap, topic_name)
    ts = int(time.time() * 1000) - 5000
    sets = kp_message_set(magic, codec, MSGS, ts) if codec != "none" else \
        b"".join(spec_message(magic, i, k, v, ts + i) for i, (k, v) in enumerate(MSGS))
    with OldClient(kb.bootstrap) as c:
        r = c.old(getattr(old_produce, f"ProduceRequest_v{version}")(acks=-1, timeout_ms=10000, topic_data=[(topic_name, [(0, sets)])]),
                  getattr(old_produce, f"ProduceResponse_v{version}"))
    [(name, [part])] = r.responses
    assert name == topic_name and part[0] == 0 and part[1] == 0 and part[2] == 0, r
    got = consume_all(kb.bootstrap, topic_name, len(MSGS))
    assert [(m.offset(), m.key(), m.value()) for m in got] == [(i, k, v) for i, (k, v) in enumerate(MSGS)]
    if magic == 1:
        assert [m.timestamp()[1] for m in got] == [ts + i for i in range(len(MSGS))]
    else:
        assert all(m.timestamp()[1] == -1 for m in got)


def test_raw_produce_corrupt_message(kb, topic_name):
    create_topic(kb.bootstrap, topic_name)
    bad = bytearray(spec_message(0, 0, b"k", b"v"))
    bad[-1] ^= 1
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_produce.ProduceRequest_v0(acks=1, timeout_ms=10000, topic_data=[(topic_name, [(0, bytes(bad))])]), old_produce.ProduceResponse_v0)
        [(_name, [part])] = r.responses
        assert part[1] == ErrorCode.corrupt_message
        # the connection keeps working
        good = spec_message(0, 0, b"k", b"v")
        r = c.old(old_produce.ProduceRequest_v0(acks=1, timeout_ms=10000, topic_data=[(topic_name, [(0, good)])]), old_produce.ProduceResponse_v0)
        assert r.responses[0][1][0][1:] == (0, 0)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_raw_fetch_old(kb, topic_name, version):
    create_topic(kb.bootstrap, topic_name)
    v0, v1 = b"v0" * 200, b"v1" * 200
    with RawClient(kb.bootstrap) as c:  # a gzip batch of two, then a plain one (Produce v9)
        assert c.produce(topic_name, 0, records.build_batch([(b"k0", v0, [("h", b"x")]), (None, v1)], timestamp=7, codec=1)).error_code == 0
        assert c.produce(topic_name, 0, records.build_batch([(b"k2", b"v2")], timestamp=8)).error_code == 0
    kw = {"max_bytes": 1 << 20} if version == 3 else {}
    with OldClient(kb.bootstrap) as c:
        r = c.old(getattr(old_fetch, f"FetchRequest_v{version}")(replica_id=-1, max_wait_ms=100, min_bytes=1,
                                                                    topics=[(topic_name, [(0, 0, 1 << 20)])], **kw),
                  getattr(old_fetch, f"FetchResponse_v{version}"))
    [(name, [(index, err, hw, data)])] = r.responses
    assert (name, index, err, hw) == (topic_name, 0, 0, 3)
    outer = parse_message_set(data)
    magic = 0 if version < 2 else 1
    assert [(m[0], m[1], m[2] & 7) for m in outer] == [(1, magic, 1), (2, magic, 0)]
    from kafka.record.legacy_records import LegacyRecordBatch

    pos, got = 0, []
    for m in outer:
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        got += [(r.offset, r.key, r.value) for r in LegacyRecordBatch(data[pos : pos + size], magic)]
        pos += size
    assert got == [(0, b"k0", v0), (1, None, v1), (2, b"k2", b"v2")]


def test_list_offsets_v0(kb, topic_name):
    from tests.test_clients import confluent_produce

    create_topic(kb.bootstrap, topic_name)
    confluent_produce(kb.bootstrap, topic_name, [(None, b"a", []), (None, b"b", [])], partition=0)
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_lo.ListOffsetsRequest_v0(replica_id=-1, topics=[(topic_name, [(0, -1, 1), (7, -1, 1)])]), old_lo.ListOffsetsResponse_v0)
        [(_n, parts)] = r.topics
        assert parts[0] == (0, 0, [2])
        assert parts[1][1] == ErrorCode.unknown_topic_or_partition
        r = c.old(old_lo.ListOffsetsRequest_v0(replica_id=-1, topics=[(topic_name, [(0, -2, 10)])]), old_lo.ListOffsetsResponse_v0)
        assert r.topics[0][1][0] == (0, 0, [0])
        r = c.old(old_lo.ListOffsetsRequest_v0(replica_id=-1, topics=[(topic_name, [(0, -1, 0)])]), old_lo.ListOffsetsResponse_v0)
        assert r.topics[0][1][0] == (0, 0, [])


def test_metadata_v0_empty_list_means_all(kb, topic_name):
    create_topic(kb.bootstrap, topic_name)
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_md.MetadataRequest_v0(topics=[]), old_md.MetadataResponse_v0)
    assert topic_name in [t[1] for t in r.topics]


def test_group_and_offsets_old_versions(kb, topic_name):
    """FindCoordinator v0, JoinGroup v0 (session timeout = rebalance timeout), SyncGroup,
    Heartbeat and LeaveGroup v0, OffsetCommit v0/v1, OffsetFetch v0."""
    create_topic(kb.bootstrap, topic_name)
    group = f"g-{topic_name}"
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_fc.FindCoordinatorRequest_v0(group), old_fc.FindCoordinatorResponse_v0)
        assert r.error_code == 0 and r.node_id == 0
        r = c.old(old_group.JoinGroupRequest_v0(group, 6000, "", "consumer", [("range", b"")]), old_group.JoinGroupResponse_v0)
        assert r.error_code == 0, r
        member, gen = r.member_id, r.generation_id
        r = c.old(old_group.SyncGroupRequest_v0(group, gen, member, [(member, b"")]), old_group.SyncGroupResponse_v0)
        assert r.error_code == 0
        r = c.old(old_group.HeartbeatRequest_v0(group, gen, member), old_group.HeartbeatResponse_v0)
        assert r.error_code == 0
        r = c.old(old_commit.OffsetCommitRequest_v1(group, gen, member, [(topic_name, [(0, 5, -1, "meta")])]), old_commit.OffsetCommitResponse_v1)
        assert r.topics[0][1] == [(0, 0)]
        r = c.old(old_commit.OffsetFetchRequest_v0(group, [(topic_name, [0])]), old_commit.OffsetFetchResponse_v0)
        assert r.topics[0][1] == [(0, 5, "meta", 0)]
        r = c.old(old_group.LeaveGroupRequest_v0(group, member), old_group.LeaveGroupResponse_v0)
        assert r.error_code == 0
        # v0: no generation (a group with no members: Kafka's simple consumers)
        r = c.old(old_commit.OffsetCommitRequest_v0(group, [(topic_name, [(0, 9, "")])]), old_commit.OffsetCommitResponse_v0)
        assert r.topics[0][1] == [(0, 0)]
        r = c.old(old_commit.OffsetFetchRequest_v0(group, [(topic_name, [0])]), old_commit.OffsetFetchResponse_v0)
        assert r.topics[0][1] == [(0, 9, "", 0)]


def test_admin_old_versions(kb, topic_name):
    """CreateTopics v0-1, DescribeConfigs v0 (is_default), DeleteTopics v0."""
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_admin.CreateTopicsRequest_v0([(topic_name, 2, 1, [], [("retention.ms", "3600000")])], 10000), old_admin.CreateTopicsResponse_v0)
        assert r.topics == [(topic_name, 0)]
        r = c.old(old_admin.CreateTopicsRequest_v1([(topic_name, 2, 1, [], [])], 10000, False), old_admin.CreateTopicsResponse_v1)
        assert r.topics[0][1] == ErrorCode.topic_already_exists
        r = c.old(old_admin.DescribeConfigsRequest_v0([(2, topic_name, ["retention.ms", "cleanup.policy"])]), old_admin.DescribeConfigsResponse_v0)
        [(err, _msg, _type, name, configs)] = r.results
        assert err == 0 and name == topic_name
        by_name = {cfg[0]: cfg for cfg in configs}
        assert by_name["retention.ms"][1:4] == ("3600000", False, False)
        assert by_name["cleanup.policy"][1] == "delete" and by_name["cleanup.policy"][3] is True  # is_default
        r = c.old(old_admin.DeleteTopicsRequest_v0([topic_name], 10000), old_admin.DeleteTopicsResponse_v0)
        assert r.responses == [(topic_name, 0)]


def test_describe_configs_v0_of_a_group(kb):
    """DescribeConfigs v0 (Kafka 3.9's lowest) answers GROUP resources too: the defaults are
    is_default, an override is not."""
    group = f"old-cfg-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": kb.bootstrap})
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    r = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([r]).values():
        fut.result(15)
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_admin.DescribeConfigsRequest_v0([(32, group, None)]), old_admin.DescribeConfigsResponse_v0)
    [(err, _msg, kind, name, configs)] = r.results
    by_name = {cfg[0]: cfg for cfg in configs}
    assert (err, kind, name, len(by_name)) == (0, 32, group, 10)
    assert by_name["share.auto.offset.reset"][1:4] == ("earliest", False, False)
    assert by_name["share.isolation.level"][1] == "read_uncommitted" and by_name["share.isolation.level"][3] is True


@pytest.mark.parametrize("api_version", [(0, 10, 1), (0, 10, 0), (0, 9)])
def test_kafka_python_old_api_versions(kb, topic_name, api_version):
    """kafka-python forced to an old broker version produces (Produce v2 / v0, message
    format v1 / v0, gzip) and consumes (Fetch v2 / v0) in a group that commits (OffsetCommit
    v2 / v2, JoinGroup v0), and a second consumer of the group resumes from the commit."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP

    create_topic(kb.bootstrap, topic_name)
    m0 = metrics(kb)
    p = KafkaProducer(bootstrap_servers=kb.bootstrap, api_version=api_version, compression_type="gzip", linger_ms=20)
    sent = [(f"k{i}".encode(), (f"value-{i}-" * 20).encode()) for i in range(6)]
    before = time.time() * 1000
    futures = [p.send(topic_name, key=k, value=v, partition=0) for k, v in sent]
    p.flush(15)
    assert [f.get(10).offset for f in futures] == list(range(6))
    p.close()
    group = f"kp-{topic_name}"

    def consume(n):
        c = KafkaConsumer(bootstrap_servers=kb.bootstrap, api_version=api_version, group_id=group,
                          auto_offset_reset="earliest", enable_auto_commit=False)
        c.subscribe([topic_name])
        got, deadline = [], time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            for recs in c.poll(500, max_records=n - len(got)).values():
                got += recs
        c.commit()
        committed = c.committed(KTP(topic_name, 0))
        c.close()
        return got, committed

    got, committed = consume(4)
    assert [(m.offset, m.key, m.value) for m in got] == [(i, k, v) for i, (k, v) in enumerate(sent[:4])]
    if api_version >= (0, 10):
        assert all(m.timestamp >= before - 1000 for m in got)  # message format v1 keeps the producer's time
    assert committed == 4
    got, _ = consume(2)
    assert [(m.offset, m.key) for m in got] == [(4, b"k4"), (5, b"k5")]
    m1 = metrics(kb)
    produce_v, fetch_v = {(0, 10, 1): (2, 3), (0, 10, 0): (2, 2), (0, 9): (1, 1)}[api_version]
    assert requests_count(m1, "Produce", produce_v) > requests_count(m0, "Produce", produce_v)
    assert requests_count(m1, "Fetch", fetch_v) > requests_count(m0, "Fetch", fetch_v)
    up, down = 'kafscale_record_conversions_total{direction="up"}', 'kafscale_record_conversions_total{direction="down"}'
    assert m1[up] > m0.get(up, 0) and m1[down] > m0.get(down, 0)
    confluent = consume_all(kb.bootstrap, topic_name, 6)
    assert [(m.offset(), m.key(), m.value()) for m in confluent] == [(i, k, v) for i, (k, v) in enumerate(sent)]


def test_kafka_python_0_8_2(kb, topic_name):
    """kafka-python as a 0.8.2 client: Produce v0 (message format v0: no timestamps), Fetch
    v0, manual assignment with offsets committed to and fetched from the broker."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTP
    from kafka.structs import OffsetAndMetadata

    create_topic(kb.bootstrap, topic_name)
    m0 = metrics(kb)
    p = KafkaProducer(bootstrap_servers=kb.bootstrap, api_version=(0, 8, 2), compression_type="snappy")
    sent = [(f"k{i}".encode(), (f"v{i}-" * 30).encode()) for i in range(4)]
    for k, v in sent:
        p.send(topic_name, key=k, value=v, partition=0)
    p.flush(15)
    p.close()
    tp = KTP(topic_name, 0)
    c = KafkaConsumer(bootstrap_servers=kb.bootstrap, api_version=(0, 8, 2), group_id=f"g82-{topic_name}", enable_auto_commit=False, auto_offset_reset="earliest")
    c.assign([tp])
    got, deadline = [], time.monotonic() + 20
    while len(got) < 4 and time.monotonic() < deadline:
        for recs in c.poll(500).values():
            got += recs
    assert [(m.offset, m.key, m.value) for m in got] == [(i, k, v) for i, (k, v) in enumerate(sent)]
    c.commit({tp: OffsetAndMetadata(3, "", -1)})
    assert c.committed(tp) == 3
    c.close()
    m1 = metrics(kb)
    assert requests_count(m1, "Produce", 0) > requests_count(m0, "Produce", 0)
    assert requests_count(m1, "Fetch", 0) > requests_count(m0, "Fetch", 0)
    assert [m.timestamp()[1] for m in consume_all(kb.bootstrap, topic_name, 4)] == [-1] * 4


# ---------------------------------------------------------------------------------------
# Unsupported API keys and versions


def test_log_limiter():
    import logging

    from kafscale.broker.server import LogLimiter

    lim = LogLimiter(interval_s=60)
    assert lim.decide(("h", 0, 99), 0.0) == (logging.WARNING, 0)
    assert [lim.decide(("h", 0, 99), t) for t in (1.0, 2.0, 3.0)] == [(logging.DEBUG, 0)] * 3
    assert lim.decide(("h", 1, 99), 3.0) == (logging.WARNING, 0)  # another key
    assert lim.decide(("h", 0, 99), 61.0) == (logging.WARNING, 3)  # says how many were left out


def test_unsupported_version_closes_and_logs_once(kb):
    """Kafka closes the connection on an API key or version it does not serve; the log says
    which, once per connection, and not for every one of a reconnecting client's tries."""
    for _ in range(30):
        with RawClient(kb.bootstrap) as c:
            c.send_frame(struct.pack(">hhih", 0, 99, 1, 1) + b"x" + b"\0" * 16)
            assert c.wait_closed(5)
    with RawClient(kb.bootstrap) as c:
        c.send_frame(struct.pack(">hhih", 4242, 0, 1, 1) + b"x" + b"\0" * 16)
        assert c.wait_closed(5)
    from tests.support.wait import wait_until

    wait_until(lambda: "API key 4242" in kb.log_text(), 10, "the unknown key logged")
    lines = [ln for ln in kb.log_text().splitlines() if "unsupported request" in ln]
    produce_99 = [ln for ln in lines if "API key 0 (produce) version 99" in ln]
    assert len(produce_99) == 1 and "WARNING" in produce_99[0] and "supported versions 0-" in produce_99[0], lines
    assert any("API key 4242 (unknown API) version 0" in ln for ln in lines)


def test_garbled_old_bodies_close_only_that_connection(kb):
    """Truncated and random bodies of every old version: the connection is answered or
    closed, and the broker keeps serving."""
    import random

    from kafscale.broker.router import build_router
    from kafscale.protocol.codec import kio_versions

    rng = random.Random(18)
    olds = [(a.key, v) for a in build_router().apis.values() for v in range(a.min_version, kio_versions(a.key)[0])]
    assert len(olds) >= 20
    for key, v in olds:
        for body in (b"", b"\xff" * 7, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), b"\x7f\xff\xff\xff" * 4):
            with RawClient(kb.bootstrap, timeout=5) as c:
                c.send_frame(struct.pack(">hhih", key, v, 1, 1) + b"x" + body)
                try:
                    c.recv_frame()  # an answer (an empty request is valid for some)
                except Exception:  # noqa: BLE001 - closed: fine
                    pass
    with OldClient(kb.bootstrap) as c:
        assert c.old(old_api_versions.ApiVersionsRequest_v0(), old_api_versions.ApiVersionsResponse_v0).error_code == 0
    assert "Traceback" not in kb.log_text() and "internal error" not in kb.log_text()


def test_write_txn_markers_v0(kb, topic_name):
    """WriteTxnMarkers v0 (v1 without flexible encoding; kafka-python's JSON-spec classes):
    a marker for a producer with no transaction on the partition is answered per partition."""
    from kafka.protocol.producer.transaction import WriteTxnMarkersRequest as Rq, WriteTxnMarkersResponse as Rs

    create_topic(kb.bootstrap, topic_name)
    marker = Rq.WritableTxnMarker(producer_id=4242, producer_epoch=0, transaction_result=False,
                                  topics=[Rq.WritableTxnMarker.WritableTxnMarkerTopic(name=topic_name, partition_indexes=[0])], coordinator_epoch=0)
    body = bytes(Rq(markers=[marker]).encode(version=0))
    # the same bytes as kio's v1 body without its compact lengths and tags: check the layout by hand
    assert body[:4] == struct.pack(">i", 1) and body[4:12] == struct.pack(">q", 4242)
    with RawClient(kb.bootstrap) as c:
        c.send_frame(struct.pack(">hhih", 27, 0, 7, 1) + b"x" + body)
        payload = c.recv_frame()
    assert struct.unpack_from(">i", payload, 0)[0] == 7
    resp = Rs.decode(io.BytesIO(payload[4:]), version=0)
    [m] = resp.markers
    assert m.producer_id == 4242
    [t] = m.topics
    assert t.name == topic_name and [p.partition_index for p in t.partitions] == [0]


def test_down_convert_zstd_and_log_append_time():
    plain = records.build_batch([(b"a", b"1")], base_offset=0, timestamp=5)
    zstd = records.build_batch([(b"b", b"2")], base_offset=1, timestamp=5, codec=4)
    with pytest.raises(InvalidRecordError) as e:
        legacy_records.down_convert([zstd], 1, 1 << 20)
    assert e.value.error_code == ErrorCode.unsupported_compression_type
    # what comes before a zstd batch is returned; the next fetch starts at it
    assert [m[0] for m in parse_message_set(legacy_records.down_convert([plain + zstd], 1, 1 << 20))] == [0]
    # LogAppendTime: the broker's time and the timestamp-type bit, CRCs right (parse checks them)
    for codec in (0, 1):
        b = bytearray(records.build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0, timestamp=5, codec=codec))
        records.set_max_timestamp(b, 0, len(b), 777)
        msgs = parse_message_set(legacy_records.down_convert([bytes(b)], 1, 1 << 20))
        assert all(m[2] & 0x08 and m[3] == 777 for m in msgs), msgs


def test_raw_produce_old_limits(kb, topic_name):
    """MESSAGE_TOO_LARGE per message (max.message.bytes) and INVALID_TIMESTAMP for a v1
    timestamp out of message.timestamp.difference.max.ms, as Kafka's LogValidator."""
    create_topic(kb.bootstrap, topic_name, config={"max.message.bytes": "1000", "message.timestamp.difference.max.ms": "60000"})
    now = int(time.time() * 1000)
    with OldClient(kb.bootstrap) as c:
        def produce(data):
            r = c.old(old_produce.ProduceRequest_v2(acks=1, timeout_ms=10000, topic_data=[(topic_name, [(0, data)])]), old_produce.ProduceResponse_v2)
            return r.responses[0][1][0][1]

        assert produce(spec_message(1, 0, None, b"x" * 2000, now)) == ErrorCode.message_too_large
        # each message under the limit, the converted batch over it: Kafka re-checks a
        # converted batch (UnifiedLog.append: messageSizeMaybeChanged)
        assert produce(b"".join(spec_message(1, i, None, b"y" * 400, now) for i in range(5))) == ErrorCode.message_too_large
        assert produce(b"".join(spec_message(1, i, None, b"y" * 100, now) for i in range(5))) == 0
        assert produce(spec_message(1, 0, None, b"old", now - 3_600_000)) == ErrorCode.invalid_timestamp
        assert produce(spec_message(1, 0, None, b"now", now)) == 0


def test_raw_fetch_old_zstd(kb, topic_name):
    create_topic(kb.bootstrap, topic_name)
    with RawClient(kb.bootstrap) as c:
        assert c.produce(topic_name, 0, records.build_batch([(b"k", b"v" * 100)], timestamp=int(time.time() * 1000), codec=4)).error_code == 0
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_fetch.FetchRequest_v2(replica_id=-1, max_wait_ms=100, min_bytes=1, topics=[(topic_name, [(0, 0, 1 << 20)])]), old_fetch.FetchResponse_v2)
    [(_name, [(_index, err, hw, data)])] = r.responses
    assert (err, hw, data) == (ErrorCode.unsupported_compression_type, 1, b"")


@pytest.mark.parametrize("fallback", ["0.9.0", "0.8.2"])
def test_librdkafka_without_api_versions(kb, topic_name, fallback):
    """librdkafka told not to ask ApiVersions (api.version.request=false) speaks what the
    broker version it is told had: 0.9.0 (Produce v1, Fetch v1, a consumer group with
    JoinGroup v0 and OffsetCommit v2), 0.8.2 (Produce v0, Fetch v0, ListOffsets v0, no group:
    assign)."""
    from confluent_kafka import Producer

    create_topic(kb.bootstrap, topic_name)
    old = {"api.version.request": False, "broker.version.fallback": fallback}
    m0 = metrics(kb)
    p = Producer({"bootstrap.servers": kb.bootstrap, "linger.ms": 5, "compression.type": "gzip", **old})
    sent = [(f"k{i}".encode(), (f"v{i}-" * 30).encode()) for i in range(5)]
    for k, v in sent:
        p.produce(topic_name, key=k, value=v, partition=0)
    assert p.flush(20) == 0
    group = f"rd-{topic_name}"
    c = Consumer({"bootstrap.servers": kb.bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 50, **old})
    try:
        if fallback == "0.9.0":
            c.subscribe([topic_name])
        else:
            c.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
        got, deadline = [], time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
        assert [(m.offset(), m.key(), m.value()) for m in got] == [(i, k, v) for i, (k, v) in enumerate(sent)]
        if fallback == "0.9.0":
            c.commit(asynchronous=False)
            assert c.committed([TopicPartition(topic_name, 0)], timeout=15)[0].offset == 5
    finally:
        c.close()
    m1 = metrics(kb)
    v = 1 if fallback == "0.9.0" else 0
    assert requests_count(m1, "Produce", v) > requests_count(m0, "Produce", v)
    assert requests_count(m1, "Fetch", v) > requests_count(m0, "Fetch", v)
    if fallback == "0.8.2":  # OFFSET_BEGINNING resolved with ListOffsets v0
        assert requests_count(m1, "ListOffsets", 0) > requests_count(m0, "ListOffsets", 0)
    else:
        assert requests_count(m1, "JoinGroup", 0) > requests_count(m0, "JoinGroup", 0)
    # stored compressed as librdkafka sent it (one message set: one v2 batch)
    from tests.support.wait import wait_until
    from tests.test_clients import segment_batches

    batches = wait_until(lambda: segment_batches(kb.data_dir, topic_name, 0), 10, "a flushed segment")
    assert {attrs & 7 for _b, attrs, _n in batches} == {1}


def test_downconversion_disabled(kb, topic_name):
    """message.downconversion.enable=false: Fetch v0-v3 gets UNSUPPORTED_VERSION (Kafka's
    answer); modern fetches are untouched."""
    create_topic(kb.bootstrap, topic_name, config={"message.downconversion.enable": "false"})
    with RawClient(kb.bootstrap) as c:
        assert c.produce(topic_name, 0, records.build_batch([(b"k", b"v")], timestamp=int(time.time() * 1000))).error_code == 0
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_fetch.FetchRequest_v3(replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 20, topics=[(topic_name, [(0, 0, 1 << 20)])]), old_fetch.FetchResponse_v3)
    assert r.responses[0][1][0][1] == ErrorCode.unsupported_version
    assert [m.value() for m in consume_all(kb.bootstrap, topic_name, 1)] == [b"v"]


def test_offset_for_leader_epoch_v0_v1(kb, topic_name):
    from kafka.protocol.old import offset_for_leader_epoch as old_ofle

    create_topic(kb.bootstrap, topic_name)
    with RawClient(kb.bootstrap) as c:
        assert c.produce(topic_name, 0, records.build_batch([(None, b"a"), (None, b"b")], timestamp=int(time.time() * 1000))).error_code == 0
        epoch = c.metadata([topic_name]).topics[0].partitions[0].leader_epoch
    with OldClient(kb.bootstrap) as c:
        r = c.old(old_ofle.OffsetForLeaderEpochRequest_v0([(topic_name, [(0, epoch), (9, epoch)])]), old_ofle.OffsetForLeaderEpochResponse_v0)
        [(_t, parts)] = r.topics
        assert parts[0] == (0, 0, 2)  # error, partition, end offset
        assert parts[1][0] == ErrorCode.unknown_topic_or_partition
        r = c.old(old_ofle.OffsetForLeaderEpochRequest_v1([(topic_name, [(0, epoch)])]), old_ofle.OffsetForLeaderEpochResponse_v1)
        assert r.topics[0][1][0] == (0, 0, epoch, 2)  # error, partition, leader epoch, end offset


def test_acls_v0(kb_acl):
    """CreateAcls / DescribeAcls / DeleteAcls v0: literal resource names (no pattern type)."""
    with OldClient(kb_acl.bootstrap) as c:
        r = c.old(old_admin.CreateAclsRequest_v0([(2, "orders", "User:alice", "*", 3, 3)]), old_admin.CreateAclsResponse_v0)
        assert r.results == [(0, None)], r
        r = c.old(old_admin.DescribeAclsRequest_v0(2, "orders", None, None, 1, 1), old_admin.DescribeAclsResponse_v0)
        assert r.error_code == 0 and r.resources == [(2, "orders", [("User:alice", "*", 3, 3)])], r
        r = c.old(old_admin.DeleteAclsRequest_v0([(2, "orders", None, None, 1, 1)]), old_admin.DeleteAclsResponse_v0)
        [(err, _msg, matching)] = r.filter_results
        assert err == 0 and [(m[3], m[4], m[6]) for m in matching] == [("orders", "User:alice", 3)], r
        r = c.old(old_admin.DescribeAclsRequest_v0(2, None, None, None, 1, 1), old_admin.DescribeAclsResponse_v0)
        assert r.resources == []


@pytest.fixture(scope="module")
def kb_acl():
    b = BrokerProcess(extra_args=["--authorizer", "acls", "--super-users", "User:ANONYMOUS"]).start()
    yield b
    b.stop()


def _random_value(typ, rng, depth=0):
    from kafka.protocol.old.types import Array, Boolean, Bytes, Int8, Int16, Int32, Int64, Schema, String

    if isinstance(typ, Schema):
        return tuple(_random_value(t, rng, depth + 1) for t in typ.fields)
    if isinstance(typ, Array):
        return [_random_value(typ.array_of, rng, depth + 1) for _ in range(rng.randrange(0, 3))]
    if isinstance(typ, String):
        return rng.choice([None, "", "t", "x" * rng.randrange(1, 20), "\u00e9"])
    if typ is Bytes:
        return rng.choice([None, b"", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))])
    if typ is Boolean:
        return rng.random() < 0.5
    bits = {Int8: 8, Int16: 16, Int32: 32, Int64: 64}[typ]
    return rng.choice([0, -1, 1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1)), rng.randrange(-100, 100)])


def test_random_old_requests_are_answered_or_closed(kb, topic_name):
    """Requests of every old version (kafka.protocol.old) with random field values: each is
    answered in the old version's response format, or its connection is closed; the broker
    logs no internal error and keeps serving."""
    import random

    from kafscale.protocol import legacy

    create_topic(kb.bootstrap, topic_name)
    rng = random.Random(1839)
    answered = 0
    for adapter in legacy.ADAPTERS.values():
        for version, (req_cls, resp_cls) in (adapter.classes or {}).items():
            for _ in range(10):
                values = _random_value(req_cls.SCHEMA, rng)
                if req_cls.API_KEY == 0:
                    values = (1, *values[1:])  # acks=1: an answer to read
                if req_cls.API_KEY == 1:
                    values = (values[0], 0, *values[2:])  # no long poll
                body = req_cls.SCHEMA.encode(values)
                with RawClient(kb.bootstrap, timeout=5) as c:
                    c.send_frame(struct.pack(">hhih", req_cls.API_KEY, version, 5, 1) + b"x" + body)
                    try:
                        payload = c.recv_frame()
                    except Exception:  # noqa: BLE001 - closed (Kafka's answer to what it cannot parse)
                        continue
                assert struct.unpack_from(">i", payload, 0)[0] == 5
                buf = io.BytesIO(payload[4:])
                resp_cls.SCHEMA.decode(buf)
                assert buf.read() == b"", f"{resp_cls.__name__}: trailing bytes"
                answered += 1
    assert answered > 80
    log = kb.log_text()
    assert "Traceback" not in log and "internal error" not in log, [ln for ln in log.splitlines() if "internal error" in ln or "Error" in ln][:5]
