"""segments_past_retention: which whole segments retention.ms and retention.bytes delete,
on real SegmentInfo and LogSettings values, without a broker."""

from __future__ import annotations

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.topic_config import LogSettings
from kafscale.storage.retention import segments_past_retention

NOW = 10_000_000


def _seg(base: int, size: int = 100, max_timestamp: int = -1, created_ms: int = NOW) -> SegmentInfo:
    return SegmentInfo(base, base + 9, size, 10, max_timestamp, created_ms)


def _settings(retention_ms: int = -1, retention_bytes: int = -1) -> LogSettings:
    return LogSettings(retention_ms, retention_bytes, 1 << 30, 1 << 20, False)


def test_retention_ms_by_max_timestamp():
    cutoff = NOW - 1000
    a = _seg(0, max_timestamp=cutoff - 500)
    b = _seg(10, max_timestamp=cutoff - 1)
    c = _seg(20, max_timestamp=cutoff)  # exactly retention.ms old: kept
    d = _seg(30, max_timestamp=cutoff - 900)  # older, but after a kept one: kept
    assert segments_past_retention([a, b, c, d], _settings(retention_ms=1000), NOW) == [a, b]


def test_retention_ms_goes_by_the_timestamp_not_the_creation_when_there_is_one():
    old_created_new_records = _seg(0, max_timestamp=NOW - 10, created_ms=NOW - 5000)
    later = _seg(10, max_timestamp=NOW - 5000)
    assert segments_past_retention([old_created_new_records, later], _settings(retention_ms=1000), NOW) == []


def test_retention_ms_by_created_ms_when_no_timestamps():
    a = _seg(0, max_timestamp=-1, created_ms=NOW - 3000)
    b = _seg(10, max_timestamp=-1, created_ms=NOW - 1001)
    c = _seg(20, max_timestamp=-1, created_ms=NOW - 1000)  # exactly retention.ms old: kept
    assert segments_past_retention([a, b, c], _settings(retention_ms=1000), NOW) == [a, b]


def test_retention_ms_from_topic_configs():
    a = _seg(0, max_timestamp=NOW - 60_001)
    b = _seg(10, max_timestamp=NOW - 59_999)
    settings = LogSettings.from_configs({"retention.ms": "60000", "retention.bytes": "-1"})
    assert segments_past_retention([a, b], settings, NOW) == [a]


def test_retention_bytes_keeps_at_least_retention_bytes():
    a, b, c, d = _seg(0, 100), _seg(10, 200), _seg(20, 300), _seg(30, 400)  # 1000 bytes
    segs = [a, b, c, d]
    assert segments_past_retention(segs, _settings(retention_bytes=600), NOW) == [a, b]  # 500 left would be < 600
    assert segments_past_retention(segs, _settings(retention_bytes=700), NOW) == [a, b]  # exactly 700 left
    assert segments_past_retention(segs, _settings(retention_bytes=701), NOW) == [a]
    assert segments_past_retention(segs, _settings(retention_bytes=1000), NOW) == []
    assert segments_past_retention(segs, _settings(retention_bytes=0), NOW) == [a, b, c, d]


def test_retention_ms_and_bytes_together_oldest_first_without_duplicates():
    a = _seg(0, 100, max_timestamp=NOW - 5000)
    b = _seg(10, 200, max_timestamp=NOW - 4000)
    c = _seg(20, 300, max_timestamp=NOW - 10)
    d = _seg(30, 400, max_timestamp=NOW - 5)
    segs = [a, b, c, d]
    # time dooms a and b; size alone would doom only a
    assert segments_past_retention(segs, _settings(retention_ms=1000, retention_bytes=800), NOW) == [a, b]
    # time dooms a and b; size dooms c as well (400 bytes left >= 400)
    assert segments_past_retention(segs, _settings(retention_ms=1000, retention_bytes=400), NOW) == [a, b, c]
    # time dooms only a; size dooms a and b
    assert segments_past_retention(segs, _settings(retention_ms=4500, retention_bytes=700), NOW) == [a, b]


def test_nothing_doomed():
    segs = [_seg(0, 100, max_timestamp=NOW - 10), _seg(10, 100, max_timestamp=NOW - 5)]
    assert segments_past_retention(segs, _settings(retention_ms=1000, retention_bytes=1000), NOW) == []
    assert segments_past_retention([], _settings(retention_ms=0, retention_bytes=0), NOW) == []


def test_minus_one_is_unlimited():
    segs = [_seg(0, 1 << 20, max_timestamp=0, created_ms=0), _seg(10, 1 << 20, max_timestamp=-1, created_ms=0)]
    assert segments_past_retention(segs, _settings(retention_ms=-1, retention_bytes=-1), NOW) == []
    assert segments_past_retention(segs, _settings(retention_ms=-1, retention_bytes=1 << 20), NOW) == [segs[0]]
    assert segments_past_retention(segs, _settings(retention_ms=1000, retention_bytes=-1), NOW) == segs
