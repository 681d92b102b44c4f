"""sarama, the Go client most Go tools embed (Burrow, ...), from Debian
(golang-github-shopify-sarama-dev 1.22), against the broker: with its default version
(0.8.2: Produce v0 with gzip message sets, Fetch v0, Metadata v0), its admin at 0.11.0
(it refuses lower versions itself: CreateTopics v1, Metadata v1, DescribeConfigs v0) and at 0.10.2, the lowest its consumer groups take (Produce v2 with
snappy message format v1, Fetch v3, JoinGroup v1, OffsetCommit v2). `make test` installs
the Debian packages (golang-go, golang-github-shopify-sarama-dev); without them the test
is skipped, saying which is missing. The program is built offline in GOPATH mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

SARAMA_SRC = Path("/usr/share/gocode/src/github.com/Shopify/sarama")
PROGRAM = Path(__file__).parent / "sarama" / "main.go"


@pytest.fixture(scope="module")
def saramacheck():
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: apt-get install golang-go (make test does)")
    if not SARAMA_SRC.is_dir():
        pytest.skip("no sarama sources: apt-get install golang-github-shopify-sarama-dev (make test does)")
    root = Path(tempfile.mkdtemp(prefix="kafscale-sarama-"))
    src = root / "src" / "saramacheck"
    src.mkdir(parents=True)
    shutil.copy(PROGRAM, src / "main.go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{root}:/usr/share/gocode", "GOFLAGS": "",
           "GOCACHE": os.environ.get("KAFSCALE_GOCACHE", str(Path(tempfile.gettempdir()) / "kafscale-gocache"))}
    r = subprocess.run(["go", "build", "-o", str(root / "saramacheck"), "."], cwd=src, env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    yield root / "saramacheck"
    shutil.rmtree(root, ignore_errors=True)


def run(program: Path, *args: str) -> dict[str, dict]:
    r = subprocess.run([str(program), *args], capture_output=True, timeout=120)
    assert r.returncode == 0, f"sarama {args[0]} failed: {r.stderr.decode()[-3000:]}\n{r.stdout.decode()}"
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
