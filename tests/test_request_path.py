"""The request path's steps one by one, without a socket (broker/request_path.py,
broker/authz_checks.py): which step refuses what, with which error code or closing reason.
The same paths over TCP: test_malformed_requests.py, test_old_versions.py, test_sasl.py,
test_acl_enforcement.py, test_quota_enforcement.py."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
import types
import uuid

import pytest

from kafscale.broker import authz_checks, request_path
from kafscale.broker.authz import BrokerAuthorizer
from kafscale.broker.config import BrokerConfig
from kafscale.broker.request_path import CloseConnection
from kafscale.broker.router import RequestContext, build_router
from kafscale.errors import ErrorCode
from kafscale.protocol import error_response
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.codec import RequestHeader
from kafscale.protocol.records import build_batch
from kafscale.security.acl import AclBinding, Authorizer, Operation as Op, PatternType, Permission, ResourceType as Res
from kafscale.security.sasl import SaslSession
from tests.support.raw import decode_response, encode_request, req

ROUTER = build_router()


def payload(api_key: int, version: int, body) -> memoryview:
    return memoryview(bytearray(encode_request(api_key, version, body, 7, "unit")))


def decoded(api_key: int, version: int, frames: list):
    """The response the frames hold (correlation id 7)."""
    data = b"".join(bytes(f) for f in frames)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    correlation_id, value = decode_response(api_key, version, data[4:])
    assert correlation_id == 7
    return value


# -- 1, 2: header and SASL gate ----------------------------------------------------------------


def test_a_frame_too_short_for_a_header_closes():
    with pytest.raises(CloseConnection, match="too short for a request header"):
        request_path.read_api(memoryview(b"\x00\x03\x00"))
    assert request_path.read_api(payload(ApiKey.METADATA, 12, req(3, 12, topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)))[:2] == (3, 12)


def test_before_sasl_authentication_only_the_handshake_apis_pass():
    session = SaslSession(enabled=("PLAIN",))
    for key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
        request_path.sasl_gate(session, key, "SASL")
    with pytest.raises(CloseConnection, match=r"unexpected request produce \(api 0\) before SASL authentication on listener SASL"):
        request_path.sasl_gate(session, ApiKey.PRODUCE, "SASL")


def test_an_expired_sasl_session_may_only_reauthenticate():
    session = SaslSession(enabled=("PLAIN",))
    session.succeeded("User:alice", lifetime_ms=1, now=0.0)
    assert session.expired()
    request_path.sasl_gate(session, ApiKey.SASL_HANDSHAKE, "SASL")
    request_path.sasl_gate(session, ApiKey.SASL_AUTHENTICATE, "SASL")
    with pytest.raises(CloseConnection, match="SASL session of User:alice expired"):
        request_path.sasl_gate(session, ApiKey.METADATA, "SASL")


# -- 3: versions ---------------------------------------------------------------------------------


def test_served_versions_pass_and_others_close_with_the_supported_range():
    produce = ROUTER.get(ApiKey.PRODUCE)
    assert request_path.check_version(produce, ApiKey.PRODUCE, produce.max_version) is None
    too_new = request_path.check_version(produce, ApiKey.PRODUCE, produce.max_version + 1)
    assert not too_new.answer_with_versions
    assert too_new.reason() == f"unsupported request: API key 0 (produce) version {produce.max_version + 1}; supported versions {produce.min_version}-{produce.max_version}"
    assert "(3 more such requests" in too_new.reason(3)
    unknown = request_path.check_version(ROUTER.get(ApiKey.VOTE), ApiKey.VOTE, 0)  # a KRaft API: not served
    assert unknown.reason() == "unsupported request: API key 52 (vote) version 0"
    assert request_path.check_version(None, 999, 0).reason() == "unsupported request: API key 999 (unknown API) version 0"


def test_a_too_new_api_versions_is_answered_with_the_v0_error_and_the_api_list():
    api = ROUTER.get(ApiKey.API_VERSIONS)
    assert request_path.check_version(api, ApiKey.API_VERSIONS, api.max_version + 1).answer_with_versions
    assert not request_path.check_version(api, ApiKey.API_VERSIONS, -1).answer_with_versions  # no version to answer: closed
    answer = decoded(ApiKey.API_VERSIONS, 0, request_path.api_versions_error_frame(ROUTER.apis.values(), 7))
    assert answer.error_code == ErrorCode.unsupported_version
    listed = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert listed == {key: (a.min_version, a.max_version) for key, a in ROUTER.apis.items()}


# -- 4: decoding ---------------------------------------------------------------------------------


def test_decode_reads_header_and_body():
    body = req(3, 12, topics=(req(3, 12, "MetadataRequestTopic", name="t", topic_id=None),), allow_auto_topic_creation=False,
               include_topic_authorized_operations=False)
    call = request_path.decode(ROUTER.get(ApiKey.METADATA), 12, payload(ApiKey.METADATA, 12, body))
    assert (call.version, call.wire_version, call.adapter, call.header.client_id) == (12, 12, None, "unit")
    assert [t.name for t in call.request.topics] == ["t"]


def test_an_old_version_is_converted_to_kios_lowest():
    # DescribeLogDirs v0 is v1's bytes (kio starts at v1)
    data = bytearray(encode_request(ApiKey.DESCRIBE_LOG_DIRS, 1, req(35, 1, topics=None), 7, "unit"))
    data[2:4] = struct.pack(">h", 0)
    call = request_path.decode(ROUTER.get(ApiKey.DESCRIBE_LOG_DIRS), 0, memoryview(data))
    assert (call.version, call.wire_version, call.adapter.kio_version, call.request.topics) == (1, 0, 1, None)


def test_a_truncated_body_closes_the_connection():
    body = req(3, 12, topics=(req(3, 12, "MetadataRequestTopic", name="topic", topic_id=None),), allow_auto_topic_creation=False,
               include_topic_authorized_operations=False)
    whole = payload(ApiKey.METADATA, 12, body)
    with pytest.raises(CloseConnection, match=r"malformed request \(api 3 v12\)"):
        request_path.decode(ROUTER.get(ApiKey.METADATA), 12, whole[:-4])


# -- 5: authorization ----------------------------------------------------------------------------


def allow(res: Res, name: str, op: Op, principal: str = "User:alice") -> AclBinding:
    return AclBinding(res, name, PatternType.LITERAL, principal, "*", op, Permission.ALLOW)


def context(*bindings: AclBinding, api_key: int = 0, version: int = 0) -> RequestContext:
    authz = BrokerAuthorizer(BrokerConfig(authorizer="acls"), metadata=None)
    authz.current = Authorizer(bindings)
    broker = types.SimpleNamespace(authorizer=authz)  # all the rules read of the broker
    return RequestContext(broker, RequestHeader(api_key, version, 7, "unit", 0), "10.0.0.1:4000", principal="User:alice")


def denied(ctx, api_key: int, request):
    return asyncio.run(authz_checks.denied(ctx, api_key, request))


def test_group_apis_need_read_on_the_group():
    heartbeat = req(12, 4, group_id="g1", generation_id=1, member_id="m", group_instance_id=None)
    assert denied(context(allow(Res.GROUP, "g1", Op.READ)), ApiKey.HEARTBEAT, heartbeat) is None
    code, reason = denied(context(allow(Res.GROUP, "g2", Op.READ)), ApiKey.HEARTBEAT, heartbeat)
    assert (code, reason) == (ErrorCode.group_authorization_failed, "User:alice may not READ GROUP g1")


def test_create_topics_needs_create_on_the_cluster_or_the_topic():
    topic = req(19, 7, "CreatableTopic", name="orders", num_partitions=1, replication_factor=1, assignments=(), configs=())
    create = req(19, 7, topics=(topic,), timeout=1000, validate_only=False)
    assert denied(context(allow(Res.TOPIC, "orders", Op.CREATE)), ApiKey.CREATE_TOPICS, create) is None
    assert denied(context(allow(Res.CLUSTER, "kafka-cluster", Op.CREATE)), ApiKey.CREATE_TOPICS, create) is None
    code, _ = denied(context(), ApiKey.CREATE_TOPICS, create)
    assert code == ErrorCode.topic_authorization_failed  # the last option's type answers


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic():
    init = req(22, 5, transactional_id=None, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)
    assert denied(context(allow(Res.TOPIC, "any", Op.WRITE)), ApiKey.INIT_PRODUCER_ID, init) is None
    assert denied(context(allow(Res.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE)), ApiKey.INIT_PRODUCER_ID, init) is None
    assert denied(context(allow(Res.TOPIC, "any", Op.READ)), ApiKey.INIT_PRODUCER_ID, init)[0] == ErrorCode.cluster_authorization_failed
    transactional = dataclasses.replace(init, transactional_id="tx")
    assert denied(context(allow(Res.TOPIC, "any", Op.WRITE)), ApiKey.INIT_PRODUCER_ID, transactional)[0] == ErrorCode.transactional_id_authorization_failed


def test_add_offsets_to_txn_from_a_broker_needs_cluster_action_only():
    add = req(25, 4, transactional_id="tx", producer_id=1, producer_epoch=0, group_id="g")
    assert denied(context(allow(Res.CLUSTER, "kafka-cluster", Op.CLUSTER_ACTION)), ApiKey.ADD_OFFSETS_TO_TXN, add) is None
    client = context(allow(Res.TRANSACTIONAL_ID, "tx", Op.WRITE))
    assert denied(client, ApiKey.ADD_OFFSETS_TO_TXN, add) == (ErrorCode.group_authorization_failed, "User:alice may not READ GROUP g")


def test_apis_without_a_rule_need_nothing():
    assert authz_checks.RULES.get(ApiKey.API_VERSIONS) is None
    assert denied(context(), ApiKey.API_VERSIONS, req(18, 3, client_software_name="x", client_software_version="1")) is None


def list_offsets(*topics: str):
    part = req(2, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1)
    return req(2, 7, replica_id=-1, isolation_level=0, topics=tuple(req(2, 7, "ListOffsetsTopic", name=t, partitions=(part,)) for t in topics))


def test_denied_topics_are_split_off_and_merged_back_with_topic_authorization_failed():
    ctx = context(allow(Res.TOPIC, "open", Op.DESCRIBE), api_key=2, version=7)
    serve, denied_request, refusal = asyncio.run(authz_checks.authorize(ctx, ApiKey.LIST_OFFSETS, list_offsets("open", "closed")))
    assert refusal is None
    assert [t.name for t in serve.topics] == ["open"] and [t.name for t in denied_request.topics] == ["closed"]
    answered = error_response.build(ApiKey.LIST_OFFSETS, 7, serve, ErrorCode.none)
    merged = authz_checks.merge_denied(ApiKey.LIST_OFFSETS, 7, answered, denied_request)
    assert [(t.name, t.partitions[0].error_code) for t in merged.topics] == [("open", ErrorCode.none), ("closed", ErrorCode.topic_authorization_failed)]


def test_all_topics_denied_refuses_the_request_whole():
    ctx = context(api_key=2, version=7)
    _, denied_request, refusal = asyncio.run(authz_checks.authorize(ctx, ApiKey.LIST_OFFSETS, list_offsets("a", "b")))
    assert denied_request is None and refusal == (ErrorCode.topic_authorization_failed, "User:alice may not DESCRIBE TOPIC a")
    call = request_path.Call(ROUTER.get(ApiKey.LIST_OFFSETS), RequestHeader(2, 7, 7, "unit", 0), list_offsets("a", "b"), 7)
    answer = decoded(ApiKey.LIST_OFFSETS, 7, request_path.refusal_frame(call, 7, refusal))
    assert [(t.name, t.partitions[0].error_code) for t in answer.topics] == [("a", ErrorCode.topic_authorization_failed), ("b", ErrorCode.topic_authorization_failed)]


def produce(acks: int, *topics: str):
    part = req(0, 9, "PartitionProduceData", index=0, records=build_batch([(b"k", b"v")]))
    return req(0, 9, transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=1),
               topic_data=tuple(req(0, 9, "TopicProduceData", name=t, partition_data=(part,)) for t in topics))


def test_an_acks_0_produce_with_a_denied_topic_closes_the_connection():
    ctx = context(allow(Res.TOPIC, "open", Op.WRITE))
    _, _, refusal = asyncio.run(authz_checks.authorize(ctx, ApiKey.PRODUCE, produce(0, "open", "closed")))
    assert refusal[0] == ErrorCode.topic_authorization_failed  # refused whole: no answer can carry the split
    call = request_path.Call(ROUTER.get(ApiKey.PRODUCE), RequestHeader(0, 9, 7, "unit", 0), produce(0, "open", "closed"), 9)
    with pytest.raises(CloseConnection, match="acks=0 produce refused: User:alice may not WRITE TOPIC closed"):
        request_path.refusal_frame(call, 7, refusal)
    served, denied_request, refusal = asyncio.run(authz_checks.authorize(ctx, ApiKey.PRODUCE, produce(-1, "open", "closed")))
    assert refusal is None and [t.name for t in served.topic_data] == ["open"] and [t.name for t in denied_request.topic_data] == ["closed"]


def test_a_refused_fetch_names_the_error_in_every_partition():
    fp = req(1, 12, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1)
    fetch = req(1, 12, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1, isolation_level=0, session_id=0, session_epoch=-1,
                topics=(req(1, 12, "FetchTopic", topic="t", partitions=(fp, dataclasses.replace(fp, partition=1))),), forgotten_topics_data=(), rack_id="")
    call = request_path.Call(ROUTER.get(ApiKey.FETCH), RequestHeader(1, 12, 7, "unit", 0), fetch, 12)
    answer = decoded(ApiKey.FETCH, 12, request_path.refusal_frame(call, 7, (ErrorCode.topic_authorization_failed, "no")))
    assert [(p.partition_index, p.error_code) for p in answer.responses[0].partitions] == [(0, ErrorCode.topic_authorization_failed), (1, ErrorCode.topic_authorization_failed)]


# -- 8, 9: quotas and encoding -------------------------------------------------------------------


def test_a_throttle_goes_into_the_response_unless_it_says_more():
    answered = error_response.build(ApiKey.LIST_OFFSETS, 7, list_offsets("t"), ErrorCode.none)
    assert request_path.with_throttle(answered, 250).throttle_time == datetime.timedelta(milliseconds=250)
    slower = dataclasses.replace(answered, throttle_time=datetime.timedelta(milliseconds=900))
    assert request_path.with_throttle(slower, 250).throttle_time == datetime.timedelta(milliseconds=900)
    assert request_path.with_throttle(None, 250) is None  # Produce acks=0: nothing to say it in


def metadata_v10(*names):
    topics = tuple(req(3, 10, "MetadataRequestTopic", name=n, topic_id=uuid.UUID(int=0)) for n in names)
    return req(3, 10, topics=topics, allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
               include_topic_authorized_operations=False)


def test_an_unencodable_response_is_answered_with_the_fallback():
    request = metadata_v10("a", "named")
    call = request_path.Call(ROUTER.get(ApiKey.METADATA), RequestHeader(3, 10, 7, "unit", 0), request, 10)
    fine = error_response.build(ApiKey.METADATA, 10, request, ErrorCode.none)
    unencodable = dataclasses.replace(fine, topics=(dataclasses.replace(fine.topics[0], name=None), fine.topics[1]))
    codes = []

    def fallback(exc, code):
        codes.append(code)
        return error_response.build(ApiKey.METADATA, 10, request, code)

    frames = request_path.encode_answer(call, 7, unencodable, fallback)
    assert codes == [ErrorCode.invalid_request]
    answer = decoded(ApiKey.METADATA, 10, frames)
    assert [(t.name, t.error_code) for t in answer.topics] == [("a", ErrorCode.invalid_request), ("named", ErrorCode.invalid_request)]
    with pytest.raises(CloseConnection, match=r"no encodable response to api 3 v10"):
        request_path.encode_answer(call, 7, unencodable, lambda exc, code: unencodable)
