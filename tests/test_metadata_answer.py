"""Metadata answers put together from topic entries encoded once (protocol/metadata_response.py,
handlers/metadata.py): in every version the bytes are those kio writes for the response
they decode to, the same when asked again (from the kept entries), with a quota's throttle,
and they change when the topic does.

A broker built in this process (not listening), its request path fed request frames."""

from __future__ import annotations

import struct

import pytest

from kafscale.broker import request_path, topics
from kafscale.broker.app import Broker
from kafscale.broker.config import BrokerConfig
from kafscale.broker.router import RequestContext
from kafscale.broker.server import KafkaConnection
from kafscale.protocol import codec
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.codec import kio_versions
from tests.support.raw import decode_response, encode_request, error_code, req

BIG, SMALL, MISSING = "answer-big", "answer-small", "answer-missing"


@pytest.fixture
async def broker(tmp_path):
    b = Broker(BrokerConfig(listen="127.0.0.1:0", data_dir=str(tmp_path), http=""))
    await topics.create(b, BIG, 300, {})
    await topics.create(b, SMALL, 1, {})
    yield b
    await b.metadata.close()


def metadata_request(version: int, names, ops: bool = False):
    named = None if names is None else tuple(req(ApiKey.METADATA, version, "MetadataRequestTopic", name=n) for n in names)
    return req(ApiKey.METADATA, version, topics=named, allow_auto_topic_creation=False,
               include_topic_authorized_operations=ops, include_cluster_authorized_operations=ops)


async def answer(broker, version: int, body, correlation_id: int) -> bytes:
    frames = await broker.server.handle(KafkaConnection(broker.server), bytearray(encode_request(ApiKey.METADATA, version, body, correlation_id)))
    data = b"".join(frames)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4, "length prefix"
    return data[4:]


def kio_bytes(version: int, payload: bytes):
    """(the decoded response, the frame kio writes for it) of an answer's payload."""
    correlation_id, decoded = decode_response(ApiKey.METADATA, version, payload)
    return decoded, codec.encode_response(ApiKey.METADATA, version, correlation_id, decoded)[0][4:]


@pytest.mark.parametrize("version", range(kio_versions(ApiKey.METADATA)[0], kio_versions(ApiKey.METADATA)[1] + 1))
async def test_answers_are_the_bytes_kio_writes_in_every_version(broker, version):
    asks = [metadata_request(version, [BIG, MISSING, SMALL])]
    asks.append(metadata_request(version, [] if version == 0 else None))  # every topic
    if version >= 8:
        asks.append(metadata_request(version, [SMALL, BIG], ops=True))
    for body in asks:
        first = await answer(broker, version, body, 7)
        decoded, written = kio_bytes(version, first)
        assert first == written, f"v{version}: answer differs from kio's encoding of what it decodes to"
        by_name = {t.name: t for t in decoded.topics}
        big = by_name[BIG]
        assert error_code(big.error_code) == 0 and [p.partition_index for p in big.partitions] == list(range(300))
        assert {p.leader_id for p in big.partitions} == {broker.cluster.local.node_id}
        assert [p.partition_index for p in by_name[SMALL].partitions] == [0]
        if body.topics:
            order = [t.name for t in body.topics]
            assert [t.name for t in decoded.topics] == order, "topics in the order asked"
        if MISSING in by_name and version >= 4:  # v0-3 create topics they name
            assert error_code(by_name[MISSING].error_code) == 3 and by_name[MISSING].partitions == ()  # UNKNOWN_TOPIC_OR_PARTITION
        if version >= 8 and body.include_topic_authorized_operations:
            assert big.topic_authorized_operations != -(2**31), "authorized operations asked for and left out"
        again = await answer(broker, version, body, 8)  # from the kept entries
        assert again[:4] == struct.pack(">i", 8) and again[4:] == first[4:]


async def test_a_throttle_is_written_into_the_answer(broker):
    body = metadata_request(12, [BIG])
    await answer(broker, 12, body, 3)  # the entry is kept
    ctx = RequestContext(broker, codec.RequestHeader(ApiKey.METADATA, 12, 4, "unit", 0), "127.0.0.1:1")
    handled = await broker.router.get(ApiKey.METADATA).handler(ctx, body)
    throttled = request_path.with_throttle(handled, 250)
    payload = throttled.encode_frame(4)[0][4:]
    decoded, written = kio_bytes(12, payload)
    assert decoded.throttle_time.total_seconds() == 0.25 and len(decoded.topics[0].partitions) == 300
    assert payload == written


async def test_a_changed_topic_is_answered_as_it_is_now(broker):
    body = metadata_request(12, [SMALL])
    decoded, _ = kio_bytes(12, await answer(broker, 12, body, 1))
    assert len(decoded.topics[0].partitions) == 1
    await topics.add_partitions(broker, SMALL, 4, validate_only=False)
    decoded, _ = kio_bytes(12, await answer(broker, 12, body, 2))
    assert [p.partition_index for p in decoded.topics[0].partitions] == [0, 1, 2, 3]
    before = decoded.topics[0].topic_id
    await topics.delete(broker, SMALL)
    await topics.create(broker, SMALL, 2, {})
    decoded, _ = kio_bytes(12, await answer(broker, 12, body, 3))
    assert decoded.topics[0].topic_id != before and [p.partition_index for p in decoded.topics[0].partitions] == [0, 1]
