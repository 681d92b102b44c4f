"""Metadata snapshots in the object store and the restore of a lost metadata store
(docs/operations.md, "Metadata snapshots and restore").

  snapshot.py  the snapshot object: format, keys, writing, listing, loading, pruning
  writer.py    the broker task that takes snapshots (one writer per cluster)
  restore.py   rebuilding an empty metadata store from a snapshot and the bucket
  reconcile.py one partition's segment list, reconciled with the objects in the bucket
"""
