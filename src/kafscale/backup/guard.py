"""No silent empty start: a broker whose metadata store holds no topic while its namespace
in the object store holds data (segments, snapshots) has lost its metadata. Starting would
serve empty topics over records that still exist, and a topic created again would meet the
old objects. It stops instead, naming `kafscale metadata restore`, unless started with
`--metadata-auto-restore`, which runs that restore first. While a restore is under way
(its RESTORING mark is in the store) a broker waits for it."""

from __future__ import annotations

import asyncio
import logging
import time

from kafscale.backup.restore import RESTORING, RestoreRefused, namespace_holds_data, restore
from kafscale.backup.snapshot import SnapshotStore
from kafscale.metadata import keys
from kafscale.metadata.kv import KV
from kafscale.storage.objectstore import ObjectStore

log = logging.getLogger("kafscale.backup")

WAIT_LOG_S = 30.0


class MetadataLost(RuntimeError):
    """The metadata store is empty but the namespace holds data."""


async def _wait_for_restore(kv: KV) -> None:
    said = 0.0
    while await kv.get(RESTORING) is not None:
        if time.monotonic() - said >= WAIT_LOG_S:
            said = time.monotonic()
            log.warning("a metadata restore is under way: waiting for it before starting")
        await asyncio.sleep(0.5)


async def refuse_lost_metadata(kv: KV, store: ObjectStore, snapshots: SnapshotStore, config) -> None:
    while True:
        await _wait_for_restore(kv)
        if await kv.range(keys.TOPICS):
            return
        if not await namespace_holds_data(store, config.namespace) and not await snapshots.ids():
            return  # a new cluster
        if not config.metadata_auto_restore:
            raise MetadataLost(
                f"the metadata store ({config.metadata}) is empty but namespace {config.namespace!r} of {config.storage} holds data; "
                f"run `kafscale metadata restore` with this broker's --data-dir/--storage/--metadata/--namespace flags "
                f"(or start with --metadata-auto-restore true)"
            )
        log.warning("the metadata store is empty but namespace %r holds data: restoring it (--metadata-auto-restore)", config.namespace)
        try:
            await restore(kv, store, snapshots, config.namespace, fence_epochs=config.metadata_url.is_etcd)
            return
        except RestoreRefused as e:
            if await kv.get(RESTORING) is None:
                raise MetadataLost(f"cannot restore the metadata store automatically: {e}") from e
            log.warning("not restoring: %s", e)  # another broker's restore: wait for it
