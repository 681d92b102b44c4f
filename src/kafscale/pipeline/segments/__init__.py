"""Reading KafScale topic partitions straight from segment objects, without a broker.

Only *flushed* segments are visible here: records still in a broker's write buffer (not yet
sealed into a `segment-*.kfs` object) do not exist for this reader, so "latest" means "end of
the last flushed segment", which can trail the broker's high watermark.

Spark-free (the Spark source in `pipeline/source.py` is a thin layer over it); one module
per job, this package re-exporting what the source, the jobs and the tests use:

* `runner`: running the async object store from Spark's synchronous threads;
* `listing`: `{namespace}/{topic}/{partition}/segment-{base:020d}.kfs` keys per partition;
* `pieces`: committed segments held in write-ahead objects (the metadata store names them),
  listed as piece keys and read through `PieceStore` like segment objects;
* `segment_meta`: per segment, its exact extent from the `.index` and the object's footer;
* `planning`: a non-overlapping cover of an offset range by segments, byte ranges of large
  ones, Spark tasks;
* `transactions`: read_committed (`transaction_outcomes`): the range ends before the first
  undecided transaction, and the batches of aborted transactions are skipped;
* `timestamps`: the first offset at or after a timestamp;
* `decode`: records of checked batches into columns (imports only `protocol`);
* `read`: a planned slice fetched, checked (strict batch framing, CRC32C per batch and per
  segment when the whole object is read), decoded, re-planned when the object changed;
* `arrow_output`: Arrow record batches and row tuples of the Spark Kafka source schema;
* `errors`: the reader's errors and the report of what failOnCorruption=false skipped.
"""

from __future__ import annotations

from kafscale.pipeline.segments.arrow_output import arrow_schema, columns_to_arrow, columns_to_tuples
from kafscale.pipeline.segments.decode import Chunk, Columns
from kafscale.pipeline.segments.errors import (
    CorruptSegmentError,
    DataLossError,
    ListingChanged,
    PipelineError,
    SkipReport,
    TopicNotFoundError,
    read_skip_log,
)
from kafscale.pipeline.segments.listing import PartitionRange, TopicListing, TopicPartition, list_topics
from kafscale.pipeline.segments.pieces import PieceStore, parse_piece_key, piece_key
from kafscale.pipeline.segments.planning import (
    DEFAULT_MAX_PARTITION_BYTES,
    EARLIEST,
    LATEST,
    SegmentSlice,
    candidate_keys,
    cover,
    group_slices,
    pack_slices,
    plan_slices,
    split_offset_ranges,
    split_piece,
)
from kafscale.pipeline.segments.read import DEFAULT_ARROW_BATCH_ROWS, ReadOptions, read_slice, read_slices
from kafscale.pipeline.segments.runner import METADATA_CONCURRENCY, run_with_store
from kafscale.pipeline.segments.segment_meta import MetaCache, SegmentMeta, fetch_metas, partition_bounds, read_segment_meta
from kafscale.pipeline.segments.timestamps import offset_for_timestamp
from kafscale.pipeline.segments.transactions import END_OF_LOG, aborted_batch, transaction_outcomes

__all__ = [
    "PieceStore",
    "parse_piece_key",
    "piece_key",
    "Chunk",
    "Columns",
    "CorruptSegmentError",
    "DEFAULT_ARROW_BATCH_ROWS",
    "DEFAULT_MAX_PARTITION_BYTES",
    "DataLossError",
    "ListingChanged",
    "EARLIEST",
    "END_OF_LOG",
    "LATEST",
    "METADATA_CONCURRENCY",
    "MetaCache",
    "PartitionRange",
    "PipelineError",
    "ReadOptions",
    "SegmentMeta",
    "SegmentSlice",
    "SkipReport",
    "TopicListing",
    "TopicNotFoundError",
    "TopicPartition",
    "aborted_batch",
    "arrow_schema",
    "candidate_keys",
    "columns_to_arrow",
    "columns_to_tuples",
    "cover",
    "fetch_metas",
    "group_slices",
    "list_topics",
    "offset_for_timestamp",
    "pack_slices",
    "partition_bounds",
    "plan_slices",
    "read_segment_meta",
    "read_skip_log",
    "read_slice",
    "read_slices",
    "run_with_store",
    "split_offset_ranges",
    "split_piece",
    "transaction_outcomes",
]
