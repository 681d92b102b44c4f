"""A stateful Quix Streams application on KafScale (issue #16): Quix Streams keeps each
state store in a changelog topic it creates with cleanup.policy=compact, which KafScale
used to refuse, so no stateful Quix app could start. Here the app counts messages per key,
its changelog topic is created compacted and holds keyed records only, and a second run
with an empty state directory recovers the counts from the changelog.

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
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

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
