"""The broker task that keeps metadata snapshots fresh.

Exactly one broker of a cluster writes: the owner of `__consumer_offsets` partition 0
(every broker on the embedded store, which is one broker). Ownership moves with a new
leader epoch through etcd, so two writers overlap at most for the moment of a hand-over,
and even then each writes a snapshot object of its own (ids differ by writer).

The writer snapshots every `--metadata-snapshot-interval-ms`, and soon after topics, ACLs,
SCRAM users, client quotas or group configs change on any broker (it compares the versions of those keys
every CHECK_S, a few small range reads), then prunes to `--metadata-snapshots-keep`.
The other brokers only look up the newest snapshot's time, for
`kafscale_metadata_snapshot_age_seconds`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from kafscale.backup.snapshot import SnapshotInfo, SnapshotStore
from kafscale.metadata import keys
from kafscale.metadata.internal_topics import OFFSETS_TOPIC
from kafscale.metadata.kv import KV

log = logging.getLogger("kafscale.backup")

CHECK_S = 2.0  # how often the writer looks for topic/ACL/user/quota/group config changes
CHANGE_DEBOUNCE_S = 1.0  # least time between two snapshots taken for changes
WATCHED = (keys.TOPICS, keys.ACLS, keys.SCRAM_CREDENTIALS, keys.CLIENT_QUOTAS, keys.GROUP_CONFIGS)


class SnapshotWriter:
    def __init__(self, kv: KV, snapshots: SnapshotStore, cluster, broker_id: int, interval_s: float, keep: int):
        self.kv = kv
        self.snapshots = snapshots
        self.cluster = cluster
        self.broker_id = broker_id
        self.interval_s = interval_s
        self.keep = keep
        self.newest_ms: int | None = None  # creation time of the newest snapshot known
        self.written = 0
        self.failures = 0
        self._last_taken = 0.0
        self._last_looked = 0.0
        self._fingerprint: bytes | None = None
        self._dirty = False
        self._task: asyncio.Task | None = None

    def is_writer(self) -> bool:
        return self.cluster.owns(OFFSETS_TOPIC, 0)

    def age_seconds(self) -> float | None:
        return None if self.newest_ms is None else max(0.0, time.time() - self.newest_ms / 1000)

    async def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="metadata-snapshots")

    async def stop(self, final: bool = True) -> None:
        """Stop the task; `final`: the writer takes one last snapshot (after the logs were
        flushed, so it holds every acknowledged record's segment)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
            if final and self.is_writer():
                try:
                    await self.take()
                except Exception as e:  # noqa: BLE001 - shutting down: say so, go on
                    log.warning("final metadata snapshot failed: %s", e)

    async def take(self) -> SnapshotInfo:
        info = await self.snapshots.take(self.kv, self.broker_id)
        self.written += 1
        self.newest_ms = info.created_ms
        self._last_taken = time.monotonic()
        log.info("metadata snapshot %s: %d keys, %d bytes", info.id, info.key_count, info.size)
        pruned = await self.snapshots.prune(self.keep)
        if pruned:
            log.debug("pruned metadata snapshots %s", ", ".join(pruned))
        return info

    async def _changed(self) -> bool:
        digest = hashlib.blake2b(digest_size=16)
        for prefix in WATCHED:
            for kv in await self.kv.range(prefix):
                digest.update(f"{kv.key}\0{kv.version}\0".encode())
        fingerprint = digest.digest()
        changed = self._fingerprint is not None and fingerprint != self._fingerprint
        self._fingerprint = fingerprint
        return changed

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception as e:  # noqa: BLE001 - store or metadata outage: try again later
                self.failures += 1
                log.warning("metadata snapshot failed: %s", e)
            await asyncio.sleep(min(CHECK_S, self.interval_s))

    async def _tick(self) -> None:
        now = time.monotonic()
        if not self.is_writer():
            self._fingerprint = None
            if now - self._last_looked >= self.interval_s:
                self._last_looked = now
                self.newest_ms = await self.snapshots.newest_ms()
            return
        self._dirty = await self._changed() or self._dirty
        since = now - self._last_taken
        if since >= self.interval_s or (self._dirty and since >= CHANGE_DEBOUNCE_S):
            self._dirty = False
            await self.take()
