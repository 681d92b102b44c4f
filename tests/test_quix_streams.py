"""A stateful Quix Streams application on KafScale (issue #16): Quix Streams keeps each
state store in a changelog topic it creates with cleanup.policy=compact, which KafScale
used to refuse, so no stateful Quix app could start. Here the app counts messages per key,
its changelog topic is created compacted and holds keyed records only, and a second run
with an empty state directory recovers the counts from the changelog; with the compactor
running, a run with an empty state directory recovers them from the compacted changelog.

Quix Streams runs in its own venv (`.venv-quix`, built by `make test`): it pins
confluent-kafka < 2.13 and pydantic < 2.14, older than the clients of the test venv.
KAFSCALE_QUIX_PYTHON names another interpreter that has quixstreams."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]
QUIX_PYTHON = os.environ.get("KAFSCALE_QUIX_PYTHON") or str(ROOT / ".venv-quix" / "bin" / "python")
APP = ROOT / "tests" / "support" / "quix_app.py"

pytestmark = pytest.mark.skipif(not Path(QUIX_PYTHON).exists(), reason=f"no Quix Streams venv at {QUIX_PYTHON} (make test builds .venv-quix)")


def run_app(bootstrap: str, group: str, topic: str, count: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with tempfile.TemporaryDirectory() as state_dir:
        r = subprocess.run([QUIX_PYTHON, str(APP), bootstrap, group, topic, str(count), state_dir], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out) == count, r.stderr[-4000:]
    return out


def send(bootstrap: str, topic: str, words: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for w in words:
        p.produce(topic, key=w, value=json.dumps({"word": w}))
    assert p.flush(15) == 0


def read_all(bootstrap: str, topic: str) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "quix-check", "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while True:
            m = c.poll(10)
            assert m is not None, "no end of partition within 10 s"
            if m.error():
                break  # _PARTITION_EOF
            got.append(m)
    finally:
        c.close()
    return got


def test_stateful_app_changelog_is_compacted_and_recovers(broker, topic_name):
    group = f"quix-{topic_name}"
    changelog = f"changelog__{group}--{topic_name}--default"
    send(broker.bootstrap, topic_name, ["a", "b", "a", "c", "a", "b"])
    first = run_app(broker.bootstrap, group, topic_name, 6)
    assert [(o["word"], o["n"]) for o in first] == [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3), ("b", 2)]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, changelog)
    policy = admin.describe_configs([res])[res].result(15)["cleanup.policy"]
    assert (policy.value, policy.source) == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    stored = read_all(broker.bootstrap, changelog)
    # one record per key and checkpoint (Quix writes a key's last state of each checkpoint), all keyed
    assert all(m.key() is not None for m in stored) and len({m.key() for m in stored}) == 3

    # a fresh state directory: the counts come back from the changelog topic
    send(broker.bootstrap, topic_name, ["a", "b"])
    second = run_app(broker.bootstrap, group, topic_name, 2)
    assert [(o["word"], o["n"]) for o in second] == [("a", 4), ("b", 3)]


def test_state_recovers_from_a_compacted_changelog(broker_factory, topic_name):
    """Three runs update the same keys, each from an empty state directory (recovering the
    previous runs' counts), each run's checkpoint a segment of the changelog; the compactor
    then removes the states later runs superseded, leaving offset gaps; a fourth run with an
    empty state directory recovers the latest counts across them."""
    b = broker_factory(extra_args=["--group-initial-rebalance-delay-ms", "0", "--compaction-interval-ms", "300", "--merge-interval-ms", "0"])
    group = f"quix-{topic_name}"
    changelog = f"changelog__{group}--{topic_name}--default"
    counts: dict[str, int] = {}

    def run(words: list[str]) -> None:
        send(b.bootstrap, topic_name, words)
        out = run_app(b.bootstrap, group, topic_name, len(words))
        expected = []
        for w in words:
            counts[w] = counts.get(w, 0) + 1
            expected.append((w, counts[w]))
        assert [(o["word"], o["n"]) for o in out] == expected

    run(["a", "b", "a", "c"])
    # Kafka's default min.cleanable.dirty.ratio (0.5) would wait for more dirty bytes than
    # these few records make: ask for a pass as soon as anything is dirty
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, changelog,
                         incremental_configs=[ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET)])
    assert admin.incremental_alter_configs([res])[res].result(15) is None
    run(["a", "b"])
    run(["a"])
    # The changelog got offsets 0-2 (first run: a, b, c in some order), 3-4 (a, b), 5 (a).
    # The newest segment (offset 5) is never cleaned; the first run's a and b are superseded.
    wait_until(lambda: len(read_all(b.bootstrap, changelog)) == 4, 60, "the compactor to remove the superseded states")
    left = read_all(b.bootstrap, changelog)
    offsets = [m.offset() for m in left]
    assert offsets[0] in (0, 1, 2) and offsets[1:] == [3, 4, 5], offsets  # survivors keep their offsets
    assert left[0].key() not in {left[1].key(), left[2].key()} and left[3].key() in {left[1].key(), left[2].key()}  # c survived
    run(["a", "b", "c"])
