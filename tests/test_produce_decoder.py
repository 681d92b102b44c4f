"""The zero-copy Produce decoder against kio's encoder, for every version kio provides."""

from __future__ import annotations

import datetime
import io
import struct
import uuid

import pytest
from kio.serial import entity_writer

from kafscale.protocol import produce_request
from kafscale.protocol.codec import MalformedRequest, kio_versions
from tests.support.raw import req


def _encode(version: int, topics: list[tuple[str, uuid.UUID, list[tuple[int, bytes | None]]]], txn: str | None) -> bytes:
    tds = []
    for name, tid, parts in topics:
        pds = tuple(req(0, version, "PartitionProduceData", index=i, records=r) for i, r in parts)
        tds.append(req(0, version, "TopicProduceData", name=name, topic_id=tid, partition_data=pds))
    body = req(0, version, transactional_id=txn, acks=-1, timeout=datetime.timedelta(milliseconds=1234), topic_data=tuple(tds))
    buf = io.BytesIO()
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


@pytest.mark.parametrize("version", range(kio_versions(0)[0], kio_versions(0)[1] + 1))
def test_decoder_matches_kio(version):
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    topics = [("alpha", t1, [(0, b"\x01" * 70), (3, None)]), ("beta-topic", t2, [(1, b"xyz" * 50)])]
    raw = bytearray(b"HDR" + _encode(version, topics, "tx" if version % 2 else None))
    got = produce_request.decode(version, memoryview(raw), 3)
    assert (got.acks, got.timeout_ms, got.transactional_id) == (-1, 1234, "tx" if version % 2 else None)
    for (name, tid, parts), td in zip(topics, got.topic_data, strict=True):
        assert (td.name, td.topic_id) == ((None, tid) if version >= 13 else (name, None))
        assert [(p.index, None if p.records is None else bytes(p.records)) for p in td.partition_data] == parts
    # the record sets are writable views into the frame: patching them changes the frame
    view = got.topic_data[0].partition_data[0].records
    assert not view.readonly
    view[0] = 0xFF
    assert 0xFF in raw
    for cut in (4, len(raw) // 2, len(raw) - 1):
        with pytest.raises(MalformedRequest):
            produce_request.decode(version, memoryview(raw[:cut]), 3)


def _flexible_frame(tags: bytes) -> bytes:
    """Produce v9 by hand: transactional id null, acks -1, timeout 1234, topic "t" with
    partition 7 of 200 record bytes (a two-byte compact length); `tags` as every tagged-field
    section (partition, topic, request)."""
    records = bytes(range(200))
    partition = struct.pack(">i", 7) + bytes([0xC9, 0x01]) + records + tags  # 201 = 0xC9 0x01
    topic = bytes([2]) + b"t" + bytes([2]) + partition + tags
    return bytes([0]) + struct.pack(">hi", -1, 1234) + bytes([2]) + topic + tags


def test_flexible_decoder_skips_tagged_fields_and_reads_long_varints():
    tags = bytes([2, 0, 3]) + b"abc" + bytes([0x81, 0x01, 1]) + b"z"  # two fields: tag 0 (3 bytes), tag 129 (1 byte)
    for section in (b"\0", tags):
        got = produce_request.decode(9, memoryview(bytearray(_flexible_frame(section))), 0)
        assert (got.transactional_id, got.acks, got.timeout_ms) == (None, -1, 1234)
        (td,) = got.topic_data
        (pd,) = td.partition_data
        assert (td.name, pd.index, bytes(pd.records)) == ("t", 7, bytes(range(200)))
    raw = _flexible_frame(tags)
    for cut in range(len(raw)):  # every truncation is refused, none reads past the end
        with pytest.raises(MalformedRequest):
            produce_request.decode(9, memoryview(bytearray(raw[:cut])), 0)
    with pytest.raises(MalformedRequest, match="varint too long"):
        produce_request.decode(9, memoryview(bytearray(b"\xff" * 8)), 0)
    with pytest.raises(MalformedRequest, match="null array"):
        produce_request.decode(9, memoryview(bytearray(bytes([0]) + struct.pack(">hi", 1, 0) + b"\0")), 0)
