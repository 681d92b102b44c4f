"""Output shapes: Arrow record batches and row tuples of the Spark Kafka source schema."""

from __future__ import annotations

import datetime as _dt
import itertools
from typing import Iterator

from kafscale.pipeline.segments.decode import Chunk, Columns


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def arrow_schema(include_headers: bool = True):
    """The Arrow form of the Spark Kafka source schema (what Spark expects from read());
    without the `headers` column unless include_headers (Spark's includeHeaders)."""
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


def columns_to_arrow(cols: "Chunk | Columns", topic: str, partition: int, schema=None):
    """One Arrow record batch of the source schema, built from arrays without a Python object per row."""
    import numpy as np
    import pyarrow as pa

    chunk = cols if isinstance(cols, Chunk) else Chunk.from_columns(cols)
    schema = schema or arrow_schema()
    n = len(chunk)
    arrays = [
        chunk.keys,
        chunk.values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.full(n, partition, np.int32)),
        pa.array(chunk.offsets),
        pa.array(chunk.timestamps * 1000, schema.field("timestamp").type),
        pa.array(chunk.ts_types),
    ]
    if schema.get_field_index("headers") >= 0:
        list_type = schema.field("headers").type
        if len(chunk.header_keys):
            header_structs = pa.StructArray.from_arrays([chunk.header_keys, chunk.header_values], fields=list(list_type.value_type))
            ends = chunk.header_ends
            headers = pa.ListArray.from_arrays(pa.array(ends), header_structs, type=list_type, mask=pa.array(ends[1:] == ends[:-1]))
        else:
            headers = pa.nulls(n, list_type)
        arrays.append(headers)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def columns_to_tuples(cols: "Chunk | Columns", topic: str, partition: int, include_headers: bool = True) -> Iterator[tuple]:
    """Row tuples of the source schema (the `arrow=false` path); columns go to Python objects
    in C where pyarrow/numpy can, so this is as fast as a row path gets."""
    import numpy as np

    chunk = cols if isinstance(cols, Chunk) else Chunk.from_columns(cols)
    n = len(chunk)
    epoch, delta = _EPOCH, _dt.timedelta
    headers: list = [None] * n
    if include_headers and len(chunk.header_keys):
        hkeys, hvals = chunk.header_keys.to_pylist(), chunk.header_values.to_pylist()
        ends = chunk.header_ends
        starts_l, ends_l = ends[:-1].tolist(), ends[1:].tolist()
        for i in np.flatnonzero(ends[1:] != ends[:-1]).tolist():
            a, b = starts_l[i], ends_l[i]
            headers[i] = list(zip(hkeys[a:b], hvals[a:b]))
    columns = [
        chunk.keys.to_pylist(),
        chunk.values.to_pylist(),
        itertools.repeat(topic, n),
        itertools.repeat(partition, n),
        chunk.offsets.tolist(),
        [epoch + delta(milliseconds=ts) for ts in chunk.timestamps.tolist()],
        chunk.ts_types.tolist(),
    ]
    if include_headers:
        columns.append(headers)
    return zip(*columns)
