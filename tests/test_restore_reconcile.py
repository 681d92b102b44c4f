"""The restore's reconciliation in process (backup/reconcile.py, restore.py), on a real local
object store and a real SQLite store, with segments written by the segment codec: a merge
after the snapshot (merged object preferred, its leftover dropped), retention after it
(log start moves), segments committed after it (adopted as a chain), a transaction open at
the loss (closed by an ABORT marker the consumer's aborted list names), leader epochs and
producer ids moved past what the bucket shows; and the snapshot format's checks."""

from __future__ import annotations

import time

import pytest

from kafscale.backup import snapshot as snapshot_format
from kafscale.backup.restore import PRODUCER_ID_MARGIN, RestoreRefused, restore
from kafscale.backup.snapshot import SnapshotCorrupt, SnapshotStore
from kafscale.metadata import keys
from kafscale.metadata.kv import Txn
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.protocol import records
from kafscale.storage import segment
from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.objectstore import ObjectNotFound

NS = "default"


def _segment(base: int, n: int, *, epoch: int = 0, pid: int = -1, transactional: bool = False) -> segment.EncodedSegment:
    """n records at offsets base.., one batch, as a broker would have stored it."""
    attrs = records.TRANSACTIONAL_MASK if transactional else 0
    buf = bytearray(records.build_batch([(f"k{i}".encode(), f"v{base + i}".encode()) for i in range(n)], base_offset=base,
                                        timestamp=int(time.time() * 1000), producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                        base_sequence=0 if pid >= 0 else -1, attributes=attrs))  # fmt: skip
    records.patch_batch(buf, 0, base, epoch)
    return segment.encode([bytes(buf)], base)


async def _put(store, topic: str, p: int, enc: segment.EncodedSegment) -> None:
    await store.put(segment.segment_key(NS, topic, p, enc.info.base_offset), enc.parts)


async def _commit(meta: MetadataStore, store, topic: str, p: int, enc: segment.EncodedSegment) -> None:
    await _put(store, topic, p, enc)
    st = await meta.get_partition(topic, p)
    await meta.commit_segment(st, enc.info)


async def test_reconcile_merge_retention_chain_and_open_transaction(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    meta = MetadataStore(SqliteKV(tmp_path / "before.sqlite"))
    await meta.create_topic(TopicMeta("t", 2, configs={"retention.ms": "1000"}))
    for base in (0, 10, 20):
        await _commit(meta, store, "t", 0, _segment(base, 10))
        await _commit(meta, store, "t", 1, _segment(base, 10))
    # Producer 77's previous transaction was committed before the snapshot, at the epoch
    # its open one (below) has: not a decision about the open one, which gets an ABORT.
    await meta.put_transaction("tx77", {"producer_id": 77, "producer_epoch": 0, "timeout_ms": 60000, "state": "CompleteCommit",
                                        "partitions": [], "groups": [], "start_ms": 0, "last_update_ms": 0}, 0)  # fmt: skip
    snaps = SnapshotStore(store, NS)
    await snaps.take(meta.kv, 1)
    # After the snapshot. Partition 0: a merge replaced segment 0 by one covering 0-19 (its
    # leftover 10 not swept yet), then segments 30 and 40 were committed, 40 holding a
    # transaction of producer 77 still open at the loss, at leader epoch 5.
    merged = segment.encode([bytes(_segment(0, 10).parts[1]), bytes(_segment(10, 10).parts[1])], 0)
    await _put(store, "t", 0, merged)
    await _put(store, "t", 0, _segment(30, 10, epoch=5))
    await _put(store, "t", 0, _segment(40, 5, epoch=5, pid=77, transactional=True))
    # Partition 1: retention deleted segment 0; a gap after 20 (no object at 30) stops the
    # chain and the object beyond it is moved aside.
    await store.delete([segment.segment_key(NS, "t", 1, 0)])
    await _put(store, "t", 1, _segment(40, 10))
    await meta.close()

    kv = SqliteKV(tmp_path / "after.sqlite")
    report = await restore(kv, store, snaps, NS, fence_epochs=True)
    after = MetadataStore(kv)
    p0 = await after.get_partition("t", 0)
    assert [(s.base_offset, s.last_offset) for s in p0.segments] == [(0, 19), (20, 29), (30, 39), (40, 44), (45, 45)]
    assert p0.high_watermark == 46 and p0.log_start_offset == 0
    assert p0.leader_epoch == 6  # above the 5 the adopted batches carry
    marker = p0.segments[-1]
    assert marker.aborted == ((77, 40, 45),)
    data = await store.get(segment.segment_key(NS, "t", 0, 45))
    body = segment.decode(data).batches
    h = records.read_header(body, 0)
    assert h.is_control and h.producer_id == 77 and records.read_control(body, 0, h)[0] == records.CONTROL_ABORT
    p1 = await after.get_partition("t", 1)
    assert [s.base_offset for s in p1.segments] == [10, 20]
    assert p1.log_start_offset == 10 and p1.high_watermark == 30
    assert await store.list(segment.partition_prefix(NS, "t", 1) + "segment-00000000000000000040") == []
    assert report.quarantined == [f"{NS}/~quarantine/t/1/segment-00000000000000000040.kfs"]
    assert report.segments_replaced == 1 and report.segments_adopted == 2 and report.transactions_aborted == 1
    assert report.segments_dropped == 2  # partition 0's leftover 10, partition 1's 0
    assert "t-1: no segment starts at offset 30" in "\n".join(report.problems)
    assert (await after.get_topic("t")).configs == {"retention.ms": "1000"}
    pid_block = int((await kv.get(keys.PRODUCER_IDS)).value)
    assert pid_block >= 78 + PRODUCER_ID_MARGIN - 1
    assert await kv.get("/restore-in-progress") is None

    # An unknown snapshot asked for: nothing written, not even the restore's mark.
    empty = SqliteKV(tmp_path / "empty.sqlite")
    with pytest.raises(ObjectNotFound):
        await restore(empty, store, snaps, NS, snapshot_id="20000101T000000000Z-0")
    assert await empty.read_all() == (0, [])
    await empty.close()

    # A second restore into the now filled store: refused, nothing changed.
    before = await kv.read_all()
    with pytest.raises(RestoreRefused):
        await restore(kv, store, snaps, NS)
    assert await kv.read_all() == before
    await kv.close()


async def test_snapshot_format_checks_and_pruning(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    kv = SqliteKV(tmp_path / "m.sqlite")
    meta = MetadataStore(kv)
    await meta.create_topic(TopicMeta("a", 1))
    await kv.commit(Txn(puts=[(keys.broker(3), b"{}"), (keys.owner("a", 0), b"{}")]))
    snaps = SnapshotStore(store, NS)
    info = await snaps.take(kv, 2)
    loaded = await snaps.load(info.id)
    assert [k for k, _ in loaded.entries] == [keys.topic("a")]  # lease-bound keys left out
    assert loaded.info.writer == 2 and loaded.info.key_count == 1
    raw = bytearray(await store.get(snapshot_format.snapshot_key(NS, info.id)))
    for cut in (raw[:20], raw[:-3], raw[:10] + b"\xff" + raw[11:], raw[:-1] + bytes([raw[-1] ^ 1])):
        with pytest.raises(SnapshotCorrupt):
            snapshot_format.decode(bytes(cut), "x")
    ids = [info.id]
    for _ in range(4):
        time.sleep(0.002)
        ids.append((await snaps.take(kv, 2)).id)
    assert await snaps.ids() == sorted(ids)
    assert await snaps.prune(2) == sorted(ids)[:3]
    assert await snaps.ids() == sorted(ids)[3:]
    assert snapshot_format.created_ms_of(ids[-1]) == (await snaps.load(ids[-1])).info.created_ms
    await kv.close()
