"""The records of v2 record batches, read field by field: one contract, two readers.

A batch's records follow its 61-byte header (decompressed first when the batch is
compressed: a *body*). Each record is: length (zigzag varint), attributes (one byte),
timestamp delta, offset delta, key length and key, value length and value, header count,
then per header key length and key, value length and value (Kafka's DefaultRecord).

The contract (`RecordReader`): `read(data, bodies)` takes bodies in `data`, as
(start, end, record count), and returns a `RecordLayout`: per record (of all the bodies,
in order) where it starts and ends, its timestamp and offset deltas, and the position and
length of its key, value and headers; a length below zero is a null. Nothing is copied:
callers cut out what they need (a Record, a key to map, Arrow arrays). Both readers check
the same bounds: every record inside its body, every field inside its record, the record
read exactly to the end its length says, varints of at most 10 bytes; a body that breaks
one raises RecordFormatError.

* `PlainRecordReader` (`PLAIN`): a Python loop, record by record, the reference: it
  decides about errors. Lists out. Used by the protocol tools (`records.decode_records`,
  the produce-side key checks), the log compactor and the Spark source's exact path.
* `FastRecordReader` (`FAST`): numpy, every field of every record at once after one short
  walk over the record lengths (a record's length is the only thing that says where the
  next one begins). numpy arrays out. It declines (`Declined`) what it does not handle --
  a damaged or odd record, varints beyond 9 bytes -- and the caller asks the plain reader,
  so both deliver the same records and raise the same errors. The Spark source reads
  groups of batches through it; per record it costs a fraction of the plain reader.

As aiokafka keeps a Python and a C record reader behind one protocol; here the fast one is
numpy, imported only when it is first used (the broker never does).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from kafscale.protocol.varint import BufferUnderflow, native_varlong

Body = tuple[int, int, int]  # (start, end, record count) of one batch body in `data`


class RecordFormatError(ValueError):
    """Records that do not parse. `record`: the index of the offending record in its batch
    (None: unknown); `overrun`: a record or field runs past its batch or record (else: a
    varint that is cut short or too long)."""

    def __init__(self, message: str, record: int | None = None, overrun: bool = False):
        super().__init__(message)
        self.record = record
        self.overrun = overrun


class Declined(Exception):
    """The fast reader does not handle these records; ask the plain reader."""


# The fields of a record, in the order of a row (RecordLayout.rows) and of the columns.
FIELDS = (
    "starts",  # the record's length varint
    "ends",  # after the record
    "attributes_at",  # its attributes byte (after the length)
    "timestamp_deltas",
    "timestamp_ends",  # after the timestamp delta
    "offset_deltas",
    "key_at",
    "key_lengths",  # < 0: null key
    "value_at",
    "value_lengths",  # < 0: null value
    "header_stops",  # its headers are header entries [previous record's stop, this stop)
)


class RecordLayout:
    """Records field by field, as rows (`rows`: a tuple of FIELDS per record, of all bodies
    read, in order) or as columns (`starts`, `key_at`, ...: record i at index i). Header
    fields are flat (`header_key_at`, `header_key_lengths` (< 0: null key, read as ""),
    `header_value_at`, `header_value_lengths` (< 0: null value)); record i's headers are
    entries header_ends[i]:header_ends[i + 1]. Positions are in the `data` read.

    The plain reader makes rows (one tuple a record is the cheapest thing Python can make
    per record); the fast one columns (numpy arrays); either form is made from the other
    when first asked for."""

    __slots__ = ("_rows", "_columns", "header_key_at", "header_key_lengths", "header_value_at", "header_value_lengths")

    def __init__(self, rows: list | None, columns: Sequence | None, header_key_at, header_key_lengths, header_value_at, header_value_lengths):
        self._rows = rows
        self._columns = columns
        self.header_key_at = header_key_at
        self.header_key_lengths = header_key_lengths
        self.header_value_at = header_value_at
        self.header_value_lengths = header_value_lengths

    @property
    def rows(self) -> list:
        if self._rows is None:
            self._rows = list(zip(*(c.tolist() if hasattr(c, "tolist") else c for c in self._columns)))
        return self._rows

    @property
    def columns(self) -> Sequence:
        if self._columns is None:
            self._columns = tuple(zip(*self._rows)) if self._rows else ((),) * len(FIELDS)
        return self._columns

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else len(self._columns[0])

    starts = property(lambda self: self.columns[0])
    ends = property(lambda self: self.columns[1])
    attributes_at = property(lambda self: self.columns[2])
    timestamp_deltas = property(lambda self: self.columns[3])
    timestamp_ends = property(lambda self: self.columns[4])
    offset_deltas = property(lambda self: self.columns[5])
    key_at = property(lambda self: self.columns[6])
    key_lengths = property(lambda self: self.columns[7])
    value_at = property(lambda self: self.columns[8])
    value_lengths = property(lambda self: self.columns[9])

    @property
    def header_ends(self) -> Sequence[int]:
        """len(self) + 1 entries, from 0."""
        stops = self.columns[10]
        if hasattr(stops, "dtype"):  # numpy
            import numpy as np

            return np.concatenate((np.zeros(1, stops.dtype), stops))
        return [0, *stops]


class RecordReader(Protocol):
    def read(self, data: Any, bodies: Sequence[Body]) -> RecordLayout:
        """The records of `bodies` in `data`; RecordFormatError when they do not parse."""
        ...


def readonly(data):
    """`data` as the readers take it: bytes as they are, anything else as a read-only view
    (kio's varint reader refuses writable buffers)."""
    return data if isinstance(data, bytes) else memoryview(data).toreadonly()


_ZIGZAG = [(b >> 1) ^ -(b & 1) for b in range(0x80)]  # one-byte zigzag varints by their byte


class PlainRecordReader:
    """Record by record in Python, a tuple a record. Varints of one byte (most record
    fields) are decoded inline by a table lookup, longer ones by kio's native reader
    (measured: faster than decoding two bytes inline)."""

    def read(self, data, bodies: Sequence[Body]) -> RecordLayout:
        # Positions index `data`; a copy as bytes reads faster than a view, byte by byte.
        data = data if isinstance(data, bytes) else bytes(data)
        rows: list = []
        add = rows.append
        hk_at: list[int] = []
        hk_len: list[int] = []
        hv_at: list[int] = []
        hv_len: list[int] = []
        varlong = native_varlong
        zigzag = _ZIGZAG
        header_fields = ((hk_at, hk_len), (hv_at, hv_len))
        headers = 0
        i = 0
        try:
            for p, body_end, count in bodies:
                for i in range(count):
                    start = p
                    # length
                    n, size = (zigzag[b], 1) if (b := data[p]) < 0x80 else varlong(data, p)
                    p += size
                    end = p + n
                    if n < 1 or end > body_end:
                        raise RecordFormatError(f"record {i} of a batch overruns its batch", i, True)
                    attrs = p
                    p += 1
                    # timestamp delta
                    ts_delta, size = (zigzag[b], 1) if (b := data[p]) < 0x80 else varlong(data, p)
                    p += size
                    ts_end = p
                    # offset delta
                    off_delta, size = (zigzag[b], 1) if (b := data[p]) < 0x80 else varlong(data, p)
                    p += size
                    # key
                    key_len, size = (zigzag[b], 1) if (b := data[p]) < 0x80 else varlong(data, p)
                    p += size
                    key_at = p
                    if key_len > 0:
                        p += key_len
                    # value
                    value_len, size = (zigzag[b], 1) if (b := data[p]) < 0x80 else varlong(data, p)
                    p += size
                    value_at = p
                    if value_len > 0:
                        p += value_len
                    # headers (a negative count: none)
                    if data[p] == 0:
                        p += 1
                    else:
                        nh, size = varlong(data, p)
                        p += size
                        for _ in range(nh):
                            if p >= end:  # each header takes two bytes at least
                                raise RecordFormatError(f"record {i} of a batch overruns its batch", i, True)
                            for at, lengths in header_fields:  # its key, then its value
                                n, size = varlong(data, p)
                                p += size
                                at.append(p)
                                lengths.append(n)
                                if n > 0:
                                    p += n
                            headers += 1
                    if p != end:
                        raise RecordFormatError(f"record {i} of a batch overruns its batch", i, True)
                    add((start, end, attrs, ts_delta, ts_end, off_delta, key_at, key_len, value_at, value_len, headers))
        except RecordFormatError:
            raise
        except (IndexError, ValueError, BufferUnderflow):
            raise RecordFormatError("malformed record in a record batch", i) from None
        return RecordLayout(rows, None, hk_at, hk_len, hv_at, hv_len)


# Bytes from a record's start to the next record's, by the first byte of its length varint
# (sign bit ignored): 1-byte lengths need nothing else; 2-byte ones add (second byte << 6).
# A table lookup is ~30% cheaper per record than the shifts and masks.
_RECORD_STEP = [1 + (b >> 1) for b in range(0x80)] + [2 + ((b & 0x7F) >> 1) for b in range(0x80, 0x100)]


def _vvarint(np, arr, pos):
    """Zigzag varints starting at `pos` (int64 array) in the uint8 array `arr`: (values, next positions).

    Small records have 1- or 2-byte varints: those take one or two gathers over all elements;
    only longer ones are extended element by element. Over 9 bytes (beyond int64) is left to
    the plain reader.
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
            raise Declined
        c = arr[nxt[idx]]
        v[idx] |= (c & 0x7F).astype(np.int64) << shift
        nxt[idx] += 1
        idx = idx[c >= 0x80]
        shift += 7
    return (v >> 1) ^ -(v & 1), nxt


class FastRecordReader:
    """All records of a group of bodies at once with numpy; declines (Declined) anything
    irregular, which the plain reader then reads or refuses."""

    def read(self, data, bodies: Sequence[Body]) -> RecordLayout:
        import numpy as np

        # Record starts: the only sequential step, so it does the least per record: it reads
        # the length varint's magnitude (ignoring the zigzag sign bit), so positions only grow
        # and "inside the body" is one check per body. The vectorized pass below decodes the
        # length properly and declines if any record does not end where the next one starts.
        data = readonly(data)
        starts: list[int] = []
        add = starts.append
        step = _RECORD_STEP
        varlong = native_varlong
        try:
            for p, end, count in bodies:
                for _ in range(count):
                    add(p)
                    b = data[p]
                    if b < 0x80:
                        p += step[b]
                    else:
                        c = data[p + 1]
                        if c < 0x80:
                            p += step[b] + (c << 6)
                        else:
                            n, size = varlong(data, p)
                            p += size + abs(n)
                if p > end:
                    raise Declined
        except (IndexError, ValueError, BufferUnderflow):
            raise Declined from None

        arr = np.frombuffer(data, np.uint8)
        limit = len(arr)
        rec = np.array(starts, np.int64)
        try:
            length, q = _vvarint(np, arr, rec)
            attributes_at = q
            rec_end = q + length
            ts_delta, q = _vvarint(np, arr, q + 1)  # + 1: record attributes
            ts_end = q
            off_delta, q = _vvarint(np, arr, q)
            klen, q = _vvarint(np, arr, q)
            kpos = q
            if klen.max(initial=0) > limit:
                raise Declined
            q = q + np.maximum(klen, 0)
            vlen, q = _vvarint(np, arr, q)
            vpos = q
            if vlen.max(initial=0) > limit:
                raise Declined
            q = q + np.maximum(vlen, 0)
            nh, q = _vvarint(np, arr, q)
            nh = np.maximum(nh, 0)  # a negative count means no headers, as range() does
            n_rows = len(rec)
            hends = np.zeros(n_rows + 1, np.int64)
            np.cumsum(nh, out=hends[1:])
            total = int(hends[-1]) if n_rows else 0
            hkpos = np.empty(total, np.int64)
            hklen = np.empty(total, np.int64)
            hvpos = np.empty(total, np.int64)
            hvlen = np.empty(total, np.int64)
            if total:
                # each header takes at least two bytes: also bounds the arrays allocated here
                if (nh > (rec_end - q) // 2).any():
                    raise Declined
                rows = np.flatnonzero(nh)
                slot, hq, left = hends[rows], q[rows], nh[rows]
                while rows.size:  # the j-th header of every row that has one, j = 0, 1, ...
                    kl, hq = _vvarint(np, arr, hq)
                    if kl.max() > limit:
                        raise Declined
                    hkpos[slot], hklen[slot] = hq, kl
                    hq = hq + np.maximum(kl, 0)
                    vl, hq = _vvarint(np, arr, hq)
                    if vl.max() > limit:
                        raise Declined
                    hvpos[slot], hvlen[slot] = hq, vl
                    hq = hq + np.maximum(vl, 0)
                    left = left - 1
                    done = left == 0
                    q[rows[done]] = hq[done]
                    more = ~done
                    rows, slot, hq, left = rows[more], slot[more] + 1, hq[more], left[more]
        except IndexError:
            raise Declined from None
        # every field inside its record, each record read exactly to its end, and (lengths were
        # taken unsigned above) each one ending where the walk put the next record
        if not np.array_equal(q, rec_end) or (length < 1).any():
            raise Declined
        return RecordLayout(None, (rec, rec_end, attributes_at, ts_delta, ts_end, off_delta, kpos, klen, vpos, vlen, hends[1:]), hkpos, hklen, hvpos, hvlen)


PLAIN = PlainRecordReader()
FAST = FastRecordReader()
