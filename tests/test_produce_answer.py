"""Produce answers encoded by hand (protocol/produce_response.py) are the bytes kio writes
for the same response, in every version kio has; with authorization's refusals (kio
entries) merged in, a quota's throttle, errors, record errors and topic ids."""

from __future__ import annotations

import uuid

import pytest

from kafscale.broker import authz_checks, request_path
from kafscale.errors import ErrorCode
from kafscale.protocol import codec
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.protocol.produce_response import PartitionAnswer, ProduceAnswer, TopicAnswer
from tests.support.raw import decode_response, req

TOPIC_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PARTITIONS = [
    PartitionAnswer(0, ErrorCode.none, 41, -1, 0),
    PartitionAnswer(3, ErrorCode.none, 7, 1_700_000_000_123, 5),
    PartitionAnswer(1, ErrorCode.invalid_record, -1, -1, -1, ((0, "bad key"), (2, None)), "record 0 has no key"),
    PartitionAnswer(2, ErrorCode.not_leader_or_follower, -1, -1, -1, (), "moved"),
]


def kio_answer(version: int, topics: list[TopicAnswer], throttle_ms: int = 0):
    cls = response(ApiKey.PRODUCE, version)
    topic_cls, part_cls = nested(cls, "TopicProduceResponse"), nested(cls, "PartitionProduceResponse")
    return make(cls, throttle_time=throttle_ms, responses=tuple(
        make(topic_cls, name=t.name, topic_id=t.topic_id, partition_responses=tuple(
            make(part_cls, index=p.index, error_code=p.error_code, base_offset=p.base_offset, log_append_time=p.log_append_time,
                 log_start_offset=p.log_start_offset, error_message=p.error_message,
                 record_errors=tuple({"batch_index": i, "batch_index_error_message": m} for i, m in p.record_errors))
            for p in t.partition_responses))
        for t in topics))  # fmt: skip


VERSIONS = range(codec.kio_versions(ApiKey.PRODUCE)[0], codec.kio_versions(ApiKey.PRODUCE)[1] + 1)


@pytest.mark.parametrize("version", VERSIONS)
def test_hand_encoded_answers_are_the_bytes_kio_writes(version):
    topics = [TopicAnswer("orders", TOPIC_ID, PARTITIONS), TopicAnswer("payments", TOPIC_ID, PARTITIONS[:1]), TopicAnswer("empty", TOPIC_ID, [])]
    for throttle in (0, 250):
        ours = request_path.with_throttle(ProduceAnswer(version, topics), throttle) if throttle else ProduceAnswer(version, topics)
        frame = b"".join(ours.encode_frame(17))
        assert frame == codec.encode_response(ApiKey.PRODUCE, version, 17, kio_answer(version, topics, throttle))[0], f"v{version} throttle {throttle}"
        got, decoded = decode_response(ApiKey.PRODUCE, version, frame[4:])
        assert got == 17 and [p.base_offset for p in decoded.responses[0].partition_responses] == [41, 7, -1, -1]


@pytest.mark.parametrize("version", [VERSIONS[0], 9, VERSIONS[-1]])
def test_refused_topics_merged_in_are_written_by_kio(version):
    name = "refused"
    td = req(ApiKey.PRODUCE, version, "TopicProduceData", name=name, topic_id=TOPIC_ID,
             partition_data=(req(ApiKey.PRODUCE, version, "PartitionProduceData", index=4, records=b""),))
    denied = req(ApiKey.PRODUCE, version, transactional_id=None, acks=-1, timeout=1000, topic_data=(td,))
    allowed = [TopicAnswer("orders", TOPIC_ID, PARTITIONS[:2])]
    merged = authz_checks.merge_denied(ApiKey.PRODUCE, version, ProduceAnswer(version, allowed), denied)
    refused = authz_checks.refused(ApiKey.PRODUCE, version, denied, ErrorCode.topic_authorization_failed)
    expected = dataclass_replace(kio_answer(version, allowed), responses=kio_answer(version, allowed).responses + refused.responses)
    assert b"".join(merged.encode_frame(3)) == codec.encode_response(ApiKey.PRODUCE, version, 3, expected)[0]
    _, decoded = decode_response(ApiKey.PRODUCE, version, b"".join(merged.encode_frame(3))[4:])
    assert [p.error_code for p in decoded.responses[1].partition_responses] == [ErrorCode.topic_authorization_failed]


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)
