"""The consumer-protocol group state machine (KIP-848) and its assignors, without a broker."""

from __future__ import annotations

import pytest

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import MemberSpec, range_, uniform, use_racks
from kafscale.groups.consumer_group import (
    ConsumerGroup,
    ConsumerGroupConfig,
    GroupState,
    HeartbeatRequest,
    MemberState,
    validate_request,
)

T = "00000000-0000-0000-0000-00000000000a"
TOPICS = {"t": (T, 6)}
CONFIG = ConsumerGroupConfig(session_timeout_ms=45_000, heartbeat_interval_ms=5_000, max_size=3)


def join(group, member_id, now=0.0, **kw):
    req = HeartbeatRequest(member_id=member_id, member_epoch=0, rebalance_timeout_ms=kw.pop("rebalance_timeout_ms", 30_000),
                           subscribed_topic_names=kw.pop("topics", ("t",)), owned=frozenset(), **kw)
    validate_request(req, group.config)
    return group.heartbeat(now, req, TOPICS)


def beat(group, member_id, epoch, owned, now=0.0, **kw):
    req = HeartbeatRequest(member_id=member_id, member_epoch=epoch, owned=frozenset(owned), **kw)
    validate_request(req, group.config)
    return group.heartbeat(now, req, TOPICS)


def code(fn, *args, **kw) -> ErrorCode:
    with pytest.raises(KafkaError) as e:
        fn(*args, **kw)
    return e.value.code


def holders(group):
    """partition -> members holding it (assigned or still revoking)."""
    out = {}
    for m in group.members.values():
        for tp in m.assigned | m.revoking:
            out.setdefault(tp, []).append(m.member_id)
    return out


def test_uniform_balances_and_keeps_partitions():
    a = uniform({"a": MemberSpec(frozenset({T}), frozenset())}, {T: 6})
    assert a["a"] == {(T, p) for p in range(6)}
    b = uniform({"a": MemberSpec(frozenset({T}), a["a"]), "b": MemberSpec(frozenset({T}), frozenset())}, {T: 6})
    assert len(b["a"]) == len(b["b"]) == 3 and b["a"] <= a["a"]
    c = uniform({m: MemberSpec(frozenset({T}), b.get(m, frozenset())) for m in "abc"}, {T: 6})
    assert sorted(len(v) for v in c.values()) == [2, 2, 2]
    assert c["a"] <= b["a"] and c["b"] <= b["b"]  # only the third member's share moved
    assert set().union(*c.values()) == {(T, p) for p in range(6)}


def test_uniform_heterogeneous_subscriptions():
    U = "00000000-0000-0000-0000-00000000000b"
    out = uniform({"a": MemberSpec(frozenset({T}), frozenset()), "b": MemberSpec(frozenset({T, U}), frozenset())}, {T: 4, U: 2})
    assert all(tp[0] == T for tp in out["a"]) and {tp for tp in out["b"] if tp[0] == U} == {(U, 0), (U, 1)}
    assert len(out["a"]) == len(out["b"]) == 3


def test_range_gives_contiguous_ranges():
    out = range_({m: MemberSpec(frozenset({T}), frozenset()) for m in "ab"}, {T: 5})
    assert out["a"] == {(T, 0), (T, 1), (T, 2)} and out["b"] == {(T, 3), (T, 4)}


# Partitions 0, 2, 4 on rack x and 1, 3, 5 on rack y (their owner brokers' racks)
RACKS = {(T, p): frozenset({"x" if p % 2 == 0 else "y"}) for p in range(6)}


def test_rack_awareness_applies_only_where_kafka_uses_it():
    specs = {"a": MemberSpec(frozenset({T}), frozenset(), "x"), "b": MemberSpec(frozenset({T}), frozenset(), "y")}
    assert use_racks(specs, {T: 6}, RACKS)
    assert not use_racks({m: MemberSpec(frozenset({T}), frozenset()) for m in "ab"}, {T: 6}, RACKS)  # members without racks
    assert not use_racks(specs, {T: 6}, {tp: frozenset({"x", "y"}) for tp in RACKS})  # every partition on every rack
    assert not use_racks(specs, {T: 6}, {tp: frozenset({"z"}) for tp in RACKS})  # no member on a partition's rack
    # without rack awareness the assignment is the same as without racks at all
    plain = {m: MemberSpec(frozenset({T}), frozenset()) for m in "ab"}
    assert uniform(plain, {T: 6}, RACKS) == uniform(plain, {T: 6}) and range_(plain, {T: 6}, RACKS) == range_(plain, {T: 6})


def test_uniform_gives_members_their_racks_partitions_balance_first():
    specs = {"a": MemberSpec(frozenset({T}), frozenset(), "x"), "b": MemberSpec(frozenset({T}), frozenset(), "y")}
    out = uniform(specs, {T: 6}, RACKS)
    assert out["a"] == {(T, 0), (T, 2), (T, 4)} and out["b"] == {(T, 1), (T, 3), (T, 5)}
    # a partition kept against its rack is moved to its rack's member when balance allows ...
    crossed = {"a": MemberSpec(frozenset({T}), frozenset({(T, 0), (T, 1), (T, 2)}), "x"),
               "b": MemberSpec(frozenset({T}), frozenset({(T, 3), (T, 4), (T, 5)}), "y")}
    assert uniform(crossed, {T: 6}, RACKS) == out
    # ... but balance comes first: three members on x, one on y, and y's partitions shared
    four = {m: MemberSpec(frozenset({T}), frozenset(), "x") for m in "abc"} | {"d": MemberSpec(frozenset({T}), frozenset(), "y")}
    got = uniform(four, {T: 6}, RACKS)
    assert sorted(len(v) for v in got.values()) == [1, 1, 2, 2] and set().union(*got.values()) == set(RACKS)
    # d has only its rack's partitions; x's three partitions went to x's three members, one each
    assert got["d"] <= {(T, 1), (T, 3), (T, 5)} and all(len(got[m] & {(T, 0), (T, 2), (T, 4)}) == 1 for m in "abc")
    # a member without a rack takes what is left
    mixed = {"a": MemberSpec(frozenset({T}), frozenset(), "x"), "n": MemberSpec(frozenset({T}), frozenset())}
    got = uniform(mixed, {T: 6}, RACKS)
    assert got["a"] == {(T, 0), (T, 2), (T, 4)} and got["n"] == {(T, 1), (T, 3), (T, 5)}


def test_range_takes_its_racks_partitions_first():
    specs = {"a": MemberSpec(frozenset({T}), frozenset(), "y"), "b": MemberSpec(frozenset({T}), frozenset(), "x")}
    out = range_(specs, {T: 6}, RACKS)
    assert out["a"] == {(T, 1), (T, 3), (T, 5)} and out["b"] == {(T, 0), (T, 2), (T, 4)}
    # counts stay the range assignor's (5 partitions: the first member in id order gets 3)
    five = range_(specs, {T: 5}, {tp: r for tp, r in RACKS.items() if tp[1] < 5})
    assert five["a"] == {(T, 1), (T, 3), (T, 4)} and five["b"] == {(T, 0), (T, 2)}


def test_rack_aware_group_and_rack_moves():
    g = ConsumerGroup("g", CONFIG)
    racks = {T: tuple("x" if p % 2 == 0 else "y" for p in range(6))}

    def hb(member_id, epoch, owned, rack, racks=racks):
        req = HeartbeatRequest(member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",),
                               owned=frozenset(owned), rack_id=rack)
        return g.heartbeat(0.0, req, TOPICS, racks)

    hb("a", 0, (), "x")
    hb("b", 0, (), "y")
    assert g.target == {"a": frozenset({(T, 0), (T, 2), (T, 4)}), "b": frozenset({(T, 1), (T, 3), (T, 5)})}
    epoch = g.group_epoch
    # the partitions' owners move: rack x now holds 0-2, y 3-5; the epoch moves and the target follows
    moved = {T: ("x", "x", "x", "y", "y", "y")}
    hb("a", g.members["a"].member_epoch, g.members["a"].assigned, "x", moved)
    assert g.group_epoch == epoch + 1 and g.target["a"] == {(T, 0), (T, 1), (T, 2)}
    # a member changing racks moves the epoch too; and racks survive the document round trip
    hb("b", g.members["b"].member_epoch, g.members["b"].assigned, "x", moved)
    assert g.group_epoch == epoch + 2
    assert ConsumerGroup.from_doc("g", g.to_doc(), CONFIG, 0.0).racks == moved


def test_join_revoke_then_assign_never_two_owners():
    g = ConsumerGroup("g", CONFIG)
    r = join(g, "a")
    assert (r.member_epoch, len(r.assignment)) == (1, 6) and g.state is GroupState.STABLE
    a_owned = r.assignment
    r = join(g, "b")
    assert r.member_epoch == 2 and r.assignment == frozenset()  # a still holds everything
    assert g.state is GroupState.RECONCILING
    # a's heartbeat: three partitions to revoke, epoch unchanged until it acknowledges
    r = beat(g, "a", 1, a_owned)
    assert r.member_epoch == 1 and len(r.assignment) == 3
    assert g.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    assert all(len(v) == 1 for v in holders(g).values())
    # b asks again: the partitions are still a's
    assert beat(g, "b", 2, ()).assignment is None
    # a acknowledges by no longer listing them: it moves to epoch 2
    r = beat(g, "a", 1, r.assignment)
    assert r.member_epoch == 2 and g.members["a"].state is MemberState.STABLE
    r = beat(g, "b", 2, ())
    assert len(r.assignment) == 3 and not r.assignment & g.members["a"].assigned
    assert g.state is GroupState.STABLE and all(len(v) == 1 for v in holders(g).values())


def test_leave_frees_partitions_and_bumps_epoch():
    g = ConsumerGroup("g", CONFIG)
    join(g, "a")
    join(g, "b")
    a = beat(g, "a", 1, [(T, p) for p in range(6)])
    beat(g, "a", 1, a.assignment)
    beat(g, "b", 2, ())
    epoch = g.group_epoch
    assert beat(g, "b", -1, ()).member_epoch == -1
    assert "b" not in g.members and g.group_epoch == epoch + 1
    r = beat(g, "a", 2, g.members["a"].assigned)
    assert r.member_epoch == epoch + 1 and len(r.assignment) == 6


def test_epoch_fencing_and_unknown_member():
    g = ConsumerGroup("g", CONFIG)
    join(g, "a")
    assert code(beat, g, "a", 5, ()) is ErrorCode.fenced_member_epoch
    assert code(beat, g, "x", 1, ()) is ErrorCode.unknown_member_id
    join(g, "b")  # epoch 2; a at 1 still
    a = beat(g, "a", 1, [(T, p) for p in range(6)])
    beat(g, "a", 1, a.assignment)  # a at 2 now, previous 1
    # its previous epoch is accepted (lost response) when it owns nothing it should not
    assert beat(g, "a", 1, a.assignment).member_epoch == 2
    assert code(beat, g, "a", 1, [(T, p) for p in range(6)]) is ErrorCode.fenced_member_epoch
    assert code(beat, g, "a", 0 - 5, ()) is ErrorCode.invalid_request


def test_request_validation_and_assignor():
    g = ConsumerGroup("g", CONFIG)
    assert code(join, g, "a", server_assignor="sticky") is ErrorCode.unsupported_assignor
    assert code(join, g, "") is ErrorCode.invalid_request
    assert code(validate_request, HeartbeatRequest("a", 0, subscribed_topic_names=("t",), owned=frozenset()), CONFIG) \
        is ErrorCode.invalid_request  # no rebalance timeout
    join(g, "a", server_assignor="range")
    join(g, "b", server_assignor="range")
    assert g.preferred_assignor() == "range"


def test_max_size():
    g = ConsumerGroup("g", CONFIG)
    for m in "abc":
        join(g, m)
    assert code(join, g, "d") is ErrorCode.group_max_size_reached
    assert join(g, "a").member_id == "a"  # a member already in counts once


def test_static_member_leaves_and_comes_back_with_its_partitions():
    g = ConsumerGroup("g", CONFIG)
    join(g, "a", instance_id="i1")
    join(g, "b")
    a = beat(g, "a", 1, [(T, p) for p in range(6)], instance_id="i1")
    a = beat(g, "a", 1, a.assignment, instance_id="i1")
    kept = g.members["a"].assigned
    assert code(join, g, "a2", instance_id="i1") is ErrorCode.unreleased_instance_id
    assert code(beat, g, "zz", -2, (), instance_id="i1") is ErrorCode.fenced_instance_id
    epoch = g.group_epoch
    assert beat(g, "a", -2, (), instance_id="i1").member_epoch == -2
    assert g.group_epoch == epoch  # no rebalance for a static leave
    r = join(g, "a2", instance_id="i1")
    assert r.assignment == kept and r.member_epoch == a.member_epoch and "a" not in g.members
    assert g.group_epoch == epoch


def test_session_and_revocation_timeouts():
    g = ConsumerGroup("g", CONFIG)
    join(g, "a", rebalance_timeout_ms=10_000)
    join(g, "b", now=1000)
    beat(g, "a", 1, [(T, p) for p in range(6)], now=2000)  # must revoke three by 12 000
    assert g.next_deadline() == 12_000
    assert g.tick(12_000) == [("a", "revocation not acknowledged within the rebalance timeout")]
    assert list(g.members) == ["b"]
    assert g.tick(46_000) == [("b", "session timeout")] and g.state is GroupState.EMPTY


def test_offset_commit_validation():
    g = ConsumerGroup("g", CONFIG)
    g.validate_offset_commit("", -1, 9)  # empty group: an admin commit
    join(g, "a")
    g.validate_offset_commit("a", 1, 9)
    assert code(g.validate_offset_commit, "a", 0, 9) is ErrorCode.stale_member_epoch
    assert code(g.validate_offset_commit, "x", 1, 9) is ErrorCode.unknown_member_id
    assert code(g.validate_offset_commit, "a", 1, 8) is ErrorCode.unsupported_version
    g.validate_offset_fetch(None, -1)
    assert code(g.validate_offset_fetch, "a", 3) is ErrorCode.stale_member_epoch


def test_doc_round_trip():
    g = ConsumerGroup("g", CONFIG)
    join(g, "a", instance_id="i")
    join(g, "b")
    beat(g, "a", 1, [(T, p) for p in range(6)], instance_id="i")
    back = ConsumerGroup.from_doc("g", g.to_doc(), CONFIG, 0.0)
    assert back.to_doc() == g.to_doc()
    assert back.members["a"].state is MemberState.UNREVOKED_PARTITIONS


async def test_offset_retention_of_consumer_groups(tmp_path):
    """Through the coordinator over a real store: offsets of topics the group no longer
    subscribes to expire after the retention; an empty group goes with its last offset."""
    from types import SimpleNamespace

    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import CommittedOffset, MetadataStore
    from tests.test_groups_unit import FakeClock

    clock = FakeClock()
    md = MetadataStore(SqliteKV(tmp_path / "meta.db"))
    coord = GroupCoordinator(md, SimpleNamespace(offsets_retention_minutes=1, group_initial_rebalance_delay_ms=0), clock=clock)
    await coord.start()

    async def lookup(names):
        return {n: {"t": TOPICS["t"], "u": ("00000000-0000-0000-0000-00000000000b", 1)}[n] for n in names}

    req = HeartbeatRequest(member_id="a", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_names=("t",), owned=frozenset())
    assert (await coord.consumer.heartbeat("cg", req, lookup)).member_epoch == 1
    kw = dict(member_id="a", group_instance_id=None, generation_id=1, api_version=9)
    await coord.commit_offsets("cg", offsets={("t", 0): CommittedOffset(5), ("u", 0): CommittedOffset(7)}, **kw)
    clock.now += 60_000
    assert await coord.expire_offsets() == 1  # u: not subscribed; t stays while subscribed
    assert set(await coord.fetch_offsets("cg")) == {("t", 0)}
    leave = HeartbeatRequest(member_id="a", member_epoch=-1)
    assert (await coord.consumer.heartbeat("cg", leave, lookup)).member_epoch == -1
    assert await coord.expire_offsets() == 1 and await md.get_group("cg") is None
    await coord.stop()


async def test_store_writes_off_the_lock_batched_and_before_the_answer(tmp_path):
    """Through the coordinator over a real store, as Kafka's coordinator: a heartbeat that
    changes the group is answered once the store has the change; one that changes nothing
    writes nothing; commits of many members at once go out in fewer writes than commits,
    each answered once stored, with their __consumer_offsets records in commit order."""
    import asyncio
    import struct
    from types import SimpleNamespace

    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.metadata import keys
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import CommittedOffset, MetadataStore

    md = MetadataStore(SqliteKV(tmp_path / "meta.db"))
    appends: list[list[tuple[int, bytes]]] = []  # per append to __consumer_offsets: (key version, key)

    async def append(_topic, _partition, recs):
        appends.append([(struct.unpack_from(">h", k)[0], k) for k, _v in recs])

    coord = GroupCoordinator(md, SimpleNamespace(group_initial_rebalance_delay_ms=0), append_records=append)
    await coord.start()

    async def lookup(names):
        return {n: TOPICS[n] for n in names if n in TOPICS}

    try:
        members = [f"m{i}" for i in range(6)]
        epochs, owned = {}, {}
        for m in members:
            r = await coord.consumer.heartbeat("g", HeartbeatRequest(
                member_id=m, member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=frozenset()), lookup)
            assert m in {d["member_id"] for d in (await md.get_group("g"))["members"]}  # stored before the answer
            epochs[m], owned[m] = r.member_epoch, r.assignment
        # Heartbeats until the group is stable: each answered change is in the store.
        for _ in range(10):
            for m in members:
                r = await coord.consumer.heartbeat("g", HeartbeatRequest(member_id=m, member_epoch=epochs[m], owned=owned[m]), lookup)
                epochs[m] = r.member_epoch
                if r.assignment is not None:
                    owned[m] = r.assignment
                stored = next(d for d in (await md.get_group("g"))["members"] if d["member_id"] == m)
                assert stored["member_epoch"] == r.member_epoch
        group = coord.consumer.groups["g"]
        assert group.state.value == "Stable"
        # Heartbeats that change nothing write nothing.
        before = (await md.kv.get(keys.group("g"))).version
        for m in members:
            await coord.consumer.heartbeat("g", HeartbeatRequest(member_id=m, member_epoch=epochs[m], owned=owned[m]), lookup)
        assert (await md.kv.get(keys.group("g"))).version == before
        # Every member commits at once, twice: fewer writes than commits, every commit stored
        # when answered, the later commit of a partition last.
        del appends[:]

        async def commit(m: str, offset: int):
            mine = {("t", p): CommittedOffset(offset + p) for _tid, p in owned[m]}
            error = await coord.commit_offsets("g", member_id=m, group_instance_id=None, generation_id=epochs[m],
                                               offsets=mine, api_version=9)
            got = await md.fetch_offsets("g")
            assert error is ErrorCode.none and all(got[tp].offset >= o.offset for tp, o in mine.items())

        await asyncio.gather(*[commit(m, 100) for m in members], *[commit(m, 200) for m in members])
        assert {tp: o.offset for tp, o in (await md.fetch_offsets("g")).items()} == {("t", p): 200 + p for p in range(6)}
        offset_appends = [a for a in appends if a and a[0][0] == 1]
        assert 1 <= len(offset_appends) < 2 * len(members)
    finally:
        await coord.stop()


async def test_commits_queued_when_the_group_moves_are_refused_not_written(tmp_path):
    """The group moves to another broker while commits wait for their write: they are not
    written and answer NOT_COORDINATOR (the client commits again at the new coordinator)."""
    import asyncio
    from types import SimpleNamespace

    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import CommittedOffset, MetadataStore

    md = MetadataStore(SqliteKV(tmp_path / "meta.db"))
    coord = GroupCoordinator(md, SimpleNamespace(group_initial_rebalance_delay_ms=0))
    await coord.start()
    kw = dict(member_id="", group_instance_id=None, generation_id=-1, api_version=8)
    try:
        assert await coord.commit_offsets("g", offsets={("t", 0): CommittedOffset(1)}, **kw) is ErrorCode.none
        # Both commits queue before the writer's next flush starts; the release comes between.
        commits = [asyncio.ensure_future(coord.commit_offsets("g", offsets={("t", p): CommittedOffset(9)}, **kw))
                   for p in (0, 1)]
        released = asyncio.ensure_future(coord.release("g"))
        assert await asyncio.gather(*commits) == [ErrorCode.not_coordinator] * 2
        await released
        assert {tp: o.offset for tp, o in (await md.fetch_offsets("g")).items()} == {("t", 0): 1}
    finally:
        await coord.stop()


def test_regex_subscription_follows_topics():
    U = "00000000-0000-0000-0000-00000000000b"
    g = ConsumerGroup("g", CONFIG)
    everything = {"t": TOPICS["t"], "orders-eu": (U, 2), "__consumer_offsets": ("00000000-0000-0000-0000-00000000000c", 50)}
    req = HeartbeatRequest(member_id="a", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_regex="orders-.*",
                           owned=frozenset())
    validate_request(req, CONFIG)
    g.resolve_regexes(["t", "__consumer_offsets"], req.subscribed_topic_regex)
    r = g.heartbeat(0, req, {})
    assert r.member_epoch == 1 and r.assignment == frozenset()
    # A topic created later that the regex selects (whole names only; internal topics never).
    g.resolve_regexes(everything, None)
    r = g.heartbeat(0, HeartbeatRequest(member_id="a", member_epoch=1, owned=frozenset()), everything)
    assert r.member_epoch == 2 and r.assignment == {(U, 0), (U, 1)}
    assert code(validate_request, HeartbeatRequest("b", 0, rebalance_timeout_ms=1, subscribed_topic_regex="(?<=a)b",
                                                   owned=frozenset()), CONFIG) is ErrorCode.invalid_regular_expression
