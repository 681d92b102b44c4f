"""The hand-written Fetch response encoder, byte for byte against kio's, every version."""

from __future__ import annotations

import io
import uuid

import pytest
from kio.serial import entity_writer

from kafscale.protocol import build, codec, fetch_response
from kafscale.protocol.records import build_batch


@pytest.mark.parametrize("version", range(codec.kio_versions(1)[0], codec.kio_versions(1)[1] + 1))
def test_matches_kio(version):
    tid = uuid.uuid4()
    b1, b2 = build_batch([(b"k", b"v1")]), build_batch([(None, b"v2" * 40)], base_offset=1)
    ours = fetch_response.FetchResponse(
        version,
        [
            fetch_response.TopicData("orders", tid, [
                fetch_response.PartitionData(0, 0, 10, 10, 0, fetch_response.RecordChunks([memoryview(b1), memoryview(b2)])),
                fetch_response.PartitionData(3, 1, 7, 7, 2),
            ]),
            fetch_response.TopicData("empty", tid, []),
        ],
    )  # fmt: skip
    cls = build.response(1, version)
    part, topic = build.nested(cls, "PartitionData"), build.nested(cls, "FetchableTopicResponse")
    kio_resp = build.make(
        cls, throttle_time=0, error_code=0, session_id=0,
        responses=(
            build.make(topic, topic="orders", topic_id=tid, partitions=(
                build.make(part, partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10, log_start_offset=0,
                           aborted_transactions=None, preferred_read_replica=-1, records=b1 + b2),
                build.make(part, partition_index=3, error_code=1, high_watermark=7, last_stable_offset=7, log_start_offset=2,
                           aborted_transactions=None, preferred_read_replica=-1, records=b""),
            )),
            build.make(topic, topic="empty", topic_id=tid, partitions=()),
        ),
    )  # fmt: skip
    expected = b"".join(codec.encode_response(1, version, 42, kio_resp))
    assert b"".join(bytes(b) for b in ours.encode_frame(42)) == expected
    assert len(ours.responses[0].partitions[0].records) == len(b1) + len(b2)
