"""Decoding: the records of CRC-checked v2 batches into columns, read by the protocol's
record readers (protocol/record_reader.py): all of a group of batches at once by the fast
(numpy) reader into Arrow-ready columns (Chunk), or batch by batch by the plain reader
(Columns) where the fast one declines. Imports only `protocol` (tests/test_layers.py)."""

from __future__ import annotations

from kafscale.protocol import record_reader, records
from kafscale.protocol.record_reader import Declined

class Columns:
    """Decoded records of one topic partition, column by column (Arrow-friendly).

    Headers are kept flat, as Arrow stores them: `header_ends[i]` is the end of row i's
    headers in `header_keys`/`header_values`; a row without headers is null (as in Spark's
    Kafka source), not an empty list.
    """

    __slots__ = ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends", "header_keys", "header_values")

    def __init__(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []  # milliseconds
        self.ts_types: list[int] = []
        self.header_ends: list[int] = []
        self.header_keys: list[str] = []
        self.header_values: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    def truncate(self, rows: int) -> None:
        """Drop rows from `rows` on (what a failed batch decode appended part-way)."""
        keep_headers = self.header_ends[rows - 1] if rows else 0
        for name in ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends"):
            del getattr(self, name)[rows:]
        del self.header_keys[keep_headers:]
        del self.header_values[keep_headers:]


def decode_batch_into(cols: Columns, body: bytes, h: records.BatchHeader, lo: int, hi: int) -> None:
    """Append the records of one (decompressed) batch body with offsets in [lo, hi) to `cols`,
    read by the plain record reader (RecordFormatError, nothing appended, when they do not
    parse)."""
    layout = record_reader.PLAIN.read(body, ((0, len(body), h.record_count),))
    keys, values, offs, tss, types = cols.keys, cols.values, cols.offsets, cols.timestamps, cols.ts_types
    hends, hkeys, hvals = cols.header_ends, cols.header_keys, cols.header_values
    hk_at, hk_len, hv_at, hv_len = layout.header_key_at, layout.header_key_lengths, layout.header_value_at, layout.header_value_lengths
    base = h.base_offset
    log_append = h.is_log_append_time
    ts_type = 1 if log_append else 0
    first_ts = h.first_timestamp
    max_ts = h.max_timestamp
    h0 = 0
    for _start, _end, _attrs, ts_delta, _ts_end, off_delta, k_at, k_len, v_at, v_len, h1 in layout.rows:
        off = base + off_delta
        if lo <= off < hi:
            keys.append(body[k_at : k_at + k_len] if k_len >= 0 else None)
            values.append(body[v_at : v_at + v_len] if v_len >= 0 else None)
            for j in range(h0, h1):
                hkeys.append(body[hk_at[j] : hk_at[j] + hk_len[j]].decode("utf-8", "replace") if hk_len[j] > 0 else "")
                hvals.append(body[hv_at[j] : hv_at[j] + hv_len[j]] if hv_len[j] >= 0 else None)
            hends.append(len(hkeys))
            offs.append(off)
            tss.append(max_ts if log_append else first_ts + ts_delta)
            types.append(ts_type)
        h0 = h1


# Vectorized decoding. Python's per-record cost is what limits the reader, so a group of
# batches is read column-wise by the fast record reader, and keys, values and headers are
# cut out of the batch bodies by pyarrow in C (no bytes object per record). Anything the
# fast reader declines -- a damaged or odd record, a failing codec, varints beyond 9 bytes
# -- sends the group to decode_batch_into, batch by batch: the plain reader decides about
# errors, so both paths deliver the same rows and raise the same errors.


class Chunk:
    """Decoded rows of one topic partition as Arrow-ready columns (what read_slice yields).

    `keys`, `values`, `header_keys` (str) and `header_values` are pyarrow arrays, the others
    numpy arrays. Headers are kept flat, as Arrow stores them: row i's headers are
    `header_keys[header_ends[i]:header_ends[i + 1]]`; a row without headers is null (as in
    Spark's Kafka source), not an empty list.
    """

    __slots__ = ("keys", "values", "offsets", "timestamps", "ts_types", "header_ends", "header_keys", "header_values")

    def __init__(self, keys, values, offsets, timestamps, ts_types, header_ends, header_keys, header_values) -> None:
        self.keys = keys
        self.values = values
        self.offsets = offsets  # int64
        self.timestamps = timestamps  # int64 milliseconds
        self.ts_types = ts_types  # int32
        self.header_ends = header_ends  # int32, len + 1 entries
        self.header_keys = header_keys
        self.header_values = header_values

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def from_columns(cls, cols: Columns) -> "Chunk":
        import numpy as np
        import pyarrow as pa

        return cls(
            pa.array(cols.keys, pa.binary()),
            pa.array(cols.values, pa.binary()),
            np.array(cols.offsets, np.int64),
            np.array(cols.timestamps, np.int64),
            np.array(cols.ts_types, np.int32),
            np.array([0] + cols.header_ends, np.int32),
            pa.array(cols.header_keys, pa.string()),
            pa.array(cols.header_values, pa.binary()),
        )


def _spans_to_binary(np, pa, pbuf, large: bool, pos, lens, null=None):
    """A binary array of data[pos[i]:pos[i] + lens[i]] (null where `null`), copied out in C.

    The spans and the gaps between them form one binary array over the unchanged buffer
    (offsets pos0, end0, pos1, end1, ...; spans are in buffer order); taking every other
    element packs the spans contiguously.
    """
    n = len(pos)
    if n == 0:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int64 if large else np.int32)
    bounds[0::2] = pos
    bounds[1::2] = pos + lens
    spans = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pbuf])
    idx = np.arange(0, 2 * n, 2, dtype=np.int64)
    out = spans.take(pa.array(idx, mask=null) if null is not None and null.any() else idx)
    return out.cast(pa.binary()) if large else out


def decode_fast(buf, group: list[tuple[int, records.BatchHeader, int]], hi: "int | list[int]") -> Chunk:
    """Records with offsets in [first, hi) of the CRC-checked data batches `group`
    ((position in buf, header, first wanted offset)), or Declined. `hi` is one end for
    all batches, or a list of one per batch (batches of several slices joined)."""
    import numpy as np
    import pyarrow as pa

    hs = records.HEADER_SIZE
    if any(h.compression != records.COMPRESSION_NONE for _, h, _ in group):
        parts, bodies, size = [], [], 0
        mv = memoryview(buf)
        for bpos, h, _ in group:
            body = mv[bpos + hs : bpos + h.size]
            if h.compression != records.COMPRESSION_NONE:
                try:
                    body = records.decompress(h.compression, body)
                except Exception:
                    raise Declined from None
            parts.append(body)
            bodies.append((size, size + len(body), h.record_count))
            size += len(body)
        data = b"".join(parts)
    else:
        data = buf  # read the bodies in place
        bodies = [(bpos + hs, bpos + h.size, h.record_count) for bpos, h, _ in group]
    layout = record_reader.FAST.read(data, bodies)
    _starts, _ends, _attrs, ts_delta, _ts_end, off_delta, kpos, klen, vpos, vlen, _stops = layout.columns
    hends = layout.header_ends
    nh = np.diff(hends)
    total = int(hends[-1])
    hkpos, hklen = layout.header_key_at, np.maximum(layout.header_key_lengths, 0)  # a null header key reads as ""
    hvpos, hvlen = layout.header_value_at, layout.header_value_lengths
    limit = len(data)

    # Deltas from varints of at most 9 bytes are below 2**62 in magnitude, so int64 sums
    # cannot wrap unless a header value is that large too (Python ints would not wrap).
    if any(abs(h.base_offset) >= 1 << 62 or abs(h.first_timestamp) >= 1 << 62 for _, h, _ in group):
        raise Declined
    counts = [h.record_count for _, h, _ in group]
    which = np.repeat(np.arange(len(group)), counts)
    offsets = np.array([h.base_offset for _, h, _ in group], np.int64)[which] + off_delta
    first = np.array([f for _, _, f in group], np.int64)[which]
    keep = (offsets >= first) & (offsets < (np.array(hi, np.int64)[which] if isinstance(hi, list) else hi))
    log_append = np.array([h.is_log_append_time for _, h, _ in group], bool)
    if log_append.any():
        log_append = log_append[which]
        created = np.array([h.first_timestamp for _, h, _ in group], np.int64)[which] + ts_delta
        timestamps = np.where(log_append, np.array([h.max_timestamp for _, h, _ in group], np.int64)[which], created)
        ts_types = log_append.astype(np.int32)
    else:
        timestamps = np.array([h.first_timestamp for _, h, _ in group], np.int64)[which] + ts_delta
        ts_types = np.zeros(len(offsets), np.int32)
    if not keep.all():  # offsets outside the wanted range (slice ends, already read)
        offsets, timestamps, ts_types = offsets[keep], timestamps[keep], ts_types[keep]
        kpos, klen, vpos, vlen = kpos[keep], klen[keep], vpos[keep], vlen[keep]
        if total:
            hkeep = np.repeat(keep, nh)
            hkpos, hklen, hvpos, hvlen = hkpos[hkeep], hklen[hkeep], hvpos[hkeep], hvlen[hkeep]
        nh = nh[keep]
        hends = np.zeros(len(nh) + 1, np.int64)
        np.cumsum(nh, out=hends[1:])

    pbuf = pa.py_buffer(data)
    large = limit > 0x7FFFFFFF
    knull, vnull = klen < 0, vlen < 0
    keys = _spans_to_binary(np, pa, pbuf, large, kpos, np.maximum(klen, 0), knull)
    values = _spans_to_binary(np, pa, pbuf, large, vpos, np.maximum(vlen, 0), vnull)
    if total and len(hkpos):
        hkeys = _spans_to_binary(np, pa, pbuf, large, hkpos, hklen)
        try:
            hkeys = hkeys.cast(pa.string())  # checks UTF-8
        except pa.ArrowInvalid:  # not UTF-8: replace bad bytes, as bytes.decode(errors="replace")
            hkeys = pa.array([k.decode("utf-8", "replace") for k in hkeys.to_pylist()], pa.string())
        hvalues = _spans_to_binary(np, pa, pbuf, large, hvpos, np.maximum(hvlen, 0), hvlen < 0)
    else:
        hkeys, hvalues = pa.array([], pa.string()), pa.array([], pa.binary())
    return Chunk(keys, values, offsets, timestamps, ts_types, hends.astype(np.int32), hkeys, hvalues)
