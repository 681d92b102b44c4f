"""Requests whose lengths, counts or nulls do not fit their schema.

The first three are the frames a fuzzer found that killed the whole broker process
(SIGABRT: "memory allocation of ... failed" in kio's native decoder, which reserved an
array's capacity from its declared count). Each malformed request must be answered with
an error or get its connection closed, with one log line and no traceback, and the
broker must keep serving everyone else.

Below them, in-process checks of the schema validator (every well-formed request of
every served API passes it) and of the generic error-response builder.
"""

from __future__ import annotations

import io
import random
import socket
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from kafscale.protocol import codec, error_response, validate
from kafscale.protocol.records import build_batch
from tests.support.broker import BrokerProcess
from tests.support.raw import ConnectionClosed, RawClient, decode_response, encode_request, frame, req
from tests.support.samples import sample_body, sample_request, served_versions

DESCRIBE_GROUPS, JOIN_GROUP, FETCH, FIND_COORDINATOR, OFFSET_FETCH, SYNC_GROUP = 15, 11, 1, 10, 9, 14
PRODUCE, METADATA, CREATE_TOPICS = 0, 3, 19
COMPACT_LENGTH_2_32_MINUS_1 = b"\xff\xff\xff\xff\x0f"  # uvarint 2^32-1: a compact array of 2^32-2
VARINT_BOMB = b"\xff" * 9 + b"\x01"  # a 10-byte varint (more than a uvarint may have)


@pytest.fixture(scope="module")
def lone_broker():
    """A private broker: a regression here kills it, not the session's shared one."""
    b = BrokerProcess(extra_args=["--group-initial-rebalance-delay-ms", "0"]).start()
    yield b
    b.stop()


def header(api_key: int, version: int, corr: int = 1, client_id: bytes = b"ab", flexible: bool = True) -> bytes:
    return struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id + (b"\x00" if flexible else b"")


def compact_string(s: bytes) -> bytes:
    assert len(s) < 127
    return bytes([len(s) + 1]) + s


def assert_serving(b: BrokerProcess) -> None:
    """The process is alive, a Metadata request on a fresh connection is answered, and
    the log has no traceback."""
    assert b.proc is not None and b.proc.poll() is None, f"broker exited with {b.proc.returncode}:\n{b.log_text()[-3000:]}"
    with RawClient(b.bootstrap, timeout=5) as c:
        md = c.metadata([], version=12)
        assert len(md.brokers) == 1
    assert "Traceback" not in b.log_text(), b.log_text()[-3000:]


def closed_or_error(c: RawClient, corr: int) -> bytes | None:
    """The broker's answer to a bad request: None when it closed the connection, else the
    response payload (checked to carry the request's correlation id)."""
    try:
        resp = c.recv_frame()
    except (ConnectionClosed, socket.timeout):
        return None
    assert struct.unpack_from(">i", resp, 0)[0] == corr
    return resp


def send_and_expect_close(b: BrokerProcess, payload: bytes, what: str) -> None:
    before = b.log_text().count("closing connection")
    with RawClient(b.bootstrap) as c:
        c.send_frame(payload)
        assert c.wait_closed(5), f"{what}: the connection was kept"
    assert_serving(b)
    log = b.log_text()
    assert log.count("closing connection") == before + 1, log[-2000:]


# ---------------------------------------------------------------------------------------
# the frames that killed the process


def test_describe_groups_v5_compact_array_length_2_32_minus_1(lone_broker):
    payload = header(DESCRIBE_GROUPS, 5) + COMPACT_LENGTH_2_32_MINUS_1 + b"\x00\x00"
    assert len(frame(payload)) == 24
    send_and_expect_close(lone_broker, payload, "DescribeGroups v5 with 2^32-2 groups")
    assert "groups: 4294967294 elements cannot fit" in lone_broker.log_text()


def test_join_group_v7_huge_protocols_count(lone_broker):
    body = (compact_string(b"g") + struct.pack(">ii", 10_000, 10_000) + compact_string(b"") + b"\x00"  # null instance id
            + compact_string(b"consumer") + b"\xfe\xff\xff\xff\x0f" + compact_string(b"range") + b"\x01\x00\x00")
    send_and_expect_close(lone_broker, header(JOIN_GROUP, 7) + body, "JoinGroup v7 with 2^32-3 protocols")


@pytest.mark.parametrize("bomb", [VARINT_BOMB, COMPACT_LENGTH_2_32_MINUS_1], ids=["10-byte-varint", "2^32-1"])
def test_fetch_v16_varint_bomb(lone_broker, bomb):
    # max_wait, min_bytes, max_bytes, isolation_level, session_id, session_epoch, then the topics count
    body = struct.pack(">iiibii", 100, 1, 1 << 20, 0, 0, -1) + bomb + b"\x00" * 8
    send_and_expect_close(lone_broker, header(FETCH, 16) + body, "Fetch v16 with a varint bomb")


def test_fetch_v16_partitions_count_bomb(lone_broker):
    """The huge count one level down: one topic whose partitions array claims 2^32-2."""
    body = (struct.pack(">iiibii", 100, 1, 1 << 20, 0, 0, -1) + b"\x02" + b"\x11" * 16 + COMPACT_LENGTH_2_32_MINUS_1
            + b"\x00" * 30)
    send_and_expect_close(lone_broker, header(FETCH, 16) + body, "Fetch v16 with 2^32-2 partitions")


# ---------------------------------------------------------------------------------------
# nulls where the schema has none, and strings that are not UTF-8


def test_find_coordinator_v6_null_coordinator_keys(lone_broker):
    send_and_expect_close(lone_broker, header(FIND_COORDINATOR, 6) + b"\x00" + b"\x00" + b"\x00", "null coordinator_keys")


def test_offset_fetch_v9_null_partition_indexes(lone_broker):
    group = compact_string(b"g") + compact_string(b"member") + struct.pack(">i", -1)  # group_id, member_id, member_epoch
    topic = compact_string(b"t") + b"\x00" + b"\x00"  # name, partition_indexes null, tags
    body = b"\x02" + group + b"\x02" + topic + b"\x00" + b"\x00" + b"\x00"  # groups[1]{..., topics[1]}, require_stable, tags
    send_and_expect_close(lone_broker, header(OFFSET_FETCH, 9) + body, "null partition_indexes")


def test_sync_group_v3_null_assignments(lone_broker):
    s = lambda v: struct.pack(">h", len(v)) + v  # noqa: E731
    body = s(b"g") + struct.pack(">i", 1) + s(b"member") + struct.pack(">h", -1) + struct.pack(">i", -1)
    send_and_expect_close(lone_broker, header(SYNC_GROUP, 3, flexible=False) + body, "null assignments")


@pytest.mark.parametrize("api_key,version", [(METADATA, 12), (METADATA, 4), (CREATE_TOPICS, 7)])
def test_non_utf8_topic_name_closes_connection(lone_broker, api_key, version):
    name = "bad-\ufffd-name"
    if api_key == METADATA:
        body = req(METADATA, version, topics=(req(METADATA, version, "MetadataRequestTopic", name=name),), allow_auto_topic_creation=True,
                   include_topic_authorized_operations=False, include_cluster_authorized_operations=False)
    else:
        body = req(CREATE_TOPICS, version, topics=(req(CREATE_TOPICS, version, "CreatableTopic", name=name, num_partitions=1, replication_factor=1,
                                                        assignments=(), configs=()),), timeout=1000, validate_only=False)
    payload = encode_request(api_key, version, body, correlation_id=5).replace("\ufffd".encode(), b"\xff\xfe\xfd")
    send_and_expect_close(lone_broker, payload, f"api {api_key} v{version} with a non-UTF-8 topic name")


@pytest.mark.parametrize("version", [3, 9])
def test_non_utf8_topic_name_in_produce_is_invalid_topic(lone_broker, version):
    """Kafka decodes strings with `new String(bytes, UTF_8)` (invalid bytes replaced), so a
    Produce to such a name is answered like one to any topic that does not exist."""
    p = req(PRODUCE, version, "PartitionProduceData", index=0, records=build_batch([(None, b"x")], timestamp=1_700_000_000_000))
    t = req(PRODUCE, version, "TopicProduceData", name="bad-\ufffd-name", partition_data=(p,))
    body = req(PRODUCE, version, transactional_id=None, acks=-1, timeout=5000, topic_data=(t,))
    payload = encode_request(PRODUCE, version, body, correlation_id=8).replace("\ufffd".encode(), b"\xff\xfe\xfd")
    with RawClient(lone_broker.bootstrap) as c:
        c.send_frame(payload)
        resp = closed_or_error(c, 8)
        assert resp is not None, "the Produce request was not answered"
        _corr, r = decode_response(PRODUCE, version, resp)
        part = r.responses[0].partition_responses[0]
        assert part.error_code in (ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_topic_exception) and part.base_offset == -1
    assert_serving(lone_broker)


@pytest.mark.parametrize("version", [3, 9])
def test_null_topic_name_in_produce_closes_connection(lone_broker, version):
    flexible = version >= 9
    batch = build_batch([(None, b"x")], timestamp=1_700_000_000_000)
    if flexible:
        body = (b"\x00" + struct.pack(">hi", -1, 5000) + b"\x02" + b"\x00"  # null txn id, acks, timeout, topics[1], null name
                + b"\x02" + struct.pack(">i", 0) + bytes([len(batch) + 1]) + batch + b"\x00" + b"\x00" + b"\x00")
    else:
        body = (struct.pack(">hhii", -1, -1, 5000, 1) + struct.pack(">h", -1)
                + struct.pack(">ii", 1, 0) + struct.pack(">i", len(batch)) + batch)
    send_and_expect_close(lone_broker, header(PRODUCE, version, flexible=flexible) + body, "Produce with a null topic name")


# ---------------------------------------------------------------------------------------
# the validator and the error-response builder, in process


def test_validator_accepts_every_well_formed_request():
    """Random well-formed bodies of every served API/version: the validator ends exactly
    where kio's decoder does, and both consume the whole body."""
    rng = random.Random(20)
    for api_key, version in served_versions():
        cls = codec.schema(api_key, version, "request")
        for _ in range(15):
            body = sample_body(api_key, version, rng)
            end = validate.check(cls, memoryview(body), 0)
            _value, size = codec._reader(cls)(memoryview(body), 0)
            assert end == size == len(body), (api_key, version)


def test_generated_checkers_agree_with_the_plan_interpreter():
    """The straight-line checkers the broker runs and the plan interpreter accept and
    reject the same mutated bodies, and end at the same place."""
    from tests.test_fuzz import mutate

    rng = random.Random(11)
    apis = served_versions()
    accepted = 0
    for _ in range(4000):
        api_key, version = rng.choice(apis)
        cls = codec.schema(api_key, version, "request")
        body = b"\0" * 12 + sample_body(api_key, version, rng)  # mutate() spares a 12-byte header
        buf = memoryview(bytearray(mutate(body, rng)[12:]))
        results = []
        for check in (validate.check, validate.check_interpreted):
            try:
                results.append(check(cls, buf, 0))
            except validate.InvalidRequestBody:
                results.append("malformed")
        assert results[0] == results[1], (api_key, version, bytes(buf).hex())
        accepted += results[0] != "malformed"
    assert 200 < accepted < 3800  # both outcomes were exercised


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_validator_rejects_truncation_and_overstated_lengths(cut):
    body = sample_body(METADATA, 12, random.Random(cut))
    cls = codec.schema(METADATA, 12, "request")
    t = req(METADATA, 12, "MetadataRequestTopic", name="some-topic")
    full = io.BytesIO()
    entity_writer(type(t))(full, t)
    whole = b"\x02" + full.getvalue() + b"\x00\x00\x00"  # topics[1], bools, tags
    assert validate.check(cls, memoryview(whole), 0) == len(whole)
    with pytest.raises(validate.InvalidRequestBody):
        validate.check(cls, memoryview(whole[: max(1, len(whole) - cut)]), 0)
    bumped = bytearray(whole)
    bumped[0] = 0x7F  # 126 topics in a few bytes
    with pytest.raises(validate.InvalidRequestBody, match="cannot fit"):
        validate.check(cls, memoryview(bumped), 0)
    assert body  # the sample itself is well formed
    assert validate.check(cls, memoryview(body), 0) == len(body)


def test_error_response_for_every_served_api():
    """Every served API/version gets an encodable error response that names what the
    request named, with the error code in every entry."""
    rng = random.Random(7)
    for api_key, version in served_versions():
        request = sample_request(api_key, version, rng)
        resp = error_response.build(api_key, version, request, ErrorCode.not_coordinator.value)
        if api_key == PRODUCE and request.acks == 0:
            assert resp is None
            continue
        payload = b"".join(codec.encode_response(api_key, version, 99, resp))[4:]
        corr, back = decode_response(api_key, version, payload)
        # compared re-encoded: kio reads an all-zero uuid back as None
        assert corr == 99 and b"".join(codec.encode_response(api_key, version, 99, back))[4:] == payload
        codes = {code for code in _error_codes(back)}
        assert codes <= {ErrorCode.not_coordinator}, (api_key, version, back)


def _error_codes(entity):
    for name in getattr(entity, "__dataclass_fields__", ()):
        value = getattr(entity, name)
        if isinstance(value, ErrorCode):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                yield from _error_codes(item)
        else:
            yield from _error_codes(value)


def test_error_response_mirrors_the_request():
    fp = lambda p: req(FETCH, 12, "FetchPartition", partition=p, fetch_offset=5, partition_max_bytes=1000)  # noqa: E731
    fetch = req(FETCH, 12, max_wait=10, min_bytes=1, max_bytes=1000, isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                topics=(req(FETCH, 12, "FetchTopic", topic="a", partitions=(fp(0), fp(3))),), forgotten_topics_data=())
    r = error_response.build(FETCH, 12, fetch, ErrorCode.unknown_server_error.value)
    assert r.error_code == ErrorCode.unknown_server_error
    [t] = r.responses
    assert t.topic == "a" and [(p.partition_index, p.error_code, p.high_watermark, p.records) for p in t.partitions] == [
        (0, ErrorCode.unknown_server_error, -1, b""), (3, ErrorCode.unknown_server_error, -1, b"")]  # empty records, not null
    groups = req(DESCRIBE_GROUPS, 5, groups=("g1", "g2"), include_authorized_operations=False)
    r = error_response.build(DESCRIBE_GROUPS, 5, groups, ErrorCode.coordinator_not_available.value)
    assert [(g.group_id, g.error_code) for g in r.groups] == [("g1", ErrorCode.coordinator_not_available), ("g2", ErrorCode.coordinator_not_available)]
    keys = req(FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g",))
    r = error_response.build(FIND_COORDINATOR, 4, keys, ErrorCode.coordinator_load_in_progress.value)
    assert [(c.key, c.error_code, c.node_id) for c in r.coordinators] == [("g", ErrorCode.coordinator_load_in_progress, -1)]
    p = req(PRODUCE, 9, "PartitionProduceData", index=2, records=b"")
    produce = req(PRODUCE, 9, transactional_id=None, acks=-1, timeout=10, topic_data=(req(PRODUCE, 9, "TopicProduceData", name="t", partition_data=(p,)),))
    r = error_response.build(PRODUCE, 9, produce, ErrorCode.not_leader_or_follower.value)
    part = r.responses[0].partition_responses[0]
    assert (r.responses[0].name, part.index, part.error_code, part.base_offset) == ("t", 2, ErrorCode.not_leader_or_follower, -1)
    assert error_response.error_code_for(RuntimeError("x")) == ErrorCode.unknown_server_error.value


# ---------------------------------------------------------------------------------------
# well-formed requests the fuzzer found handlers tripping over


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_null_topic_name_before_v12_is_invalid_request(lone_broker, version):
    """v10-11 have nullable names but no lookup by id: Kafka refuses such a request with
    INVALID_REQUEST in every topic entry (a handler traceback before)."""
    topics = (req(METADATA, version, "MetadataRequestTopic", name=None), req(METADATA, version, "MetadataRequestTopic", name="named"))
    body = req(METADATA, version, topics=topics, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
               include_topic_authorized_operations=False)
    with RawClient(lone_broker.bootstrap) as c:
        r = c.request(METADATA, version, body)
        assert [(t.name, t.error_code) for t in r.topics] == [("", ErrorCode.invalid_request), ("named", ErrorCode.invalid_request)]
        assert c.metadata([], version=12).brokers  # the connection stays usable
    assert_serving(lone_broker)


@pytest.mark.parametrize("version", [12, 13])
def test_metadata_topic_without_name_or_id(lone_broker, version):
    body = req(METADATA, version, topics=(req(METADATA, version, "MetadataRequestTopic", name=None, topic_id=None),),
               allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    with RawClient(lone_broker.bootstrap) as c:
        [t] = c.request(METADATA, version, body).topics
        assert (t.name, t.error_code, t.partitions) == (None, ErrorCode.unknown_topic_id, ())
    assert_serving(lone_broker)


@pytest.mark.parametrize("name,version", [("", "1.0"), ("bad name", "1.0"), ("client", "1.0-"), ("client", "x_y")])
def test_api_versions_with_invalid_client_software_is_invalid_request(lone_broker, name, version):
    """Kafka's ApiVersionsRequest.isValid(): names and versions are [a-zA-Z0-9] with '-' and
    '.' inside; anything else is answered INVALID_REQUEST with no API list."""
    with RawClient(lone_broker.bootstrap) as c:
        r = c.request(18, 3, req(18, 3, client_software_name=name, client_software_version=version))
        assert (r.error_code, r.api_keys) == (ErrorCode.invalid_request, ())
        ok = c.request(18, 3, req(18, 3, client_software_name="apache-kafka-java", client_software_version="3.7.0"))
        assert ok.error_code == ErrorCode.none and len(ok.api_keys) > 10
    assert_serving(lone_broker)
