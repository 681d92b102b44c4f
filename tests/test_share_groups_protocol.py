"""Share groups (KIP-932) against a real broker over raw frames: ShareGroupHeartbeat and
ShareGroupDescribe with Apache Kafka's codes, ListGroups' types filter, the features and
API versions a share consumer looks for."""

from __future__ import annotations

import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

HEARTBEAT, DESCRIBE, LIST_GROUPS = 76, 77, 16


@pytest.fixture(scope="module")
def sbroker():
    # (a heartbeat interval below Kafka's least, 5 s, needs the least lowered too, as in Kafka)
    # (and a least record lock duration of 1 s, for a group of the renewal test to lock for 4 s)
    b = BrokerProcess(extra_args=["--group-share-heartbeat-interval-ms", "300", "--group-share-min-heartbeat-interval-ms", "300",
                                  "--group-share-max-size", "3", "--group-share-min-record-lock-duration-ms", "1000"]).start()
    yield b
    b.stop()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        fut.result(15)


def heartbeat(c: RawClient, group: str, member_id: str, epoch: int, topics=None):
    return c.request(HEARTBEAT, 1, req(HEARTBEAT, 1, group_id=group, member_id=member_id, member_epoch=epoch,
                                       subscribed_topic_names=topics))


def describe(c: RawClient, *groups: str):
    return c.request(DESCRIBE, 1, req(DESCRIBE, 1, group_ids=groups, include_authorized_operations=True)).groups


def assigned(resp) -> set[tuple[uuid.UUID, int]]:
    return {(t.topic_id, p) for t in resp.assignment.topic_partitions for p in t.partitions}


def test_heartbeat_describe_and_list(sbroker):
    bootstrap = sbroker.bootstrap
    topic, group = f"share-raw-{uuid.uuid4().hex[:8]}", f"sg-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 2)
    m1, m2, m3 = (str(uuid.uuid4()) for _ in range(3))
    with RawClient(bootstrap) as c:
        r = heartbeat(c, group, m1, 0, (topic,))
        assert (error_code(r.error_code), r.member_id, r.member_epoch) == (0, m1, 1)
        assert r.heartbeat_interval.total_seconds() == 0.3
        [(topic_id, _)] = {(t, 0) for t, _ in assigned(r)}
        assert assigned(r) == {(topic_id, 0), (topic_id, 1)}
        r2 = heartbeat(c, group, m2, 0, (topic,))
        r3 = heartbeat(c, group, m3, 0, (topic,))
        assert (r2.member_epoch, r3.member_epoch) == (2, 3)
        # three members on two partitions: each gets one, every partition is read
        assert len(assigned(r2)) == len(assigned(r3)) == 1
        r1 = heartbeat(c, group, m1, 1)
        assert r1.member_epoch == 3 and len(assigned(r1)) == 1
        assert assigned(r1) | assigned(r2) | assigned(r3) == {(topic_id, 0), (topic_id, 1)}
        # Kafka's refusals
        assert error_code(heartbeat(c, group, str(uuid.uuid4()), 0, (topic,)).error_code) == ErrorCode.group_max_size_reached.value
        assert error_code(heartbeat(c, group, m1, 9).error_code) == ErrorCode.fenced_member_epoch.value
        assert error_code(heartbeat(c, group, "stranger", 3).error_code) == ErrorCode.unknown_member_id.value
        assert error_code(heartbeat(c, group, "", 0, (topic,)).error_code) == ErrorCode.invalid_request.value
        assert (error_code(heartbeat(c, group, m1, 3).error_code), heartbeat(c, group, m1, 3).assignment) == (0, None)
        assert error_code(heartbeat(c, f"none-{group}", m1, 1).error_code) == ErrorCode.group_id_not_found.value

        [g, missing] = describe(c, group, f"none-{group}")
        assert (error_code(g.error_code), g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name) == (0, "Stable", 3, 3, "simple")
        assert {m.member_id for m in g.members} == {m1, m2, m3}
        assert {p for m in g.members for t in m.assignment.topic_partitions for p in t.partitions} == {0, 1}
        assert all(t.topic_name == topic for m in g.members for t in m.assignment.topic_partitions)
        assert error_code(missing.error_code) == ErrorCode.group_id_not_found.value

        listed = c.request(LIST_GROUPS, 5, req(LIST_GROUPS, 5, states_filter=(), types_filter=("share",))).groups
        assert [(x.group_id, x.group_type, x.group_state) for x in listed if x.group_id == group] == [(group, "share", "Stable")]
        others = c.request(LIST_GROUPS, 5, req(LIST_GROUPS, 5, states_filter=(), types_filter=("classic", "consumer"))).groups
        assert group not in {x.group_id for x in others}

        # a share group is no classic group, and a classic group's id is no share group
        r = c.request(11, 9, req(11, 9, group_id=group, session_timeout=10_000, rebalance_timeout=10_000, member_id="",
                                 protocol_type="consumer",
                                 protocols=(req(11, 9, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
        assert error_code(r.error_code) == ErrorCode.inconsistent_group_protocol.value

        for m in (m1, m2, m3):
            assert heartbeat(c, group, m, -1).member_epoch == -1
        [g] = describe(c, group)
        assert (g.group_state, g.members) == ("Empty", ())
        assert error_code(c.request(42, 2, req(42, 2, groups_names=(group,))).results[0].error_code) == 0
        [g] = describe(c, group)
        assert error_code(g.error_code) == ErrorCode.group_id_not_found.value


def test_api_versions_and_features(sbroker):
    with RawClient(sbroker.bootstrap) as c:
        r = c.request(18, 4, req(18, 4, client_software_name="t", client_software_version="1"))
        keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
        assert keys[HEARTBEAT] == (1, 1) and keys[DESCRIBE] == (1, 1)
        assert keys[78] == (1, 2) and keys[79] == (1, 2)  # ShareFetch, ShareAcknowledge (v2: Kafka 4.2)
        # the share-state APIs between brokers: not needed, the metadata store holds that state
        assert not {83, 84, 85, 86, 87} & set(keys)
        assert {f.name: f.max_version_level for f in r.finalized_features}["share.version"] == 1


FETCH, ACK = 78, 79


def share_fetch(c: RawClient, group: str, member: str, epoch: int, topic_id, acks=(), max_records: int = 100, wait: int = 500,
                version: int = 1, **v2):
    """A ShareFetch of partition 0; `v2`: ShareFetch v2's fields (share_acquire_mode, is_renew_ack, ...)."""
    batches = tuple(req(FETCH, version, "AcknowledgementBatch", first_offset=a, last_offset=b, acknowledge_types=(t,))
                    for a, b, t in acks)
    topics = (req(FETCH, version, "FetchTopic", topic_id=topic_id, partitions=(
        req(FETCH, version, "FetchPartition", partition_index=0, acknowledgement_batches=batches),)),)
    fields = dict(max_wait=wait, min_bytes=1, max_bytes=1 << 20, max_records=max_records, batch_size=max_records) | v2
    return c.request(FETCH, version, req(FETCH, version, group_id=group, member_id=member, share_session_epoch=epoch,
                                         topics=topics, forgotten_topics_data=(), **fields))


def share_ack(c: RawClient, group: str, member: str, epoch: int, topic_id, acks, version: int = 1, **v2):
    batches = tuple(req(ACK, version, "AcknowledgementBatch", first_offset=a, last_offset=b, acknowledge_types=(t,))
                    for a, b, t in acks)
    topics = (req(ACK, version, "AcknowledgeTopic", topic_id=topic_id, partitions=(
        req(ACK, version, "AcknowledgePartition", partition_index=0, acknowledgement_batches=batches),)),)
    return c.request(ACK, version, req(ACK, version, group_id=group, member_id=member, share_session_epoch=epoch,
                                       topics=topics, **v2))


def acquired(resp) -> list[tuple[int, int, int]]:
    return [(a.first_offset, a.last_offset, a.delivery_count) for t in resp.responses for p in t.partitions
            for a in p.acquired_records]


def test_share_fetch_sessions_and_acknowledgements_raw(sbroker):
    from confluent_kafka import Producer

    bootstrap = sbroker.bootstrap
    topic, group = f"share-fetch-{uuid.uuid4().hex[:8]}", f"sf-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    member = str(uuid.uuid4())
    with RawClient(bootstrap) as c:
        r = heartbeat(c, group, member, 0, (topic,))
        [(topic_id, _)] = assigned(r)
        # the share partition starts at the log end: open the session first, then produce
        r = share_fetch(c, group, member, 0, topic_id, wait=10)
        assert error_code(r.error_code) == 0 and r.acquisition_lock_timeout.total_seconds() == 30
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(5):
            p.produce(topic, value=b"v%d" % i)
        assert p.flush(10) == 0
        r = share_fetch(c, group, member, 1, topic_id, wait=5_000)
        [part] = r.responses[0].partitions
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(0, 4, 1)]
        assert len(part.records) > 0
        # piggybacked acknowledgements without fetching: an answer with no records
        r = share_fetch(c, group, member, 2, topic_id, acks=[(0, 1, 1), (2, 2, 2)], max_records=0)
        [part] = r.responses[0].partitions
        assert (error_code(part.acknowledge_error_code), part.acquired_records, bytes(part.records or b"")) == (0, (), b"")
        # released offset 2 comes back with its second delivery
        r = share_fetch(c, group, member, 3, topic_id)
        [part] = r.responses[0].partitions
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(2, 2, 2)]
        # acknowledging what the member does not hold: INVALID_RECORD_STATE, nothing changes
        r = share_ack(c, group, member, 4, topic_id, [(0, 0, 1)])
        assert error_code(r.responses[0].partitions[0].error_code) == ErrorCode.invalid_record_state.value
        r = share_ack(c, group, member, 5, topic_id, [(2, 4, 1)])
        assert error_code(r.error_code) == 0 and error_code(r.responses[0].partitions[0].error_code) == 0
        # Kafka's session errors
        assert error_code(share_fetch(c, group, member, 9, topic_id).error_code) == ErrorCode.invalid_share_session_epoch.value
        assert error_code(share_fetch(c, group, "stranger", 1, topic_id).error_code) == ErrorCode.share_session_not_found.value
        assert error_code(share_ack(c, group, member, 0, topic_id, []).error_code) == ErrorCode.invalid_share_session_epoch.value
        assert error_code(share_ack(c, group, member, -1, topic_id, []).error_code) == 0  # closes it
        assert error_code(share_ack(c, group, member, 7, topic_id, []).error_code) == ErrorCode.share_session_not_found.value
        # every record is done: a new session finds nothing
        r = share_fetch(c, group, member, 0, topic_id, wait=300)
        assert all(not p.acquired_records for t in r.responses for p in t.partitions)


def test_a_closed_connection_ends_its_share_session_and_releases_its_records(sbroker):
    from confluent_kafka import Producer

    bootstrap = sbroker.bootstrap
    topic, group = f"share-conn-{uuid.uuid4().hex[:8]}", f"sc-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with RawClient(bootstrap) as c:
        [(topic_id, _)] = assigned(heartbeat(c, group, a, 0, (topic,)))
        share_fetch(c, group, a, 0, topic_id, wait=10)
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(3):
            p.produce(topic, value=b"v%d" % i)
        assert p.flush(10) == 0
        [part] = share_fetch(c, group, a, 1, topic_id, wait=5_000).responses[0].partitions
        assert [(x.first_offset, x.last_offset, x.delivery_count) for x in part.acquired_records] == [(0, 2, 1)]
    # a's connection is gone (a crashed consumer): its records come back long before their 30 s locks
    with RawClient(bootstrap) as c:
        heartbeat(c, group, b, 0, (topic,))
        got = []
        wait_until(lambda: got.extend(x for t in share_fetch(c, group, b, 0, topic_id,
                                                                wait=1_000).responses
                                      for part in t.partitions for x in part.acquired_records) or got, 10,
                   "the records of the closed connection")
        assert [(x.first_offset, x.last_offset, x.delivery_count) for x in got] == [(0, 2, 2)]


RENEW = 4


def test_share_fetch_v2_renews_locks_and_limits_records(sbroker):
    """Kafka 4.2: RENEW keeps records locked past their lock duration (KIP-1222), with
    Kafka's checks, and the record-limit acquire mode splits a stored batch (KIP-1206)."""
    from kafscale.protocol import records as batches

    bootstrap = sbroker.bootstrap
    topic, group = f"share-v2-{uuid.uuid4().hex[:8]}", f"s2-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    lock_s = 4
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group, incremental_configs=[
            ConfigEntry("share.record.lock.duration.ms", str(lock_s * 1000), incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])]).values():
        fut.result(15)
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with RawClient(bootstrap) as c, RawClient(bootstrap) as other:
        # one stored batch of 10 records (offsets 0-9)
        now_ms = int(time.time() * 1000)
        r = c.produce(topic, 0, batches.build_batch([(None, b"v%d" % i) for i in range(10)], timestamp=now_ms))
        assert error_code(r.error_code) == 0
        [(topic_id, _)] = assigned(heartbeat(c, group, a, 0, (topic,)))
        heartbeat(other, group, b, 0, (topic,))
        # record-limit mode: 3 of the batch's 10, the other member the next 3; the whole batch is sent
        r = share_fetch(c, group, a, 0, topic_id, max_records=3, wait=5_000, version=2, share_acquire_mode=1)
        assert acquired(r) == [(0, 2, 1)] and r.acquisition_lock_timeout.total_seconds() == lock_s
        acquired_at = time.monotonic()
        r = share_fetch(other, group, b, 0, topic_id, max_records=3, wait=5_000, version=2, share_acquire_mode=1)
        assert acquired(r) == [(3, 5, 1)]
        # batch-optimized (v1's only mode): the rest of the batch, past MaxRecords
        assert acquired(share_fetch(other, group, b, 1, topic_id, max_records=1, version=2)) == [(6, 9, 1)]

        # RENEW needs IsRenewAck and v2; a renewing ShareFetch must not fetch
        r = share_ack(c, group, a, 1, topic_id, [(0, 2, RENEW)], version=2)
        assert error_code(r.responses[0].partitions[0].error_code) == ErrorCode.invalid_request.value
        r = share_ack(c, group, a, 2, topic_id, [(0, 2, RENEW)], version=1)
        assert error_code(r.responses[0].partitions[0].error_code) == ErrorCode.invalid_request.value
        r = share_fetch(c, group, a, 3, topic_id, acks=[(0, 2, RENEW)], version=2, is_renew_ack=True)
        assert error_code(r.error_code) == ErrorCode.invalid_request.value
        # renewals more often than the lock duration keep a's records past it
        epoch = 3
        while time.monotonic() - acquired_at < lock_s * 1.5:
            if epoch % 2:
                r = share_ack(c, group, a, epoch, topic_id, [(0, 2, RENEW)], version=2, is_renew_ack=True)
                [part] = r.responses[0].partitions
                assert (error_code(r.error_code), error_code(part.error_code)) == (0, 0)
                assert r.acquisition_lock_timeout.total_seconds() == lock_s
            else:
                r = share_fetch(c, group, a, epoch, topic_id, acks=[(0, 2, RENEW)], max_records=0, wait=0, version=2,
                                is_renew_ack=True, min_bytes=0, max_bytes=0)
                [part] = r.responses[0].partitions
                assert (error_code(r.error_code), error_code(part.acknowledge_error_code), part.acquired_records) == (0, 0, ())
            epoch += 1
            time.sleep(0.5)
        # b's records, not renewed, timed out and come back to b; a's are still a's to accept
        got: list = []
        wait_until(lambda: got.extend(acquired(share_fetch(other, group, b, 0, topic_id, wait=1_000, version=2))) or got,
                   10, "b's timed-out records")
        assert got == [(3, 9, 2)]
        r = share_ack(c, group, a, epoch, topic_id, [(0, 2, 1)], version=2)
        assert error_code(r.responses[0].partitions[0].error_code) == 0
