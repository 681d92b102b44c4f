"""Offsets: Spark's offset JSON, and the concrete start and end of each partition resolved
from the options (offsets, timestamps, earliest/latest, read_committed) over the listed
segments and, with a metadata store, the partitions' log start offsets."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from kafscale.pipeline import segments as seg
from kafscale.pipeline.options import SourceConfig
from kafscale.pipeline.segments import EARLIEST, LATEST, PartitionRange, TopicPartition

log = logging.getLogger("kafscale.pipeline")


def offsets_json(offsets: dict[TopicPartition, int]) -> dict:
    """Spark Kafka style {topic: {"partition": offset}} with a stable key order.

    Spark compares serialized offsets, so the same positions must always print the same.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, part in sorted(offsets):
        out.setdefault(topic, {})[str(part)] = offsets[(topic, part)]
    return out


def offsets_from_json(data: dict | None) -> dict[TopicPartition, int]:
    if not data:
        return {}
    return {(topic, int(p)): int(off) for topic, parts in data.items() for p, off in parts.items()}


def _check_names_every_partition(name: str, spec: dict, known: set[TopicPartition]) -> None:
    named = {(t, p) for t, ps in spec.items() for p in ps}
    if named != known:
        missing = ", ".join(f"{t}/{p}" for t, p in sorted(known - named))
        extra = ", ".join(f"{t}/{p}" for t, p in sorted(named - known))
        raise ValueError(
            f"{name} must give a value for every partition of the topics read (use -2 for earliest, -1 for latest)"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not found in the storage: {extra}" if extra else "")
        )


async def resolve(store, cfg: SourceConfig, listing: seg.TopicListing, bounds: dict[TopicPartition, PartitionRange], *, is_start: bool, streaming: bool = False) -> dict[TopicPartition, int]:
    """Concrete offsets for the starting (or ending) options over the listed partitions.

    As Spark: a global timestamp wins over per-partition timestamps, which win over offsets.
    A timestamp resolves to the first offset whose record time is >= it; with no such record
    a start fails (startingOffsetsByTimestampStrategy=error) or is the latest offset, an end
    is the latest offset.

    With read_committed, a start at "latest" is the last stable offset (the first offset of
    the earliest transaction with no marker yet), where a Kafka consumer in read_committed
    lands when it seeks to the end: a transaction open when the query starts is read once it
    commits. An end at "latest" stays the flushed end here; the batch plan cuts the range at
    the first undecided transaction.
    """
    known = set(listing.partitions())
    stable: dict[TopicPartition, int] = {}

    async def latest(tp: TopicPartition) -> int:
        b = bounds[tp]
        if not (is_start and cfg.read_committed):
            return b.end
        if tp not in stable:
            # an open transaction may have begun anywhere in the log: scan from its start
            stable[tp], _ = await seg.transaction_outcomes(store, listing.segments[tp], b.start, b.end, fail_on_corruption=cfg.fail_on_corruption)
            stable[tp] = max(b.start, stable[tp])
        return stable[tp]

    if is_start:
        global_ts, by_ts, spec, kind = cfg.starting_timestamp, cfg.starting_by_timestamp, cfg.starting, "startingOffsets"
    else:
        global_ts, by_ts, spec, kind = cfg.ending_timestamp, cfg.ending_by_timestamp, cfg.ending, "endingOffsets"
    tps = sorted(known)
    if global_ts is not None or by_ts is not None:
        if by_ts is not None and global_ts is None:
            _check_names_every_partition(kind + "ByTimestamp", by_ts, known)
        wanted = {tp: (global_ts if global_ts is not None else by_ts[tp[0]][tp[1]]) for tp in tps}
        found_all = await asyncio.gather(*(seg.offset_for_timestamp(store, listing.segments[tp], wanted[tp]) for tp in tps))
        out = {}
        for tp, found in zip(tps, found_all):
            if found is None:
                if is_start and cfg.timestamp_strategy == "error":
                    option = "startingTimestamp" if global_ts is not None else "startingOffsetsByTimestamp"
                    raise ValueError(
                        f"{option} {wanted[tp]}: partition {tp[0]}/{tp[1]} has no record at or after it "
                        "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
                    )
                found = await latest(tp)
            out[tp] = max(found, bounds[tp].start)
        return out
    if isinstance(spec, dict):
        _check_names_every_partition(kind, spec, known)
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        b = bounds[tp]
        want = spec[tp[0]][tp[1]] if isinstance(spec, dict) else (EARLIEST if spec == "earliest" else LATEST)
        if want == EARLIEST:
            out[tp] = b.start
        elif want == LATEST:
            out[tp] = await latest(tp)
        else:
            if is_start and want < b.start:
                if cfg.fail_on_data_loss:
                    raise seg.DataLossError(
                        f"startingOffsets {tp[0]}/{tp[1]}: offset {want} is before the earliest offset {b.start} "
                        "(deleted by retention or DeleteRecords?); set failOnDataLoss=false to start at the earliest"
                    )
                log.warning("%s/%s: starting offset %d is gone, starting at %d", tp[0], tp[1], want, b.start)
                want = b.start
            if not is_start and want > b.end:
                raise ValueError(
                    f"endingOffsets {tp[0]}/{tp[1]}: offset {want} is beyond the end of the flushed segments ({b.end}); "
                    "only flushed records are readable"
                )
            out[tp] = want
    return out


async def _list(store, cfg: SourceConfig, *, require_all: bool = True, pieces=None) -> seg.TopicListing:
    return await seg.list_topics(
        store,
        cfg.namespace,
        topics=list(cfg.topics) if cfg.topics and cfg.assign is None else None,
        pattern=cfg.pattern,
        assigned=cfg.assigned,
        require_all=require_all,
        pieces=pieces,
    )


@dataclass(slots=True)
class _MetadataView:
    """What the metadata store says of the subscribed topics."""

    starts: dict[TopicPartition, int]  # log start offset per partition
    topics: set[str]  # the topic names it knows (among those looked at)
    pieces: dict[TopicPartition, list[tuple[int, str]]]  # committed segments in write-ahead objects


async def _metadata_view(cfg: SourceConfig, known: list[TopicPartition]) -> _MetadataView | None:
    """The subscribed topics' partitions in the metadata store, or None without one: their
    log start offsets (DeleteRecords moves one in the metadata store at once, possibly to the
    middle of a segment that stays in the object store until it is wholly below the start:
    the objects alone would show the deleted records), which topics exist, and the committed
    segments held in write-ahead objects (segments/pieces.py). Read before the listing, so a
    segment that leaves a write-ahead object for its own object meanwhile is in one or both."""
    if cfg.metadata is None:
        return None
    from kafscale.metadata.backends import open_kv
    from kafscale.metadata.internal_topics import is_internal
    from kafscale.metadata.store import MetadataStore

    store = MetadataStore(open_kv(cfg.metadata, ".", cfg.metadata_prefix))
    try:
        if cfg.pattern is not None:
            every = await store.list_topics()
            names = {m.name for m in every}
            regex = re.compile(cfg.pattern)
            metas = [m for m in every if not is_internal(m.name) and regex.fullmatch(m.name)]
        else:
            wanted = sorted(set(cfg.assigned or cfg.topics or ()) | {t for t, _ in known})
            metas = [m for m in await asyncio.gather(*(store.get_topic(t) for t in wanted)) if m is not None]
            names = {m.name for m in metas}
        view = _MetadataView({}, names, {})
        for meta in metas:
            parts = cfg.assigned.get(meta.name, ()) if cfg.assigned is not None else range(meta.partitions)
            for p, st in zip(parts, await asyncio.gather(*(store.get_partition(meta.name, p) for p in parts))):
                if st is None:
                    continue
                view.starts[(meta.name, p)] = st.log_start_offset
                held = [(s.base_offset, seg.piece_key(s)) for s in st.segments if s.wao_key]
                if held:
                    view.pieces[(meta.name, p)] = held
        return view
    finally:
        await store.close()


async def listing_and_bounds(store, cfg: SourceConfig, skipped=None, *, require_all: bool = True, known: list[TopicPartition] = (), cache: seg.MetaCache | None = None):
    """Segments and [earliest, latest) per partition, earliest raised to the metadata store's
    log start offset; also the partitions in `known` that are gone (their topic deleted, or,
    without a metadata store, no object left). `cache`: a stream's segment metadata."""
    view = await _metadata_view(cfg, list(known))
    listing = await _list(store, cfg, require_all=require_all, pieces=view.pieces if view is not None else None)
    if cache is not None:
        cache.keep_only({k for segs in listing.segments.values() for _, k in segs})
    bounds = await seg.partition_bounds(store, listing, fail_on_corruption=cfg.fail_on_corruption, skipped=skipped, cache=cache)
    if view is None:
        gone = {tp for tp in known if tp not in listing.segments}
    else:
        starts = view.starts
        gone = {tp for tp in set(known) | set(bounds) if tp[0] not in view.topics}
        for tp, b in bounds.items():
            if starts.get(tp, 0) > b.start:
                b.start = min(starts[tp], b.end)
        for tp in gone:  # objects a deleted topic left behind are not read
            bounds.pop(tp, None)
            listing.segments.pop(tp, None)
    return listing, bounds, gone
