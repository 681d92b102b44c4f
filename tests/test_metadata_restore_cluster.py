"""Issue #25 on etcd + S3 (moto): three brokers under acks=all load from an idempotent and a
transactional producer and a committing group; etcd is killed, its data dir wiped and it
starts empty. After `kafscale metadata restore` and a restart of the brokers: every
acknowledged record is readable once at its offset, committed offsets are no older than
the newest snapshot's, the transactional producer's open transaction is aborted and a
read_committed consumer reaches the end of every partition.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.backup.snapshot import SnapshotStore
from kafscale.metadata import keys
from kafscale.storage.backends import open_store
from tests.support.broker import REPO, BrokerProcess
from tests.support.clients import AckedLoad
from tests.support.servers import ETCD_BIN, start_etcd
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(240),
]

TOPIC = "orders"
PARTITIONS = 3


def newest_snapshot_offsets(storage: str, env: dict, group: str) -> dict[int, int]:
    import asyncio

    async def read():
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            store = open_store(storage)
            snaps = SnapshotStore(store, "default")
            snap = await snaps.load_newest([])
            await store.close()
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        prefix = keys.group_offsets_prefix(group)
        out = {}
        for key, value in snap.entries:
            if key.startswith(prefix):
                t, p = keys.offset_partition_of(key)
                if t == TOPIC:
                    import json

                    out[p] = json.loads(value)["offset"]
        return out

    return asyncio.run(read())


def test_etcd_lost_three_brokers_restored(moto_server):
    etcd = start_etcd()
    tag = uuid.uuid4().hex[:8]
    prefix, bucket = f"/rs-{tag}", f"rs-{tag}"
    storage = f"s3://{bucket}/data"
    env = {**moto_server.env, "KAFSCALE_S3_CREATE_BUCKET": "true"}
    common = ["--metadata", etcd.url, "--metadata-prefix", prefix, "--storage", storage, "--lease-ttl-s", "3",
              "--group-initial-rebalance-delay-ms", "0", "--metadata-snapshot-interval-ms", "1000"]
    brokers = [BrokerProcess(extra_args=["--broker-id", str(i), *common], env=env) for i in range(3)]
    stop = threading.Event()
    load = None
    try:
        for b in brokers:
            b.start()
        bootstrap = ",".join(b.bootstrap for b in brokers)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(20)

        load = AckedLoad({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}, TOPIC, PARTITIONS, "i", poll_s=0.002, flush_s=5)

        committed_by_group: dict[int, int] = {}

        def committing_group() -> None:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing", "enable.auto.commit": False,
                          "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})
            c.subscribe([TOPIC])
            seen = 0
            while not stop.is_set():
                msgs = c.consume(200, 0.2)
                seen += len([m for m in msgs if m.error() is None])
                if msgs and seen >= 100:
                    try:
                        for tp in c.commit(asynchronous=False) or []:
                            committed_by_group[tp.partition] = tp.offset
                    except Exception:  # noqa: BLE001 - a rebalance or the outage: try again later
                        pass
                    seen = 0
            c.close()

        group = threading.Thread(target=committing_group, daemon=True)
        load.start()
        group.start()

        tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{tag}", "acks": "all", "linger.ms": 5})
        tx.init_transactions(30)
        txn_committed: set[bytes] = set()
        for n in range(3):
            tx.begin_transaction()
            values = [f"t{n}-{j}".encode() for j in range(30)]
            for j, v in enumerate(values):
                tx.produce(TOPIC, value=v, partition=j % PARTITIONS)
            tx.commit_transaction(30)
            txn_committed.update(values)
        tx.begin_transaction()
        open_values = {f"open-{j}".encode() for j in range(12)}
        delivered = []
        for j, v in enumerate(sorted(open_values)):
            tx.produce(TOPIC, value=v, partition=j % PARTITIONS, on_delivery=lambda err, msg: delivered.append(err))
        tx.flush(30)
        assert len(delivered) == len(open_values) and not any(delivered)  # durable, never committed

        wait_until(lambda: len(load.acked) >= 2000 and len(committed_by_group) >= 2, 90, "load and group commits")
        # The loss: etcd goes, its data with it. Clients stop; brokers are stopped for the restore.
        etcd.stop()
        stop.set()
        acked = load.stop(20)
        group.join(20)
        for b in brokers:
            b.stop(signal.SIGKILL)
        shutil.rmtree(etcd.data_dir)
        etcd.start()
        before = newest_snapshot_offsets(storage, env, "billing")

        out = subprocess.run(
            [sys.executable, "-m", "kafscale", "metadata", "restore", "--metadata", etcd.url, "--metadata-prefix", prefix, "--storage", storage],
            capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, **env},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + out.stdout
        assert "aborted" in out.stdout
        assert "open transactions closed: 0 aborted" not in out.stdout, out.stdout

        for b in brokers:
            b.start()
        # Every acknowledged record once, at its offset (read_uncommitted: the idempotent
        # producer's records with the rest).
        hw = {}
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{tag}", "enable.auto.commit": False, "isolation.level": "read_committed"})
        for p in range(PARTITIONS):
            hw[p] = wait_until(lambda p=p: reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=5)[1], 60, "watermarks")
        reader.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        got: dict[tuple[int, int], bytes] = {}
        at_end: set[int] = set()

        def read_committed_reaches_the_end() -> bool:
            for m in reader.consume(500, 0.5):
                if m.error() is None:
                    got[(m.partition(), m.offset())] = m.value()
            for p in range(PARTITIONS):
                if reader.position([TopicPartition(TOPIC, p)])[0].offset >= hw[p]:
                    at_end.add(p)
            return len(at_end) == PARTITIONS

        wait_until(read_committed_reaches_the_end, 90, "a read_committed consumer reaching the end of every partition")
        reader.close()
        for key, value in acked.items():
            assert got.get(key) == value, f"acknowledged record {key} not back at its offset"
        values = list(got.values())
        assert len(values) == len(set(values)), "a record read twice"
        assert txn_committed <= set(values)
        assert not (open_values & set(values)), "records of the open transaction visible to read_committed"

        check = Consumer({"bootstrap.servers": bootstrap, "group.id": "billing", "enable.auto.commit": False})
        restored = {tp.partition: tp.offset for tp in check.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)}
        check.close()
        for p, off in before.items():
            assert restored[p] >= off, f"partition {p}: committed {restored[p]} is older than the snapshot's {off}"
    finally:
        stop.set()
        if load is not None:
            load.stop(5)
        for b in brokers:
            b.stop(signal.SIGKILL)
            print(f"--- broker log {b.log_path} ---\n" + "\n".join(ln for ln in b.log_text().splitlines() if "took ownership" not in ln)[-3000:])
        etcd.cleanup()
