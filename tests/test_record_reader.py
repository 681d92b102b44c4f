"""The record-body reader contract (protocol/record_reader.py): the plain and the fast
reader give the same layout of the same records, refuse the same damage (the fast one by
declining), and what the protocol tools decode from it is what was encoded."""

from __future__ import annotations

import pytest

from kafscale.protocol import record_reader, records

pytest.importorskip("numpy")

RECORDS = [
    (b"k", b"v"),
    (None, b"null key"),
    (b"null value", None),
    (b"", b""),
    (b"h", b"headers", [("a", b"1"), ("", None), ("b", b"x" * 300)]),
    (b"big", b"y" * 9000),  # a length varint of 3 bytes
    (b"k" * 200, b"v" * 70),  # 2-byte key length
]


def _bodies(batches: list[bytes]) -> tuple[bytes, list[tuple[int, int, int]]]:
    data = b"".join(batches)
    bodies = []
    for pos, h in records.iter_batches(data):
        bodies.append((pos + records.HEADER_SIZE, pos + h.size, h.record_count))
    return data, bodies


def _columns(layout) -> list[list[int]]:
    cols = [list(map(int, c)) for c in layout.columns]
    heads = [layout.header_ends, layout.header_key_at, layout.header_key_lengths, layout.header_value_at, layout.header_value_lengths]
    return cols + [list(map(int, c)) for c in heads]


def test_plain_and_fast_readers_agree():
    batches = [
        records.build_batch(RECORDS, base_offset=0, timestamp=1_000, timestamps=[1_000 + 7 * i for i in range(len(RECORDS))]),
        records.build_batch([(b"x", b"y")] * 50, base_offset=len(RECORDS), timestamp=5, timestamps=[5 - i * 100_000 for i in range(50)]),
    ]
    data, bodies = _bodies(batches)
    plain = record_reader.PLAIN.read(data, bodies)
    fast = record_reader.FAST.read(data, bodies)
    assert len(plain) == len(fast) == len(RECORDS) + 50
    assert _columns(plain) == _columns(fast)
    assert plain.rows == fast.rows


def test_protocol_decoding_returns_what_was_encoded():
    batch = records.build_batch(RECORDS, base_offset=10, timestamp=1_000)
    got = records.decode_records(batch)
    assert [(r.offset, r.key, r.value, [(k, v) for k, v in r.headers]) for r in got] == [
        (10 + i, rec[0], rec[1], [(k, v) for k, v in (rec[2] if len(rec) > 2 else [])]) for i, rec in enumerate(RECORDS)
    ]


@pytest.mark.parametrize(
    "damage",
    [
        lambda body: body[:-3],  # the last record cut short
        lambda body: bytes([0x7E]) + body[1:],  # a length past the batch
        lambda body: bytes([0x02]) + body[1:],  # a record shorter than its fields
        lambda body: body[:1] + b"\x00" + b"\xff" * 11 + body[13:],  # a varint over 10 bytes
    ],
)
def test_damage_is_refused_by_the_plain_reader_and_declined_by_the_fast_one(damage):
    batch = records.build_batch([(b"key", b"value"), (b"k2", b"v2")])
    body = damage(batch[records.HEADER_SIZE :])
    with pytest.raises(record_reader.RecordFormatError):
        record_reader.PLAIN.read(body, [(0, len(body), 2)])
    with pytest.raises(record_reader.Declined):
        record_reader.FAST.read(body, [(0, len(body), 2)])
