"""`kafscale metadata snapshot|snapshots|restore`: metadata snapshots and the restore of a
lost metadata store (docs/operations.md). They open the metadata store and the object
store directly, with `kafscale broker`'s own flags (--data-dir, --storage, --metadata,
--namespace, --metadata-backup, ... and their KAFSCALE_* variables), not a broker.

Exit codes: 0 done, 1 refused or failed (said on stderr), 2 a store could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from kafscale.broker import config as broker_config

EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 2


def _stores(args: argparse.Namespace):
    from kafscale.backup.snapshot import SnapshotStore
    from kafscale.metadata.backends import open_kv
    from kafscale.storage.backends import open_store

    cfg = broker_config.from_args(args)
    kv = open_kv(cfg.metadata_url, cfg.data_dir, cfg.metadata_prefix)
    store = open_store(cfg.storage_url)
    backup = open_store(cfg.metadata_backup_url) if cfg.metadata_backup_url else store
    return cfg, kv, store, backup, SnapshotStore(backup, cfg.namespace)


async def _close(kv, store, backup) -> None:
    await kv.close()
    await store.close()
    if backup is not store:
        await backup.close()


def _run(coro_fn):
    def run(args: argparse.Namespace) -> int:
        from kafscale.backup.restore import RestoreRefused
        from kafscale.backup.snapshot import SnapshotCorrupt
        from kafscale.metadata.kv import MetadataUnavailable
        from kafscale.storage.objectstore import ObjectNotFound, ObjectStoreError

        try:
            return asyncio.run(coro_fn(args))
        except (RestoreRefused, SnapshotCorrupt) as e:
            print(f"refused: {e}", file=sys.stderr)
            return EXIT_FAILED
        except ObjectNotFound as e:
            print(f"not found: {e}", file=sys.stderr)
            return EXIT_FAILED
        except (MetadataUnavailable, ObjectStoreError) as e:
            print(f"unreachable: {e}", file=sys.stderr)
            return EXIT_UNREACHABLE

    return run


async def _snapshot(args: argparse.Namespace) -> int:
    from kafscale.backup.snapshot import CLI_WRITER

    cfg, kv, store, backup, snapshots = _stores(args)
    try:
        info = await snapshots.take(kv, CLI_WRITER)
        await snapshots.prune(cfg.metadata_snapshots_keep)
    finally:
        await _close(kv, store, backup)
    if args.json:
        print(json.dumps({"id": info.id, "created": info.created_iso, "keys": info.key_count, "bytes": info.size, "revision": info.revision}))
    else:
        print(f"snapshot {info.id}: {info.key_count} keys, {info.size} bytes, revision {info.revision}")
    return EXIT_OK


async def _snapshots(args: argparse.Namespace) -> int:
    from kafscale.cli.common import table

    _cfg, kv, store, backup, snapshots = _stores(args)
    try:
        found = await snapshots.list()
    finally:
        await _close(kv, store, backup)
    good = [s for s in found if not isinstance(s, str)]
    if args.json:
        print(json.dumps([{"id": s.id, "created": s.created_iso, "keys": s.key_count, "bytes": s.size, "revision": s.revision, "writer": s.writer} for s in good], indent=2))
    else:
        table(["ID", "CREATED", "KEYS", "BYTES", "REVISION", "WRITER"], [[s.id, s.created_iso, s.key_count, s.size, s.revision, s.writer] for s in good])
    for problem in (s for s in found if isinstance(s, str)):
        print(f"damaged: {problem}", file=sys.stderr)
    return EXIT_OK


async def _restore(args: argparse.Namespace) -> int:
    from kafscale.backup.restore import restore

    cfg, kv, store, backup, snapshots = _stores(args)
    try:
        report = await restore(
            kv, store, snapshots, cfg.namespace,
            snapshot_id=args.snapshot, use_snapshots=not args.no_snapshot, force=args.force,
            fence_epochs=cfg.metadata_url.is_etcd,
        )
    finally:
        await _close(kv, store, backup)
    if args.json:
        print(json.dumps(report.to_doc(), indent=2))
    else:
        print("\n".join(report.lines()))
    return EXIT_OK


def add_commands(sub) -> None:
    from kafscale.cli.common import command_family

    ms = command_family(sub, "metadata", "metadata snapshots and restore of a lost metadata store")

    def leaf(name: str, fn, help_text: str) -> argparse.ArgumentParser:
        p = ms.add_parser(name, help=help_text, description=help_text)
        broker_config.add_arguments(p, only=broker_config.STORE_FLAGS)  # the broker's own flags for its stores
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=_run(fn))
        return p

    leaf("snapshot", _snapshot, "take a metadata snapshot now")
    leaf("snapshots", _snapshots, "list the metadata snapshots")
    p = leaf("restore", _restore, "rebuild an empty metadata store from the newest snapshot and the bucket (brokers stopped)")
    p.add_argument("--snapshot", metavar="ID", help="restore this snapshot (see `kafscale metadata snapshots`) instead of the newest")
    p.add_argument("--no-snapshot", action="store_true", help="ignore every snapshot: rebuild from the bucket alone")
    p.add_argument("--force", action="store_true", help="replace whatever the metadata store holds (its keys are deleted first)")
