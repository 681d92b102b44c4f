"""The one builder every handler uses: fields a version lacks are dropped, a field no
version has (a typo) is refused, required fields get Kafka's zero, plain values convert."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from kafscale.protocol.build import make, nested, response

METADATA = 3
PRODUCE = 0


def test_a_field_no_version_has_is_refused():
    with pytest.raises(TypeError, match="topicz"):
        make(response(METADATA, 12), throttle_time=0, brokers=(), topics=(), cluster_id="c", controller_id=0,
             cluster_authorized_operations=0, topicz=())


def test_a_nested_typo_is_refused_too():
    partition = nested(response(PRODUCE, 9), "PartitionProduceResponse")
    with pytest.raises(TypeError, match="base_ofset"):
        make(partition, index=0, error_code=0, base_ofset=5)


def test_a_field_only_other_versions_have_is_dropped():
    # cluster_id arrived in Metadata v2: v0 drops it, v12 keeps it
    v0 = make(response(METADATA, 0), brokers=(), topics=(), cluster_id="c", controller_id=1)
    assert not hasattr(v0, "cluster_id")
    v12 = make(response(METADATA, 12), brokers=(), topics=(), cluster_id="c", controller_id=1)
    assert v12.cluster_id == "c" and v12.controller_id == 1


def test_required_fields_get_zero_and_plain_values_convert():
    cls = response(PRODUCE, 9)
    partition_cls = nested(cls, "PartitionProduceResponse")
    p = make(partition_cls, index=3, error_code=ErrorCode.not_leader_or_follower.value, log_append_time=1000)
    assert p.error_code is ErrorCode.not_leader_or_follower
    assert p.log_append_time == datetime.datetime.fromtimestamp(1, tz=datetime.timezone.utc)
    assert p.base_offset == 0  # required, not given: Kafka's zero
    assert p.log_start_offset == -1  # not given, has a default: kio's default (Kafka's)
    assert make(partition_cls, index=0, log_append_time=-1).log_append_time is None  # Kafka's "none"
    out = make(cls, throttle_time=5, responses=[{"name": "t", "partition_responses": [p]}])
    assert out.throttle_time == datetime.timedelta(milliseconds=5)
    assert out.responses[0].name == "t" and out.responses[0].partition_responses == (p,)
    topic_id = uuid.uuid4()
    assert make(response(METADATA, 12), topics=[{"name": "t", "topic_id": str(topic_id)}]).topics[0].topic_id == topic_id
