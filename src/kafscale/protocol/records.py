"""Kafka v2 record batches: a zero-copy header view for the produce/fetch paths, and a
full decoder (with decompression) for tests, the CLI and the Spark reader.

The broker itself never decodes records: it validates the CRC32C of each batch, patches
the base offset and partition leader epoch in place and keeps the bytes as they came. Two
topic configs make produce look inside: message.timestamp.*.max.ms (check_timestamps) and
cleanup.policy compact (check_keys: every record needs a key).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import crc32c as _crc32c

from kafscale.errors import ErrorCode, KafkaError
from kafscale.protocol.record_reader import PLAIN, RecordFormatError, readonly
from kafscale.protocol.varint import encode_varlong as _varint

LONG_MAX = (1 << 63) - 1

# Offsets of the v2 batch header fields (see the spec's "Message Batch Format").
BASE_OFFSET = 0
BATCH_LENGTH = 8
PARTITION_LEADER_EPOCH = 12
MAGIC = 16
CRC = 17
ATTRIBUTES = 21
LAST_OFFSET_DELTA = 23
FIRST_TIMESTAMP = 27
MAX_TIMESTAMP = 35
PRODUCER_ID = 43
PRODUCER_EPOCH = 51
BASE_SEQUENCE = 53
RECORD_COUNT = 57
HEADER_SIZE = 61
# Bytes before the batch-length-counted part: base offset (8) + batch length (4).
LOG_OVERHEAD = 12
# The CRC covers everything from the attributes to the end of the batch.
CRC_START = ATTRIBUTES

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
# KIP-534: set by the log compactor on a batch holding tombstones or a transaction marker;
# the batch's base timestamp is then its delete horizon (record timestamps stay base +
# delta, so readers need not know the bit).
DELETE_HORIZON_MASK = 0x40

COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD = range(5)

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")


def crc32c(data, value: int = 0) -> int:
    """CRC32C of `data`, continuing from `value` (the CRC of the bytes before it)."""
    return _crc32c.crc32c(data, value)


def read_base_offset(buf, pos: int = 0) -> int:
    """The base offset of the batch at `pos` (its first 8 bytes), for messages about a cut-short header."""
    return _I64.unpack_from(buf, pos)[0]


class InvalidRecordError(KafkaError, ValueError):
    """A record set that cannot be accepted. `error_code` is the Kafka error to answer;
    `record_errors` (index of the record in its batch, message) the records that made it
    (Produce v8+ answers them, as Kafka's RecordValidationException)."""

    def __init__(self, message: str, error_code: ErrorCode, record_errors: tuple[tuple[int, str], ...] = ()):
        super().__init__(error_code, message)
        self.record_errors = record_errors


class BatchHeader(NamedTuple):
    # A NamedTuple, not a frozen dataclass: one is built per batch on the produce and
    # fetch paths, and a frozen dataclass's __init__ sets each of the 13 fields through
    # object.__setattr__ (3x the cost of the tuple; 100 B records, #33).
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, including offset and length prefix."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The compactor's delete horizon (KIP-534), or None when the batch has none."""
        return self.first_timestamp if self.attributes & DELETE_HORIZON_MASK else None


def read_header(buf, pos: int = 0) -> BatchHeader:
    return _new_tuple(BatchHeader, _HEADER.unpack_from(buf, pos))


_new_tuple = tuple.__new__  # BatchHeader from the unpacked fields without a Python-level __new__


def iter_batches(buf, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch in buf[pos:end].

    A trailing partial batch (as a Fetch with a byte limit may return) is ignored.
    """
    end = len(buf) if end is None else end
    while pos + HEADER_SIZE <= end:
        header = read_header(buf, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > end:
            return
        yield pos, header
        pos += header.size


# base offset, batch length, last offset delta, max timestamp, record count (batch_spans)
_SPAN = struct.Struct(">qi11xi8xq14xi")
assert _SPAN.size == HEADER_SIZE


def batch_spans(buf) -> list[tuple[int, int, int, int, int]]:
    """(position, base offset, last offset, max timestamp, record count) of each batch
    iter_batches(buf) yields, as a list: five fields unpacked instead of a whole header,
    no generator (a segment's encoding and its cache view scan each flush with it, #33)."""
    out = []
    pos, end = 0, len(buf)
    unpack = _SPAN.unpack_from
    while pos + HEADER_SIZE <= end:
        base, length, last_delta, max_ts, count = unpack(buf, pos)
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > end:
            break
        out.append((pos, base, base + last_delta, max_ts, count))
        pos += LOG_OVERHEAD + length
    return out


_BATCH_LENGTH = struct.Struct(">i")


def count_batches(buf) -> int:
    """How many batches iter_batches(buf) yields, reading only their lengths."""
    n, pos, end = 0, 0, len(buf)
    while pos + HEADER_SIZE <= end:
        (length,) = _BATCH_LENGTH.unpack_from(buf, pos + BATCH_LENGTH)
        if length < HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > end:
            break
        n += 1
        pos += LOG_OVERHEAD + length
    return n


def any_attribute(headers: list[BatchHeader], mask: int) -> bool:
    """Whether any batch has an attribute bit of `mask` (TRANSACTIONAL_MASK, CONTROL_MASK):
    a loop, not any() over a generator, which costs more than the test on the produce
    path's one-batch record sets."""
    for h in headers:
        if h.attributes & mask:
            return True
    return False


def record_count(headers: list[BatchHeader]) -> int:
    """Records in the batches (as any_attribute: no generator)."""
    n = 0
    for h in headers:
        n += h.record_count
    return n


def validate_record_set(data: memoryview, max_batch_bytes: int | None = None) -> list[BatchHeader]:
    """Check a produced record set: whole v2 batches, each with a valid CRC32C.

    Returns the batch headers. Raises InvalidRecordError with the Kafka error code.
    """
    headers: list[BatchHeader] = []
    pos, end = 0, len(data)
    unpack = _HEADER.unpack_from
    if end == 0:
        raise InvalidRecordError("empty record set", ErrorCode.invalid_record)
    while pos < end:
        if end - pos < MAGIC + 1:
            raise InvalidRecordError("truncated record batch", ErrorCode.corrupt_message)
        magic = data[pos + MAGIC]
        if magic != 2:
            raise InvalidRecordError(
                f"message format v{magic} is not supported; use record batches (magic 2)",
                ErrorCode.unsupported_for_message_format,
            )
        if end - pos < HEADER_SIZE:
            raise InvalidRecordError("truncated record batch header", ErrorCode.corrupt_message)
        header = _new_tuple(BatchHeader, unpack(data, pos))
        size = header.batch_length + LOG_OVERHEAD  # header.size, without a property call (#33)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise InvalidRecordError("record batch length exceeds the record set", ErrorCode.corrupt_message)
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise InvalidRecordError(f"record batch of {size} bytes exceeds max.message.bytes", ErrorCode.message_too_large)
        if _crc32c.crc32c(data[pos + CRC_START : pos + size]) != header.crc:
            raise InvalidRecordError("record batch CRC32C mismatch", ErrorCode.corrupt_message)
        if header.record_count < 0 or header.last_offset_delta < 0:
            raise InvalidRecordError("negative record count or offset delta", ErrorCode.corrupt_message)
        headers.append(header)
        pos += size
    return headers


def check_timestamps(data, headers: list[BatchHeader], before_max_ms: int, after_max_ms: int, now_ms: int | None = None) -> None:
    """Kafka's CreateTime check (LogValidator): every record's timestamp (except -1) lies in
    [now - before_max_ms, now + after_max_ms], else INVALID_TIMESTAMP for the record set.
    Nothing is read when both bounds are unlimited; otherwise each batch's records are
    decoded (a compressed batch is decompressed, and counted)."""
    if before_max_ms >= LONG_MAX and after_max_ms >= LONG_MAX:
        return
    now = int(time.time() * 1000) if now_ms is None else now_ms
    lo, hi = now - before_max_ms, now + after_max_ms
    pos = 0
    for header in headers:
        for rec in decode_records(data, pos, header, verify_crc=False):
            if rec.timestamp != -1 and not lo <= rec.timestamp <= hi:
                raise InvalidRecordError(
                    f"timestamp {rec.timestamp} of the record at offset delta {rec.offset - header.base_offset} is out of range: it must be within [{lo}, {hi}]",
                    ErrorCode.invalid_timestamp,
                )
        pos += header.size


def check_keys(data, headers: list[BatchHeader], partition: str) -> None:
    """Kafka's rule for compacted topics (LogValidator): every record has a key, else
    INVALID_RECORD for the record set, naming each keyless record of the first batch that
    has one. Uncompressed batches are checked by walking the record headers (length,
    attributes, timestamp and offset deltas, key length), without copying; a compressed batch
    is decompressed first (counted in `key_check_decompressions`, not in `decompressions`).
    Control batches are not checked (their records always have a key)."""
    global key_check_decompressions
    for header, body in batch_bodies(data, headers):
        if header.compression != COMPRESSION_NONE:
            key_check_decompressions += 1
        missing = _keyless_records(body, header.record_count)
        if missing:
            raise rejected_records([(i, f"Compacted topic cannot accept message without key in topic partition {partition}") for i in missing])


def batch_bodies(data, headers: list[BatchHeader]) -> Iterator[tuple[BatchHeader, object]]:
    """(header, records body) of every batch with records that is not a control batch; a
    compressed body decompressed (callers count that), an uncompressed one a read-only view."""
    view = memoryview(data).toreadonly()
    pos = 0
    for header in headers:
        if not header.is_control and header.record_count > 0:
            body = view[pos + HEADER_SIZE : pos + header.size]
            if header.compression != COMPRESSION_NONE:
                try:
                    body = _decompress(header.compression, body)
                except Exception:  # noqa: BLE001 - whatever the codec library raises on bad input
                    raise InvalidRecordError("compressed record batch does not decompress", ErrorCode.corrupt_message) from None
            yield header, body
        pos += header.size


def rejected_records(errors: list[tuple[int, str]]) -> InvalidRecordError:
    """INVALID_RECORD with Kafka's record_errors (batch index, message) and its message."""
    errors = tuple(errors)
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return InvalidRecordError(
        f"One or more records have been rejected due to {len(errors)} record errors in total, and only showing the first three errors at most: [{shown}]",
        ErrorCode.invalid_record,
        errors,
    )


def record_keys_values(body, count: int) -> Iterator[tuple[int, object, object]]:
    """(index, key, value) of each record of a batch body (decompressed), as views into it
    (None for a null key or value); a record that does not parse is CORRUPT_MESSAGE."""
    body = memoryview(body).toreadonly()  # slices are views
    try:
        layout = PLAIN.read(body, ((0, len(body), count),))
    except RecordFormatError as e:
        raise InvalidRecordError(str(e), ErrorCode.corrupt_message) from None
    for i, (_start, _end, _attrs, _ts_delta, _ts_end, _off_delta, k_at, k_len, v_at, v_len, _h) in enumerate(layout.rows):
        yield i, (body[k_at : k_at + k_len] if k_len >= 0 else None), (body[v_at : v_at + v_len] if v_len >= 0 else None)


def _keyless_records(body, count: int) -> list[int]:
    """Indexes of the records in a batch body (decompressed) whose key is null."""
    return [i for i, key, _value in record_keys_values(body, count) if key is None]


def patch_batch(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Set base offset and partition leader epoch in place; neither is covered by the CRC."""
    _I64.pack_into(buf, pos + BASE_OFFSET, base_offset)
    _I32.pack_into(buf, pos + PARTITION_LEADER_EPOCH, leader_epoch)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, size: int, timestamp: int) -> None:
    """LogAppendTime: the broker stamps max timestamp and the timestamp-type bit, then re-CRCs.

    Only the header changes; the records themselves are not touched.
    """
    attrs = struct.unpack_from(">h", buf, pos + ATTRIBUTES)[0] | TIMESTAMP_TYPE_MASK
    struct.pack_into(">h", buf, pos + ATTRIBUTES, attrs)
    _I64.pack_into(buf, pos + MAX_TIMESTAMP, timestamp)
    struct.pack_into(">I", buf, pos + CRC, crc32c(memoryview(buf)[pos + CRC_START : pos + size]))


# ---------------------------------------------------------------------------------------
# Full decoding (not on the broker's hot path).


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _xerial_snappy_decompress(data: bytes) -> bytes:
    # Java clients frame snappy as: 8-byte magic, version, compat, then (len, block) chunks.
    import cramjam

    out = bytearray()
    pos = 16
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + n]))
        pos += n
    return bytes(out)


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


# Record-set decompressions in this process. Produce and fetch never decompress (produce
# keeps the client's bytes, fetch returns them as stored); only ListOffsets by timestamp
# decodes the batch holding the answer. /metrics exports this count
# (kafscale_decompressions_total) so that staying at zero under load is checked, not assumed.
# The log compactor decompresses with counted=False and counts its own
# (kafscale_compaction_recompressions_total).
decompressions = 0
# Compressed batches decompressed by produce to check that every record sent to a compacted
# topic has a key (check_keys): the one check that looks inside compressed batches on the
# produce path, for compacted topics only (kafscale_key_check_decompressions_total).
key_check_decompressions = 0
# Likewise for the schema-id check of topics with confluent.{key,value}.schema.validation
# (registry/validation.py; kafscale_schema_check_decompressions_total).
schema_check_decompressions = 0


def decompress(codec: int, data, counted: bool = True) -> bytes:
    """The records of a batch, decompressed; counted in `decompressions` unless `counted`
    is False (the compactor, which counts its own)."""
    global decompressions
    if codec == COMPRESSION_NONE:
        return bytes(data)
    if counted:
        decompressions += 1
    return _decompress(codec, data)


def _decompress(codec: int, data) -> bytes:
    import cramjam

    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.decompress(bytes(data)))
    if codec == COMPRESSION_SNAPPY:
        raw = bytes(data)
        if raw.startswith(_XERIAL_MAGIC):
            return _xerial_snappy_decompress(raw)
        return bytes(cramjam.snappy.decompress_raw(raw))
    if codec == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.decompress(bytes(data)))
    if codec == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.decompress(bytes(data)))
    raise ValueError(f"unknown compression codec {codec}")


def decode_records(buf, pos: int = 0, header: BatchHeader | None = None, verify_crc: bool = True) -> list[Record]:
    """Decode every record of the batch at buf[pos:]."""
    header = header or read_header(buf, pos)
    end = pos + header.size
    if verify_crc and crc32c(memoryview(buf)[pos + CRC_START : end]) != header.crc:
        raise InvalidRecordError(f"CRC mismatch in batch at offset {header.base_offset}", ErrorCode.corrupt_message)
    body = buf[pos + HEADER_SIZE : end]
    if header.compression != COMPRESSION_NONE:
        body = decompress(header.compression, body)
    body = readonly(body)
    layout = PLAIN.read(body, ((0, len(body), header.record_count),))
    base = header.base_offset
    log_append, first_ts, max_ts = header.is_log_append_time, header.first_timestamp, header.max_timestamp
    hk_at, hk_len, hv_at, hv_len = layout.header_key_at, layout.header_key_lengths, layout.header_value_at, layout.header_value_lengths
    records = []
    h0 = 0
    for _start, _end, _attrs, ts_delta, _ts_end, off_delta, k_at, k_len, v_at, v_len, h1 in layout.rows:
        hdrs = tuple(
            (bytes(body[hk_at[j] : hk_at[j] + hk_len[j]]).decode("utf-8", "replace") if hk_len[j] > 0 else "", bytes(body[hv_at[j] : hv_at[j] + hv_len[j]]) if hv_len[j] >= 0 else None)
            for j in range(h0, h1)
        )
        h0 = h1
        key = bytes(body[k_at : k_at + k_len]) if k_len >= 0 else None
        value = bytes(body[v_at : v_at + v_len]) if v_len >= 0 else None
        records.append(Record(base + off_delta, max_ts if log_append else first_ts + ts_delta, key, value, hdrs))
    return records


# ---------------------------------------------------------------------------------------
# Building batches (tests, CLI produce, benchmarks).


def _varbytes(b: bytes | None) -> bytes:
    if b is None:
        return _varint(-1)
    return _varint(len(b)) + b


def compress(codec: int, data) -> bytes:
    """Records of a batch compressed with `codec` (snappy unframed, as librdkafka writes it;
    lz4 in the frame format Kafka uses)."""
    import cramjam

    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        return bytes(cramjam.gzip.compress(bytes(data)))
    if codec == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if codec == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(bytes(data)))
    if codec == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(bytes(data)))
    raise ValueError(f"unknown compression codec {codec}")


def build_batch(
    records: list[tuple[bytes | None, bytes | None]] | list[tuple[bytes | None, bytes | None, list]],
    *,
    base_offset: int = 0,
    timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    codec: int = COMPRESSION_NONE,
    attributes: int = 0,
    timestamps: list[int] | None = None,
    offset_deltas: list[int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode a v2 record batch. Each record is (key, value) or (key, value, headers).

    By default every record has timestamp `timestamp` and offset deltas 0, 1, ...;
    `timestamps` and `offset_deltas` give each record its own (the base timestamp stays
    `timestamp`), and `last_offset_delta` overrides the batch's (as a compacted batch keeps
    it past its last remaining record)."""
    body = bytearray()
    max_ts = timestamp
    for i, rec in enumerate(records):
        key, value = rec[0], rec[1]
        hdrs = rec[2] if len(rec) > 2 else []
        ts = timestamps[i] if timestamps is not None else timestamp
        max_ts = max(max_ts, ts) if i else ts
        r = bytearray(b"\x00")
        r += _varint(ts - timestamp)  # timestamp delta
        r += _varint(offset_deltas[i] if offset_deltas is not None else i)  # offset delta
        r += _varbytes(key)
        r += _varbytes(value)
        r += _varint(len(hdrs))
        for hk, hv in hdrs:
            r += _varbytes(hk.encode() if isinstance(hk, str) else hk)
            r += _varbytes(hv)
        body += _varint(len(r)) + r
    body = compress(codec, body)
    attrs = (attributes & ~COMPRESSION_MASK) | codec
    n = len(records)
    if last_offset_delta is None:
        last_offset_delta = (offset_deltas[-1] if offset_deltas else max(n - 1, 0))
    after_crc = struct.pack(">hiqqqhii", attrs, last_offset_delta, timestamp, max_ts, producer_id, producer_epoch, base_sequence, n) + bytes(body)
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiib", base_offset, batch_length, -1, 2) + struct.pack(">I", crc32c(after_crc)) + after_crc


# ---------------------------------------------------------------------------------------
# Control batches: the end-transaction markers (COMMIT / ABORT) of Kafka's transactions.
# One record; key = version (int16 0) + type (int16: 0 abort, 1 commit); value = version
# (int16 0) + coordinator epoch (int32); attributes transactional + control.

CONTROL_ABORT, CONTROL_COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(commit: bool, producer_id: int, producer_epoch: int, coordinator_epoch: int, timestamp: int, base_offset: int = 0) -> bytes:
    """An end-transaction marker batch for `producer_id` (offset patched on append)."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value)],
        base_offset=base_offset,
        timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        attributes=TRANSACTIONAL_MASK | CONTROL_MASK,
    )


def read_control(buf, pos: int, header: BatchHeader) -> tuple[int, int]:
    """(control type, coordinator epoch) of the control batch at `pos`; type -1 for a control
    batch this broker does not know (or an empty one), which ends no transaction."""
    recs = decode_records(buf, pos, header, verify_crc=False)
    if not recs or recs[0].key is None or len(recs[0].key) < _CONTROL_KEY.size:
        return -1, -1
    _version, kind = _CONTROL_KEY.unpack_from(recs[0].key, 0)
    epoch = -1
    if recs[0].value is not None and len(recs[0].value) >= _CONTROL_VALUE.size:
        epoch = _CONTROL_VALUE.unpack_from(recs[0].value, 0)[1]
    return kind, epoch
