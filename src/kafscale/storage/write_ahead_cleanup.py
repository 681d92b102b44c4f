"""Deleting write-ahead objects nothing refers to any more (storage/write_ahead.py).

A write-ahead object is needed while any partition's committed segment list refers to it
(SegmentInfo.wao_key). Once the merger has rewritten every piece of it into spec segments,
nothing does; an object whose commit never happened (the broker killed between upload and
commit, a failed or fenced commit) never was. Either way it holds nothing anyone needs,
but it may not be deleted at once: readers that read the segment list before the rewrite
may still fetch from it, and a commit may still be on its way.

So each round lists `{namespace}/~wal/`, THEN reads which keys the metadata refers to
(one consistent read of every segment key; a commit landing in between is seen; skipped
while no listed object is within a grace of orphan_age_s), and deletes an object only when
- it has been unreferenced at every round for at least `grace_s` (the merger's grace for
  merged-away segments: readers' segment lists are at most that old), and
- it is at least `orphan_age_s` old (by the creation time its key names): the flusher
  starts no commit of an object older than a quarter of that (write_ahead_flusher.py), so
  nothing can refer to it later. This also bounds the clock skew between brokers it
  tolerates (three quarters of it).
The rule keeps no state that a kill -9 could leave wrong (a restarted broker starts every
grace afresh) and is safe however many brokers run it at once; every broker runs it after
each merge round for its namespace. Cost per round: one LIST per 1,000 objects under
`~wal/`, one read of the segment keys of the metadata, one DELETE per 1,000 objects.
"""

from __future__ import annotations

import logging
import time

from kafscale.metadata.store import MetadataStore
from kafscale.storage import write_ahead
from kafscale.storage.objectstore import ObjectStore

log = logging.getLogger("kafscale.storage")


class WriteAheadCleanup:
    def __init__(self, store: ObjectStore, metadata: MetadataStore, namespace: str, grace_s: float, orphan_age_s: float):
        self.store = store
        self.metadata = metadata
        self.namespace = namespace
        self.grace_s = grace_s
        self.orphan_age_s = orphan_age_s
        self._unreferenced_since: dict[str, float] = {}  # key -> first round (monotonic) it was seen unreferenced
        self.deleted = 0

    async def run_once(self) -> int:
        """One round; returns how many objects it deleted."""
        listed = await self.store.list(write_ahead.wal_prefix(self.namespace))
        now, now_ms = time.monotonic(), time.time() * 1000
        # Only objects that may be due within a grace are followed: a younger one could
        # not go before orphan_age_s anyway. Without any, the metadata is not read (a read
        # of every segment key, the bulk of a round's cost): a round that does not look
        # restarts every grace, which only delays deletions.
        watch_from_ms = now_ms - (self.orphan_age_s - self.grace_s) * 1000
        candidates = {}
        for key in listed:
            created_ms = write_ahead.created_ms_of_key(key)
            if created_ms is not None and created_ms <= watch_from_ms:
                candidates[key] = created_ms
        if not candidates:
            self._unreferenced_since = {}
            return 0
        used = await self.metadata.write_ahead_keys_in_use()
        unreferenced: dict[str, float] = {}
        doomed = []
        for key, created_ms in candidates.items():
            if key in used:
                continue
            since = self._unreferenced_since.get(key, now)
            if now - since >= self.grace_s and now_ms - created_ms >= self.orphan_age_s * 1000:
                doomed.append(key)
            else:
                unreferenced[key] = since
        self._unreferenced_since = unreferenced
        if doomed:
            try:
                await self.store.delete(doomed)
            except Exception:
                for key in doomed:  # their grace is over: due again at the next round
                    self._unreferenced_since[key] = now - self.grace_s
                raise
            self.deleted += len(doomed)
            log.info("deleted %d write-ahead objects no segment refers to", len(doomed))
        return len(doomed)
