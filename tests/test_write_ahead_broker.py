"""Write-ahead objects on a real broker (issue #32), a real client over TCP, on the file
store and on moto S3: a produce to many partitions makes one object for all of them, and
every record comes back at its offset through consumers and ListOffsets; kill -9 between
an object's upload and its commit, during the rewrite into spec segments and during the
cleanup loses no acknowledged record and serves nothing twice, and no object is left
behind; a consumer reading while the data moves sees every record once."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafscale.storage import segment, write_ahead
from kafscale.storage.backends import open_store
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(300)


class Objects:
    """The broker's object store, read by the test through the store's own client: one
    client session for the test (opening one costs a second on S3), closed by `close`."""

    def __init__(self, url: str):
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._store = None

    def _run(self, call):
        async def go():
            if self._store is None:
                self._store = open_store(self.url)
            return await call(self._store)

        return self._loop.run_until_complete(go())

    def close(self) -> None:
        if self._store is not None:
            self._loop.run_until_complete(self._store.close())
        self._loop.close()

    def wal(self) -> list[str]:
        return self._run(lambda st: st.list("default/~wal/"))

    def specs(self, topic: str) -> list[str]:
        return [k for k in self._run(lambda st: st.list(f"default/{topic}/")) if k.endswith(".kfs")]

    def read(self, keys: list[str]) -> list[bytes]:
        """The objects at `keys`."""
        return self._run(lambda st: st.get_many([(k, None) for k in keys]))


@pytest.fixture(params=["file", "s3"])
def storage(request):
    """(extra broker args, env, Objects of a started broker)."""
    made: list[Objects] = []

    def objects_at(url: str) -> Objects:
        made.append(Objects(url))
        return made[-1]

    if request.param == "file":
        yield [], {}, lambda b: objects_at(f"file://{b.data_dir}/objects")
    else:
        moto = request.getfixturevalue("moto_server")
        bucket = f"wal-{uuid.uuid4().hex[:12]}"

        async def create():
            store = open_store(f"s3://{bucket}")
            await store.create_bucket()
            await store.close()

        asyncio.run(create())
        url = f"s3://{bucket}/data"
        # every flush at once (on S3 a busy partition waits --min-flush-interval-ms between them)
        yield ["--storage", url, "--min-flush-interval-ms", "0"], moto.env, lambda b: objects_at(url)
    for objects in made:
        objects.close()


FLAG = ["--write-ahead-objects", "true", "--merge-interval-ms", "0"]


def _started(broker_factory, storage, flags: list[str], topic: str, partitions: int):
    """(a broker on `storage` with `flags`, its Objects) and `topic` created on it."""
    args, env, objects_of = storage
    b = broker_factory(extra_args=[*flags, *args], env=env)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # held until the result: its end fails the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    return b, objects_of(b)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wal-{time.monotonic_ns()}", "enable.auto.commit": False, "fetch.wait.max.ms": 20})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout
    n = 0
    while n < expected and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            got[m.partition()].append((m.offset(), m.value()))
            n += 1
    c.close()
    return got


def test_one_object_per_flush_for_all_partitions_and_every_record_back(broker_factory, storage, topic_name):
    parts = 32
    b, objects = _started(broker_factory, storage, FLAG, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 50, "acks": "all"})
    sent: dict[int, list[bytes]] = {i: [] for i in range(parts)}
    t0 = int(time.time() * 1000)
    for rnd in range(3):
        before = set(objects.wal())
        for i in range(parts):
            v = b"r%d-p%d" % (rnd, i)
            p.produce(topic_name, value=v, partition=i, timestamp=t0 + rnd * 1000)
            sent[i].append(v)
        assert p.flush(15) == 0
        new = sorted(set(objects.wal()) - before)
        pieces = [pc for data in objects.read(new) for pc in write_ahead.decode(data)[1]]
        assert sorted(pc.partition for pc in pieces) == list(range(parts)), new
        if rnd > 0:  # once every log is loaded, the one produce request makes one object
            assert len(new) <= 2, new
    assert not objects.specs(topic_name)  # no partition wrote a segment object of its own
    got = _consume_all(b.bootstrap, topic_name, parts, 3 * parts)
    assert got == {i: list(enumerate(sent[i])) for i in range(parts)}
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wal-offsets"})
    assert c.get_watermark_offsets(TopicPartition(topic_name, 5, 0), timeout=10) == (0, 3)
    found = c.offsets_for_times([TopicPartition(topic_name, i, t0 + 1000) for i in range(parts)], timeout=10)
    assert [tp.offset for tp in found] == [1] * parts
    c.close()
    # and after a restart (cold cache) from the objects
    b.restart()
    assert _consume_all(b.bootstrap, topic_name, parts, 3 * parts) == got


def test_kill9_between_upload_and_commit_keeps_every_acknowledged_record(broker_factory, storage, topic_name):
    parts = 8
    b, objects = _started(broker_factory, storage, FLAG, topic_name, parts)
    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(err, m):
        if err is None:
            acked.append((m.partition(), m.offset(), m.value()))

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i in range(parts * 10):
        p.produce(topic_name, value=b"before-%03d" % i, partition=i % parts, on_delivery=on_delivery)
    assert p.flush(15) == 0
    # Hold the metadata store's write lock: the next flush uploads its object, then its
    # commit waits on the lock; the broker is killed right then.
    db_path = Path(b.data_dir) / "metadata.sqlite"
    assert db_path.exists()
    db = sqlite3.connect(str(db_path), isolation_level=None, timeout=30)
    try:
        before = set(objects.wal())
        db.execute("BEGIN IMMEDIATE")
        for i in range(parts * 5):
            p.produce(topic_name, value=b"during-%03d" % i, partition=i % parts, on_delivery=on_delivery)
        p.poll(0)
        wait_until(lambda: set(objects.wal()) - before, 20, "the write-ahead object of the held flush", interval=0.01)
        acked_at_kill = len(acked)
        b.kill9()
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert acked_at_kill == parts * 10  # nothing of the held flush was acknowledged
    b.start()
    for i in range(parts * 5):
        p.produce(topic_name, value=b"after-%03d" % i, partition=i % parts, on_delivery=on_delivery)
    assert p.flush(30) == 0
    total = sum(1 for _ in acked)
    got = _consume_all(b.bootstrap, topic_name, parts, total)
    for part in range(parts):
        offsets = [o for o, _v in got[part]]
        assert offsets == list(range(len(offsets)))  # nothing served twice, no hole
        values = [v for _o, v in got[part]]
        assert len(values) == len(set(values))
    served = {(part, o, v) for part, recs in got.items() for o, v in recs}
    assert set(acked) <= served  # every acknowledged record, at its offset
    assert len(served) == len(set(acked))


REWRITE = ["--write-ahead-objects", "true", "--merge-interval-ms", "100", "--merge-grace-ms", "1000",
           "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "4000"]


def test_consumer_reading_while_data_moves_into_segments_sees_every_record_once(broker_factory, storage, topic_name):
    parts = 4
    b, objects = _started(broker_factory, storage, REWRITE, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    total = 600
    reads: list = []
    import threading

    t = None
    for i in range(total):
        p.produce(topic_name, value=b"v-%05d" % i, partition=i % parts)
        if i % 8 == 0:
            p.flush(10)  # many small flushes: many pieces to move
        if i == total // 3:
            t = threading.Thread(target=lambda: reads.append(_consume_all(b.bootstrap, topic_name, parts, total, timeout=60)))
            t.start()
    assert p.flush(10) == 0
    t.join(90)
    expected = {q: [(o, b"v-%05d" % (o * parts + q)) for o in range(total // parts)] for q in range(parts)}
    assert reads[0] == expected  # read while pieces moved into segments
    wait_until(lambda: objects.specs(topic_name) and not objects.wal(), 30, "every piece rewritten and its objects deleted", interval=0.2)

    def listed_and_read() -> list[tuple[str, bytes]]:
        # the merger may still merge these segments: one listed then merged away reads as
        # None, so list and read again until every listed one is read
        specs = objects.specs(topic_name)
        got = list(zip(specs, objects.read(specs)))
        return got if all(data is not None for _key, data in got) else []

    for key, data in wait_until(listed_and_read, 30, "the segments listed and read in one go", interval=0.2):
        assert key.endswith(f"/segment-{segment.decode(data).info.base_offset:020d}.kfs")  # the spec's layout, keyed by base offset
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected


def test_kill9_during_rewrite_and_cleanup_loses_and_duplicates_nothing(broker_factory, storage, topic_name):
    parts = 4
    b, objects = _started(broker_factory, storage, REWRITE, topic_name, parts)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    acked = []
    total = 400
    for i in range(total):
        p.produce(topic_name, value=b"k-%04d" % i, partition=i % parts,
                  on_delivery=lambda e, m: acked.append((m.partition(), m.offset(), m.value())) if e is None else None)
        if i % 4 == 0:
            p.flush(10)
    assert p.flush(10) == 0
    # kill once the rewrite is under way (a spec segment exists), then again while the
    # cleanup deletes (fewer objects than at the first kill)
    wait_until(lambda: objects.specs(topic_name), 30, "a first rewritten segment", interval=0.01)
    b.kill9()
    left = len(objects.wal())
    b.start()
    _consume_all(b.bootstrap, topic_name, parts, total)  # loads the partitions: the rewrite goes on
    wait_until(lambda: len(objects.wal()) < left, 60, "the cleanup deleting", interval=0.01)
    b.kill9()
    b.start()
    expected = {q: [(o, b"k-%04d" % (o * parts + q)) for o in range(total // parts)] for q in range(parts)}
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected
    assert sorted(acked) == sorted((q, o, v) for q, recs in expected.items() for o, v in recs)
    # and the job ends: every piece in spec segments, no write-ahead object left
    wait_until(lambda: not objects.wal(), 60, "no write-ahead object left", interval=0.2)
    assert _consume_all(b.bootstrap, topic_name, parts, total) == expected


def test_kill9_in_the_cleanup_leaves_no_orphan_and_loses_nothing(broker_factory, storage, topic_name):
    """An object whose commit never happened (the broker killed -9 between its upload and
    its commit: an orphan) and many committed ones; then, with the rewrite and the cleanup
    running, the broker is killed -9 again and again as soon as the cleanup has deleted
    some objects and not all. In the end no write-ahead object is left, the orphan
    included (--write-ahead-orphan-age-ms, 6 s here), and every acknowledged record is
    read once at its offset."""
    parts = 4
    b, objects = _started(broker_factory, storage, FLAG, topic_name, parts)
    acked: list[tuple[int, int, bytes]] = []

    def on_delivery(err, m):
        if err is None:
            acked.append((m.partition(), m.offset(), m.value()))

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    n = 0

    def produce(count: int, flush_every: int) -> None:
        nonlocal n
        for _ in range(count):
            p.produce(topic_name, value=b"o-%05d" % n, partition=n % parts, on_delivery=on_delivery)
            n += 1
            if n % flush_every == 0:
                assert p.flush(15) == 0  # one object per flush: many objects for the cleanup
        assert p.flush(30) == 0

    produce(40, 4)
    # the orphan: its flush uploads, its commit waits on the held metadata write lock, kill -9
    db = sqlite3.connect(str(Path(b.data_dir) / "metadata.sqlite"), isolation_level=None, timeout=30)
    try:
        before = set(objects.wal())
        db.execute("BEGIN IMMEDIATE")
        p.produce(topic_name, value=b"held", partition=0, on_delivery=on_delivery)
        p.poll(0)
        wait_until(lambda: set(objects.wal()) - before, 20, "the held flush's object", interval=0.01)
        b.kill9()
    finally:
        db.execute("ROLLBACK")
        db.close()
    b.extra_args = ["--write-ahead-objects", "true", "--merge-interval-ms", "100", "--merge-grace-ms", "1000",
                    "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "6000", *storage[0]]  # fmt: skip
    b.start()
    # objects in a burst shorter than the orphan age: they come of age, and go, over several rounds
    produce(60, 2)  # (the held record too, retried by the producer into a later object)
    kills = 0
    while kills < 2:
        count = len(objects.wal())
        if not count:
            break
        # kill while the cleanup deletes: as soon as some objects went and others are left
        wait_until(lambda: 0 < len(objects.wal()) < count or not objects.wal(), 60, "the cleanup deleting", interval=0.005)
        if not objects.wal():
            break
        b.kill9()
        kills += 1
        b.start()
        _consume_all(b.bootstrap, topic_name, parts, 1)  # loads the partitions: their rewrite goes on
    assert kills >= 1, "the cleanup deleted everything at once: no kill landed in it"
    wait_until(lambda: not objects.wal(), 60, "no write-ahead object left, the orphan included", interval=0.2)
    got = _consume_all(b.bootstrap, topic_name, parts, len(acked))
    for part in range(parts):
        assert [o for o, _v in got[part]] == list(range(len(got[part])))  # nothing served twice, no hole
    assert sorted((q, o, v) for q, recs in got.items() for o, v in recs) == sorted(acked)


def test_with_merging_off_pieces_still_move_into_segments_and_their_objects_go(broker_factory, topic_name):
    """--merge-interval-ms 0 turns off the merging of small segments, not the rewrite of
    write-ahead pieces nor the cleanup (storage/merger.py WRITE_AHEAD_ROUND_S): else the
    data would never reach the spec's segments and the objects would stay for good."""
    parts = 3
    flags = ["--write-ahead-objects", "true", "--merge-interval-ms", "0", "--merge-grace-ms", "0",
             "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "4000"]  # fmt: skip
    b, objects = _started(broker_factory, ([], {}, lambda b: Objects(f"file://{b.data_dir}/objects")), flags, topic_name, parts)
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        for i in range(30):
            p.produce(topic_name, value=b"m-%03d" % i, partition=i % parts)
            if i % 6 == 5:
                assert p.flush(15) == 0
        assert p.flush(15) == 0
        assert objects.wal() and not objects.specs(topic_name)
        wait_until(lambda: not objects.wal() and len(objects.specs(topic_name)) >= parts, 60, "every piece in segments, no object left", interval=0.2)
        expected = {q: [(o, b"m-%03d" % (o * parts + q)) for o in range(30 // parts)] for q in range(parts)}
        assert _consume_all(b.bootstrap, topic_name, parts, 30) == expected
    finally:
        objects.close()


def _read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of each partition up to its end (the last stable offset for
    read_committed), as {partition: [(offset, value)]}."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wal-{time.monotonic_ns()}", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 20, "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"read {got} ({isolation}), ends seen {ended}"
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                continue
            got[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def test_aborted_transactions_stay_hidden_from_read_committed_across_the_rewrite(broker_factory, topic_name):
    """A transactional producer's committed and aborted transactions, flushed into
    write-ahead objects: a read_committed consumer sees nothing of the aborted ones, at the
    same offsets as a read_uncommitted one shows them, before the pieces are rewritten
    into segments (their aborted-transaction entries merged), after, and after a restart
    that loads those entries from the rewritten segments' metadata."""
    parts = 2
    flags = ["--transactions", "true", "--group-initial-rebalance-delay-ms", "0", "--write-ahead-objects", "true", "--merge-interval-ms", "0"]
    b, objects = _started(broker_factory, ([], {}, lambda b: Objects(f"file://{b.data_dir}/objects")), flags, topic_name, parts)
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{topic_name}", "linger.ms": 5})
        p.init_transactions(30)
        outcomes = [True, False, True, False, True]
        for rnd, commit in enumerate(outcomes):
            p.begin_transaction()
            for i in range(6):
                p.produce(topic_name, value=b"t%d-%d" % (rnd, i), partition=i % parts)
            p.flush(30)  # durable before the transaction ends: its marker lands in a later piece
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
        plain = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        for q in range(parts):
            plain.produce(topic_name, value=b"plain-%d" % q, partition=q)
        assert plain.flush(15) == 0

        def check() -> tuple[dict, dict]:
            committed = _read_to_end(b.bootstrap, topic_name, parts, "read_committed")
            everything = _read_to_end(b.bootstrap, topic_name, parts, "read_uncommitted")
            for q in range(parts):
                want = [b"t%d-%d" % (rnd, i) for rnd, ok in enumerate(outcomes) if ok for i in range(q, 6, parts)] + [b"plain-%d" % q]
                assert [v for _o, v in committed[q]] == want
                assert len(everything[q]) == 15 + 1  # the aborted records are there, read_uncommitted
                assert set(committed[q]) <= set(everything[q])  # at the offsets they have for everyone
            return committed, everything

        assert objects.wal() and not objects.specs(topic_name)
        before = check()
        assert not objects.specs(topic_name)  # read from the write-ahead objects
        b.stop()
        b.extra_args = ["--transactions", "true", "--group-initial-rebalance-delay-ms", "0", "--write-ahead-objects", "true",
                        "--merge-interval-ms", "100", "--merge-grace-ms", "0", "--segment-max-age-ms", "0", "--write-ahead-orphan-age-ms", "4000"]  # fmt: skip
        b.start()
        wait_until(lambda: len(objects.specs(topic_name)) >= parts and not objects.wal(), 60, "every piece in segments, no object left", interval=0.2)
        assert check() == before
        b.restart()
        assert check() == before
    finally:
        objects.close()
