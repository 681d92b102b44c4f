"""A broker on the embedded default drops a segment's pages from the page cache once the
segment is durable (storage/local_store.py): by the time a producer's acks=all write is
acknowledged, no page of its segment file is cached, and the records read back whole
(from the broker's own segment cache, and after a restart from the disk)."""

from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka import Producer

from tests.support.compaction import read_all
from tests.support.page_cache import resident_pages, skip_unless_pages_can_be_dropped


def test_an_acknowledged_segment_is_out_of_the_page_cache(broker_factory, topic_name):
    b = broker_factory()
    skip_unless_pages_can_be_dropped(b.data_dir)
    values = [os.urandom(1000) for _ in range(300)]  # ~300 KB: one batch, one segment
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5000, "batch.num.messages": 10000})
    acked = []
    for i, v in enumerate(values):
        p.produce(topic_name, key=b"k%d" % i, value=v, partition=0, on_delivery=lambda err, msg: acked.append(err))
    assert p.flush(30) == 0 and acked == [None] * len(values)

    segments = sorted(Path(b.data_dir, "objects").rglob(f"{topic_name}/0/segment-*.kfs"))
    assert segments, "no segment object of the partition"
    assert sum(f.stat().st_size for f in segments) > 300_000
    assert {f.name: resident_pages(f) for f in segments} == {f.name: 0 for f in segments}

    expected = [(i, b"k%d" % i, v) for i, v in enumerate(values)]
    assert read_all(b.bootstrap, topic_name) == expected
    b.stop()
    b.start()
    assert read_all(b.bootstrap, topic_name) == expected
