"""Online migration between the classic and the consumer group protocol (KIP-848), without
a broker: the policy, both conversions, classic members inside a consumer group (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup answered from its state), and the coordinator converting
groups both ways through its store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kafscale.errors import ErrorCode as E, KafkaError
from kafscale.groups import migration
from kafscale.groups.consumer_group import ConsumerGroup, ConsumerGroupConfig, HeartbeatRequest, MemberState
from kafscale.groups.consumer_protocol import encode_assignment, encode_subscription, parse_assignment
from kafscale.groups.migration import MigrationPolicy
from kafscale.groups.state import Group, GroupConfig, GroupState, Member as ClassicMember

T = "00000000-0000-0000-0000-00000000000a"
TOPICS = {"t": (T, 4)}
CONFIG = ConsumerGroupConfig(session_timeout_ms=45_000, heartbeat_interval_ms=5_000, max_size=10)
CLASSIC = GroupConfig(initial_rebalance_delay_ms=0)


def classic_group(assignments: dict[str, list[int]], generation: int = 3) -> Group:
    members = [
        ClassicMember(mid, None, "cli", "/h", 10_000, 20_000, "consumer",
                      [("range", encode_subscription(["t"])), ("roundrobin", encode_subscription(["t"]))],
                      encode_assignment([("t", p) for p in ps]))
        for mid, ps in assignments.items()
    ]
    return Group.restored("g", CLASSIC, 0.0, generation_id=generation, protocol_type="consumer", protocol_name="range",
                          state_timestamp=0.0, members=members, leader_id=None)


def classic_join(group: ConsumerGroup, member_id: str, owned=(), now=0.0, **kw):
    req = dict(member_id=member_id, group_instance_id=None, client_id="cli", client_host="/h", session_timeout_ms=10_000,
               rebalance_timeout_ms=20_000, protocol_type="consumer",
               protocols=[("range", encode_subscription(["t"], [("t", p) for p in owned]))], require_known_member_id=False)
    req.update(kw)
    return group.classic_join(now, topics=TOPICS, **req)


def classic_sync(group, member_id, generation, now=0.0, **kw):
    return group.classic_sync(now, member_id=member_id, group_instance_id=None, generation_id=generation,
                              protocol_type=kw.get("protocol_type", "consumer"), protocol_name=kw.get("protocol_name", "range"))


def consumer_beat(group, member_id, epoch, owned=(), now=0.0):
    req = HeartbeatRequest(member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=30_000 if epoch == 0 else -1,
                           subscribed_topic_names=("t",) if epoch == 0 else None, owned=frozenset((T, p) for p in owned))
    return group.heartbeat(now, req, TOPICS)


def code(fn, *args, **kw) -> E:
    with pytest.raises(KafkaError) as e:
        fn(*args, **kw)
    return e.value.code


def holders(group: ConsumerGroup) -> dict:
    out = {}
    for m in group.members.values():
        for tp in m.assigned | m.revoking:
            out.setdefault(tp[1], []).append(m.member_id)
    return out


def test_policy_parses_as_kafka():
    assert MigrationPolicy.parse("Bidirectional") is MigrationPolicy.BIDIRECTIONAL
    assert [MigrationPolicy.parse(n).upgrades for n in ("upgrade", "downgrade", "disabled")] == [True, False, False]
    assert [MigrationPolicy.parse(n).downgrades for n in ("upgrade", "DOWNGRADE", "disabled")] == [False, True, False]
    assert migration.DEFAULT_POLICY is MigrationPolicy.BIDIRECTIONAL
    with pytest.raises(ValueError, match="group.consumer.migration.policy"):
        MigrationPolicy.parse("sideways")


def test_upgrade_refused_by_policy_protocol_type_and_size():
    classic = classic_group({"a": [0, 1], "b": [2, 3]})
    assert migration.upgrade_refusal(MigrationPolicy.BIDIRECTIONAL, classic, 10) is None
    assert migration.upgrade_refusal(MigrationPolicy.UPGRADE, classic, 10) is None
    for policy in (MigrationPolicy.DOWNGRADE, MigrationPolicy.DISABLED):
        assert "disabled" in migration.upgrade_refusal(policy, classic, 10)
    assert "max.size" in migration.upgrade_refusal(MigrationPolicy.BIDIRECTIONAL, classic, 1)
    classic.protocol_type = "connect"
    assert "embedded protocol" in migration.upgrade_refusal(MigrationPolicy.BIDIRECTIONAL, classic, 10)


def test_classic_group_converts_with_its_assignment_and_generation():
    group = migration.to_consumer_group(classic_group({"a": [0, 1], "b": [2, 3]}, generation=5), CONFIG, TOPICS, 0.0)
    assert (group.group_epoch, group.target_epoch, group.state.value) == (5, 5, "Stable")
    a, b = group.members["a"], group.members["b"]
    assert (a.member_epoch, a.assigned, group.target["a"]) == (5, {(T, 0), (T, 1)}, {(T, 0), (T, 1)})
    assert b.assigned == {(T, 2), (T, 3)} and a.uses_classic and b.classic.session_timeout_ms == 10_000
    assert [n for n, _ in a.classic.protocols] == ["range", "roundrobin"] and a.subscribed_topic_names == ("t",)
    # A malformed assignment refuses the conversion (the classic group stays), as Kafka.
    bad = classic_group({"a": [0]})
    bad.members["a"].assignment = b"\x00\x00\x00"
    assert code(migration.to_consumer_group, bad, CONFIG, TOPICS, 0.0) is E.group_id_not_found
    # The document keeps the classic members' metadata.
    again = ConsumerGroup.from_doc("g", group.to_doc(), CONFIG, 0.0)
    assert again.members["a"].classic == a.classic and again.members["a"].session_deadline == 10_000


def test_rolling_upgrade_never_gives_a_partition_to_two_members():
    """A consumer-protocol member joining gets only partitions the classic members gave up
    by rejoining (their heartbeats say REBALANCE_IN_PROGRESS), one member at a time."""
    group = migration.to_consumer_group(classic_group({"a": [0, 1], "b": [2, 3]}), CONFIG, TOPICS, 0.0)
    r = consumer_beat(group, "c", 0)
    assert r.assignment == frozenset() and group.members["c"].state is MemberState.UNRELEASED_PARTITIONS
    assert all(len(v) == 1 for v in holders(group).values())
    # The classic members are told to rejoin; generation still theirs.
    assert group.classic_heartbeat(1.0, member_id="a", group_instance_id=None, generation_id=3) is E.rebalance_in_progress
    assert group.members["a"].join_deadline == 1.0 + 20_000
    # a rejoins having revoked everything (eager): it keeps its target share at the new epoch.
    j = classic_join(group, "a")
    assert (j.error, j.generation_id, j.protocol_name, j.leader) == (E.none, group.group_epoch, "range", "")
    s = classic_sync(group, "a", j.generation_id)
    kept = {p for _t, p in parse_assignment(s.assignment)}
    assert s.error is E.none and kept <= {0, 1} and group.members["a"].join_deadline is None
    assert all(len(v) == 1 for v in holders(group).values())
    r = consumer_beat(group, "c", r.member_epoch, owned=())
    got = {p for _t, p in r.assignment or ()}
    assert not got & kept and all(len(v) == 1 for v in holders(group).values())
    # b too; then c holds its whole target, and everyone is Stable.
    assert group.classic_heartbeat(1.0, member_id="b", group_instance_id=None, generation_id=3) is E.rebalance_in_progress
    j = classic_join(group, "b")
    s = classic_sync(group, "b", j.generation_id)
    assert not {p for _t, p in parse_assignment(s.assignment)} & (kept | got)
    r = consumer_beat(group, "c", r.member_epoch, owned=got)
    got = {p for _t, p in r.assignment}
    assert len(got) == 1 and group.state.value == "Stable", {m.member_id: (m.state, m.assigned) for m in group.members.values()}
    assert sorted(holders(group)) == [0, 1, 2, 3] and all(len(v) == 1 for v in holders(group).values())
    assert group.classic_heartbeat(2.0, member_id="b", group_instance_id=None, generation_id=j.generation_id) is E.none


def test_classic_member_errors_as_kafka():
    group = migration.to_consumer_group(classic_group({"a": [0, 1, 2, 3]}), CONFIG, TOPICS, 0.0)
    consumer_beat(group, "c", 0)
    assert code(classic_sync, group, "a", 2) is E.illegal_generation
    assert code(group.classic_heartbeat, 0.0, member_id="a", group_instance_id=None, generation_id=9) is E.illegal_generation
    assert code(classic_sync, group, "a", 3, protocol_name="roundrobin") is E.inconsistent_group_protocol
    assert code(classic_sync, group, "a", 3, protocol_type="connect") is E.inconsistent_group_protocol
    assert code(classic_sync, group, "a", 3) is E.rebalance_in_progress  # the group epoch moved past it
    assert code(classic_sync, group, "ghost", 3) is E.unknown_member_id
    assert code(classic_sync, group, "c", group.members["c"].member_epoch) is E.unknown_member_id  # not classic
    assert code(classic_join, group, "x", protocol_type="connect") is E.inconsistent_group_protocol
    assert code(classic_join, group, "x", protocols=[("sticky", encode_subscription(["t"]))]) is E.inconsistent_group_protocol
    r = classic_join(group, "", require_known_member_id=True)
    assert r.error is E.member_id_required and r.member_id and r.member_id not in group.members
    assert code(classic_join, group, "s", group_instance_id="i1") is E.unknown_member_id  # a known id for an unknown instance
    full = migration.to_consumer_group(classic_group({"a": [0]}), ConsumerGroupConfig(max_size=1), TOPICS, 0.0)
    assert code(classic_join, full, "x") is E.group_max_size_reached


def test_offset_commits_of_classic_members():
    group = migration.to_consumer_group(classic_group({"a": [0, 1, 2, 3]}), CONFIG, TOPICS, 0.0)
    consumer_beat(group, "c", 0)
    group.validate_offset_commit("a", 3, api_version=8)  # any version, its generation
    assert code(group.validate_offset_commit, "a", 2, 8) is E.illegal_generation
    assert code(group.validate_offset_fetch, "a", 2) is E.illegal_generation
    assert code(group.validate_offset_commit, "c", group.members["c"].member_epoch, 8) is E.unsupported_version
    assert code(group.validate_offset_commit, "c", 99, 9) is E.stale_member_epoch


def test_classic_leave_and_timeouts():
    group = migration.to_consumer_group(classic_group({"a": [0, 1], "b": [2, 3]}), CONFIG, TOPICS, 0.0)
    consumer_beat(group, "c", 0)
    epoch = group.group_epoch
    assert group.classic_leave([("a", None), ("ghost", None), ("c", None)]) == [E.none, E.unknown_member_id, E.unknown_member_id]
    assert group.group_epoch == epoch + 1 and "a" not in group.members
    # b told to rejoin and silent: removed after its rebalance timeout, not its session.
    group.classic_heartbeat(0.0, member_id="b", group_instance_id=None, generation_id=3)
    group.classic_heartbeat(15_000.0, member_id="b", group_instance_id=None, generation_id=3)  # (its session: 25 s)
    assert group.expired(19_999.0) == []
    assert group.expired(20_000.0) == [("b", "the classic member did not rejoin within the rebalance timeout")]


def test_downgrade_when_the_last_consumer_member_leaves():
    group = migration.to_consumer_group(classic_group({"a": [0, 1], "b": [2, 3]}), CONFIG, TOPICS, 0.0)
    r = consumer_beat(group, "c", 0)
    assert not migration.downgrade_allowed(MigrationPolicy.BIDIRECTIONAL, group, "a")  # a classic member
    assert not migration.downgrade_allowed(MigrationPolicy.UPGRADE, group, "c")
    assert migration.downgrade_allowed(MigrationPolicy.DOWNGRADE, group, "c")
    lone = ConsumerGroup("g", CONFIG)
    consumer_beat(lone, "c", 0)
    assert not migration.downgrade_allowed(MigrationPolicy.BIDIRECTIONAL, lone, "c")  # nobody would remain
    targets = {mid: {p for _t, p in group.target[mid]} for mid in ("a", "b")}
    classic = migration.to_classic_group(group, "c", CLASSIC, 5.0)
    assert (classic.state, classic.generation_id, classic.protocol_name) == (GroupState.PREPARING_REBALANCE, r.member_epoch, "range")
    assert sorted(classic.members) == ["a", "b"] and classic.protocol_type == "consumer"
    assert {mid: {p for _t, p in parse_assignment(m.assignment)} for mid, m in classic.members.items()} == targets
    # Its members rejoin: their heartbeats at the group epoch say REBALANCE_IN_PROGRESS.
    out = classic.heartbeat(6.0, member_id="a", group_instance_id=None, generation_id=r.member_epoch)
    assert out.result is E.rebalance_in_progress and classic.join_timer.deadline == 5.0 + 20_000


@pytest.fixture
def store(tmp_path):
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import MetadataStore

    return MetadataStore(SqliteKV(tmp_path / "meta.db"))


async def lookup(names):
    return {n: TOPICS[n] for n in names if n in TOPICS}


async def list_names():
    return list(TOPICS)


def coordinator(store, policy="bidirectional", written=None):
    """A coordinator; `written` (a list) collects the (key version, value is a tombstone)
    of what it appends to __consumer_offsets."""
    import struct

    from kafscale.groups.coordinator import GroupCoordinator

    async def append(_topic, _partition, recs):
        written.extend((struct.unpack_from(">h", k)[0], v is None) for k, v in recs)

    cfg = SimpleNamespace(group_initial_rebalance_delay_ms=0, offsets_retention_minutes=60,
                          group_consumer_migration_policy=policy)
    return GroupCoordinator(store, cfg, append_records=append if written is not None else None)


async def classic_members(coord, n: int) -> list[tuple[str, int]]:
    """n classic members joined and synced, through the coordinator: [(member id, generation)]."""
    import asyncio

    kw = dict(group_instance_id=None, client_id="cli", client_host="/h", session_timeout_ms=10_000,
              rebalance_timeout_ms=20_000, protocol_type="consumer", protocols=[("range", encode_subscription(["t"]))],
              require_known_member_id=False, lookup=lookup, list_names=list_names)
    joins = await asyncio.gather(*[coord.join("g", member_id="", **kw) for _ in range(n)])
    leader = next(j for j in joins if j.leader == j.member_id)
    plan = {j.member_id: encode_assignment([("t", p) for p in range(4) if p % n == i]) for i, j in enumerate(joins)}
    syncs = await asyncio.gather(*[coord.sync("g", member_id=j.member_id, group_instance_id=None, generation_id=j.generation_id,
                                              protocol_type="consumer", protocol_name="range",
                                              assignments=plan if j is leader else {}) for j in joins])
    assert all(s.error is E.none for s in syncs)
    return [(j.member_id, j.generation_id) for j in joins]


async def test_coordinator_converts_both_ways(store):
    from kafscale.groups.consumer_group import is_consumer_group_doc

    written = []
    coord = coordinator(store, written=written)
    await coord.start()
    try:
        members = await classic_members(coord, 2)
        del written[:]
        join = HeartbeatRequest(member_id="c", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                                owned=frozenset())
        r = await coord.consumer.heartbeat("g", join, lookup, list_names)
        assert r.error is E.none and r.assignment == frozenset()  # everything still held by the classic members
        assert is_consumer_group_doc(await store.get_group("g")) and "g" not in coord.groups
        # __consumer_offsets: the classic group's tombstone, then the consumer group's records
        # (3 members' metadata, subscription metadata, epoch, 3 targets, target epoch, 3 current).
        assert written == [(2, True)] + [(5, False)] * 3 + [(4, False), (3, False)] + [(7, False)] * 3 + [
            (6, False)] + [(8, False)] * 3
        del written[:]
        # A classic member keeps working inside the consumer group.
        (a, gen), (b, _) = members
        assert await coord.heartbeat("g", member_id=a, group_instance_id=None, generation_id=gen) is E.rebalance_in_progress
        j = await coord.join("g", member_id=a, group_instance_id=None, client_id="cli", client_host="/h",
                             session_timeout_ms=10_000, rebalance_timeout_ms=20_000, protocol_type="consumer",
                             protocols=[("range", encode_subscription(["t"]))], require_known_member_id=True,
                             lookup=lookup, list_names=list_names)
        assert j.error is E.none and j.generation_id == r.member_epoch
        s = await coord.sync("g", member_id=a, group_instance_id=None, generation_id=j.generation_id,
                             protocol_type="consumer", protocol_name="range", assignments={})
        assert s.error is E.none
        # The consumer member leaves: the group is classic again, rebalancing.
        left = await coord.consumer.heartbeat("g", HeartbeatRequest(member_id="c", member_epoch=-1), lookup, list_names)
        assert left.member_epoch == -1 and "g" not in coord.consumer.groups
        tombstones = [(8, True)] * 3 + [(7, True)] * 3 + [(6, True)] + [(5, True)] * 3 + [(4, True), (3, True)]
        assert written[-len(tombstones) - 1:] == tombstones + [(2, False)]  # then the classic group's record
        assert coord.groups["g"].state is GroupState.PREPARING_REBALANCE
        doc = await store.get_group("g")
        assert not is_consumer_group_doc(doc) and sorted(m["member_id"] for m in doc["members"]) == sorted([a, b])
        assert await coord.heartbeat("g", member_id=b, group_instance_id=None,
                                     generation_id=doc["generation"]) is E.rebalance_in_progress
    finally:
        await coord.stop()


async def test_coordinator_policy_refuses_upgrade_and_keeps_a_mixed_group(store):
    coord = coordinator(store, policy="downgrade")
    await coord.start()
    try:
        await classic_members(coord, 1)
        join = HeartbeatRequest(member_id="c", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                                owned=frozenset())
        with pytest.raises(KafkaError) as e:
            await coord.consumer.heartbeat("g", join, lookup, list_names)
        assert e.value.code is E.group_id_not_found and coord.groups["g"].state is GroupState.STABLE
    finally:
        await coord.stop()
    coord = coordinator(store, policy="upgrade")  # upgrades, never back
    await coord.start()
    try:
        await coord.consumer.heartbeat("g", join, lookup, list_names)
        await coord.consumer.heartbeat("g", HeartbeatRequest(member_id="c", member_epoch=-1), lookup, list_names)
        group = coord.consumer.groups["g"]
        assert [m.uses_classic for m in group.members.values()] == [True]
    finally:
        await coord.stop()


async def test_coordinator_downgrades_when_the_last_consumer_member_times_out(store):
    coord = coordinator(store)
    await coord.start()
    try:
        await classic_members(coord, 1)
        join = HeartbeatRequest(member_id="c", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                                owned=frozenset())
        await coord.consumer.heartbeat("g", join, lookup, list_names)
        group = coord.consumer.groups["g"]
        group.members["c"].session_deadline = 0.0  # its session ran out
        async with coord._locks["g"]:
            assert await coord.consumer._expire(group, coord.clock()) == ["c"]
        assert "g" not in coord.consumer.groups and coord.groups["g"].state is GroupState.PREPARING_REBALANCE
        assert sorted(coord.groups["g"].members) == sorted(m.member_id for m in group.members.values() if m.uses_classic)
    finally:
        await coord.stop()


async def test_classic_static_member_replacing_the_last_consumer_member_downgrades(store):
    """A static member that left the consumer protocol (epoch -2) and comes back classic
    takes its place and partitions, and the group is classic at once, without a rebalance."""
    coord = coordinator(store)
    await coord.start()
    try:
        [(a, _gen)] = await classic_members(coord, 1)
        join = HeartbeatRequest(member_id="c", member_epoch=0, instance_id="ic", rebalance_timeout_ms=30_000,
                                subscribed_topic_names=("t",), owned=frozenset())
        r = await coord.consumer.heartbeat("g", join, lookup, list_names)
        group = coord.consumer.groups["g"]
        # a rejoins (giving up what c takes), c gets its share, then c leaves as a static member.
        j = await coord.join("g", member_id=a, group_instance_id=None, client_id="cli", client_host="/h",
                             session_timeout_ms=10_000, rebalance_timeout_ms=20_000, protocol_type="consumer",
                             protocols=[("range", encode_subscription(["t"]))], require_known_member_id=False,
                             lookup=lookup, list_names=list_names)
        r = await coord.consumer.heartbeat("g", HeartbeatRequest(member_id="c", member_epoch=r.member_epoch, owned=frozenset()),
                                           lookup, list_names)
        held = {p for _t, p in group.members["c"].assigned}
        assert held and j.error is E.none
        await coord.consumer.heartbeat("g", HeartbeatRequest(member_id="c", member_epoch=-2, instance_id="ic"), lookup, list_names)
        assert "g" in coord.consumer.groups  # a static member gone for now: still a consumer group
        back = await coord.join("g", member_id="", group_instance_id="ic", client_id="cli", client_host="/h",
                                session_timeout_ms=10_000, rebalance_timeout_ms=20_000, protocol_type="consumer",
                                protocols=[("range", encode_subscription(["t"]))], require_known_member_id=False,
                                lookup=lookup, list_names=list_names)
        assert back.error is E.none and "g" not in coord.consumer.groups
        classic = coord.groups["g"]
        assert classic.state is GroupState.STABLE and classic.generation_id == back.generation_id
        assert sorted(classic.members) == sorted([a, back.member_id]) and classic.static_members == {"ic": back.member_id}
        s = await coord.sync("g", member_id=back.member_id, group_instance_id="ic", generation_id=back.generation_id,
                             protocol_type="consumer", protocol_name="range", assignments={})
        assert s.error is E.none and {p for _t, p in parse_assignment(s.assignment)} == held
    finally:
        await coord.stop()


async def test_a_mixed_group_survives_a_coordinator_move(store):
    """Another coordinator loading the group from the store (a failover) keeps its classic
    members: their metadata, epochs and assignments, and they keep heartbeating and syncing."""
    coord = coordinator(store)
    await coord.start()
    try:
        [(a, _gen)] = await classic_members(coord, 1)
        join = HeartbeatRequest(member_id="c", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                                owned=frozenset())
        await coord.consumer.heartbeat("g", join, lookup, list_names)
        j = await coord.join("g", member_id=a, group_instance_id=None, client_id="cli", client_host="/h",
                             session_timeout_ms=10_000, rebalance_timeout_ms=20_000, protocol_type="consumer",
                             protocols=[("range", encode_subscription(["t"]))], require_known_member_id=False,
                             lookup=lookup, list_names=list_names)
        before = coord.consumer.groups["g"].members[a]
    finally:
        await coord.stop()
    other = coordinator(store)
    await other.start()
    try:
        assert await other.heartbeat("g", member_id=a, group_instance_id=None, generation_id=j.generation_id) is E.none
        group = other.consumer.groups["g"]
        after = group.members[a]
        assert (after.classic, after.member_epoch, after.assigned) == (before.classic, before.member_epoch, before.assigned)
        s = await other.sync("g", member_id=a, group_instance_id=None, generation_id=j.generation_id,
                             protocol_type="consumer", protocol_name="range", assignments={})
        assert s.error is E.none and {("t", p) for _t, p in before.assigned} == set(parse_assignment(s.assignment))
    finally:
        await other.stop()


async def test_an_empty_consumer_group_gives_way_to_a_classic_group(store):
    """Whatever the policy: a classic member joining an empty consumer group makes it a
    classic group (its consumer group records tombstoned), and the offsets stay."""
    from kafscale.groups.consumer_group import is_consumer_group_doc
    from kafscale.metadata.store import CommittedOffset

    written = []
    coord = coordinator(store, policy="disabled", written=written)
    await coord.start()
    try:
        join = HeartbeatRequest(member_id="c", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                                owned=frozenset())
        await coord.consumer.heartbeat("g", join, lookup, list_names)
        await coord.commit_offsets("g", member_id="c", group_instance_id=None, generation_id=1,
                                   offsets={("t", 0): CommittedOffset(7)}, api_version=9)
        await coord.consumer.heartbeat("g", HeartbeatRequest(member_id="c", member_epoch=-1), lookup, list_names)
        del written[:]
        [(member, _gen)] = await classic_members(coord, 1)
        assert "g" not in coord.consumer.groups and coord.groups["g"].state is GroupState.STABLE
        assert not is_consumer_group_doc(await store.get_group("g"))
        assert (await store.fetch_offsets("g"))[("t", 0)].offset == 7
        # Tombstones of the consumer group's records (no member left: target epoch, subscription
        # metadata, group epoch), then the classic group's GroupMetadata records.
        assert written[:3] == [(6, True), (4, True), (3, True)] and set(written[3:]) == {(2, False)}
    finally:
        await coord.stop()
