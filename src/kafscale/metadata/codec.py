"""The metadata store's values as bytes: compact JSON documents, and segment records in
the one form every writer of /segments keys uses (the store, a metadata restore, the
restore benchmark), so a restored key reads back exactly as the broker wrote it."""

from __future__ import annotations

import json
from dataclasses import fields

from kafscale.metadata.segments import SegmentInfo


def encode(doc) -> bytes:
    """A JSON document as a value: compact, no spaces."""
    return json.dumps(doc, separators=(",", ":")).encode()


_SEGMENT_FIELDS = tuple(f.name for f in fields(SegmentInfo))


def encode_segment(seg: SegmentInfo) -> bytes:
    if not (seg.aborted or seg.open_txns or seg.cleaned) and seg.delete_horizon_ms < 0:
        # The common case formatted directly, the same bytes as below: a write-ahead flush
        # encodes one segment a partition (a dict and json.dumps were 30 us a piece).
        head = b'{"base_offset":%d,"last_offset":%d,"size":%d,"record_count":%d,"max_timestamp":%d,"created_ms":%d' % (
            seg.base_offset, seg.last_offset, seg.size, seg.record_count, seg.max_timestamp, seg.created_ms,
        )
        if not seg.wao_key:
            return head + b"}"
        return b'%s,"wao_key":%s,"wao_position":%d}' % (head, json.dumps(seg.wao_key).encode(), seg.wao_position)
    # The fields by hand, not dataclasses.asdict: that deep-copies every value (a third of
    # a write-ahead flush's Python time over 1,024 partitions); tuples write as JSON arrays.
    d = {name: getattr(seg, name) for name in _SEGMENT_FIELDS}
    for name in ("aborted", "open_txns", "cleaned"):
        if not d[name]:
            del d[name]  # the common case stays as compact as before transactions and compaction
    if d["delete_horizon_ms"] < 0:
        del d["delete_horizon_ms"]
    if not d["wao_key"]:
        del d["wao_key"], d["wao_position"]  # its own spec object, as before write-ahead objects
    return encode(d)


def decode_segment(value: bytes) -> SegmentInfo:
    return SegmentInfo(**json.loads(value))
