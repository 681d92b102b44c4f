"""Go clients from Debian against the broker, built offline in GOPATH mode from the
distribution's packages (`make test` installs golang-go, golang-github-shopify-sarama-dev
and golang-github-segmentio-kafka-go-dev; without them a test is skipped, saying which is
missing).

- sarama 1.22, the client most Go tools embed (Burrow, ...): with its default version
  (0.8.2: Produce v0 with gzip message sets, Fetch v0, Metadata v0), its admin at 0.11.0
  (it refuses lower versions itself: CreateTopics v1, Metadata v1, DescribeConfigs v0) and
  at 0.10.2, the lowest its consumer groups take (Produce v2 with snappy message format v1,
  Fetch v3, JoinGroup v1, OffsetCommit v2).
- kafka-go 0.2.1: gzip Produce v2 (message format v1), a consumer group reading with
  Fetch v2 and committing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

GOCODE = Path("/usr/share/gocode/src")


def build(name: str, package: str, debian_package: str) -> Path:
    """Build tests/<name>/main.go; skip when Go or the Debian Go package is missing."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: apt-get install golang-go (make test does)")
    if not (GOCODE / package).is_dir():
        pytest.skip(f"no {package} sources: apt-get install {debian_package} (make test does)")
    root = Path(tempfile.mkdtemp(prefix=f"kafscale-{name}-"))
    src = root / "src" / name
    src.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / name / "main.go", src / "main.go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{root}:/usr/share/gocode", "GOFLAGS": "",
           "GOCACHE": os.environ.get("KAFSCALE_GOCACHE", str(Path(tempfile.gettempdir()) / "kafscale-gocache"))}
    r = subprocess.run(["go", "build", "-o", str(root / name), "."], cwd=src, env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    return root / name


@pytest.fixture(scope="module")
def saramacheck():
    program = build("sarama", "github.com/Shopify/sarama", "golang-github-shopify-sarama-dev")
    yield program
    shutil.rmtree(program.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def kafkagocheck():
    program = build("kafkago", "github.com/segmentio/kafka-go", "golang-github-segmentio-kafka-go-dev")
    yield program
    shutil.rmtree(program.parent, ignore_errors=True)


def run(program: Path, *args: str) -> dict[str, dict]:
    r = subprocess.run([str(program), *args], capture_output=True, timeout=120)
    assert r.returncode == 0, f"{program.name} {args[0]} failed: {r.stderr.decode()[-3000:]}\n{r.stdout.decode()}"
    return {d["step"]: d for d in map(json.loads, r.stdout.decode().splitlines())}


def test_sarama(broker, topic_name, saramacheck):
    out = run(saramacheck, "default", broker.bootstrap, topic_name)
    assert out["version"]["version"] == "0.8.2.0"
    assert out["produced"]["offsets"] == [0, 1, 2, 3, 4]
    assert out["consumed"]["offsets"] == [0, 1, 2, 3, 4]
    assert out["consumed"]["messages"] == [f"gz-k{i}=gz-value-{i}-" + "x" * 40 for i in range(5)]
    assert out["listed"]["found"] and out["listed"]["partitions"] == 1
    assert out["listed"]["configs"].get("retention.ms") == "3600000"
    described = out["described"]["configs"]
    assert described["retention.ms"] == {"value": "3600000", "default": False, "read_only": False}
    assert described["cleanup.policy"]["value"] == "delete" and described["cleanup.policy"]["default"] is True

    group = f"sarama-{topic_name}"
    out = run(saramacheck, "group", broker.bootstrap, topic_name, group)
    assert out["produced"]["offsets"] == [5, 6, 7, 8, 9]
    assert sorted(out["group"]["messages"], key=lambda s: int(s.split(":")[0])) == \
        [f"{i}:gz-k{i}" for i in range(5)] + [f"{i + 5}:sn-k{i}" for i in range(5)]
    # the group's commits, read by another client
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic_name, 0)], timeout=15)
        assert tp.offset == 10
    finally:
        c.close()
    # the stored batches are compressed as sarama sent them (up-converted: one v2 batch per message set)
    from tests.test_clients import segment_batches

    codecs = [attrs & 7 for _b, attrs, _n in segment_batches(broker.data_dir, topic_name, 0)]
    assert set(codecs) == {1, 2}, codecs


def test_kafka_go(broker, topic_name, kafkagocheck):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    group = f"kafkago-{topic_name}"
    out = run(kafkagocheck, broker.bootstrap, topic_name, group)
    assert out["written"]["count"] == 5
    assert out["read"]["messages"] == [f"{i}:go-k{i}=go-value-{i}-" + "y" * 32 for i in range(5)]
    import time

    assert all(abs(t - time.time() * 1000) < 120_000 for t in out["read"]["times"])  # message format v1 timestamps
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        [tp] = c.committed([TopicPartition(topic_name, 0)], timeout=15)
        assert tp.offset == 5
    finally:
        c.close()
    from tests.test_clients import segment_batches

    assert {attrs & 7 for _b, attrs, _n in segment_batches(broker.data_dir, topic_name, 0)} == {1}
