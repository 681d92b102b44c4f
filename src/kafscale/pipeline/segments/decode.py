"""Decoding: the records of CRC-checked v2 batches into columns, vectorized with numpy
(Chunk), or record by record (Columns) where the vectorized path declines."""

from __future__ import annotations

from kafscale.protocol import records


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


def _varint_slow(buf: bytes, p: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        b = buf[p]
        p += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), p
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def decode_batch_into(cols: Columns, body: bytes, h: records.BatchHeader, lo: int, hi: int) -> None:
    """Append the records of one (decompressed) batch body with offsets in [lo, hi) to `cols`.

    A hand-inlined parser: varints of small records take one or two bytes, so those cases
    are decoded in line; a call and a Record object per record would halve throughput.
    """
    keys, values, offs, tss, types = cols.keys, cols.values, cols.offsets, cols.timestamps, cols.ts_types
    hends, hkeys, hvals = cols.header_ends, cols.header_keys, cols.header_values
    base = h.base_offset
    log_append = h.is_log_append_time
    ts_type = 1 if log_append else 0
    first_ts = h.first_timestamp
    max_ts = h.max_timestamp
    p = 0
    for _ in range(h.record_count):
        # record length
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        rec_end = p + n
        p += 1  # record attributes
        # timestamp delta
        b = body[p]
        if b < 0x80:
            ts_delta, p = (b >> 1) ^ -(b & 1), p + 1
        else:
            ts_delta, p = _varint_slow(body, p)
        # offset delta
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        off = base + n
        if off < lo or off >= hi:
            p = rec_end
            continue
        # key
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        else:
            n, p = _varint_slow(body, p)
        if n < 0:
            keys.append(None)
        else:
            keys.append(body[p : p + n])
            p += n
        # value
        b = body[p]
        if b < 0x80:
            n, p = (b >> 1) ^ -(b & 1), p + 1
        elif body[p + 1] < 0x80:
            n = (b & 0x7F) | (body[p + 1] << 7)
            n, p = (n >> 1) ^ -(n & 1), p + 2
        else:
            n, p = _varint_slow(body, p)
        if n < 0:
            values.append(None)
        else:
            values.append(body[p : p + n])
            p += n
        # headers
        b = body[p]
        if b == 0:
            p += 1
        else:
            nh, p = _varint_slow(body, p)
            for _h in range(nh):
                n, p = _varint_slow(body, p)
                if n < 0:
                    hkeys.append("")
                else:
                    hkeys.append(body[p : p + n].decode("utf-8", "replace"))
                    p += n
                n, p = _varint_slow(body, p)
                if n < 0:
                    hvals.append(None)
                else:
                    hvals.append(body[p : p + n])
                    p += n
        hends.append(len(hkeys))
        offs.append(off)
        tss.append(max_ts if log_append else first_ts + ts_delta)
        types.append(ts_type)
        if p != rec_end:
            raise ValueError(f"record at offset {off} does not match its length")


# Vectorized decoding. Python's per-record cost is what limits the reader, so a group of
# batches is decoded column-wise with numpy: one short Python loop finds where each record
# starts (a record's length is the only thing that says where the next one begins), then
# every field of every record is read with array operations, and keys, values and headers
# are cut out of the batch bodies by pyarrow in C (no bytes object per record). Anything the
# vectorized path does not handle -- a damaged or odd record, a failing codec, varints
# beyond 9 bytes -- sends the group to the per-record decoder above, which is the reference:
# it decides about errors, so both paths deliver the same rows and raise the same errors.


class Irregular(Exception):
    """The vectorized decoder declines a group; the exact per-record decoder takes it."""


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


# Bytes from a record's start to the next record's, by the first byte of its length varint
# (sign bit ignored): 1-byte lengths need nothing else; 2-byte ones add (second byte << 6).
# A table lookup is ~30% cheaper per record than the shifts and masks.
_RECORD_STEP = [1 + (b >> 1) for b in range(0x80)] + [2 + ((b & 0x7F) >> 1) for b in range(0x80, 0x100)]


def _vvarint(np, arr, pos):
    """Zigzag varints starting at `pos` (int64 array) in the uint8 array `arr`: (values, next positions).

    Small records have 1- or 2-byte varints: those take one or two gathers over all elements;
    only longer ones are extended element by element. Over 9 bytes (beyond int64) is left to
    the exact decoder.
    """
    b = arr[pos]
    more = b >= 0x80
    if not more.any():
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), pos + 1
    c = arr.take(pos + 1, mode="clip")  # clip: a 1-byte varint may end the data; c is unused there
    if not (more & (c >= 0x80)).any():  # none longer than 2 bytes: no index lists needed
        v = b.astype(np.int64)
        v = np.where(more, (v & 0x7F) | (c.astype(np.int64) << 7), v)
        return (v >> 1) ^ -(v & 1), pos + 1 + more
    v = (b & 0x7F).astype(np.int64)
    nxt = pos + 1
    idx = np.flatnonzero(more)
    shift = 7
    while idx.size:
        if shift > 56:
            raise Irregular
        c = arr[nxt[idx]]
        v[idx] |= (c & 0x7F).astype(np.int64) << shift
        nxt[idx] += 1
        idx = idx[c >= 0x80]
        shift += 7
    return (v >> 1) ^ -(v & 1), nxt


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
    ((position in buf, header, first wanted offset)), or Irregular. `hi` is one end for
    all batches, or a list of one per batch (batches of several slices joined)."""
    import numpy as np
    import pyarrow as pa

    hs = records.HEADER_SIZE
    if any(h.compression != records.COMPRESSION_NONE for _, h, _ in group):
        parts, spans, size = [], [], 0
        mv = memoryview(buf)
        for bpos, h, _ in group:
            body = mv[bpos + hs : bpos + h.size]
            if h.compression != records.COMPRESSION_NONE:
                try:
                    body = records.decompress(h.compression, body)
                except Exception:
                    raise Irregular from None
            parts.append(body)
            spans.append((size, size + len(body)))
            size += len(body)
        data = b"".join(parts)
    else:
        data = buf  # read the bodies in place
        spans = [(bpos + hs, bpos + h.size) for bpos, h, _ in group]

    # Record starts: the only sequential step, so it does the least per record: it reads the
    # length varint's magnitude (ignoring the zigzag sign bit), so positions only grow and
    # "inside the body" is one check per batch. The vectorized pass below decodes the length
    # properly and declines the group if any record does not end where the next one starts.
    starts: list[int] = []
    add = starts.append
    step = _RECORD_STEP
    try:
        for (p, end), (_, h, _) in zip(spans, group):
            for _ in range(h.record_count):
                add(p)
                b = data[p]
                if b < 0x80:
                    p += step[b]
                else:
                    c = data[p + 1]
                    if c < 0x80:
                        p += step[b] + (c << 6)
                    else:
                        n, p = _varint_slow(data, p)
                        p += abs(n)
            if p > end:
                raise Irregular
    except (IndexError, ValueError):
        raise Irregular from None

    arr = np.frombuffer(data, np.uint8)
    limit = len(arr)
    rec = np.array(starts, np.int64)
    try:
        length, q = _vvarint(np, arr, rec)
        rec_end = q + length
        ts_delta, q = _vvarint(np, arr, q + 1)  # + 1: record attributes
        off_delta, q = _vvarint(np, arr, q)
        klen, q = _vvarint(np, arr, q)
        kpos = q
        if klen.max(initial=0) > limit:
            raise Irregular
        q = q + np.maximum(klen, 0)
        vlen, q = _vvarint(np, arr, q)
        vpos = q
        if vlen.max(initial=0) > limit:
            raise Irregular
        q = q + np.maximum(vlen, 0)
        nh, q = _vvarint(np, arr, q)
        nh = np.maximum(nh, 0)  # a negative count means no headers, as range() does
        n_rows = len(rec)
        hends = np.zeros(n_rows + 1, np.int64)
        np.cumsum(nh, out=hends[1:])
        total = int(hends[-1]) if n_rows else 0
        if total:
            # each header takes at least two bytes: also bounds the arrays allocated here
            if (nh > (rec_end - q) // 2).any():
                raise Irregular
            hkpos = np.empty(total, np.int64)
            hklen = np.empty(total, np.int64)
            hvpos = np.empty(total, np.int64)
            hvlen = np.empty(total, np.int64)
            rows = np.flatnonzero(nh)
            slot, hq, left = hends[rows], q[rows], nh[rows]
            while rows.size:  # the j-th header of every row that has one, j = 0, 1, ...
                kl, hq = _vvarint(np, arr, hq)
                kl = np.maximum(kl, 0)  # a null header key reads as ""
                if kl.max() > limit:
                    raise Irregular
                hkpos[slot], hklen[slot] = hq, kl
                hq = hq + kl
                vl, hq = _vvarint(np, arr, hq)
                if vl.max() > limit:
                    raise Irregular
                hvpos[slot], hvlen[slot] = hq, vl
                hq = hq + np.maximum(vl, 0)
                left = left - 1
                done = left == 0
                q[rows[done]] = hq[done]
                more = ~done
                rows, slot, hq, left = rows[more], slot[more] + 1, hq[more], left[more]
    except IndexError:
        raise Irregular from None
    # every field inside its record, each record read exactly to its end, and (lengths were
    # taken unsigned above) each one ending where the walk put the next record
    if not np.array_equal(q, rec_end) or (length < 0).any():
        raise Irregular

    # Deltas from varints of at most 9 bytes are below 2**62 in magnitude, so int64 sums
    # cannot wrap unless a header value is that large too (Python ints would not wrap).
    if any(abs(h.base_offset) >= 1 << 62 or abs(h.first_timestamp) >= 1 << 62 for _, h, _ in group):
        raise Irregular
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
