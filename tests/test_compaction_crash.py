"""kill -9 of a broker while it compacts (file store and moto S3, 5 trials each): the log
afterwards reads as the model says, with no offset renumbered: every key's latest record,
anything missing superseded (or a tombstone past its horizon, with its older values gone);
and once compaction runs again to its end, exactly the latest value per key."""

from __future__ import annotations

import uuid

import pytest

from kafscale.storage.objectstore import open_store
from tests.support.broker import BrokerProcess
from tests.support.compaction import Model, broker_args, create_topic, metrics, produce, read_all
from tests.support.wait import wait_until

TRIALS = 5


@pytest.fixture(params=["file", "s3"])
async def storage(request, tmp_path):
    """(extra broker args, env) for the object store."""
    if request.param == "file":
        return [], {}
    moto = request.getfixturevalue("moto_server")
    bucket = f"crash-{uuid.uuid4().hex[:12]}"
    store = open_store(f"s3://{bucket}")
    await store.create_bucket()
    await store.close()
    return ["--storage", f"s3://{bucket}/data"], moto.env


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill9_during_compaction_leaves_the_log_as_the_model_says(storage, trial, tmp_path, topic_name):
    store_args, env = storage
    args, port = broker_args()
    (tmp_path / "broker").mkdir()
    b = BrokerProcess(data_dir=str(tmp_path / "broker"), extra_args=[*args, *store_args], env=env).start()
    try:
        create_topic(b.bootstrap, topic_name, **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "segment.bytes": "4096", "delete.retention.ms": "50"})
        model = Model()
        items = [(b"key-%02d" % k, b"v-%d-%d-" % (k, r) + b"y" * 40) for r in range(15) for k in range(30)]
        items += [(b"key-%02d" % k, None) for k in range(0, 30, 3)]  # tombstones
        items += [(b"key-%02d" % k, b"after-%d" % k) for k in range(0, 30, 9)]  # some keys come back
        written = metrics(port).get("kafscale_compaction_segments_written_total", 0)
        produce(b.bootstrap, topic_name, items, model, flush_every=15)
        produce(b.bootstrap, topic_name, [(b"sentinel", b"end")], model)
        # kill once the pass has written a few of its segments (more each trial)
        wait_until(lambda: metrics(port).get("kafscale_compaction_segments_written_total", 0) >= written + 1 + trial * 2, 60, "compaction under way", interval=0.01)
        b.kill9()
        # as it was left: compaction off
        b.extra_args = [*args, *store_args, "--compaction-interval-ms", "0"]
        b.start()
        model.check_read(read_all(b.bootstrap, topic_name))
        b.stop()
        # and compaction finishes the job after the crash
        b.extra_args = [*args, *store_args]
        b.start()
        wait_until(lambda: read_all(b.bootstrap, topic_name) == model.compacted(), 60, "compaction to finish after the restart", interval=0.3)
    finally:
        b.stop()
