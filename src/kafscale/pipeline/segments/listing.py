"""Listing: `{namespace}/{topic}/{partition}/segment-{base:020d}.kfs` keys per partition.

Only segment keys count: anything else under a topic (its `.index` objects aside, a
topic marker object, foreign files) is passed over.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from kafscale.metadata.internal_topics import is_internal
from kafscale.pipeline.segments.errors import TopicNotFoundError
from kafscale.storage import segment
from kafscale.storage.objectstore import ObjectStore

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class TopicListing:
    """Segment keys per partition, each list sorted by base offset."""

    segments: dict[TopicPartition, list[tuple[int, str]]]
    # segment keys whose .index object was listed too (None: not known); a segment without
    # one is measured by its footer alone, and many footers are read in one request
    indexed: set[str] | None = None

    def partitions(self) -> list[TopicPartition]:
        return sorted(self.segments)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.segments})


async def list_topics(
    store: ObjectStore,
    namespace: str,
    topics: list[str] | None = None,
    pattern: str | None = None,
    *,
    assigned: dict[str, list[int]] | None = None,
    require_all: bool = True,
    pieces: dict[TopicPartition, list[tuple[int, str]]] | None = None,
) -> TopicListing:
    """Find partitions and segments of the subscribed topics.

    A subscribed topic without any segment object is an error: this reader cannot tell an
    unknown topic from one that has not flushed yet, and silently reading nothing would hide
    a typo in `subscribe`. `assigned` ({topic: [partitions]}, Spark's `assign`) reads only
    those partitions. With require_all False (a stream waiting for its topics) missing
    topics are simply absent from the listing. `pieces`: (base offset, piece key) of
    committed segments held in write-ahead objects, per partition (pieces.py), listed with
    the segment objects under the same subscription.
    """
    if assigned is not None:
        topics = sorted(assigned)
    if (topics is None) == (pattern is None):
        raise ValueError("give exactly one of topics or pattern")
    if topics is not None:
        keys_per_topic = await asyncio.gather(*(store.list(f"{namespace}/{t}/") for t in topics))
        keys = [k for ks in keys_per_topic for k in ks]
    else:
        keys = await store.list(f"{namespace}/")
    regex = re.compile(pattern) if pattern is not None else None
    found: dict[TopicPartition, list[tuple[int, str]]] = {}
    indexed = {segment.segment_key_of_index(key) for key in keys if key.endswith(".index")}
    segment_key = segment.segment_key_pattern(namespace)

    def subscribed(topic: str, part: int) -> bool:
        if topics is not None and topic not in topics:
            return False
        if regex is not None and (is_internal(topic) or not regex.fullmatch(topic)):
            return False  # a pattern leaves internal topics out, as a Kafka consumer's subscribe(Pattern)
        return assigned is None or part in assigned[topic]

    for key in keys:
        m = segment_key.fullmatch(key)
        if m is None:
            continue
        topic, part, base = m.group(1), int(m.group(2)), int(m.group(3))
        if subscribed(topic, part):
            found.setdefault((topic, part), []).append((base, key))
    for tp, entries in (pieces or {}).items():
        if subscribed(*tp):
            # A segment object at a piece's base offset is the rewrite of that piece (and
            # maybe more after it): the segment object is read, the piece left out.
            bases = {b for b, _ in found.get(tp, ())}
            found.setdefault(tp, []).extend(e for e in entries if e[0] not in bases)
    for segs in found.values():
        segs.sort()
    listing = TopicListing(found, indexed)
    if not require_all:
        return listing
    if assigned is not None:
        missing_parts = sorted(f"{t}/{p}" for t, ps in assigned.items() for p in ps if (t, p) not in found)
        if missing_parts:
            raise TopicNotFoundError(
                f"assigned partition(s) {', '.join(missing_parts)} not found: no flushed segments under {namespace}/ "
                "in the storage (check assign, namespace and storage options)"
            )
    if topics is not None:
        missing = sorted(set(topics) - set(listing.topics()))
        if missing and not found and not await store.list(f"{namespace}/"):
            raise TopicNotFoundError(_no_objects(store, namespace))
        if missing:
            raise TopicNotFoundError(
                f"topic(s) {', '.join(missing)} not found: no flushed segments under "
                + ", ".join(f"{namespace}/{t}/" for t in missing)
                + " in the storage (check subscribe, namespace and storage options)"
            )
    elif not found and not keys:
        raise TopicNotFoundError(_no_objects(store, namespace))
    elif not found:
        raise TopicNotFoundError(f"no topic matching subscribePattern {pattern!r} has flushed segments under {namespace}/")
    return listing


def _no_objects(store: ObjectStore, namespace: str) -> str:
    return (
        f"the storage holds no KafScale objects under {namespace}/ (nothing at all there): check the option storage "
        "(the broker's --storage URL, e.g. file:///var/lib/kafscale/objects) and namespace (the broker's --namespace)"
    )


@dataclass(slots=True)
class PartitionRange:
    start: int
    end: int
