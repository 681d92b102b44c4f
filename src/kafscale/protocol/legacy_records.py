"""Message format v0 and v1 (magic 0 and 1 message sets) to and from v2 record batches.

The log holds v2 batches only. A Produce v0-v2 message set is converted into one v2
batch on append (the one place the broker re-encodes records), a stored batch into a
magic 0 (Fetch v0-1) or magic 1 (Fetch v2-3) message set for an old consumer, compressed
with the codec it was compressed with. Messages are read and written with kafka-python's
`kafka.record` (legacy_records for v0/v1, default_records for v2): no format code of ours.
Both directions are counted (/metrics), apart from `records.decompressions`.
kafka-python is imported on the first conversion, not with this module: its package
imports its whole client, a third of a broker's import time, and most brokers never convert.
"""

from __future__ import annotations

import struct
import zlib

from kafscale.errors import ErrorCode
from kafscale.protocol import records
from kafscale.protocol.records import InvalidRecordError

# Message sets converted to v2 batches on produce, and v2 batches converted to message
# sets for old consumers, by this process (kafscale_record_conversions_total).
up_conversions = 0
down_conversions = 0

_LOG_OVERHEAD = 12  # offset, message size
_MIN_MESSAGE = 14  # crc, magic, attributes, key length, value length (magic 0)
_OFFSET_SIZE = struct.Struct(">qi")
_NO_LIMIT = 1 << 62
_TIMESTAMP_TYPE_BIT = 0x08  # attributes: LogAppendTime (magic 1)


def _corrupt(message: str) -> InvalidRecordError:
    return InvalidRecordError(message, ErrorCode.corrupt_message)


def up_convert(data, max_message_bytes: int | None) -> bytearray:
    """One v2 batch (offsets from 0, as a client's) holding every message of a produced
    magic 0/1 message set, compressed with the codec of its compressed wrappers.

    Kafka's checks (LogValidator): every message's CRC, outer and inner (CORRUPT_MESSAGE);
    each message (a compressed wrapper counts as one) within max.message.bytes
    (MESSAGE_TOO_LARGE); magic 0 messages get no timestamp (-1), magic 1 keep theirs.
    """
    from kafka.errors import CorruptRecordError
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.legacy_records import LegacyRecordBatch

    global up_conversions
    view = memoryview(data)
    pos, end = 0, len(view)
    entries: list[tuple[int, bytes | None, bytes | None]] = []
    codec = records.COMPRESSION_NONE
    while pos < end:
        if end - pos < _LOG_OVERHEAD + _MIN_MESSAGE:
            raise _corrupt(f"truncated message at byte {pos} of the message set")
        _offset, size = _OFFSET_SIZE.unpack_from(view, pos)
        if size < _MIN_MESSAGE or pos + _LOG_OVERHEAD + size > end:
            raise _corrupt(f"message size {size} at byte {pos} runs past the message set")
        magic = view[pos + 16]
        if magic > 1:
            raise _corrupt(f"message format v{magic} inside a v0/v1 message set")
        whole = _LOG_OVERHEAD + size
        if max_message_bytes is not None and whole > max_message_bytes:
            raise InvalidRecordError(f"message of {whole} bytes exceeds max.message.bytes ({max_message_bytes})", ErrorCode.message_too_large)
        try:
            batch = LegacyRecordBatch(bytes(view[pos : pos + whole]), magic)
            if not batch.validate_crc():
                raise _corrupt(f"message CRC mismatch at byte {pos} of the message set")
            if batch.compression_type:
                if batch.compression_type > records.COMPRESSION_LZ4:
                    raise InvalidRecordError(f"compression codec {batch.compression_type} in a v{magic} message", ErrorCode.unsupported_compression_type)
                codec = batch.compression_type
            for rec in batch:
                if batch.compression_type and not rec.validate_crc():
                    raise _corrupt(f"CRC mismatch in a message inside the compressed message at byte {pos}")
                ts = rec.timestamp if magic == 1 and rec.timestamp is not None else -1
                entries.append((ts, rec.key, rec.value))
        except InvalidRecordError:
            raise
        except (AssertionError, CorruptRecordError, ValueError, struct.error, OSError, RuntimeError, IndexError) as e:
            # a garbled compressed payload, a double-compressed wrapper, a truncated inner message
            raise _corrupt(f"unreadable message at byte {pos} of the message set: {e!r}") from None
        pos += whole
    if not entries:
        raise InvalidRecordError("empty message set", ErrorCode.invalid_record)
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, _NO_LIMIT)
    for i, (ts, key, value) in enumerate(entries):
        builder.append(i, ts, key, value, [])
    up_conversions += 1
    return builder.build()


def _entries(buf: bytes):
    """(start, end) of each message of a message set."""
    pos = 0
    while pos + _LOG_OVERHEAD <= len(buf):
        _offset, size = _OFFSET_SIZE.unpack_from(buf, pos)
        yield pos, pos + _LOG_OVERHEAD + size
        pos += _LOG_OVERHEAD + size


def _convert_batch(batch_bytes: bytes, header: records.BatchHeader, magic: int, first_offset: int = -1) -> bytes:
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    codec = header.compression
    builder = LegacyRecordBatchBuilder(magic, codec, _NO_LIMIT)
    last_offset, max_ts = header.base_offset, -1
    for rec in DefaultRecordBatch(batch_bytes):
        if not codec and rec.offset < first_offset:
            # below the fetch offset (as Kafka's RecordsUtil.downConvert): the consumer drops
            # them, so sent within a byte limit they could fill it and stall it forever
            continue
        ts = rec.timestamp if rec.timestamp is not None else -1
        # magic 1 wrappers carry offsets relative to the first (KIP-31); magic 0 absolute
        offset = rec.offset - header.base_offset if codec and magic == 1 else rec.offset
        builder.append(offset, ts, rec.key, rec.value)
        last_offset, max_ts = rec.offset, max(max_ts, ts)
    out = bytearray(builder.build())
    if codec and len(out):
        # kafka-python writes the wrapper at offset 0 (time 0): Kafka's wrapper holds the
        # absolute offset of its last message (and, in magic 1, the largest timestamp).
        struct.pack_into(">q", out, 0, last_offset)
        if magic == 1:
            struct.pack_into(">q", out, 18, max_ts)
            _recrc(out, 0)
    if magic == 1 and header.is_log_append_time:
        # the broker's time: the timestamp-type bit on each outer message, as Kafka sets it
        for start, _stop in _entries(out):
            out[start + 17] |= _TIMESTAMP_TYPE_BIT
            _recrc(out, start)
    return bytes(out)


def _recrc(buf: bytearray, start: int) -> None:
    """Recompute the CRC32 (from the magic byte on) of the message at `start`."""
    (size,) = struct.unpack_from(">i", buf, start + 8)
    struct.pack_into(">I", buf, start + 12, zlib.crc32(memoryview(buf)[start + 16 : start + _LOG_OVERHEAD + size]) & 0xFFFFFFFF)


def has_messages_from(chunks, first_offset: int) -> bool:
    """Would down_convert(chunks, ..., first_offset) give an old consumer a message at or
    after `first_offset`? Not when the batches are control or emptied ones (compaction keeps
    a producer's last batch with no record) or hold only records below it (the fetch offset
    in a compacted batch's tail): such a read brings the consumer back to the same offset."""
    for chunk in chunks:
        for pos, header in records.iter_batches(chunk):
            if header.is_control or header.record_count <= 0 or header.last_offset < first_offset:
                continue
            if header.base_offset >= first_offset or header.compression > records.COMPRESSION_LZ4:
                return True  # (zstd: down_convert answers it with its error)
            if any(r.offset >= first_offset for r in records.decode_records(chunk, pos, header, verify_crc=False)):
                return True
    return False


def down_convert(chunks, magic: int, limit: int, first_offset: int = -1) -> bytes:
    """The stored v2 batches in `chunks` as a magic 0/1 message set of at most `limit` bytes
    (whole messages; at least one, so that a consumer always moves on). Control batches
    (transaction markers) are left out, as Kafka does for old consumers. A zstd batch has
    no v0/v1 form: UNSUPPORTED_COMPRESSION_TYPE (InvalidRecordError), as Kafka answers a
    Fetch below v10 that would return one. Uncompressed messages below `first_offset` (the
    fetch offset, inside the first batch, or a compacted batch's) are left out as Kafka does;
    a compressed wrapper holds its batch whole."""
    global down_conversions
    out = bytearray()
    for chunk in chunks:
        for pos, header in records.iter_batches(chunk):
            if header.is_control or header.record_count <= 0:
                continue
            if header.compression > records.COMPRESSION_LZ4:
                if out:
                    return bytes(out)  # what came before it; the next fetch starts at the zstd batch
                raise InvalidRecordError(f"zstd-compressed batch at offset {header.base_offset}: Fetch v0-v3 cannot carry zstd", ErrorCode.unsupported_compression_type)
            converted = _convert_batch(bytes(chunk[pos : pos + header.size]), header, magic, first_offset)
            down_conversions += 1
            for start, stop in _entries(converted):
                if out and len(out) + (stop - start) > limit:
                    return bytes(out)
                out += converted[start:stop]
    return bytes(out)
