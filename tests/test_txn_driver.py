"""The transaction coordinator's driver in-process, over a real SQLite metadata store:
markers to local partitions through `logs.write_txn_markers`, to partitions of another broker
by WriteTxnMarkers over TCP (a small Kafka-protocol peer decoding with kio), retries until
every partition answers, completion with the pending offsets moved, recovery of a
prepared transaction found in the store, and a stale coordinator refused by the store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kafscale.cluster.membership import BrokerNode, Cluster
from kafscale.errors import ErrorCode
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.store import CommittedOffset, MetadataStore
from kafscale.protocol import codec
from kafscale.protocol.build import make, response
from kafscale.transactions.coordinator import TransactionCoordinator
from kafscale.transactions.state import TransactionMetadata, TxnState
from tests.support.wait import wait_until_async


class TwoBrokers(Cluster):
    """This broker (0) owns partitions of topic "local"; broker 1 (the peer) owns "remote"."""

    def __init__(self, peer_port: int):
        super().__init__(BrokerNode(0, "127.0.0.1", 1))
        self.peer = BrokerNode(1, "127.0.0.1", peer_port)

    def brokers(self):
        return [self.local, self.peer]

    def owner_of(self, topic, partition):
        return 0 if topic == "local" else 1

    def coordinator_for(self, key):
        return self.local


class FakeLogs:
    def __init__(self):
        self.markers = []
        self.fail_first = 0

    async def write_txn_markers(self, marker):
        if self.fail_first:
            self.fail_first -= 1
            return {tp: ErrorCode.kafka_storage_error for tp in marker.partitions}
        self.markers.append(marker)
        return {tp: ErrorCode.none for tp in marker.partitions}


class Peer:
    """A broker's Kafka listener reduced to WriteTxnMarkers: records what it was asked."""

    def __init__(self, answers: list[ErrorCode]):
        self.answers = answers  # one per request, then NONE
        self.requests = []

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer):
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                payload = memoryview(await reader.readexactly(size))
                header = codec.decode_header(payload, True)
                body = codec.decode_body(header.api_key, header.api_version, payload, header.body_offset)
                self.requests.append((header.api_key, header.api_version, body))
                code = self.answers.pop(0) if self.answers else ErrorCode.none
                cls = response(27, header.api_version)
                resp = make(cls, markers=[dict(producer_id=m.producer_id, topics=[
                    dict(name=t.name, partitions=[dict(partition_index=p, error_code=code) for p in t.partition_indexes])
                    for t in m.topics]) for m in body.markers])
                for buf in codec.encode_response(27, header.api_version, header.correlation_id, resp):
                    writer.write(buf)
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()


class Ids:
    def __init__(self):
        self.next = 100

    async def allocate(self):
        self.next += 1
        return self.next


@pytest.fixture
def env(tmp_path):
    async def make_env(answers=()):
        peer = Peer(list(answers))
        await peer.start()
        store = MetadataStore(SqliteKV(tmp_path / "m.sqlite"))
        clock = SimpleNamespace(now=1_000_000.0)
        logs = FakeLogs()
        config = SimpleNamespace(transaction_abort_timed_out_transaction_cleanup_interval_ms=3_600_000)
        coord = TransactionCoordinator(store, config, TwoBrokers(peer.port), logs, Ids(), clock=lambda: clock.now)
        return SimpleNamespace(peer=peer, store=store, clock=clock, logs=logs, coord=coord, config=config)

    return make_env


def test_commit_writes_local_and_remote_markers_then_moves_offsets(env):
    async def go():
        e = await env(answers=[ErrorCode.not_leader_or_follower])  # the owner refuses once
        e.logs.fail_first = 1  # and the local write fails once
        c = e.coord
        step = await c.init_producer_id("tx", 10_000, None)
        pid, epoch = step.producer_id, step.producer_epoch
        parts = [("local", 0), ("local", 1), ("remote", 0)]
        assert await c.add_partitions("tx", pid, epoch, parts) is ErrorCode.none
        assert await c.add_partitions("tx", pid, epoch, groups=["g"]) is ErrorCode.none
        await e.store.put_pending_offsets("g", pid, {("local", 0): CommittedOffset(offset=42)})
        step = await c.end_txn("tx", pid, epoch, commit=True)
        assert step.error is ErrorCode.none
        # Persisted before the answer: the store already says PrepareCommit.
        doc, _v = await e.store.get_transaction("tx")
        assert doc["state"] in ("PrepareCommit", "CompleteCommit")
        await wait_until_async(lambda: c.txns["tx"].state is TxnState.COMPLETE_COMMIT, 10, "completion")
        [local] = e.logs.markers
        assert (local.producer_id, local.producer_epoch, local.commit, sorted(local.partitions)) == (
            pid, epoch, True, [("local", 0), ("local", 1)])
        assert len(e.peer.requests) == 2  # refused once, then written
        api_key, version, body = e.peer.requests[-1]
        [m] = body.markers
        assert (api_key, m.producer_id, m.producer_epoch, m.transaction_result) == (27, pid, epoch, True)
        # The group's __consumer_offsets partition gets its marker too (Kafka's
        # AddOffsetsToTxn), here from its owner, the peer.
        offsets_partition = c.cluster.offsets_partition("g")
        assert sorted((t.name, list(t.partition_indexes)) for t in m.topics) == [("__consumer_offsets", [offsets_partition]), ("remote", [0])]
        assert (await e.store.fetch_offsets("g"))[("local", 0)].offset == 42
        assert await e.store.pending_offset_partitions("g") == set()
        doc, _v = await e.store.get_transaction("tx")
        assert doc["state"] == "CompleteCommit" and doc["partitions"] == []
        await c.stop()
        await e.store.close()

    asyncio.run(go())


def test_prepared_transaction_in_store_is_finished_on_load(env):
    async def go():
        e = await env()
        meta = TransactionMetadata("tx-r", 7, producer_epoch=3, timeout_ms=10_000, state=TxnState.PREPARE_ABORT,
                                   partitions={("local", 0), ("remote", 2)}, groups={"g"}, start_ms=1, last_update_ms=1)
        await e.store.put_transaction("tx-r", meta.to_doc(), 0)
        await e.store.put_pending_offsets("g", 7, {("local", 0): CommittedOffset(offset=5)})
        # The previous coordinator died after prepare: the sweep of the new one finishes it.
        await e.coord.sweep()
        await wait_until_async(lambda: e.coord.txns["tx-r"].state is TxnState.COMPLETE_ABORT, 10, "the abort")
        assert [(m.producer_id, m.producer_epoch, m.commit) for m in e.logs.markers] == [(7, 3, False)]
        assert e.peer.requests and e.peer.requests[0][2].markers[0].transaction_result is False
        assert await e.store.fetch_offsets("g") == {}
        assert await e.store.pending_offset_partitions("g") == set()
        await e.coord.stop()
        await e.store.close()

    asyncio.run(go())


def test_timeout_sweep_fences_and_stale_coordinator_is_refused(env):
    async def go():
        e = await env()
        c = e.coord
        step = await c.init_producer_id("tx-t", 1000, None)
        pid = step.producer_id
        assert await c.add_partitions("tx-t", pid, 0, [("local", 0)]) is ErrorCode.none
        e.clock.now += 1001
        await c.sweep()
        await wait_until_async(lambda: c.txns["tx-t"].state is TxnState.COMPLETE_ABORT, 10, "the timeout abort")
        assert c.txns["tx-t"].producer_epoch == 1 and e.logs.markers[-1].producer_epoch == 1
        assert (await c.end_txn("tx-t", pid, 0, commit=True)).error is ErrorCode.producer_fenced
        # Another coordinator (a second driver on the same store) moves the id on; ours, with
        # its stale copy, is refused by the store and lets go.
        other = TransactionCoordinator(e.store, e.config, c.cluster, e.logs, Ids(), clock=lambda: e.clock.now)
        assert (await other.init_producer_id("tx-t", 1000, None)).producer_epoch == 2
        assert (await c.init_producer_id("tx-t", 1000, None)).error is ErrorCode.not_coordinator
        assert "tx-t" not in c.txns
        assert (await c.init_producer_id("tx-t", 1000, None)).producer_epoch == 3  # reloaded
        e.clock.now += 8 * 24 * 3600 * 1000  # transactional.id.expiration.ms: the id goes
        await c.sweep()
        assert await e.store.get_transaction("tx-t") is None
        await c.stop()
        await other.stop()
        await e.store.close()

    asyncio.run(go())


def test_markers_refused_as_stale_stop_and_drop_the_copy(env):
    async def go():
        e = await env()
        c = e.coord

        async def refuse(marker):
            return {tp: ErrorCode.invalid_producer_epoch for tp in marker.partitions}

        e.logs.write_txn_markers = refuse
        step = await c.init_producer_id("tx-s", 10_000, None)
        assert await c.add_partitions("tx-s", step.producer_id, 0, [("local", 0)]) is ErrorCode.none
        assert (await c.end_txn("tx-s", step.producer_id, 0, commit=True)).error is ErrorCode.none
        await wait_until_async(lambda: "tx-s" not in c.txns, 10, "the stale copy dropped")
        await c.stop()
        await e.store.close()

    asyncio.run(go())
