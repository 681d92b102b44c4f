"""The compactor's pure part (storage/cleaner.py): cleanable range, key map, which records
survive, and batch rewriting, on batches built with records.build_batch. Rewritten batches
are checked with the project's decoder and independently (struct + the crc32c package)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import tracemalloc

import crc32c
import pytest

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import records
from kafscale.protocol.records import build_batch, build_control_batch, decode_records
from kafscale.storage import cleaner

NOW = 1_700_000_000_000
HEADER = struct.Struct(">qiibIhiqqqhii")  # Kafka v2 batch header, 61 bytes


def settings(**kw) -> LogSettings:
    base = dict(retention_ms=-1, retention_bytes=-1, segment_bytes=1 << 20, max_message_bytes=1 << 20, log_append_time=False, cleanup_delete=False, cleanup_compact=True)
    base.update(kw)
    return LogSettings(**base)


def seg(base, last, size=1000, *, cleaned=False, ts=NOW - 60_000, created=None, aborted=()):
    return SegmentInfo(base, last, size, last - base + 1, ts, ts if created is None else created, aborted=aborted, cleaned=cleaned)


def batches(data) -> list[tuple[int, records.BatchHeader]]:
    return list(records.iter_batches(data))


def independent_check(data) -> list[tuple]:
    """Parse batches with plain struct; check each CRC32C with the crc32c package. Returns
    the header tuples."""
    out, pos = [], 0
    while pos < len(data):
        h = HEADER.unpack_from(data, pos)
        size = h[1] + 12
        assert h[3] == 2
        assert crc32c.crc32c(bytes(data[pos + 21 : pos + size])) == h[4], "CRC32C of a rewritten batch"
        out.append(h)
        pos += size
    assert pos == len(data)
    return out


def all_records(data) -> list[records.Record]:
    return [r for pos, h in batches(data) for r in decode_records(data, pos, h)]


# -- the cleanable range --------------------------------------------------------------


def test_newest_segment_is_never_cleanable():
    assert cleaner.plan([seg(0, 9)], last_stable_offset=10, now_ms=NOW, settings=settings()) is None
    p = cleaner.plan([seg(0, 9), seg(10, 19)], last_stable_offset=20, now_ms=NOW, settings=settings())
    assert [s.base_offset for s in p.segments] == [0] and p.first_dirty == 0


def test_nothing_at_or_after_the_last_stable_offset():
    segs = [seg(0, 9), seg(10, 19), seg(20, 29), seg(30, 39)]
    p = cleaner.plan(segs, last_stable_offset=19, now_ms=NOW, settings=settings())
    assert [s.base_offset for s in p.segments] == [0]
    p = cleaner.plan(segs, last_stable_offset=20, now_ms=NOW, settings=settings())
    assert [s.base_offset for s in p.segments] == [0, 10]
    assert cleaner.plan(segs, last_stable_offset=5, now_ms=NOW, settings=settings()) is None


def test_min_compaction_lag_stops_at_the_first_young_segment():
    segs = [seg(0, 9, ts=NOW - 10_000), seg(10, 19, ts=NOW - 1000), seg(20, 29, ts=NOW - 20_000), seg(30, 39)]
    p = cleaner.plan(segs, last_stable_offset=40, now_ms=NOW, settings=settings(min_compaction_lag_ms=5000))
    assert [s.base_offset for s in p.segments] == [0]  # nor anything after the young one
    assert cleaner.plan(segs, last_stable_offset=40, now_ms=NOW, settings=settings(min_compaction_lag_ms=60_000)) is None


def test_dirty_ratio_against_min_cleanable_dirty_ratio():
    segs = [seg(0, 9, 600, cleaned=True), seg(10, 19, 400), seg(20, 29)]
    assert cleaner.dirty_ratio(segs[:2]) == pytest.approx(0.4)
    assert cleaner.plan(segs, last_stable_offset=30, now_ms=NOW, settings=settings(min_cleanable_dirty_ratio=0.5)) is None
    p = cleaner.plan(segs, last_stable_offset=30, now_ms=NOW, settings=settings(min_cleanable_dirty_ratio=0.3))
    assert p.first_dirty == 1 and [s.base_offset for s in p.dirty] == [10] and p.dirty_ratio == pytest.approx(0.4)
    # nothing dirty: nothing to do, whatever the ratio
    segs = [seg(0, 9, cleaned=True), seg(10, 19)]
    assert cleaner.plan(segs, last_stable_offset=20, now_ms=NOW, settings=settings(min_cleanable_dirty_ratio=0.0)) is None
    # ... unless a kept tombstone's delete horizon has passed (Kafka cleans such a log too)
    segs = [dataclasses.replace(segs[0], delete_horizon_ms=NOW + 1), segs[1]]
    assert cleaner.plan(segs, last_stable_offset=20, now_ms=NOW, settings=settings()) is None
    p = cleaner.plan(segs, last_stable_offset=20, now_ms=NOW + 1, settings=settings())
    assert p is not None and p.dirty == [] and p.reason == "delete horizon passed"


def test_max_compaction_lag_forces_a_pass_below_the_ratio():
    segs = [seg(0, 9, 900, cleaned=True), seg(10, 19, 100, created=NOW - 50_000), seg(20, 29)]
    assert cleaner.plan(segs, last_stable_offset=30, now_ms=NOW, settings=settings(max_compaction_lag_ms=60_000)) is None
    p = cleaner.plan(segs, last_stable_offset=30, now_ms=NOW, settings=settings(max_compaction_lag_ms=40_000))
    assert p is not None and p.forced


def test_not_compacted_topics_are_never_planned():
    assert cleaner.plan([seg(0, 9), seg(10, 19)], last_stable_offset=20, now_ms=NOW, settings=settings(cleanup_compact=False)) is None


def test_groups_of_adjacent_segments_within_segment_bytes():
    segs = [seg(0, 9, 300), seg(10, 19, 300), seg(20, 29, 300), seg(30, 39, 2000), seg(40, 49, 100)]
    assert [[s.base_offset for s in g] for g in cleaner.group_segments(segs, 1000)] == [[0, 10, 20], [30], [40]]


# -- the key map ---------------------------------------------------------------------


def test_key_map_entry_cost_is_measured():
    """KEY_MAP_ENTRY_BYTES bounds what an entry really costs, at the dict's peak."""
    n = 100_000
    tracemalloc.start()
    km = cleaner.KeyMap(n * cleaner.KEY_MAP_ENTRY_BYTES)
    for i in range(n):
        km.put(b"key-%d" % i, 10**9 + i)
    _cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(km) == n and km.fits(0) and not km.fits(1)
    assert peak / n <= cleaner.KEY_MAP_ENTRY_BYTES
    assert peak / n > cleaner.KEY_MAP_ENTRY_BYTES * 0.6  # and is not wildly pessimistic


def test_key_map_maps_latest_offsets_skipping_markers_and_aborted_transactions():
    data = (
        build_batch([(b"a", b"1"), (b"b", b"1")], base_offset=0)
        + build_batch([(b"a", b"2"), (None, b"nokey")], base_offset=2)
        + build_batch([(b"b", b"aborted")], base_offset=4, producer_id=7, producer_epoch=0, base_sequence=0, attributes=records.TRANSACTIONAL_MASK)
        + build_control_batch(False, 7, 0, 0, NOW, base_offset=5)
    )
    km = cleaner.KeyMap(1 << 20)
    mapped = km.add(data, cleaner.AbortedIndex([(7, 4, 5)]))
    assert mapped == 3
    assert km.get(b"a") == 2 and km.get(b"b") == 1 and km.get(b"c") is None
    assert km.peak_entries == 2 and km.last_offset == 5
    assert km.entries[hashlib.blake2b(b"a", digest_size=16).digest()] == 2  # keyed by a 16-byte BLAKE2b digest
    assert km.capacity == (1 << 20) // cleaner.KEY_MAP_ENTRY_BYTES


# -- cleaning ------------------------------------------------------------------------


def clean_once(data, *, now=NOW, retention=1000, aborted=(), producers=None, key_map_data=None):
    km = cleaner.KeyMap(1 << 20)
    idx = cleaner.AbortedIndex(aborted)
    km.add(data if key_map_data is None else key_map_data, idx)
    c = cleaner.BatchCleaner(km, now_ms=now, delete_retention_ms=retention, aborted=idx, producer_last_offsets=producers)
    return c, c.clean(data)


def test_superseded_records_go_and_survivors_keep_offsets_timestamps_and_batch_fields():
    b1 = build_batch(
        [(b"a", b"a0"), (b"b", b"b0"), (b"c", b"c0")],
        base_offset=100, timestamp=NOW - 5000, timestamps=[NOW - 5000, NOW - 4000, NOW - 3000],
        producer_id=42, producer_epoch=3, base_sequence=10,
    )
    b2 = build_batch([(b"a", b"a1"), (b"c", b"c1")], base_offset=103, timestamp=NOW - 2000, timestamps=[NOW - 2000, NOW - 1000], producer_id=42, producer_epoch=3, base_sequence=13)
    c, out = clean_once(b1 + b2)
    assert out.changed and out.records_in == 5 and out.records_out == 3 and out.records_removed == 2
    got = all_records(out.body)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got] == [
        (101, b"b", b"b0", NOW - 4000),
        (103, b"a", b"a1", NOW - 2000),
        (104, b"c", b"c1", NOW - 1000),
    ]
    heads = independent_check(out.body)
    first = heads[0]
    # base offset, last offset delta, producer id/epoch, base sequence kept; 1 record now
    assert (first[0], first[6], first[9], first[10], first[11], first[12]) == (100, 2, 42, 3, 10, 1)
    assert first[8] == NOW - 4000  # max timestamp of what is left
    assert heads[1] == HEADER.unpack_from(b2, 0)  # untouched batch: the same bytes
    assert out.body[len(out.body) - len(b2) :] == b2


def test_unchanged_input_is_returned_as_is():
    data = build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=0) + build_batch([(b"c", b"3")], base_offset=2)
    _c, out = clean_once(data)
    assert not out.changed and out.body == data and out.records_removed == 0


def test_keyless_records_are_removed():
    _c, out = clean_once(build_batch([(None, b"x"), (b"k", b"v")], base_offset=0))
    assert [(r.offset, r.key) for r in all_records(out.body)] == [(1, b"k")]


def test_a_batch_left_empty_is_dropped_unless_it_is_its_producers_last():
    b1 = build_batch([(b"a", b"1")], base_offset=0, producer_id=5, producer_epoch=0, base_sequence=0)
    b2 = build_batch([(b"b", b"1")], base_offset=1, producer_id=6, producer_epoch=0, base_sequence=0)
    b3 = build_batch([(b"a", b"2"), (b"b", b"2")], base_offset=2)
    _c, out = clean_once(b1 + b2 + b3, producers={6: 1, 5: 99})
    heads = independent_check(out.body)
    assert [(h[0], h[9], h[12]) for h in heads] == [(1, 6, 0), (2, -1, 2)]  # producer 6's last batch kept, empty
    assert heads[0][10:12] == (0, 0) and heads[0][6] == 0  # epoch, sequence, last offset delta kept
    assert [r.offset for r in all_records(out.body)] == [2, 3]


def test_a_batch_keeps_its_last_offset_when_its_last_records_go():
    b1 = build_batch([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], base_offset=0, producer_id=9, producer_epoch=1, base_sequence=0)
    b2 = build_batch([(b"b", b"2"), (b"c", b"2")], base_offset=3)
    _c, out = clean_once(b1 + b2)
    (pos, h), _ = batches(out.body)
    assert (h.base_offset, h.last_offset, h.record_count, h.base_sequence) == (0, 2, 1, 0)


def test_tombstones_get_a_delete_horizon_then_go_after_it():
    b1 = build_batch([(b"a", b"1"), (b"b", b"1")], base_offset=0, timestamp=NOW - 9000)
    b2 = build_batch([(b"a", None), (b"c", b"1")], base_offset=2, timestamp=NOW - 8000, timestamps=[NOW - 8000, NOW - 7000])
    c, out = clean_once(b1 + b2, retention=1000)
    # a's older value is superseded by its tombstone; the tombstone stays, with a horizon
    got = all_records(out.body)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got] == [(1, b"b", b"1", NOW - 9000), (2, b"a", None, NOW - 8000), (3, b"c", b"1", NOW - 7000)]
    (_, h1), (_, h2) = batches(out.body)
    assert h1.delete_horizon_ms is None and not h1.attributes & 0x40
    assert h2.attributes & 0x40 and h2.delete_horizon_ms == NOW + 1000 and h2.first_timestamp == NOW + 1000
    assert h2.max_timestamp == NOW - 7000
    assert c.earliest_horizon == NOW + 1000 and out.delete_horizon_ms == NOW + 1000
    independent_check(out.body)
    # before the horizon: kept as is
    c2, again = clean_once(out.body, now=NOW + 999, retention=1000)
    assert not again.changed and c2.earliest_horizon == NOW + 1000
    # after it: gone, the rest of the batch keeps its timestamps and the horizon it had
    c3, later = clean_once(out.body, now=NOW + 1000, retention=1000)
    assert [(r.offset, r.key, r.timestamp) for r in all_records(later.body)] == [(1, b"b", NOW - 9000), (3, b"c", NOW - 7000)]
    assert batches(later.body)[1][1].delete_horizon_ms == NOW + 1000
    assert c3.earliest_horizon == cleaner.LONG_MAX and later.delete_horizon_ms == -1
    independent_check(later.body)


def test_a_tombstone_superseded_by_a_later_value_goes_at_once():
    data = build_batch([(b"a", None)], base_offset=0) + build_batch([(b"a", b"back")], base_offset=1)
    _c, out = clean_once(data)
    assert [(r.offset, r.value) for r in all_records(out.body)] == [(1, b"back")]


def test_log_append_time_batches_keep_their_timestamp():
    data = build_batch([(b"a", b"1"), (b"a", None)], base_offset=0, timestamp=NOW - 100, attributes=records.TIMESTAMP_TYPE_MASK)
    _c, out = clean_once(data)
    (_, h), = batches(out.body)
    assert h.is_log_append_time and h.max_timestamp == NOW - 100 and h.delete_horizon_ms == NOW + 1000
    assert [(r.offset, r.timestamp) for r in all_records(out.body)] == [(1, NOW - 100)]


@pytest.mark.parametrize("codec", [records.COMPRESSION_GZIP, records.COMPRESSION_SNAPPY, records.COMPRESSION_LZ4, records.COMPRESSION_ZSTD])
def test_compressed_batches_are_recompressed_with_their_codec(codec):
    recs = [(b"k%d" % (i % 10), b"value-%d" % i * 20, [("h", b"x")]) for i in range(50)]
    data = build_batch(recs, base_offset=1000, timestamp=NOW, codec=codec, timestamps=[NOW + i for i in range(50)])
    before = records.decompressions
    c, out = clean_once(data)
    assert records.decompressions == before  # the compactor counts its own
    assert c.recompressions == 1
    (_, h), = batches(out.body)
    assert h.compression == codec and h.last_offset == 1049 and h.record_count == 10
    got = decode_records(out.body)
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == [
        (1000 + i, b"k%d" % (i % 10), b"value-%d" % i * 20, NOW + i, (("h", b"x"),)) for i in range(40, 50)
    ]
    independent_check(out.body)


# -- transactions --------------------------------------------------------------------

TXN = records.TRANSACTIONAL_MASK


def test_aborted_records_go_and_markers_go_after_their_horizon_once_no_batch_is_left():
    data = (
        build_batch([(b"a", b"committed")], base_offset=0, producer_id=1, producer_epoch=0, base_sequence=0, attributes=TXN)
        + build_control_batch(True, 1, 0, 0, NOW - 100, base_offset=1)
        + build_batch([(b"a", b"aborted")], base_offset=2, producer_id=1, producer_epoch=0, base_sequence=1, attributes=TXN)
        + build_control_batch(False, 1, 0, 0, NOW - 100, base_offset=3)
        + build_batch([(b"z", b"plain")], base_offset=4)
    )
    aborted = [(1, 2, 3)]
    c, out = clean_once(data, aborted=aborted)
    # the aborted record is gone (and did not supersede the committed one); both markers get a horizon
    assert [(r.offset, r.value) for r in all_records(out.body) if not r.key.startswith(b"\x00")] == [(0, b"committed"), (4, b"plain")]
    heads = [h for _, h in batches(out.body)]
    assert [(h.base_offset, h.is_control, h.delete_horizon_ms) for h in heads] == [(0, False, None), (1, True, NOW + 1000), (3, True, NOW + 1000), (4, False, None)]
    independent_check(out.body)
    # past the horizon: the ABORT marker goes (no batch of its transaction left), the COMMIT
    # marker stays while its transaction's batch is there
    c2, later = clean_once(out.body, now=NOW + 2000, aborted=aborted)
    assert [(h.base_offset, h.is_control) for _, h in batches(later.body)] == [(0, False), (1, True), (4, False)]
    assert later.removed_markers == [3]
    # once the committed value is superseded, its marker goes too (on the pass after)
    more = later.body + build_batch([(b"a", b"new")], base_offset=5)
    _c, p1 = clean_once(more, now=NOW + 2000, aborted=aborted)
    assert [(h.base_offset, h.is_control) for _, h in batches(p1.body)] == [(1, True), (4, False), (5, False)]
    _c, p2 = clean_once(p1.body, now=NOW + 2000, aborted=aborted)
    assert [h.base_offset for _, h in batches(p2.body)] == [4, 5] and p2.removed_markers == [1]


def test_an_abort_marker_stays_while_its_aborted_batch_is_met():
    data = build_batch([(b"a", b"x")], base_offset=0, producer_id=3, producer_epoch=0, base_sequence=0, attributes=TXN) + build_control_batch(
        False, 3, 0, 0, NOW, base_offset=1
    )
    c, out = clean_once(data, aborted=[(3, 0, 1)])
    assert [(h.base_offset, h.is_control) for _, h in batches(out.body)] == [(1, True)]
    # the same input past the horizon: the aborted batch is met in this pass, so the marker waits
    marked = out.body
    data2 = data[: len(data) - len(records.build_control_batch(False, 3, 0, 0, NOW, base_offset=1))] + marked
    _c, out2 = clean_once(data2, now=NOW + 5000, aborted=[(3, 0, 1)])
    assert [h.base_offset for _, h in batches(out2.body)] == [1]
    _c, out3 = clean_once(out2.body, now=NOW + 5000, aborted=[(3, 0, 1)])
    assert out3.body == b"" and out3.removed_markers == [1]


def test_cleaning_across_segments_keeps_transaction_tracking():
    """clean() is called segment by segment; a marker in a later segment than its batch waits."""
    seg1 = build_batch([(b"a", b"1")], base_offset=0, producer_id=4, producer_epoch=0, base_sequence=0, attributes=TXN)
    marker = build_control_batch(True, 4, 0, 0, NOW, base_offset=1)
    km = cleaner.KeyMap(1 << 20)
    km.add(seg1)
    c = cleaner.BatchCleaner(km, now_ms=NOW, delete_retention_ms=0)
    c.clean(seg1)
    out = c.clean(marker)
    (_, h), = batches(out.body)
    assert h.delete_horizon_ms == NOW  # set now; not removed in this pass (its batch was met)
    c2 = cleaner.BatchCleaner(km, now_ms=NOW, delete_retention_ms=0)
    c2.clean(seg1)
    assert batches(c2.clean(out.body).body)  # still its committed batch: kept
