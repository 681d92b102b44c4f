"""Topic markers: one object per topic, `{namespace}/{topic}/topic.json`, beside the topic's
partition directories (those are numeric, so the name cannot collide), saying which topic
(by Kafka topic id) the objects under that prefix belong to:

    {"topic_id": ..., "name": ..., "partitions": N, "configs": {...},
     "created_ms": ..., "deleted_ms": null}

Written when a topic is created, before the create is answered; rewritten on
CreatePartitions and config changes; a deletion first rewrites it with `deleted_ms`, then
removes the topic's objects, then the marker. Brokers write the missing markers of topics
created by older versions at start (`sync_markers`).

What it is for: a topic created again under the same name never adopts objects of an
earlier topic (`clear_for_create`: an interrupted deletion's leftovers are removed, anything
else refuses the create), recovery never adopts another topic's segments, and a restore from
the bucket alone knows each topic's id, partition count and configs. The metadata store
stays the authority while it exists: the marker's configs are a copy as of the last change
written through a broker.

Records in write-ahead objects (storage/write_ahead.py) are not under the topic's prefix:
its live marker stands for them (a topic that can have them has a marker: written at its
create, or by `sync_markers` before a broker serves). The write-ahead cleanup keeps the
objects holding pieces of a topic the metadata store does not know while its marker says
it lives, and a metadata restore counts pieces only under a live marker of their topic id;
so `clear_for_create` needs no look into those objects: pieces of the name without a live
marker are a deleted topic's, and a new topic may be created over them.

Every listing of segments matches segment keys only (segment.segment_key_pattern,
parse_segment_key), so the marker is never taken for a segment.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from kafscale.metadata.store import TopicMeta
from kafscale.storage.objectstore import ObjectExistsError, ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.storage")

MARKER_NAME = "topic.json"


class MarkerFormatError(ValueError):
    """The bytes under a marker key are not a topic marker."""


class ForeignObjectsError(Exception):
    """Objects of another topic (or of no known topic) are under a prefix a new topic would
    take: neither adopted nor deleted; `kafscale metadata restore` brings their topic back."""


@dataclass(frozen=True, slots=True)
class TopicMarker:
    topic_id: str
    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0
    deleted_ms: int | None = None

    @classmethod
    def of(cls, meta: TopicMeta, deleted_ms: int | None = None) -> "TopicMarker":
        return cls(meta.topic_id, meta.name, meta.partitions, dict(meta.configs), meta.created_ms, deleted_ms)

    @property
    def deleted(self) -> bool:
        return self.deleted_ms is not None

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, data) -> "TopicMarker":
        try:
            doc = json.loads(bytes(data))
            marker = cls(
                str(doc["topic_id"]), str(doc["name"]), int(doc["partitions"]),
                {str(k): str(v) for k, v in (doc.get("configs") or {}).items()},
                int(doc.get("created_ms") or 0),
                None if doc.get("deleted_ms") is None else int(doc["deleted_ms"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise MarkerFormatError(f"not a topic marker: {e}") from None
        return marker

    def describes(self, meta: TopicMeta) -> bool:
        """Whether this is the live marker of exactly `meta` (id, partitions, configs)."""
        return self == TopicMarker.of(meta)


def topic_prefix(namespace: str, topic: str) -> str:
    return f"{namespace}/{topic}/"


def marker_key(namespace: str, topic: str) -> str:
    return f"{namespace}/{topic}/{MARKER_NAME}"


def is_marker_key(key: str) -> bool:
    return key.rsplit("/", 1)[-1] == MARKER_NAME


async def read_marker(store: ObjectStore, namespace: str, topic: str) -> TopicMarker | None:
    """The topic's marker, None when there is none. MarkerFormatError for other bytes;
    store failures propagate."""
    try:
        data = await store.get(marker_key(namespace, topic))
    except ObjectNotFound:
        return None
    return TopicMarker.decode(data)


async def write_marker(store: ObjectStore, namespace: str, marker: TopicMarker) -> None:
    await store.put(marker_key(namespace, marker.name), [marker.encode()])


def _now_ms() -> int:
    return int(time.time() * 1000)


async def mark_deleted(store: ObjectStore, namespace: str, meta: TopicMeta) -> TopicMarker:
    """The first step of a deletion: the marker says so, so a deletion cut short is known
    as one (the next create of the name removes what it left)."""
    marker = TopicMarker.of(meta, deleted_ms=_now_ms())
    await write_marker(store, namespace, marker)
    return marker


async def _describe(store: ObjectStore, namespace: str, topic: str) -> tuple[TopicMarker | None, str | None]:
    """(marker, None) or (None, why it is unreadable)."""
    try:
        return await read_marker(store, namespace, topic), None
    except MarkerFormatError as e:
        return None, str(e)


async def clear_for_create(store: ObjectStore, namespace: str, topic: str, *, dry_run: bool = False) -> int:
    """Make the prefix of a topic about to be created hold nothing of an earlier topic of
    the name. Objects left by a deletion that was cut short (its marker says deleted) are
    removed (unless `dry_run`); returns how many. Anything else under the prefix (a live
    marker: its topic's metadata was lost; objects without a marker; an unreadable marker)
    raises ForeignObjectsError and is left alone."""
    prefix = topic_prefix(namespace, topic)
    keys = await store.list(prefix)
    if not keys:
        return 0
    marker, unreadable = await _describe(store, namespace, topic)
    if marker is not None and marker.deleted:
        leftovers = [k for k in keys if not is_marker_key(k)]
        if leftovers and not dry_run:
            log.info("topic %s: removing %d objects left by the deletion of topic id %s", topic, len(leftovers), marker.topic_id)
            await store.delete(leftovers)
        return len(leftovers)
    if marker is not None:
        what = f"a topic {topic!r} with id {marker.topic_id} (created {iso(marker.created_ms)}) that the metadata store does not know"
    elif unreadable:
        what = f"an unreadable topic marker ({unreadable})"
    else:
        what = "objects without a topic marker"
    raise ForeignObjectsError(
        f"{len(keys)} objects under {prefix} belong to {what}; the new topic would adopt them, so it is not created. "
        f"Run `kafscale metadata restore` to bring that topic back, or delete the objects under {prefix} to discard them"
    )


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, for messages."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


async def remove_topic_objects(store: ObjectStore, namespace: str, topic: str, topic_id: str | None) -> int:
    """The end of a deletion of the topic with `topic_id`: its objects, then its marker.
    Nothing is removed when the marker already names another topic (the name was created
    again, and that create removed what was left). Returns how many objects went."""
    keys = await store.list(topic_prefix(namespace, topic))
    marker, _ = await _describe(store, namespace, topic)
    if topic_id is not None and marker is not None and marker.topic_id != topic_id:
        log.info("topic %s: not removing objects: the prefix now belongs to topic id %s", topic, marker.topic_id)
        return 0
    doomed = [k for k in keys if not is_marker_key(k)]
    await store.delete(doomed)
    # Last, and only if it is still this topic's: until then it says a deletion is under way.
    marker, _ = await _describe(store, namespace, topic)
    if marker is None or topic_id is None or marker.topic_id == topic_id:
        await store.delete([marker_key(namespace, topic)])
    return len(doomed)


async def _remove_marker_if(store: ObjectStore, namespace: str, marker: TopicMarker) -> None:
    """Delete the marker if it is still exactly `marker`."""
    found, _ = await _describe(store, namespace, marker.name)
    if found == marker:
        await store.delete([marker_key(namespace, marker.name)])


async def create_marker(store: ObjectStore, namespace: str, meta: TopicMeta) -> bool:
    """Write the marker of `meta` unless a marker is there already (a topic of an older
    version, now marked); True when this call wrote it."""
    try:
        await store.create(marker_key(namespace, meta.name), [TopicMarker.of(meta).encode()])
        return True
    except ObjectExistsError:
        return False


async def sync_markers(store: ObjectStore, namespace: str, metas: list[TopicMeta], current) -> dict[str, int]:
    """Bring the markers of the topics in the metadata store up to date: written where
    missing (topics created before markers existed), rewritten where the marker of the same
    id has other partitions or configs (a change whose marker write failed). A marker of
    another topic id is left alone and logged (objects of two topics under one prefix: a
    restore or an operator must decide). `current(name)` reads a topic from the metadata
    store again: a topic deleted since `metas` were read loses the marker written for it
    here (else a create of the name would be refused). Returns counts by outcome."""
    counts = {"written": 0, "updated": 0, "foreign": 0, "ok": 0}
    if not metas:
        return counts
    found = await store.get_many([(marker_key(namespace, m.name), None) for m in metas])
    for meta, data in zip(metas, found):
        if data is None:
            if await create_marker(store, namespace, meta):
                counts["written"] += 1
                now = await current(meta.name)
                if now is None or now.topic_id != meta.topic_id:
                    await _remove_marker_if(store, namespace, TopicMarker.of(meta))
            continue
        try:
            marker = TopicMarker.decode(data)
        except MarkerFormatError as e:
            log.error("topic %s: unreadable marker %s (%s); left alone", meta.name, marker_key(namespace, meta.name), e)
            counts["foreign"] += 1
            continue
        if marker.topic_id != meta.topic_id:
            log.error(
                "topic %s (id %s): its marker names topic id %s%s; objects of another topic may be under %s",
                meta.name, meta.topic_id, marker.topic_id, " (being deleted)" if marker.deleted else "", topic_prefix(namespace, meta.name),
            )
            counts["foreign"] += 1
        elif marker.deleted:
            counts["ok"] += 1  # a deletion under way (the metadata lags it)
        elif not marker.describes(meta):
            await write_marker(store, namespace, TopicMarker.of(meta))
            counts["updated"] += 1
        else:
            counts["ok"] += 1
    return counts


async def owned_by(store: ObjectStore, namespace: str, topic: str, topic_id: str) -> tuple[bool, str]:
    """Whether the objects under the topic's prefix may be taken as the topic `topic_id`'s
    (recovery adopting segments never committed): (True, "") when the marker is that
    topic's live marker or there is none (a topic of an older version); else (False, why)."""
    marker, unreadable = await _describe(store, namespace, topic)
    if unreadable:
        return False, f"unreadable topic marker: {unreadable}"
    if marker is None:
        return True, ""
    if marker.topic_id != topic_id:
        return False, f"the topic marker names topic id {marker.topic_id}, not {topic_id}"
    if marker.deleted:
        return False, "the topic is being deleted"
    return True, ""
