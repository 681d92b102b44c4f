"""The etcd lease that fences a broker: refreshed whatever the event loop does, writes stop
half a TTL after the last refresh etcd accepted, and one broker id runs once.

The first tests run an EtcdCluster in this process against a private etcd (they freeze it),
so they can block the event loop the way a loaded machine does and read the cluster's own
view at the instant the loop comes back. The last one starts real broker processes.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
import pytest_asyncio

from kafscale.cluster.etcd_cluster import WRITE_MARGIN, EtcdCluster, keepalive_period
from kafscale.cluster.membership import BrokerNode
from kafscale.metadata.etcd import EtcdKV
from kafscale.metadata.store import MetadataStore, TopicMeta
from tests.support.broker import BrokerProcess
from tests.support.servers import ETCD_BIN, start_etcd
from tests.support.wait import wait_until, wait_until_async

pytestmark = [
    pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)"),
    pytest.mark.timeout(120),
]

TTL_S = 3


@pytest.fixture(scope="module")
def etcd():
    """Private to this module: tests here freeze it."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.cleanup()


@pytest_asyncio.fixture(loop_scope="function")  # the test's own loop: the one the test blocks
async def owner(etcd):
    """A started EtcdCluster (lease TTL 3 s) that owns both partitions of a topic."""
    kv = EtcdKV.from_url(etcd.url, prefix=f"/lease-{uuid.uuid4().hex[:8]}")
    metadata = MetadataStore(kv)
    topic = "t"
    await metadata.create_topic(TopicMeta(topic, 2))
    cluster = EtcdCluster(BrokerNode(0, "127.0.0.1", 9092), kv, metadata, TTL_S)
    await cluster.start()
    try:
        assert cluster.owns(topic, 0) and cluster.owns(topic, 1), "a lone broker takes every partition"
        yield cluster, topic
    finally:
        if etcd.proc is not None:
            etcd.resume()
        await cluster.stop()
        await metadata.close()


async def test_busy_event_loop_keeps_writing(owner):
    """The event loop is blocked for 2.5 s, longer than half the lease TTL (1.5 s), as on a
    loaded machine. The lease is refreshed meanwhile, so when the loop comes back the broker
    still owns its partitions under the same epoch: no fencing of a healthy broker."""
    cluster, topic = owner
    epochs = {p: cluster.leader_epoch(topic, p) for p in (0, 1)}
    blocked_for = TTL_S * WRITE_MARGIN + 1.0

    time.sleep(blocked_for)  # blocks the loop: nothing else in this process runs but threads
    back = time.monotonic()
    alive, owned = cluster.lease_alive(), [cluster.owns(topic, p) for p in (0, 1)]
    margin = cluster._write_deadline - back

    assert alive and owned == [True, True], f"after a {blocked_for}s busy loop: lease alive {alive}, owns {owned}"
    # Measured from a refresh sent during the block: at most one period (plus the refresh's
    # own round trip) older than now.
    assert TTL_S * WRITE_MARGIN - keepalive_period(TTL_S) - 0.5 < margin <= TTL_S * WRITE_MARGIN, f"write deadline {margin:.2f}s ahead"
    await asyncio.sleep(1.5)  # the lease loop and reconcile run: nothing is dropped or re-taken
    assert [cluster.owns(topic, p) for p in (0, 1)] == [True, True]
    held = {p: cluster._owners.get((topic, p)) for p in (0, 1)}  # as last read from etcd
    assert held == {p: (0, epochs[p]) for p in (0, 1)}, f"owner keys after the busy loop: {held}"


async def test_writes_stop_half_a_ttl_after_the_last_accepted_keepalive(owner, etcd):
    """etcd frozen: the owner stops writing at most TTL/2 after the last keepalive etcd
    accepted (so well before etcd could expire the lease, TTL after that send), and not
    much earlier; when etcd answers again within the TTL, it writes again."""
    cluster, topic = owner
    # Make the moment of the last accepted send known: wait for a fresh refresh, then freeze.
    before = cluster._write_deadline
    await wait_until_async(lambda: cluster._write_deadline > before, 2, "a keepalive", interval=0.02)
    etcd.pause()
    frozen = time.monotonic()
    await wait_until_async(lambda: not cluster.owns(topic, 0), TTL_S, "writing to stop", interval=0.02)
    etcd.resume()

    # owns() is false from the deadline on; the deadline is TTL/2 past the last accepted
    # send, which was before the freeze, and was at most one period (plus slack) before it.
    deadline = cluster._write_deadline - frozen
    assert deadline <= TTL_S * WRITE_MARGIN, f"may write until {deadline:.2f}s into the freeze: lease safe only until {TTL_S}s after the last send"
    assert deadline >= TTL_S * WRITE_MARGIN - keepalive_period(TTL_S) - 0.5, f"stopped writing {deadline:.2f}s into the freeze"
    # Same lease still alive (frozen < TTL): the next refresh lets the broker take its
    # partitions again, under a new epoch.
    await wait_until_async(lambda: cluster.owns(topic, 0) and cluster.owns(topic, 1), 10, "ownership to come back", interval=0.02)


async def test_leaders_version_changes_with_every_change_of_leaders(owner, etcd):
    """Metadata keeps encoded answers while `leaders_version()` stays the same: a second
    broker joins and takes a partition, then stops and hands it back, and at no moment
    along the way did one version stand for two different views of leaders, epochs and
    brokers."""
    cluster, topic = owner
    views: dict = {}

    def look() -> tuple:
        view = (tuple((cluster.owner_of(topic, p), cluster.leader_epoch(topic, p)) for p in (0, 1)), tuple(cluster.brokers()))
        held = views.setdefault(cluster.leaders_version(), view)
        assert held == view, f"one leaders version {cluster.leaders_version()} for {held} and {view}"
        return view[0]

    kv = EtcdKV.from_url(etcd.url, prefix=cluster.kv.prefix)
    second = EtcdCluster(BrokerNode(1, "127.0.0.1", 9093), kv, MetadataStore(kv), TTL_S)
    look()
    await second.start()
    try:
        await wait_until_async(lambda: sorted(node for node, _ in look()) == [0, 1], 10, "the second broker to lead a partition", interval=0.005)
    finally:
        await second.stop()
        await second.metadata.close()
    await wait_until_async(lambda: [node for node, _ in look()] == [0, 0], 10, "the partition to come back", interval=0.005)
    assert len(views) >= 3, f"leader changes seen: {views}"


def test_second_broker_with_a_live_id_refuses_to_start(etcd, tmp_path):
    """A second broker started with a live broker's id exits non-zero with one clear line
    (and no traceback), after waiting out the lease TTL; the first goes on serving. The
    same id started again right after a kill -9 waits for the old lease and starts."""
    prefix = f"/dupid-{uuid.uuid4().hex[:8]}"

    def broker(name: str) -> BrokerProcess:
        return BrokerProcess(
            data_dir=str(tmp_path / name),
            extra_args=["--broker-id", "7", "--metadata", etcd.url, "--metadata-prefix", prefix, "--lease-ttl-s", str(TTL_S)],
        )

    for name in ("first", "second", "third"):
        os.makedirs(tmp_path / name)
    first, second, third = broker("first").start(), broker("second"), broker("third")
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="exited with 1 before listening"):
            second.start()
        refused_after = time.monotonic() - t0
        log = second.log_text()
        assert "Traceback" not in log, log
        refusals = [ln for ln in log.splitlines() if "refusing to start" in ln]
        assert len(refusals) == 1 and "broker id 7 is in use by a live broker at " + first.bootstrap in refusals[0], log
        assert refused_after < 3 * TTL_S + 10, f"refused only after {refused_after:.1f}s"
        assert first.proc.poll() is None, "the first broker must not be disturbed"

        first.kill9()
        t1 = time.monotonic()
        third.start()  # waits (at most the old lease's TTL) instead of refusing
        restarted_after = time.monotonic() - t1
        assert third.proc.poll() is None
        assert "registered with lease" in third.log_text()
        # signal handlers are set once the broker prints its start line (the listeners'
        # own "listening on" log lines come earlier, while it is still starting)
        wait_until(lambda: "KafScale broker 7 listening on" in third.log_text(), 10, "the restarted broker to listen", interval=0.05)
        print(f"refused after {refused_after:.1f}s; restart after kill -9 listening after {restarted_after:.1f}s")
        assert third.stop() == 0
    finally:
        for b in (first, second, third):
            if b.proc is not None:
                b.stop()
