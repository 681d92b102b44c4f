"""#32: a topic whose records are only in write-ahead objects (not yet rewritten into its
own segments) and whose metadata is lost. Its marker (storage/topic_marker.py) still says
it lives, so a create of its name is refused (POLICY_VIOLATION naming the restore), the
write-ahead cleanup keeps the objects holding its pieces however old they get (else the
restore would bring the topic back empty and hand its offsets out again), and
`kafscale metadata restore` brings every acknowledged record back at its offset. A topic
deleted while its records are in write-ahead objects stays deleted through a restore from
the bucket alone, though its pieces are still in the objects.

Real brokers (subprocesses, embedded metadata) over a file store and over moto S3; the
lost metadata is made with the MetadataStore, as a lost topic key leaves it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.errors import ErrorCode
from kafscale.metadata.store import MetadataStore
from kafscale.storage import write_ahead
from tests.support.broker import REPO, wait_for_leader, with_metadata
from tests.support.wait import wait_until

PARTITIONS = 2
# Pieces stay in write-ahead objects (an hour before their rewrite); the cleanup runs every
# 200 ms and would delete an unreferenced object 2 s old.
FLAGS = ["--write-ahead-objects", "true", "--segment-max-age-ms", "3600000", "--write-ahead-orphan-age-ms", "2000",
         "--merge-grace-ms", "0", "--merge-interval-ms", "200", "--metadata-snapshot-interval-ms", "0"]  # fmt: skip


class Bucket:
    """Where a broker's objects are: storage flags, environment, and the keys under the
    namespace (relative to it)."""

    def __init__(self, kind: str, moto=None):
        self.kind = kind
        if kind == "file":
            self.args, self.env = [], {}
            return
        self.bucket = f"wal-lost-{uuid.uuid4().hex[:10]}"
        self.args = ["--storage", f"s3://{self.bucket}/data"]
        self.env = {**moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true"}
        self.s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")

    def keys(self, data_dir: str) -> set[str]:
        if self.kind == "file":
            root = Path(data_dir, "objects", "default")
            return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()
        out = set()
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="data/default/"):
            out |= {o["Key"][len("data/default/") :] for o in page.get("Contents", [])}
        return out


@pytest.fixture(params=["file", "moto"])
def bucket(request) -> Bucket:
    return Bucket(request.param, request.getfixturevalue("moto_server") if request.param == "moto" else None)


def _kafscale(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kafscale", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **env})  # fmt: skip


def _create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)


def _produce(bootstrap: str, topic: str, n: int, tag: str) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    wait_for_leader(p, topic, 0)

    def done(err, msg):
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for i in range(n):
        p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % PARTITIONS, on_delivery=done)
    assert p.flush(30) == 0
    assert len(acked) == n
    return acked


def _read(bootstrap: str, topic: str, n: int) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[tuple[int, int], bytes] = {}

    def all_read() -> bool:
        for m in c.consume(500, 0.5):
            if m.error() is None:
                got[(m.partition(), m.offset())] = m.value()
        return len(got) >= n

    wait_until(all_read, 60, f"{n} records of {topic}")
    c.close()
    return got


def _only_in_write_ahead_objects(keys: set[str], topic: str) -> set[str]:
    assert not [k for k in keys if k.startswith(f"{topic}/") and "segment-" in k], keys
    wal = {k for k in keys if k.startswith("~wal/")}
    assert wal
    return wal


def test_lost_topic_in_write_ahead_objects_refused_kept_and_restored(broker_factory, topic_name, bucket):
    b = broker_factory(extra_args=[*FLAGS, *bucket.args], env=bucket.env)
    _create(b.bootstrap, topic_name)
    acked = _produce(b.bootstrap, topic_name, 40, "kept")
    wal = _only_in_write_ahead_objects(bucket.keys(b.data_dir), topic_name)
    assert b.stop() == 0

    async def lose(md: MetadataStore):  # the topic's metadata is lost; the bucket is not
        await md.delete_topic(topic_name)

    with_metadata(b, lose)
    b.start()
    # A create of the name is refused: it would hand out offsets 0.. again.
    with pytest.raises(KafkaException) as refused:
        _create(b.bootstrap, topic_name)
    assert refused.value.args[0].code() == ErrorCode.policy_violation, refused.value
    assert "kafscale metadata restore" in refused.value.args[0].str()
    # Nothing refers to the objects now, and they are past the orphan age: the cleanup
    # keeps them all the same, for the restore.
    wait_until(lambda: "kept for `kafscale metadata restore`" in b.log_text() or not wal <= bucket.keys(b.data_dir), 60,
               "the cleanup to keep (or delete) the lost topic's objects")
    assert wal <= bucket.keys(b.data_dir)
    assert b.stop() == 0

    out = _kafscale("metadata", "restore", "--force", "--data-dir", b.data_dir, *bucket.args, env=bucket.env)
    assert out.returncode == 0, out.stdout + out.stderr
    b.start()
    assert _read(b.bootstrap, topic_name, len(acked)) == acked  # every record at its offset
    more = _produce(b.bootstrap, topic_name, 2 * PARTITIONS, "after")
    ends = {p: max(o for (q, o) in acked if q == p) + 1 for p in range(PARTITIONS)}
    assert sorted(more) == sorted((p, ends[p] + i) for p in range(PARTITIONS) for i in range(2))  # the log goes on: nothing renumbered


def test_topic_deleted_from_write_ahead_objects_stays_deleted_through_a_restore(broker_factory, topic_name):
    bucket = Bucket("file")
    b = broker_factory(extra_args=FLAGS)
    gone, kept = topic_name + "-gone", topic_name + "-kept"
    _create(b.bootstrap, gone)
    _create(b.bootstrap, kept)
    _produce(b.bootstrap, gone, 10, "gone")
    acked = _produce(b.bootstrap, kept, 10, "kept")
    _only_in_write_ahead_objects(bucket.keys(b.data_dir), gone)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.delete_topics([gone])[gone].result(15)
    wait_until(lambda: not [k for k in bucket.keys(b.data_dir) if k.startswith(f"{gone}/")], 15, "the deletion to finish (its marker last)")
    assert b.stop() == 0
    wal = Path(b.data_dir, "objects", "default", write_ahead.WAL_DIR)
    assert any(pc.topic == gone for path in wal.glob("*.wal") for pc in write_ahead.decode(path.read_bytes())[1])  # its pieces are still there
    for suffix in ("", "-wal", "-shm"):  # the whole metadata store is lost
        Path(b.data_dir, "metadata.sqlite" + suffix).unlink(missing_ok=True)

    out = _kafscale("metadata", "restore", "--data-dir", b.data_dir, env={})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no snapshot: the bucket alone" in out.stdout
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    topics = admin.list_topics(timeout=15).topics
    assert kept in topics and gone not in topics
    assert _read(b.bootstrap, kept, len(acked)) == acked
