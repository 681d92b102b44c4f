"""Large request frames are read straight into buffers of broker/memory.py's FramePool, which
lends each buffer again only once nothing refers to it: a frame the produce path or the
segment cache still holds (views of its batches) must never be overwritten by the next
request's bytes.

The pool itself is checked on real bytearrays and views; the broker over TCP with pipelined
large Produce requests whose frames are partly kept by the cache (one partition's batch
filling the frame) and partly freed after their flush (a batch for each of 4 partitions),
every record read back byte for byte.
"""

from __future__ import annotations

import gc
import os
import time

from kafscale.broker.memory import FramePool, uninitialized_bytearray
from kafscale.protocol.records import build_batch, decode_records, iter_batches
from tests.support.raw import RawClient, decode_response, error_code, produce_frame

KiB, MiB = 1024, 1024 * 1024
PRODUCE = 0


def test_a_buffer_is_lent_again_once_nothing_refers_to_it():
    pool = FramePool(MiB)
    first = pool.take(300 * KiB)
    assert len(first) == 300 * KiB
    first_id = id(first)
    del first
    again = pool.take(290 * KiB)  # fits: within 1/8 of the buffer
    assert id(again) == first_id and len(again) == 290 * KiB and pool.reused == 1


def test_a_buffer_still_viewed_or_held_is_not_lent_again():
    pool = FramePool(MiB)
    frame = pool.take(300 * KiB)
    frame[:5] = b"kept!"
    view = memoryview(frame)[:5]  # as a batch kept by a write buffer or the cache
    del frame
    other = pool.take(300 * KiB)
    assert other.__alloc__() and bytes(view) == b"kept!" and view.obj is not other
    held = [other]
    del other
    third = pool.take(300 * KiB)
    assert third is not held[0] and third is not view.obj and pool.reused == 0
    del view
    gc.collect()
    assert pool.take(300 * KiB) is not third and pool.reused == 1  # the first one, free again


def test_a_free_buffer_much_larger_than_the_frame_is_not_used_for_it():
    # The segment cache keeps a frame's whole buffer when it caches a view of it: a small
    # frame in a large buffer would hold more memory than the cache counts.
    pool = FramePool(MiB)
    big = pool.take(800 * KiB)
    del big
    small = pool.take(300 * KiB)
    assert small.__alloc__() <= 300 * KiB + 300 * KiB // 8 + 1 and pool.reused == 0


def test_a_smaller_mapped_buffer_grows_for_a_larger_frame():
    pool = FramePool(MiB)
    buf = pool.take(400 * KiB)
    buf_id = id(buf)
    del buf
    larger = pool.take(600 * KiB)
    assert id(larger) == buf_id and len(larger) == 600 * KiB and pool.reused == 1


def test_the_pool_tracks_at_most_its_bytes_and_buffers_forgetting_the_longest_lent():
    pool = FramePool(MiB, max_bytes=2 * MiB, max_buffers=4)
    held = [pool.take(600 * KiB) for _ in range(6)]  # all still in use
    assert pool.tracked_bytes <= 2 * MiB
    assert len(pool._lent) <= 4 and held[-1] in pool._lent and held[0] not in pool._lent
    del held
    assert pool.take(600 * KiB) is not None and pool.reused == 1  # a tracked one came back


def test_free_bytes_are_the_free_buffers_allocations():
    # The segment cache gives way to them (broker/app.py): the count must follow every move.
    pool = FramePool(MiB, max_bytes=3 * MiB, max_buffers=6)
    held = [pool.take(n * 100 * KiB) for n in (3, 4, 5, 6, 7, 8)]
    assert pool.free_bytes == 0
    del held[1::2]  # 400, 600 and 800 KiB come back
    pool.take(100 * KiB)  # reclaims them, uses none (too large), drops the oldest for room
    assert pool.free_bytes == sum(buf.__alloc__() for buf in pool._free) > 0
    pool.take(590 * KiB)  # the 600 KiB one lent again
    assert pool.reused == 1 and pool.free_bytes == sum(buf.__alloc__() for buf in pool._free) > 0
    pool._taken_since_idle_check = 0
    pool.release_idle()
    assert pool.free_bytes == 0 and pool._free == []


def test_frames_over_the_pooled_size_are_not_tracked():
    pool = FramePool(MiB)
    frame = pool.take(2 * MiB)
    assert len(frame) == 2 * MiB and pool.tracked_bytes == 0


def test_idle_buffers_are_freed_after_a_quiet_period():
    pool = FramePool(MiB)
    buf = pool.take(300 * KiB)
    del buf
    pool.take(300 * KiB)  # reclaims it; lent again
    pool.release_idle()  # a frame was taken since the last call: kept
    assert pool.tracked_bytes > 0
    pool._reclaim()
    pool.release_idle()  # nothing taken since: the free ones go
    assert pool._free == []


def test_a_buffer_given_back_while_no_frame_is_taken_is_freed_when_idle():
    # Frames under the direct read size take nothing from the pool (a paced producer's):
    # the buffers of the last large ones must not stay lent, resident and counted nowhere.
    pool = FramePool(MiB)
    frame = pool.take(300 * KiB)
    pool.release_idle()  # a frame was taken since the last call: kept, and still in use
    assert pool.tracked_bytes > 0 and pool.free_bytes == 0
    del frame  # its request done, no view kept: nothing refers to it any more
    pool.release_idle()  # no frame taken since the last call
    assert pool.tracked_bytes == 0 and pool.free_bytes == 0


def test_uninitialized_bytearray_has_the_asked_length():
    buf = uninitialized_bytearray(5 * MiB)
    memoryview(buf)[:3] = b"abc"
    assert len(buf) == 5 * MiB and buf[:3] == b"abc"


def _batch(seed: int, nbytes: int) -> bytes:
    values = [os.urandom(1000) for _ in range(nbytes // 1000)]
    return build_batch([(f"{seed}-{i}".encode(), v) for i, v in enumerate(values)], timestamp=int(time.time() * 1000))


def _read_partition(c: RawClient, topic: str, partition: int) -> list[tuple[bytes, bytes]]:
    out, offset = [], 0
    while True:
        p = c.fetch(topic, partition, offset, max_wait_ms=0)
        assert error_code(p.error_code) == 0, p
        if not p.records:
            return out
        for pos, h in iter_batches(p.records):
            out += [(r.key, r.value) for r in decode_records(p.records, pos, h)]
            offset = h.last_offset + 1


def test_pipelined_large_produce_frames_read_back_whole(broker_factory, topic_name):
    """40 Produce requests of 100-450 KB, 5 in flight, alternately one partition's batch (its
    segment cached as a view of the frame) and a batch for each of 4 partitions (copied into
    the cache; the frame's buffer is lent again): every record reads back as sent."""
    b = broker_factory(extra_args=["--auto-create-topics", "true", "--default-partitions", "4"])
    sent: dict[int, list[bytes]] = {p: [] for p in range(4)}
    frames = []
    for i in range(40):
        if i % 2 == 0:
            batches = {i // 2 % 4: _batch(i, 450 * KiB - (i % 5) * 20 * KiB)}
        else:
            batches = {p: _batch(i * 10 + p, 100 * KiB + (i % 3) * 10 * KiB) for p in range(4)}
        for p, batch in batches.items():
            sent[p].append(batch)
        frames.append(produce_frame(topic_name, batches, i))
    expected = {}
    for p, batches in sent.items():
        expected[p] = [(r.key, r.value) for batch in batches for pos, h in iter_batches(batch) for r in decode_records(batch, pos, h)]
    with RawClient(b.bootstrap, timeout=60) as c:
        assert error_code(c.metadata([topic_name]).topics[0].error_code) == 0
        answered = 0
        for i, frame in enumerate(frames):
            c.send_raw(frame)
            if i - answered >= 4:
                answered += _check_answer(c, answered)
        while answered < len(frames):
            answered += _check_answer(c, answered)
        for p in range(4):
            assert _read_partition(c, topic_name, p) == expected[p], f"partition {p}"
    assert "Traceback" not in b.log_text()


def _check_answer(c: RawClient, correlation_id: int) -> int:
    got, resp = decode_response(PRODUCE, 9, c.recv_frame())
    assert got == correlation_id
    for t in resp.responses:
        for p in t.partition_responses:
            assert error_code(p.error_code) == 0, p
    return 1
