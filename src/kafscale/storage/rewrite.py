"""Rewriting a run of committed segments as one (the merger and the compactor).

Both read the run's first object with its version and check it is that segment or a
superset of it this rewrite covers, read the others exactly as committed, and write the
result under the first segment's key with a conditional replace over the version read, the
index after, then swap the run for the new segment in one metadata transaction and leave
the run's other objects to be deleted after the grace period. Killed anywhere in between,
the old segment list still reads right (docs/compaction.md, storage/merger.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from kafscale.storage import segment
from kafscale.storage.failures import StorageError
from kafscale.storage.metrics import StorageMetrics
from kafscale.storage.objectstore import ObjectChangedError, ObjectExistsError, ObjectNotFound, ObjectStore
from kafscale.storage.partition_log import PartitionLog
from kafscale.storage.reader import SegmentReader

log = logging.getLogger("kafscale.storage")


@dataclass
class RunInput:
    bodies: list  # each segment's committed batches, in order
    version: object  # of the first object: the replace happens only over this one (None: the first
    # segment is in a write-ahead object, the result is created under its spec key)
    first_size: int  # bytes of the first object as read


@dataclass(frozen=True)
class SegmentRewriter:
    """Reads and writes runs of a partition's committed segments for the merger and the
    compactor, with what it is given: the store, the reader (its cache), where keys live,
    when an index is written, the metrics sink, and who owns a partition now."""

    store: ObjectStore
    reader: SegmentReader
    namespace: str
    index_min_bytes: int
    metrics: StorageMetrics
    owns: Callable[[str, int], bool]  # owns(topic, partition)

    async def read_segment_batches(self, topic: str, partition: int, seg: segment.SegmentInfo) -> memoryview:
        """The batches of the committed segment `seg`, for a rewrite: from the segment cache only
        when the cached view is exactly the committed object's batches (its size says so), else
        from the store, checked to be that segment or a superset of it (a merge or compaction
        replaced it and crashed before its swap); either way bounded by the segment's offsets.
        Whatever a rewrite reads it writes back as the only copy, so a view the cache holds for
        an older object under the key (a load that ended after a swap) must never be its input."""
        view = self.reader.cache.get((topic, partition, seg.base_offset))
        if view is not None and len(view.data) + segment.HEADER_SIZE + segment.FOOTER_SIZE == seg.size:
            return segment.batches_through(view.data, seg.last_offset, view.last_offset)
        key, start, end = segment.stored_at(self.namespace, topic, partition, seg)
        try:
            data = await self.store.get(key, start, end)
        except ObjectNotFound as e:
            raise StorageError(f"segment {key} is gone (retention, DeleteRecords?)") from e
        decoded = segment.decode(data, name=key)
        got = decoded.info
        if got.base_offset != seg.base_offset or got.created_ms != seg.created_ms or got.last_offset < seg.last_offset:
            raise StorageError(f"{key} is not the committed segment (offsets {got.base_offset}-{got.last_offset}, created {got.created_ms})")
        self.metrics.read_objects()
        return segment.batches_through(decoded.batches, seg.last_offset, got.last_offset)

    async def read_run(self, lg: PartitionLog, run: list[segment.SegmentInfo], what: str) -> RunInput | None:
        """The run's batches, or None when its first object is gone or is not one this rewrite
        may replace (a newer owner's longer rewrite under the key, which must stand)."""
        base = run[0].base_offset
        if run[0].wao_key:
            # In a write-ahead object: no spec object of its own is replaced, one is created.
            try:
                bodies = [await self.read_segment_batches(lg.topic, lg.partition, seg) for seg in run]
            except StorageError as e:
                log.info("%s of %s-%s at %d skipped: %s", what, lg.topic, lg.partition, base, e)
                return None
            return RunInput(bodies, None, 0)
        key = segment.segment_key(self.namespace, lg.topic, lg.partition, base)
        try:
            stored, version = await self.store.get_with_version(key)
        except ObjectNotFound:
            return None  # retention or DeleteRecords took the run meanwhile
        decoded = segment.decode(stored, name=key)
        first = decoded.info
        if first.base_offset != base or first.created_ms != run[0].created_ms or not run[0].last_offset <= first.last_offset <= run[-1].last_offset:
            log.info("%s of %s-%s at %d skipped: the object there (offsets %d-%d) is not one it may replace",
                     what, lg.topic, lg.partition, base, first.base_offset, first.last_offset)
            return None
        bodies = [segment.batches_through(decoded.batches, run[0].last_offset, first.last_offset)]
        for seg in run[1:]:
            bodies.append(await self.read_segment_batches(lg.topic, lg.partition, seg))
        return RunInput(bodies, version, first.size)

    async def commit_run(self, lg: PartitionLog, run: list[segment.SegmentInfo], enc: segment.EncodedSegment,
                         body: list, read: RunInput, schedule_delete, what: str) -> bool:
        """Write `enc` (of the batch buffers `body`) over the run's first object (conditionally),
        its index, swap the run for it in the metadata and schedule the run's other objects for deletion. False when another
        writer got there first, the partition changed owner, or the run changed meanwhile."""
        ns = self.namespace
        base = run[0].base_offset
        objects = segment.segment_objects(ns, lg.topic, lg.partition, enc, self.index_min_bytes)
        # Only an owner rewrites, and only over the version it read: an old owner's late write
        # would replace the new owner's longer object with a shorter one.
        if lg.closed or not self.owns(lg.topic, lg.partition):
            return False
        if len(objects) == 1 and read.first_size >= self.index_min_bytes:
            # The replaced object may have an index the new one will not: never leave an index
            # that does not match its segment (readers then read the segment whole).
            await self.store.delete([segment.index_key(ns, lg.topic, lg.partition, base)])
        try:
            if read.version is None:
                if not await self._create_first(lg, objects[0], enc.info, what):
                    return False
            else:
                await self.store.replace(*objects[0], read.version)
        except ObjectChangedError as e:
            log.warning("%s of %s-%s at %d dropped: %s (another writer, a newer owner?, replaced it first)", what, lg.topic, lg.partition, base, e)
            return False
        if len(objects) > 1:
            await self.store.put_many(objects[1:])  # the index, only once the segment is ours
        self.metrics.uploaded(len(objects))
        if not await lg.swap_segments(run, enc.info):
            return False  # retention or DeleteRecords changed the run meanwhile, or the log stopped
        self.reader.replace_cached(lg.topic, lg.partition, [s.base_offset for s in run], base, body, enc.info.last_offset)
        keys = []
        for seg in run[1:]:
            if seg.wao_key:
                continue  # its write-ahead object goes once nothing refers to it (write_ahead_cleanup.py)
            keys += [segment.segment_key(ns, lg.topic, lg.partition, seg.base_offset), segment.index_key(ns, lg.topic, lg.partition, seg.base_offset)]
        schedule_delete(keys)
        return True

    async def _create_first(self, lg: PartitionLog, obj: tuple[str, list], info: segment.SegmentInfo, what: str) -> bool:
        """Create the rewritten segment of a run that began in a write-ahead object under its
        spec key. An object already there was left by a rewrite that never committed (this
        broker's before a crash, or an old owner's): replaced, over its version, only when the
        new segment holds all of it (same segment, offsets up to its last); anything else is
        another writer's and stands (False)."""
        key, parts = obj
        try:
            await self.store.create(key, parts)
            return True
        except ObjectExistsError:
            pass
        try:
            stored, version = await self.store.get_with_version(key)
            got = segment.decode(stored, name=key).info
        except ObjectNotFound:
            return False  # gone meanwhile: the next round creates it
        except segment.SegmentFormatError as e:
            log.warning("%s of %s-%s at %d: replacing an unusable uncommitted object: %s", what, lg.topic, lg.partition, info.base_offset, e)
            got = None
        if got is not None and not (got.base_offset == info.base_offset and got.created_ms == info.created_ms and got.last_offset <= info.last_offset):
            log.warning("%s of %s-%s at %d dropped: another writer's object (offsets %d-%d) is there", what, lg.topic, lg.partition, info.base_offset, got.base_offset, got.last_offset)
            return False
        await self.store.replace(key, parts, version)
        return True
