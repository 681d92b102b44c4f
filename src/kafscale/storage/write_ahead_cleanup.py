"""Deleting write-ahead objects nothing refers to any more (storage/write_ahead.py).

A write-ahead object is needed while any partition's committed segment list refers to it
(SegmentInfo.wao_key). Once the merger has rewritten every piece of it into spec segments,
nothing does; an object whose commit never happened (the broker killed between upload and
commit, a failed or fenced commit) never was. Either way it holds nothing anyone needs,
but it may not be deleted at once: readers that read the segment list before the rewrite
may still fetch from it, and a commit may still be on its way.

Each round lists `{namespace}/~wal/` and looks only at the objects at least
`orphan_age_s` old (by the creation time their keys name): the flusher starts no commit of
an object older than a quarter of that (write_ahead_flusher.py), so from then on the
references to an object only go away, never come (this also bounds the clock skew between
brokers it tolerates: three quarters of it). For each such object it reads the object's
index once (one ranged GET, storage/write_ahead.py `read_index`) and then asks the
metadata, piece by piece, whether the piece's partition still holds it
(MetadataStore.write_ahead_pieces_held: the segment key at the piece's base offset); a
piece found released is never asked about again, and an object's pieces are asked about
in growing chunks (1, 2, 4, ...) that stop at the first piece still held. So a round costs
one LIST per 1,000 objects, one GET per object that came of age since the last round, and
about one metadata key per object still held plus two per piece released since: what may
be due, not the namespace's segment lists (which grow with every partition's history).

An object is deleted once none of its pieces is held, and it has been so for `grace_s`
(the merger's grace for merged-away segments: readers' segment lists are at most that
old), unless it holds pieces of a topic whose metadata is lost: a piece of a topic the
metadata store does not know under the piece's topic id while the topic's marker
(storage/topic_marker.py) still names that id as live. Such an object is kept (and
logged) for `kafscale metadata restore`, which finds the pieces through the objects'
indexes; deleting it would lose acknowledged records, and the restored topic would hand
their offsets out again. A deleted topic's pieces go as any other: its marker says deleted,
or is gone.

The rule keeps no state that a kill -9 could leave wrong (a restarted broker starts every
grace afresh) and is safe however many brokers run it at once; every broker runs it after
each merge round for its namespace. An object whose index cannot be read (damaged) is
checked against one read of every segment key instead, as before indexes were read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from array import array

from kafscale.metadata.store import MetadataStore
from kafscale.storage import topic_marker, write_ahead
from kafscale.storage.objectstore import ObjectNotFound, ObjectStore

log = logging.getLogger("kafscale.storage")

INDEX_READS_AT_ONCE = 16
MAX_CHUNK = 1024  # pieces asked about at once for one object


class _Watched:
    """An object of age: its pieces in compact arrays (a broker may watch hundreds of
    objects of a thousand pieces each) and which of them are still held."""

    __slots__ = ("topics", "topic_of", "partitions", "bases", "pending", "chunk", "since")

    def __init__(self, pieces: list[write_ahead.Piece] | None):
        self.since: float | None = None  # first round it was seen with no piece held
        self.chunk = 1
        if pieces is None:  # unreadable index
            self.topics, self.pending = None, None
            return
        ids: dict[tuple[str, str], int] = {}
        self.topic_of = array("I", (ids.setdefault((p.topic, p.topic_id), len(ids)) for p in pieces))
        self.topics = list(ids)
        self.partitions = array("i", (p.partition for p in pieces))
        self.bases = array("q", (p.base_offset for p in pieces))
        self.pending = array("I", range(len(pieces)))  # pieces not yet seen released, in index order


class WriteAheadCleanup:
    def __init__(self, store: ObjectStore, metadata: MetadataStore, namespace: str, grace_s: float, orphan_age_s: float):
        self.store = store
        self.metadata = metadata
        self.namespace = namespace
        self.grace_s = grace_s
        self.orphan_age_s = orphan_age_s
        self._watched: dict[str, _Watched] = {}
        self._kept_logged: set[str] = set()
        self.deleted = 0
        # What the rounds cost, for docs/performance.md's figures: object-store LIST pages,
        # index reads (GETs), metadata keys read.
        self.lists = 0
        self.index_reads = 0
        self.metadata_keys_read = 0

    async def run_once(self) -> int:
        """One round; returns how many objects it deleted."""
        listed = await self.store.list(write_ahead.wal_prefix(self.namespace))
        self.lists += 1 + len(listed) // 1000
        now, now_ms = time.monotonic(), time.time() * 1000
        of_age_ms = now_ms - self.orphan_age_s * 1000
        of_age = [k for k in listed if (c := write_ahead.created_ms_of_key(k)) is not None and c <= of_age_ms]
        self._watched = {k: self._watched[k] for k in of_age if k in self._watched}  # the others went
        self._kept_logged &= self._watched.keys()
        new = [k for k in of_age if k not in self._watched]
        for key, watched in zip(new, await self._read_indexes(new)):
            if watched is not None:
                self._watched[key] = watched
        await self._release()
        released = [k for k, w in self._watched.items() if w.pending is not None and not w.pending]
        released += await self._released_unreadable()
        for key in released:
            w = self._watched[key]
            if w.since is None:
                w.since = now
        due = [k for k in released if now - self._watched[k].since >= self.grace_s]
        doomed = await self._not_of_lost_topics(due)
        if doomed:
            await self.store.delete(doomed)  # on failure they stay watched: due again next round
            for key in doomed:
                del self._watched[key]
            self.deleted += len(doomed)
            log.info("deleted %d write-ahead objects no segment refers to", len(doomed))
        return len(doomed)

    async def _read_indexes(self, keys: list[str]) -> list[_Watched | None]:
        sem = asyncio.Semaphore(INDEX_READS_AT_ONCE)

        async def one(key: str) -> _Watched | None:
            async with sem:
                self.index_reads += 1
                try:
                    return _Watched(await write_ahead.read_index(self.store, key))
                except ObjectNotFound:
                    return None  # deleted meanwhile (another broker's cleanup)
                except write_ahead.WriteAheadFormatError as e:
                    log.error("write-ahead object %s: unreadable index (%s); checked against every segment key instead", key, e)
                    return _Watched(None)

        return list(await asyncio.gather(*(one(k) for k in keys)))

    async def _release(self) -> None:
        """Drop from each watched object's pending pieces those no partition holds any more:
        per object a chunk of its pending pieces at a time (doubling while all of a chunk
        were released, back to 1 at a piece still held), all objects' chunks in one batch."""
        active = [(k, w) for k, w in self._watched.items() if w.pending]
        while active:
            asks = [(k, w, w.pending[: w.chunk]) for k, w in active]
            held = await self.metadata.write_ahead_pieces_held(
                [(k, w.topics[w.topic_of[i]][0], w.partitions[i], w.bases[i]) for k, w, take in asks for i in take]
            )
            self.metadata_keys_read += len(held)
            at = 0
            active = []
            for k, w, take in asks:
                still = array("I", (i for j, i in enumerate(take) if held[at + j]))
                at += len(take)
                w.pending = still + w.pending[len(take) :]
                if still:
                    w.chunk = 1
                    w.since = None
                else:
                    w.chunk = min(w.chunk * 2, MAX_CHUNK)
                    if w.pending:
                        active.append((k, w))

    async def _released_unreadable(self) -> list[str]:
        unreadable = [k for k, w in self._watched.items() if w.pending is None]
        if not unreadable:
            return []
        used = await self.metadata.write_ahead_keys_in_use()
        out = []
        for k in unreadable:
            if k in used:
                self._watched[k].since = None
            else:
                out.append(k)
        return out

    async def _not_of_lost_topics(self, keys: list[str]) -> list[str]:
        """`keys` without the objects holding pieces of a topic whose metadata is lost (the
        metadata store does not know the topic under the piece's id, its marker does)."""
        pairs = {t for k in keys if self._watched[k].topics for t in self._watched[k].topics}
        if not pairs:
            return keys
        known = await self.metadata.get_topics(sorted({name for name, _ in pairs}))
        self.metadata_keys_read += len({name for name, _ in pairs})
        unknown = {(name, tid) for name, tid in pairs if (m := known.get(name)) is None or m.topic_id != tid}
        lost = set()
        for name in sorted({name for name, _ in unknown}):
            try:
                marker = await topic_marker.read_marker(self.store, self.namespace, name)
            except topic_marker.MarkerFormatError:
                marker = None
            if marker is not None and not marker.deleted and (name, marker.topic_id) in unknown:
                lost.add((name, marker.topic_id))
        if not lost:
            return keys
        out = []
        for k in keys:
            topics = self._watched[k].topics or []
            found = sorted(t for t in topics if t in lost)
            if not found:
                out.append(k)
            elif k not in self._kept_logged:
                self._kept_logged.add(k)
                log.error(
                    "write-ahead object %s holds records of topic %s (id %s), which the metadata store does not know but its marker names: "
                    "kept for `kafscale metadata restore`", k, found[0][0], found[0][1],
                )
        return out
