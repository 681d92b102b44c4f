"""Kafka's log compaction, the pure part: what is cleanable, the key map, which records
survive, and rewriting a batch. No I/O, no asyncio; `storage/compactor.py` drives it over the
object store (docs/compaction.md is the design).

Use, for one partition:

    plan = cleaner.plan(segments, last_stable_offset=lso, now_ms=now, settings=log_settings)
    if plan is not None:
        key_map = cleaner.KeyMap(budget_bytes)
        for seg, batches in dirty segments of plan, in order:   # plan.dirty
            if not key_map.fits(seg.record_count): break         # stop at the last whole segment
            key_map.add(batches, plan.aborted)
        c = cleaner.BatchCleaner(key_map, now_ms=now, delete_retention_ms=..., aborted=plan.aborted,
                                 producer_last_offsets={pid: last offset of its last batch})
        for group in cleaner.group_segments(segments through the last mapped one, segment_bytes):
            for seg in group: out = c.clean(batches of seg)     # CleanedSegment: body, changed, ...

`batches` is the bytes of whole stored v2 batches (a segment's body, bounded by its
SegmentInfo offsets). Each `clean` call must come in offset order, from the log start: the
cleaner tracks transactions across segments to know when a marker may go.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from kafscale.metadata.segments import SegmentInfo
from kafscale.metadata.topic_config import LogSettings
from kafscale.protocol import record_reader, records
from kafscale.protocol.varint import encode_varlong

LONG_MAX = (1 << 63) - 1

# What one key-map entry costs in memory (a dict of 16-byte digests to offsets), measured
# with tracemalloc on CPython 3.11: 141 bytes held per entry, 171 at the peak of the dict's
# last resize (tests/test_cleaner.py measures it again). The budget is divided by this.
KEY_MAP_ENTRY_BYTES = 176
DIGEST_BYTES = 16


def key_digest(key: bytes) -> bytes:
    """The 16-byte BLAKE2b digest a key is mapped by (Kafka's cleaner uses MD5, 16 bytes)."""
    return hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest()


# ---------------------------------------------------------------------------------------
# The cleanable range (Kafka's LogCleanerManager rules).


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """A partition due for a pass: `segments` from the log start through the last cleanable
    one; `segments[first_dirty:]` are the dirty ones (not written by the compactor yet)."""

    segments: list[SegmentInfo]
    first_dirty: int
    dirty_ratio: float
    forced: bool  # max.compaction.lag.ms passed for the oldest dirty segment
    aborted: "AbortedIndex"
    reason: str

    @property
    def dirty(self) -> list[SegmentInfo]:
        return self.segments[self.first_dirty :]


def cleanable_segments(segments: list[SegmentInfo], last_stable_offset: int, now_ms: int, min_compaction_lag_ms: int) -> list[SegmentInfo]:
    """The leading segments the compactor may clean: never the newest (Kafka's active
    segment), nothing at or above the last stable offset, and nothing from the first segment
    whose newest record is younger than min.compaction.lag.ms on."""
    out = []
    for seg in segments[:-1]:
        if seg.last_offset >= last_stable_offset:
            break
        newest = seg.max_timestamp if seg.max_timestamp >= 0 else seg.created_ms
        if min_compaction_lag_ms > 0 and now_ms - newest < min_compaction_lag_ms:
            break
        out.append(seg)
    return out


def first_dirty_index(segments: list[SegmentInfo]) -> int:
    """Index of the first segment the compactor has not written (the cleaner checkpoint)."""
    return next((i for i, s in enumerate(segments) if not s.cleaned), len(segments))


def dirty_ratio(segments: list[SegmentInfo]) -> float:
    """Dirty bytes / (clean + dirty bytes) over `segments` (Kafka's cleanable ratio)."""
    total = sum(s.size for s in segments)
    if not total:
        return 0.0
    return sum(s.size for s in segments[first_dirty_index(segments) :]) / total


def plan(
    segments: list[SegmentInfo],
    *,
    last_stable_offset: int,
    now_ms: int,
    settings: LogSettings,
) -> CleanPlan | None:
    """Whether a compacted partition is due for a pass, and over which segments (None: not).

    Due when dirty / cleanable bytes > min.cleanable.dirty.ratio (Kafka compares strictly),
    or when the oldest dirty segment was written more than max.compaction.lag.ms ago, or
    when a tombstone or marker the compactor kept has passed its delete horizon
    (SegmentInfo.delete_horizon_ms; Kafka cleans such a log even with nothing dirty)."""
    if not settings.cleanup_compact:
        return None
    segs = cleanable_segments(segments, last_stable_offset, now_ms, settings.min_compaction_lag_ms)
    if not segs:
        return None
    first = first_dirty_index(segs)
    ratio = dirty_ratio(segs)
    forced = first < len(segs) and settings.max_compaction_lag_ms < LONG_MAX and now_ms - segs[first].created_ms > settings.max_compaction_lag_ms
    aborted = AbortedIndex(a for s in segments for a in s.aborted)
    if first < len(segs) and (forced or ratio > settings.min_cleanable_dirty_ratio):
        reason = "max.compaction.lag.ms" if forced and not ratio > settings.min_cleanable_dirty_ratio else f"dirty ratio {ratio:.2f}"
        return CleanPlan(segs, first, ratio, forced, aborted, reason)
    if any(0 <= s.delete_horizon_ms <= now_ms for s in segs):
        return CleanPlan(segs, first, ratio, False, aborted, "delete horizon passed")
    return None


def group_segments(segments: list[SegmentInfo], segment_bytes: int) -> list[list[SegmentInfo]]:
    """Adjacent segments grouped so that each group's input bytes stay within segment.bytes
    (a bigger segment is a group of its own); each group becomes one cleaned segment."""
    groups: list[list[SegmentInfo]] = []
    size = 0
    for seg in segments:
        if groups and size + seg.size <= segment_bytes and groups[-1][-1].last_offset + 1 == seg.base_offset:
            groups[-1].append(seg)
            size += seg.size
        else:
            groups.append([seg])
            size = seg.size
    return groups


# ---------------------------------------------------------------------------------------
# Aborted transactions.


class AbortedIndex:
    """The aborted transactions of a log (SegmentInfo.aborted entries: producer id, first
    offset, ABORT marker offset), to ask whether a transactional batch was aborted."""

    def __init__(self, entries: Iterable[tuple[int, int, int]] = ()):
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for pid, first, last in entries:
            by_pid.setdefault(pid, []).append((first, last))
        self._firsts = {pid: [f for f, _ in sorted(v)] for pid, v in by_pid.items()}
        self._lasts = {pid: [l for _, l in sorted(v)] for pid, v in by_pid.items()}

    def contains(self, producer_id: int, offset: int) -> bool:
        firsts = self._firsts.get(producer_id)
        if not firsts:
            return False
        i = bisect.bisect_right(firsts, offset) - 1
        return i >= 0 and offset <= self._lasts[producer_id][i]


# ---------------------------------------------------------------------------------------
# Records of a batch, parsed for the cleaner (the raw bytes of each are kept).


# A record is the plain record reader's row (protocol/record_reader.py FIELDS), used as it
# is: an object made per record cost the key map and the cleaning ~15% of their time per
# record (bench/bench_record_reader.py). Its offset is the batch's base offset + its offset
# delta; a key or value length below 0 is a null key or value (a tombstone).
_OFFSET_DELTA, _KEY_AT, _KEY_LENGTH = (record_reader.FIELDS.index(f) for f in ("offset_deltas", "key_at", "key_lengths"))


def _records_of(data, pos: int, h: records.BatchHeader) -> tuple[bytes, list[tuple]]:
    """The records of the batch at `pos` (decompressed, as bytes) and their rows."""
    raw = data[pos + records.HEADER_SIZE : pos + h.size]
    body = records.decompress(h.compression, raw, counted=False) if h.compression else bytes(raw)
    return body, record_reader.PLAIN.read(body, ((0, len(body), h.record_count),)).rows


# ---------------------------------------------------------------------------------------
# The key map.


class KeyMap:
    """Key digest -> offset of the key's latest record in the mapped (dirty) range, within a
    memory budget of `budget_bytes` (KEY_MAP_ENTRY_BYTES an entry). Fill it segment by
    segment, asking `fits(record_count)` first: a segment that might not fit ends the pass's
    mapped range (Kafka's cleaner also stops at the last segment it mapped whole)."""

    def __init__(self, budget_bytes: int):
        self.capacity = max(budget_bytes // KEY_MAP_ENTRY_BYTES, 1)
        self.entries: dict[bytes, int] = {}
        self.peak_entries = 0
        self.records_mapped = 0
        self.last_offset = -1  # the last offset mapped

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def bytes_used(self) -> int:
        return len(self.entries) * KEY_MAP_ENTRY_BYTES

    def fits(self, record_count: int) -> bool:
        """Could `record_count` more records (all new keys, at worst) be mapped?"""
        return len(self.entries) + record_count <= self.capacity

    def put(self, key: bytes, offset: int) -> None:
        self.entries[key_digest(key)] = offset
        if offset > self.last_offset:
            self.last_offset = offset

    def get(self, key: bytes) -> int | None:
        return self.entries.get(key_digest(key))

    def add(self, data, aborted: AbortedIndex | None = None) -> int:
        """Map every keyed record of the batches in `data` (in offset order) but those of
        control batches and aborted transactions. Returns how many were mapped."""
        mapped = 0
        entries = self.entries
        for pos, h in records.iter_batches(data):
            if h.last_offset > self.last_offset:
                self.last_offset = h.last_offset
            if h.is_control or (h.is_transactional and aborted is not None and aborted.contains(h.producer_id, h.base_offset)):
                continue
            body, rows = _records_of(data, pos, h)
            base = h.base_offset
            for _, _, _, _, _, off_delta, k_at, k_len, _, _, _ in rows:
                if k_len >= 0:
                    entries[key_digest(body[k_at : k_at + k_len])] = base + off_delta
                    mapped += 1
        self.records_mapped += mapped
        if len(entries) > self.peak_entries:
            self.peak_entries = len(entries)
        return mapped


# ---------------------------------------------------------------------------------------
# Cleaning batches.


@dataclass(slots=True)
class CleanedSegment:
    """One segment's batches after cleaning."""

    body: bytes  # the surviving batches
    changed: bool  # False: body is the input, byte for byte
    records_in: int = 0
    records_out: int = 0
    batches_dropped: int = 0
    removed_markers: list[int] = field(default_factory=list)  # offsets of control batches removed
    delete_horizon_ms: int = -1  # earliest delete horizon of a tombstone or marker kept (-1: none)

    @property
    def records_removed(self) -> int:
        return self.records_in - self.records_out


_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count: what follows the CRC


def _control_kind(body: bytes, recs: list[tuple]) -> int:
    if not recs or recs[0][_KEY_LENGTH] < 4:
        return -1
    return struct.unpack_from(">h", body, recs[0][_KEY_AT] + 2)[0]


class BatchCleaner:
    """One compaction pass over the batches from the log start, segment by segment in
    offset order (`clean`). Per record: removed when its key maps to a later offset, when it
    has no key, when its transaction was aborted, or when it is a tombstone whose batch's
    delete horizon has passed. A batch holding tombstones, or a marker, gets its delete
    horizon (now + delete.retention.ms) the first time it is rewritten. A marker goes once
    its horizon has passed and no batch of its transaction was met in this pass.

    A rewritten batch keeps its base offset, last offset delta, producer id and epoch, base
    sequence, leader epoch and codec; records keep their offsets and timestamps; its CRC is
    recomputed. A batch left with no records is dropped unless it is its producer's last
    batch (`producer_last_offsets`: producer id -> last offset of its last batch, from the
    producer state, as Kafka keeps it so the producer's sequence survives a reload)."""

    def __init__(
        self,
        key_map: KeyMap,
        *,
        now_ms: int,
        delete_retention_ms: int,
        aborted: AbortedIndex | None = None,
        producer_last_offsets: Mapping[int, int] | None = None,
    ):
        self.key_map = key_map
        self.now_ms = now_ms
        self.new_horizon = now_ms + delete_retention_ms if delete_retention_ms < LONG_MAX - now_ms else LONG_MAX
        self.aborted = aborted or AbortedIndex()
        self.producer_last_offsets = producer_last_offsets or {}
        self._txn_seen: set[int] = set()
        self._current: CleanedSegment | None = None  # the segment being cleaned  # producers with a transactional batch met since their last marker
        # Pass totals
        self.records_in = 0
        self.records_out = 0
        self.recompressions = 0  # compressed batches decompressed and compressed again
        self.earliest_horizon = LONG_MAX  # earliest delete horizon of a kept tombstone or marker

    def clean(self, data) -> CleanedSegment:
        """The surviving batches of `data` (whole stored batches, the next in offset order)."""
        mv = memoryview(data)
        out: list = []
        changed = False
        res = self._current = CleanedSegment(b"", False)
        for pos, h in records.iter_batches(mv):
            res.records_in += h.record_count
            kept = self._clean_batch(mv, pos, h, res)
            if kept is None:
                changed = True
                res.batches_dropped += 1
                continue
            if kept is not True:
                changed = True
                out.append(kept)
                res.records_out += records.read_header(kept).record_count
            else:
                out.append(mv[pos : pos + h.size])
                res.records_out += h.record_count
        res.changed = changed
        res.body = b"".join(out) if changed else bytes(mv[: sum(len(b) for b in out)])
        self.records_in += res.records_in
        self.records_out += res.records_out
        return res

    def _note_horizon(self, horizon: int) -> None:
        """A kept tombstone or marker is due to go at `horizon` (the driver cleans the
        partition again then, dirty or not)."""
        if horizon < self.earliest_horizon:
            self.earliest_horizon = horizon
        cur = self._current
        if cur is not None and (cur.delete_horizon_ms < 0 or horizon < cur.delete_horizon_ms):
            cur.delete_horizon_ms = horizon

    def _clean_batch(self, mv: memoryview, pos: int, h: records.BatchHeader, res: CleanedSegment):
        """True: keep as is; None: drop; bytes: the rewritten batch."""
        horizon = h.delete_horizon_ms
        if h.is_control:
            body, recs = _records_of(mv, pos, h)
            pid = h.producer_id
            kind = _control_kind(body, recs)
            # Kafka (CleanedTransactionMetadata): a marker may go only once no batch of its
            # transaction is left; one met in this pass may still be kept (or its removal
            # not yet durable), so the marker waits for a pass that meets none.
            discardable = pid not in self._txn_seen or kind not in (records.CONTROL_ABORT, records.CONTROL_COMMIT)
            self._txn_seen.discard(pid)
            if horizon is None:
                self._note_horizon(self.new_horizon)
                return self._rewrite(mv, pos, h, body, recs, self.new_horizon)
            if horizon > self.now_ms:
                self._note_horizon(horizon)
            elif discardable:
                res.removed_markers.append(h.base_offset)
                return None
            return True
        aborted = h.is_transactional and self.aborted.contains(h.producer_id, h.base_offset)
        if h.is_transactional:
            self._txn_seen.add(h.producer_id)
        body, recs = _records_of(mv, pos, h)
        km = self.key_map
        past_horizon = horizon is not None and horizon <= self.now_ms
        keep = []
        tombstones = False
        base = h.base_offset
        for r in () if aborted else recs:
            _, _, _, _, _, off_delta, k_at, k_len, _, v_len, _ = r
            if k_len < 0:
                continue
            latest = km.get(body[k_at : k_at + k_len])
            if latest is not None and latest > base + off_delta:
                continue  # superseded
            if v_len < 0:  # a tombstone
                if past_horizon:
                    continue
                tombstones = True
            keep.append(r)
        new_horizon = horizon
        if tombstones:
            if horizon is None:
                new_horizon = self.new_horizon
            self._note_horizon(new_horizon)
        if len(keep) == len(recs) and new_horizon == horizon:
            return True
        if not keep and not (h.producer_id >= 0 and self.producer_last_offsets.get(h.producer_id) == h.last_offset):
            return None
        return self._rewrite(mv, pos, h, body, keep, new_horizon)

    def _rewrite(self, mv: memoryview, pos: int, h: records.BatchHeader, body: bytes, keep: list[tuple], horizon: int | None) -> bytes:
        """Batch `h` with only the records `keep` and delete horizon `horizon` (None: none)."""
        if h.compression:
            self.recompressions += 1
        return rewrite_batch(h, body, keep, horizon)


def rewrite_batch(h: records.BatchHeader, body: bytes, keep: list[tuple], horizon: int | None, last_offset_delta: int | None = None) -> bytes:
    """Batch `h` (`body`: its records, decompressed) with only the records `keep` (rows), kept
    byte for byte, at their offsets and timestamps, with the producer fields of `h`, and
    delete horizon `horizon` (None: none); recompressed with its codec. `last_offset_delta`
    overrides the batch's (a batch cut short ends at its last kept record)."""
    base_ts = h.first_timestamp
    attrs = h.attributes
    if horizon is not None:
        attrs |= records.DELETE_HORIZON_MASK
        new_base = horizon
    else:
        new_base = base_ts
    log_append = h.is_log_append_time
    parts = []
    max_ts = -1
    for start, end, attrs_at, ts_delta, ts_end, *_ in keep:
        ts = base_ts + ts_delta
        if ts > max_ts:
            max_ts = ts
        if new_base == base_ts or log_append:
            parts.append(body[start:end])  # the record as it was
        else:  # the same record, its timestamp delta now from the horizon
            rec = body[attrs_at : attrs_at + 1] + encode_varlong(ts - new_base) + body[ts_end:end]
            parts.append(encode_varlong(len(rec)) + rec)
    if log_append or not keep:
        max_ts = h.max_timestamp
    out = b"".join(parts)
    if h.compression:
        out = records.compress(h.compression, out)
    delta = h.last_offset_delta if last_offset_delta is None else last_offset_delta
    after_crc = _AFTER_CRC.pack(attrs, delta, new_base, max_ts, h.producer_id, h.producer_epoch, h.base_sequence, len(keep)) + out
    batch_length = 4 + 1 + 4 + len(after_crc)
    head = struct.pack(">qiib", h.base_offset, batch_length, h.partition_leader_epoch, 2)
    return head + struct.pack(">I", records.crc32c(after_crc)) + after_crc


def truncate_batch(data, pos: int, h: records.BatchHeader, end_offset: int) -> bytes | None:
    """The batch at `pos` holding only its records below `end_offset` (None: none is),
    ending at its last kept record: what a log cut at `end_offset` keeps of the batch it
    falls into."""
    body, recs = _records_of(data, pos, h)
    keep = [r for r in recs if h.base_offset + r[_OFFSET_DELTA] < end_offset]
    if not keep:
        return None
    return rewrite_batch(h, body, keep, h.delete_horizon_ms, last_offset_delta=keep[-1][_OFFSET_DELTA])
