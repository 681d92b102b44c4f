"""Varints and tagged-field sections read through kio's native readers
(kafscale.protocol.varint): values, bounds, and the errors callers turn into Kafka errors."""

from __future__ import annotations

import pytest

from kafscale.protocol import codec, varint
from kafscale.protocol.records import build_batch, decode_records


@pytest.mark.parametrize("make_buffer", [bytes, bytearray, lambda b: memoryview(bytearray(b))])
def test_values_from_read_only_and_writable_buffers(make_buffer):
    buf = make_buffer(b"\x00\x96\x01\x03\xfe\xff\xff\xff\x0f")
    assert varint.read_uvarint(buf, 1) == (150, 3)
    assert varint.read_varlong(buf, 3) == (-2, 4)
    assert varint.read_varlong(buf, 4) == (2147483647, 9)


def test_truncated_and_too_long_varints_are_named():
    with pytest.raises(varint.TruncatedVarint):
        varint.read_uvarint(b"\x96", 0)
    with pytest.raises(varint.TruncatedVarint):
        varint.read_uvarint(b"\x01", 5)
    with pytest.raises(varint.VarintTooLong):
        varint.read_uvarint(b"\xff" * 6, 0)
    with pytest.raises(varint.VarintTooLong):
        varint.read_varlong(bytearray(b"\xff" * 11), 0)


def test_tagged_fields_are_skipped():
    # two tagged fields: tag 0 of 2 bytes, tag 5 of 0 bytes
    assert varint.skip_tagged_fields(b"\x02\x00\x02ab\x05\x00rest", 0) == 7


def _header(tags: bytes) -> memoryview:
    # ApiVersions v3 (flexible), correlation id 7, client id "c", then the tagged fields
    return memoryview(bytearray(b"\x00\x12\x00\x03\x00\x00\x00\x07\x00\x01c" + tags))


def test_request_header_tagged_fields():
    assert codec.decode_header(_header(b"\x01\x00\x01x"), True).body_offset == 15
    with pytest.raises(codec.MalformedRequest, match="truncated varint in request header"):
        codec.decode_header(_header(b"\x01\x80"), True)
    with pytest.raises(codec.MalformedRequest, match="varint too long in request header"):
        codec.decode_header(_header(b"\xff\xff\xff\xff\xff\x01"), True)
    with pytest.raises(codec.MalformedRequest, match="past the end"):
        codec.decode_header(_header(b"\x01\x00\x09x"), True)


def test_records_decode_from_a_writable_frame():
    batch = bytearray(build_batch([(b"k", b"v", [("h", b"1")]), (None, b"w" * 300, [])], base_offset=10))
    recs = decode_records(memoryview(batch), 0)
    assert [(r.offset, r.key, r.value, r.headers) for r in recs] == [
        (10, b"k", b"v", (("h", b"1"),)),
        (11, None, b"w" * 300, ()),
    ]
