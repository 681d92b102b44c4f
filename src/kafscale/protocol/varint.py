"""Varints and tagged-field sections, read by kio's native readers; and the varint encoders.

One place for what the request header, the Produce decoder, the request validator and
the record decoder each used to loop over by hand. bench/bench_varint.py, per call with
the tuple unpack, Python 3.11 on a busy 2-core machine (two runs):

    zigzag 5 bytes   hand-written 591 ns   kio 158-166 ns
    uvarint 2 bytes  hand-written 202-258 ns   kio 146-153 ns
    zigzag 1 byte    hand-written 146-228 ns   kio 165-170 ns
    uvarint 1 byte   hand-written 118-122 ns   kio 146-156 ns

A one-byte varint costs ~30 ns more; where that would show, it does not come here: the
request validator reads one-byte varints inline in its generated code, and a request
header or a Produce request reads a handful (well under 1 us against a request's
~100 us). decode_records on 100 records: 362 us before, 356-361 us after.

kio's readers take read-only buffers only; a writable one (the server's frame is a
bytearray) is viewed read-only on the slow path, so callers need not care.
"""

from __future__ import annotations

from kio._kio_native import read_signed_varlong as _native_varlong
from kio._kio_native import read_unsigned_varint as _native_uvarint
from kio.serial.errors import BufferUnderflow


class VarintError(ValueError):
    """A varint that is truncated or longer than its type allows."""


class TruncatedVarint(VarintError):
    pass


class VarintTooLong(VarintError):
    pass


def _retry_readonly(reader, buf, pos: int, error: ValueError):
    if isinstance(buf, (bytearray, memoryview)) and not memoryview(buf).readonly:
        return reader(memoryview(buf).toreadonly(), pos)
    raise VarintTooLong("varint too long") from error


def _read(reader, buf, pos: int) -> tuple[int, int]:
    """(value, position after it) through a native kio reader; kio takes read-only buffers
    only, so a writable one is retried as a read-only view (see _retry_readonly)."""
    try:
        value, size = reader(buf, pos)
    except BufferUnderflow:
        raise TruncatedVarint("truncated varint") from None
    except ValueError as e:
        try:
            value, size = _retry_readonly(reader, buf, pos, e)
        except BufferUnderflow:
            raise TruncatedVarint("truncated varint") from None
        except ValueError as e2:
            raise VarintTooLong("varint too long") from e2
    return value, pos + size


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at buf[pos] (at most 5 bytes:
    Kafka's compact lengths, array counts and tags)."""
    return _read(_native_uvarint, buf, pos)


# kio's own reader of a zigzag varlong: (value, size), read-only buffers only, kio's
# BufferUnderflow on a truncated one. For loops over many records of an intact buffer (the
# log compactor), which decode one-byte varints inline and call this for the rest.
native_varlong = _native_varlong


def read_varlong(buf, pos: int) -> tuple[int, int]:
    """(value, position after it) of the zigzag varint at buf[pos] (at most 10 bytes:
    record fields)."""
    return _read(_native_varlong, buf, pos)


def skip_tagged_fields(buf, pos: int) -> int:
    """Position after the tagged-field section at buf[pos] (count, then tag, size and
    bytes of each). May point past the end of `buf` when a size does: callers check."""
    if pos < len(buf) and buf[pos] == 0:
        # No tagged fields, as in nearly every request header: skip the native reader,
        # which turns a writable frame away and is retried on a read-only view.
        return pos + 1
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    return pos


def encode_uvarint(n: int) -> bytes:
    """Unsigned LEB128 varint (Kafka's compact lengths and tagged fields)."""
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varlong(n: int) -> bytes:
    """Zigzag varint (record fields)."""
    return encode_uvarint((n << 1) ^ (n >> 63))
