"""kill -9 of a broker while it compacts (file store and moto S3, 5 trials each): the log
afterwards reads as the model says, with no offset renumbered: every key's latest record,
anything missing superseded (or a tombstone past its horizon, with its older values gone);
and once compaction runs again to its end, exactly the latest value per key. Odd trials
run the segment merger too (in the same loop, merging the cleaned and the dirty segments
apart)."""

from __future__ import annotations

import uuid

import pytest

from kafscale.storage.backends import open_store
from tests.support.broker import BrokerProcess
from tests.support.compaction import Model, broker_args, create_topic, metrics, produce, read_all
from tests.support.wait import wait_until

TRIALS = 5
OFF = ["--compaction-interval-ms", "0"]


@pytest.fixture(params=["file", "s3"])
async def storage(request, tmp_path):
    """Extra broker args and env for the object store."""
    if request.param == "file":
        return [], {}
    moto = request.getfixturevalue("moto_server")
    bucket = f"crash-{uuid.uuid4().hex[:12]}"
    store = open_store(f"s3://{bucket}")
    await store.create_bucket()
    await store.close()
    # every flush at once (on S3 a busy partition waits --min-flush-interval-ms between them)
    return ["--storage", f"s3://{bucket}/data", "--min-flush-interval-ms", "0"], moto.env


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill9_during_compaction_leaves_the_log_as_the_model_says(storage, trial, tmp_path, topic_name):
    store_args, env = storage
    args, port = broker_args(merge_interval_ms=100 if trial % 2 else 0)  # odd trials: the merger runs too
    (tmp_path / "broker").mkdir()
    b = BrokerProcess(data_dir=str(tmp_path / "broker"), extra_args=[*args, *store_args, *OFF], env=env).start()
    try:
        # Many small segments first, with compaction off; the pass after the restart then
        # rewrites some 70 groups of 2-3 segments, one replace and one swap each.
        create_topic(b.bootstrap, topic_name, **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "segment.bytes": "2048", "delete.retention.ms": "50"})
        model = Model()
        items = [(b"key-%02d" % k, b"v-%d-%d-" % (k, r) + b"y" * 30) for r in range(30) for k in range(60)]
        items += [(b"key-%02d" % k, None) for k in range(0, 60, 3)]  # tombstones
        items += [(b"key-%02d" % k, b"after-%d" % k) for k in range(0, 60, 9)]  # some keys come back
        produce(b.bootstrap, topic_name, items, model, flush_every=10)
        produce(b.bootstrap, topic_name, [(b"sentinel", b"end")], model)
        b.stop()
        b.extra_args = [*args, *store_args]
        b.start()
        read_all(b.bootstrap, topic_name)  # loads the partition: compaction starts
        # kill once the pass has written some of its segments (more each trial, at most about
        # half of the pass's: a later kill point let a quick pass end before the kill landed)
        wait_until(lambda: metrics(port).get("kafscale_compaction_segments_written_total", 0) >= 1 + trial * 8, 60, "compaction under way", interval=0.005)
        b.kill9()
        # the log as the crash left it (compaction off)
        b.extra_args = [*args, *store_args, *OFF]
        b.start()
        got = read_all(b.bootstrap, topic_name)
        model.check_read(got)
        b.stop()
        # and compaction finishes the job after the crash
        b.extra_args = [*args, *store_args]
        b.start()
        wait_until(lambda: read_all(b.bootstrap, topic_name) == model.compacted(), 60, "compaction to finish after the restart", interval=0.3)
        assert len(got) > len(model.compacted())  # the kill came before the end
    finally:
        b.stop()
