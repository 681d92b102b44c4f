"""Merging of small segments: few segments after many tiny flushes, every record exactly
once during and after merges, and no loss or duplicate after kill -9 mid-merge."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from kafscale.storage import merger, segment
from kafscale.storage.segment import SegmentInfo
from tests.support.wait import wait_until


def _seg(base, last, size):
    return SegmentInfo(base, last, size, last - base + 1, 0, 0)


def test_plan_runs_groups_adjacent_small_segments():
    segs = [_seg(0, 9, 100), _seg(10, 19, 100), _seg(20, 29, 900), _seg(30, 39, 100), _seg(40, 49, 100), _seg(50, 59, 100)]
    runs = merger.plan_runs(segs, 1000)
    assert [[s.base_offset for s in r] for r in runs] == [[0, 10], [30, 40, 50]]
    # the run never exceeds segment.bytes
    runs = merger.plan_runs([_seg(i * 10, i * 10 + 9, 300) for i in range(7)], 1000)
    assert all(sum(s.size for s in r) <= 1000 for r in runs) and sum(len(r) for r in runs) == 6


def _segments_on_disk(data_dir: str, topic: str) -> list[Path]:
    return sorted((Path(data_dir) / "objects" / "default" / topic / "0").glob("segment-*.kfs"))


def _merged_segment_on_disk(data_dir: str, topic: str, flush_records: int) -> bool:
    """Whether a segment holds more records than one flush wrote (only a merge makes one)."""
    return any(segment.decode(f.read_bytes()).info.record_count > flush_records for f in _segments_on_disk(data_dir, topic))


def _consume(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "merge-check", "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            got.append((m.offset(), m.value()))
    c.close()
    return got


def test_many_tiny_flushes_end_in_few_segments_and_reads_see_each_record_once(broker_factory, topic_name):
    # A segment per partition per flush: this is about merging those small segments.
    b = broker_factory(extra_args=["--merge-interval-ms", "200", "--merge-grace-ms", "500", "--write-ahead-objects", "false"])
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    total = 1500
    reads: list[list[tuple[int, bytes]]] = []

    def reader():
        reads.append(_consume(b.bootstrap, topic_name, total))

    for i in range(total):
        p.produce(topic_name, value=b"r-%05d" % i)
        if i % 5 == 0:
            p.flush(10)  # many tiny flushes: one segment each
        if i == total // 2:
            t = threading.Thread(target=reader)
            t.start()
    assert p.flush(10) == 0
    t.join(60)
    expected = [(i, b"r-%05d" % i) for i in range(total)]
    assert reads[0] == expected  # read while merges were running
    wait_until(lambda: len(_segments_on_disk(b.data_dir, topic_name)) <= 3, 20, "the merger to leave at most 3 segments", interval=0.2)
    files = _segments_on_disk(b.data_dir, topic_name)
    assert len(files) <= 3, [f.name for f in files]
    for f in files:  # merged segments keep the spec layout and offsets
        decoded = segment.decode(f.read_bytes())
        assert f.name == f"segment-{decoded.info.base_offset:020d}.kfs"
    assert _consume(b.bootstrap, topic_name, total) == expected


def test_kill9_during_merges_loses_and_duplicates_nothing(broker_factory, topic_name):
    # A segment per partition per flush: this is about a kill -9 while those are merged.
    b = broker_factory(extra_args=["--merge-interval-ms", "50", "--merge-grace-ms", "100", "--write-ahead-objects", "false"])
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    acked = []
    for i in range(800):
        p.produce(topic_name, value=b"k-%04d" % i, on_delivery=lambda e, m: acked.append(m.offset()) if e is None else None)
        if i % 4 == 0:
            p.flush(10)
    assert p.flush(10) == 0
    # Kill once merges are under way: a merged segment (more records than any one flush) exists.
    wait_until(lambda: _merged_segment_on_disk(b.data_dir, topic_name, 4), 20, "a first merged segment", interval=0.01)
    b.kill9()
    b.start()
    got = _consume(b.bootstrap, topic_name, 800)
    assert got == [(i, b"k-%04d" % i) for i in range(800)]
    assert sorted(acked) == list(range(800))
    # and after the restart the merger finishes the job
    wait_until(lambda: len(_segments_on_disk(b.data_dir, topic_name)) <= 3, 20, "the merger to leave at most 3 segments", interval=0.2)
    assert len(_segments_on_disk(b.data_dir, topic_name)) <= 3
    assert _consume(b.bootstrap, topic_name, 800) == [(i, b"k-%04d" % i) for i in range(800)]


def test_plan_runs_never_mixes_cleaned_and_dirty_segments():
    """A compacted log's cleaned prefix (SegmentInfo.cleaned) stays apart from its dirty part."""
    import dataclasses

    segs = [_seg(0, 9, 100), _seg(10, 19, 100), _seg(20, 29, 100), _seg(30, 39, 100)]
    segs[0] = dataclasses.replace(segs[0], cleaned=True)
    segs[1] = dataclasses.replace(segs[1], cleaned=True)
    runs = merger.plan_runs(segs, 1000)
    assert [[(s.base_offset, s.cleaned) for s in r] for r in runs] == [[(0, True), (10, True)], [(20, False), (30, False)]]


def test_plan_write_ahead_runs_keeps_a_compacted_logs_newest_segment_apart():
    """Pieces of write-ahead objects are rewritten in runs within segment.bytes; in a
    compacted log the newest one (the active segment, never cleaned) is a run of its own,
    or the dirty pieces before it would wait for the next flush to be compacted."""
    import dataclasses

    pieces = [dataclasses.replace(_seg(i * 10, i * 10 + 9, 100), wao_key=f"ns/~wal/{i}.wal") for i in range(4)]
    segs = [_seg(-10, -1, 900), *pieces]
    due = dict(segment_bytes=1000, max_age_ms=0, now_ms=1)
    assert [[s.base_offset for s in r] for r in merger.plan_write_ahead_runs(segs, **due)] == [[0, 10, 20, 30]]
    assert [[s.base_offset for s in r] for r in merger.plan_write_ahead_runs(segs, **due, last_apart=True)] == [[0, 10, 20], [30]]
    # not due yet: young and under half of segment.bytes
    assert merger.plan_write_ahead_runs(segs, 1000, max_age_ms=60_000, now_ms=1, last_apart=True) == []
