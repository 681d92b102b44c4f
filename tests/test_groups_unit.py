"""Consumer-group coordinator without sockets.

The pure state machine (`kafscale.groups.state`) is driven with a fake clock; the asyncio
driver and the protocol handlers run against a real embedded MetadataStore.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from kio.schema.errors import ErrorCode

from kafscale.groups import snapshot
from kafscale.groups.describe import describe_group
from kafscale.groups.state import (
    PERSIST,
    TRANSITIONS,
    Group,
    GroupConfig,
    GroupState,
    IllegalTransition,
    JoinResult,
    Reply,
    SyncResult,
)
from kafscale.groups.subscription import parse_subscription_topics
from tests.support.wait import wait_until_async

E = ErrorCode
SESSION = 10_000
REBALANCE = 30_000


def subscription(*topics: str, version: int = 0) -> bytes:
    """A ConsumerProtocolSubscription v0 (the topic list is all the broker reads)."""
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)  # null user data


class Harness:
    """A group plus bookkeeping of parked requests, driven by a fake clock."""

    def __init__(self, delay: int = 0, **config):
        self.now = 1_000_000.0
        ids = itertools.count(1)
        self.group = Group(
            "g",
            GroupConfig(initial_rebalance_delay_ms=delay, **config),
            self.now,
            new_member_id=lambda client, instance: f"{instance or client}-{next(ids)}",
        )
        self.replies: dict[int, JoinResult | SyncResult] = {}
        self.persists = 0

    def _collect(self, effects):
        for e in effects:
            if e is PERSIST:
                self.persists += 1
            elif isinstance(e, Reply):
                assert e.waiter not in self.replies, "a waiter answered twice"
                self.replies[e.waiter] = e.result

    def advance(self, ms: float):
        self.now += ms
        self._collect(self.group.tick(self.now))

    def join(self, member_id="", *, instance=None, client="c", protocols=None, ptype="consumer",
             session=SESSION, rebalance=REBALANCE, require_known=None, skip=False):
        if protocols is None:
            protocols = [("range", subscription("t"))]
        if require_known is None:
            require_known = instance is None
        out = self.group.join(
            self.now, member_id=member_id, group_instance_id=instance, client_id=client, client_host="/127.0.0.1",
            session_timeout_ms=session, rebalance_timeout_ms=rebalance, protocol_type=ptype, protocols=protocols,
            require_known_member_id=require_known, supports_skip_assignment=skip,
        )
        self._collect(out.effects)
        return out.result if out.waiter is None else out.waiter

    def sync(self, member_id, generation, assignments=None, *, instance=None, ptype=None, pname=None):
        out = self.group.sync(
            self.now, member_id=member_id, group_instance_id=instance, generation_id=generation,
            protocol_type=ptype, protocol_name=pname, assignments=assignments or {},
        )
        self._collect(out.effects)
        return out.result if out.waiter is None else out.waiter

    def heartbeat(self, member_id, generation, instance=None):
        return self.group.heartbeat(self.now, member_id=member_id, group_instance_id=instance,
                                    generation_id=generation).result

    def leave(self, *members):
        error, errors, effects = self.group.leave(self.now, members)
        self._collect(effects)
        return error, errors

    def reply(self, waiter):
        return self.replies.get(waiter)

    def new_member(self, **kw) -> str:
        """First JoinGroup of a dynamic member: MEMBER_ID_REQUIRED hands out the id."""
        res = self.join(**kw)
        assert isinstance(res, JoinResult) and res.error is E.member_id_required
        assert res.member_id
        return res.member_id

    def form_group(self, n: int, **kw) -> tuple[list[str], int]:
        """n dynamic members in a Stable group; returns (member ids, generation)."""
        ids = [self.new_member(client=f"c{i}", **kw) for i in range(n)]
        waiters = [self.join(mid, client=f"c{i}", **kw) for i, mid in enumerate(ids)]
        self.advance(self.group.config.initial_rebalance_delay_ms)
        results = [self.reply(w) for w in waiters]
        assert all(r is not None and r.error is E.none for r in results), results
        gen = results[0].generation_id
        leader = results[0].leader
        syncs = {mid: self.sync(mid, gen, {m: m.encode() for m in ids} if mid == leader else None) for mid in ids}
        assert self.group.state is GroupState.STABLE
        for mid, w in syncs.items():
            res = w if isinstance(w, SyncResult) else self.reply(w)
            assert res.error is E.none and res.assignment == mid.encode()
        return ids, gen


# -- join, sync, heartbeat ------------------------------------------------------------------


def test_first_join_requires_member_id_then_initial_delay_then_sync():
    h = Harness(delay=3000)
    first = h.join()
    assert first.error is E.member_id_required and first.member_id.startswith("c-")
    assert h.group.state is GroupState.EMPTY and first.member_id in h.group.pending_members
    mid = first.member_id
    w = h.join(mid)
    assert h.group.state is GroupState.PREPARING_REBALANCE
    h.advance(2999)
    assert h.reply(w) is None, "the initial rebalance waits out group.initial.rebalance.delay.ms"
    h.advance(1)
    res = h.reply(w)
    assert res.error is E.none and res.generation_id == 1 and res.leader == mid and res.member_id == mid
    assert res.protocol_type == "consumer" and res.protocol_name == "range"
    assert [m[0] for m in res.members] == [mid] and res.members[0][2] == subscription("t")
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    persists = h.persists
    sw = h.sync(mid, 1, {mid: b"assignment"})
    assert h.reply(sw) == SyncResult(E.none, b"assignment", "consumer", "range")
    assert h.group.state is GroupState.STABLE and h.persists == persists + 1
    assert h.heartbeat(mid, 1) is E.none


def test_join_without_member_id_required_before_v4():
    h = Harness()
    w = h.join(require_known=False)
    assert isinstance(w, int)
    h.advance(0)
    res = h.reply(w)
    assert res.error is E.none and res.member_id.startswith("c-") and res.generation_id == 1


def test_initial_delay_extends_while_members_keep_arriving():
    h = Harness(delay=3000)
    a = h.new_member(client="a")
    wa = h.join(a, client="a")
    h.advance(2000)
    b = h.new_member(client="b")
    wb = h.join(b, client="b")
    h.advance(1000)  # first delay over, but a member arrived during it
    assert h.reply(wa) is None and h.reply(wb) is None
    h.advance(3000)
    ra, rb = h.reply(wa), h.reply(wb)
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader == a and len(ra.members) == 2 and rb.members == []


def test_initial_delay_bounded_by_rebalance_timeout():
    h = Harness(delay=3000)
    a = h.new_member()
    wa = h.join(a, rebalance=4000)
    for i in range(10):  # a stream of newcomers cannot postpone the rebalance forever
        h.advance(500)
        h.join(h.new_member(client=f"n{i}"), client=f"n{i}", rebalance=4000)
    assert h.reply(wa) is not None and h.reply(wa).error is E.none
    assert h.now - 1_000_000 <= 3000 + 4000


def test_join_to_stable_group_rebalances_and_follower_gets_no_member_list():
    h = Harness()
    (a,), gen = h.form_group(1)
    b = h.new_member(client="b")
    wb = h.join(b, client="b")
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, gen) is E.rebalance_in_progress
    assert h.sync(a, gen) == SyncResult(E.rebalance_in_progress)
    wa = h.join(a)  # everyone has joined: completes at once (not an initial rebalance)
    ra, rb = h.reply(wa), h.reply(wb)
    assert ra.generation_id == rb.generation_id == gen + 1
    assert ra.leader == a and {m[0] for m in ra.members} == {a, b}
    assert rb.leader == a and rb.members == []
    # Heartbeats are fine while CompletingRebalance (clients heartbeat right after JoinGroup).
    assert h.heartbeat(b, gen + 1) is E.none
    assert h.heartbeat(b, gen) is E.illegal_generation


def test_follower_rejoin_with_same_metadata_keeps_generation_leader_rejoin_rebalances():
    h = Harness()
    (a, b), gen = h.form_group(2)
    leader = h.group.leader_id
    follower = b if leader == a else a
    res = h.join(follower, client="c1" if follower == b else "c0")
    assert isinstance(res, JoinResult) and res.error is E.none and res.generation_id == gen
    assert h.group.state is GroupState.STABLE
    h.join(leader)
    assert h.group.state is GroupState.PREPARING_REBALANCE


def test_rebalance_timeout_drops_members_that_did_not_rejoin():
    h = Harness()
    (a, b), gen = h.form_group(2)
    c = h.new_member(client="x")
    wc = h.join(c, client="x")
    wa = h.join(a, client="c0")
    for _ in range(REBALANCE // 5000 - 1):
        h.advance(5000)
        # Heartbeats keep b alive, but do not count as rejoining.
        assert h.heartbeat(b, gen) is E.rebalance_in_progress
    h.advance(4999)
    assert h.reply(wa) is None
    h.advance(1)
    ra, rc = h.reply(wa), h.reply(wc)
    assert ra.error is E.none and ra.generation_id == gen + 1
    assert set(h.group.members) == {a, c}
    assert h.heartbeat(b, gen) is E.unknown_member_id
    assert h.sync(b, gen + 1) == SyncResult(E.unknown_member_id)


def test_session_timeout_expires_silent_member():
    h = Harness()
    (a, b), gen = h.form_group(2)
    h.advance(SESSION / 2)
    assert h.heartbeat(a, gen) is E.none
    h.advance(SESSION / 2 - 1)
    assert b in h.group.members and h.heartbeat(a, gen) is E.none
    h.advance(1)
    assert b not in h.group.members, "b never heartbeat and expired"
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, gen) is E.rebalance_in_progress
    wa = h.join(a, client="c0")
    ra = h.reply(wa)
    assert ra.error is E.none and ra.generation_id == gen + 1 and ra.leader == a and len(ra.members) == 1


def test_last_member_expiring_empties_the_group():
    h = Harness()
    (a,), gen = h.form_group(1)
    persists = h.persists
    h.advance(SESSION)
    assert h.group.state is GroupState.EMPTY and not h.group.members
    assert h.group.generation_id == gen + 1 and h.group.protocol_name is None
    assert h.persists == persists + 1
    assert h.group.protocol_type == "consumer", "an Empty group keeps its protocol type"


def test_pending_member_blocks_rebalance_until_it_joins_or_expires():
    h = Harness()
    (a,), gen = h.form_group(1)
    h.new_member(client="late")  # got its id, never comes back
    wa = h.join(a, client="c0")  # the leader rejoins: rebalance
    assert h.reply(wa) is None
    h.advance(SESSION)
    ra = h.reply(wa)
    assert ra is not None and ra.generation_id == gen + 1
    assert not h.group.pending_members


# -- errors ------------------------------------------------------------------------------------


def test_stale_generation_and_unknown_member():
    h = Harness()
    (a, b), gen = h.form_group(2)
    assert h.heartbeat(a, gen - 1) is E.illegal_generation
    assert h.heartbeat("nobody", gen) is E.unknown_member_id
    assert h.sync(a, gen + 5) == SyncResult(E.illegal_generation)
    assert h.sync("nobody", gen) == SyncResult(E.unknown_member_id)
    assert h.join("nobody").error is E.unknown_member_id
    ok = h.group.validate_offset_commit(h.now, member_id=a, group_instance_id=None, generation_id=gen - 1)
    assert ok is E.illegal_generation
    # The group is still fine afterwards.
    assert h.heartbeat(a, gen) is E.none and h.group.state is GroupState.STABLE


def test_sync_from_follower_with_assignments_is_ignored():
    h = Harness()
    a = h.new_member(client="a")
    b = h.new_member(client="b")
    wa, wb = h.join(a, client="a"), h.join(b, client="b")
    h.advance(0)
    gen = h.reply(wa).generation_id
    assert h.reply(wa).leader == a
    sb = h.sync(b, gen, {a: b"FROM-FOLLOWER", b: b"FROM-FOLLOWER"})
    assert h.reply(sb) is None and h.group.state is GroupState.COMPLETING_REBALANCE
    sa = h.sync(a, gen, {a: b"pa", b: b"pb"})
    assert h.reply(sa).assignment == b"pa" and h.reply(sb).assignment == b"pb"


def test_sync_protocol_mismatch_and_missing_assignment():
    h = Harness()
    a = h.new_member()
    wa = h.join(a)
    h.advance(0)
    gen = h.reply(wa).generation_id
    assert h.sync(a, gen, pname="roundrobin") == SyncResult(E.inconsistent_group_protocol)
    assert h.sync(a, gen, ptype="connect") == SyncResult(E.inconsistent_group_protocol)
    sa = h.sync(a, gen, {}, ptype="consumer", pname="range")
    assert h.reply(sa) == SyncResult(E.none, b"", "consumer", "range"), "no assignment given: empty bytes"


def test_inconsistent_group_protocol():
    h = Harness()
    (a,), gen = h.form_group(1)
    assert h.join(protocols=[("roundrobin", b"")]).error is E.inconsistent_group_protocol
    assert h.join(ptype="connect", protocols=[("range", b"")]).error is E.inconsistent_group_protocol
    assert h.group.state is GroupState.STABLE and list(h.group.members) == [a]
    empty = Harness()
    assert empty.join(ptype="").error is E.inconsistent_group_protocol
    assert empty.join(protocols=[]).error is E.inconsistent_group_protocol


def test_session_timeout_bounds_and_oversized_metadata():
    h = Harness()
    (a,), gen = h.form_group(1)
    assert h.join(session=5999).error is E.invalid_session_timeout
    assert h.join(session=1_800_001).error is E.invalid_session_timeout
    big = b"x" * (1024 * 1024 + 1)
    res = h.join(protocols=[("range", big)])
    assert res.error is E.invalid_request
    assert h.join(a, client="c0", protocols=[("range", big)]).error is E.invalid_request
    assert h.group.state is GroupState.STABLE and h.heartbeat(a, gen) is E.none


def test_protocol_selection_by_votes_among_common_protocols():
    h = Harness()
    a = h.new_member(client="a", protocols=[("range", b"1"), ("roundrobin", b"2"), ("sticky", b"3")])
    b = h.new_member(client="b", protocols=[("roundrobin", b"1"), ("range", b"2")])
    c = h.new_member(client="c", protocols=[("roundrobin", b"1"), ("range", b"2")])
    wa = h.join(a, client="a", protocols=[("range", b"1"), ("roundrobin", b"2"), ("sticky", b"3")])
    h.join(b, client="b", protocols=[("roundrobin", b"1"), ("range", b"2")])
    h.join(c, client="c", protocols=[("roundrobin", b"B"), ("range", b"C")])
    h.advance(0)
    res = h.reply(wa)
    assert res.protocol_name == "roundrobin"
    assert dict((m[0], m[2]) for m in res.members) == {a: b"2", b: b"1", c: b"B"}, "metadata of the chosen protocol"
    # A newcomer must share a protocol every member supports.
    assert h.join(protocols=[("sticky", b"")]).error is E.inconsistent_group_protocol
    assert h.new_member(protocols=[("range", b""), ("x", b"")])


def test_commit_validation():
    h = Harness()
    g = h.group
    assert g.validate_offset_commit(h.now, member_id="", group_instance_id=None, generation_id=-1) is E.none
    (a, b), gen = h.form_group(2)
    assert g.validate_offset_commit(h.now, member_id="", group_instance_id=None, generation_id=-1) is E.unknown_member_id
    assert g.validate_offset_commit(h.now, member_id=a, group_instance_id=None, generation_id=gen) is E.none
    c = h.new_member(client="x")
    h.join(c, client="x")  # PreparingRebalance: current members may still commit
    assert g.validate_offset_commit(h.now, member_id=a, group_instance_id=None, generation_id=gen) is E.none
    h.join(a, client="c0")
    h.join(b, client="c1")  # everyone joined: CompletingRebalance
    assert g.state is GroupState.COMPLETING_REBALANCE
    assert g.validate_offset_commit(h.now, member_id=a, group_instance_id=None, generation_id=gen + 1) is E.rebalance_in_progress


def test_commit_keeps_member_alive():
    h = Harness()
    (a,), gen = h.form_group(1)
    for _ in range(4):
        h.advance(SESSION / 2)
        h.group.validate_offset_commit(h.now, member_id=a, group_instance_id=None, generation_id=gen)
    assert a in h.group.members


def test_transactional_commit_validation_as_kafka():
    """TxnOffsetCommit: one that names no member (v0-v2 cannot) is accepted whatever the
    group's state; one that names a member is checked as OffsetCommit (v3+, KIP-447), but
    neither held back by a completing rebalance nor counted as a heartbeat."""
    h = Harness()
    g = h.group

    def txn(member_id="", generation_id=-1, instance=None):
        return g.validate_offset_commit(h.now, member_id=member_id, group_instance_id=instance,
                                        generation_id=generation_id, transactional=True)

    assert txn() is E.none  # Empty
    (a, b), gen = h.form_group(2)
    assert txn() is E.none, "a group with members takes a TxnOffsetCommit without member (v0-v2)"
    assert g.validate_offset_commit(h.now, member_id="", group_instance_id=None, generation_id=-1) is E.unknown_member_id
    assert txn(a, gen) is E.none
    assert txn(a, gen - 1) is E.illegal_generation
    assert txn(a, gen + 1) is E.illegal_generation
    assert txn("ghost", gen) is E.unknown_member_id
    assert txn("", gen) is E.unknown_member_id, "a generation without member id"
    assert txn(a, gen, instance="nobody") is E.unknown_member_id
    # CompletingRebalance: OffsetCommit gets REBALANCE_IN_PROGRESS, a transaction's commit goes through.
    c = h.new_member(client="x")
    h.join(c, client="x")
    h.join(a, client="c0")
    h.join(b, client="c1")
    assert g.state is GroupState.COMPLETING_REBALANCE
    assert txn(a, gen + 1) is E.none and txn() is E.none
    assert txn(a, gen) is E.illegal_generation
    # Not a heartbeat: the member's session deadline does not move.
    deadline = g.members[a].heartbeat_deadline
    h.now += 1000
    txn(a, gen + 1)
    assert g.members[a].heartbeat_deadline == deadline
    g.mark_dead()
    assert txn() is E.coordinator_not_available


def test_transactional_commit_of_a_fenced_static_member():
    h = Harness()
    ids, gen, leader = form_static(h)
    follower_instance = next(i for i, mid in ids.items() if mid != leader)
    old_id = ids[follower_instance]
    new_id = h.reply(h.join(instance=follower_instance, client=follower_instance)).member_id
    assert h.group.validate_offset_commit(h.now, member_id=old_id, group_instance_id=follower_instance,
                                          generation_id=gen, transactional=True) is E.fenced_instance_id
    assert h.group.validate_offset_commit(h.now, member_id=new_id, group_instance_id=follower_instance,
                                          generation_id=gen, transactional=True) is E.none


def test_pending_sync_timeout_removes_members_that_never_synced():
    h = Harness()
    a = h.new_member(client="a")
    b = h.new_member(client="b")
    wa, wb = h.join(a, client="a"), h.join(b, client="b")
    h.advance(0)
    gen = h.reply(wa).generation_id
    sb = h.sync(b, gen)  # the leader a never syncs
    h.advance(REBALANCE)
    assert a not in h.group.members
    assert h.reply(sb).error is E.rebalance_in_progress
    assert h.group.state is GroupState.PREPARING_REBALANCE
    wb2 = h.join(b, client="b")
    assert h.reply(wb2).leader == b and h.reply(wb2).generation_id == gen + 1


def test_duplicate_join_supersedes_the_parked_one():
    h = Harness()
    (a, b), gen = h.form_group(2)
    w1 = h.join(a, client="c0", protocols=[("range", subscription("t", "u"))])
    w2 = h.join(a, client="c0", protocols=[("range", subscription("t", "u"))])
    assert h.reply(w1).error is E.rebalance_in_progress
    h.join(b, client="c1")
    assert h.reply(w2).error is E.none and h.reply(w2).generation_id == gen + 1


# -- leave ----------------------------------------------------------------------------------------


def test_leave_triggers_rebalance_and_last_leave_empties_group():
    h = Harness()
    (a, b), gen = h.form_group(2)
    assert h.leave((b, None)) == (E.none, [E.none])
    assert h.group.state is GroupState.PREPARING_REBALANCE
    wa = h.join(a, client="c0")
    assert h.reply(wa).generation_id == gen + 1 and len(h.reply(wa).members) == 1
    h.sync(a, gen + 1, {a: b"all"})
    assert h.leave(("nobody", None)) == (E.none, [E.unknown_member_id])
    assert h.leave((a, None)) == (E.none, [E.none])
    assert h.group.state is GroupState.EMPTY and h.group.generation_id == gen + 2


def test_leave_while_join_parked_answers_unknown_member():
    h = Harness()
    (a, b), gen = h.form_group(2)
    wa = h.join(a, client="c0")
    h.leave((a, None))
    assert h.reply(wa).error is E.unknown_member_id


# -- static membership -----------------------------------------------------------------------------


def form_static(h: Harness, instances=("i1", "i2"), session=SESSION):
    waiters = {i: h.join(instance=i, client=i, session=session) for i in instances}
    h.advance(h.group.config.initial_rebalance_delay_ms)
    results = {i: h.reply(w) for i, w in waiters.items()}
    gen = next(iter(results.values())).generation_id
    leader = next(iter(results.values())).leader
    ids = {i: r.member_id for i, r in results.items()}
    h.sync(leader, gen, {mid: f"assign-{i}".encode() for i, mid in ids.items()})
    for i, mid in ids.items():
        if mid != leader:
            h.sync(mid, gen)
    assert h.group.state is GroupState.STABLE
    return ids, gen, leader


def test_static_member_restart_keeps_generation_and_assignment():
    h = Harness()
    ids, gen, leader = form_static(h)
    follower_instance = next(i for i, mid in ids.items() if mid != leader)
    old_id = ids[follower_instance]
    w = h.join(instance=follower_instance, client=follower_instance)
    res = h.reply(w)
    assert res.error is E.none and res.generation_id == gen
    assert res.member_id != old_id and res.member_id.startswith(follower_instance)
    assert h.group.state is GroupState.STABLE, "no rebalance for a static member rejoining"
    assert h.sync(res.member_id, gen, instance=follower_instance) == SyncResult(
        E.none, f"assign-{follower_instance}".encode(), "consumer", "range")
    # The old incarnation is fenced.
    assert h.heartbeat(old_id, gen, instance=follower_instance) is E.fenced_instance_id
    assert h.heartbeat(res.member_id, gen, instance=follower_instance) is E.none
    assert h.join(old_id, instance=follower_instance, client=follower_instance).error is E.fenced_instance_id
    assert h.group.validate_offset_commit(h.now, member_id=old_id, group_instance_id=follower_instance,
                                          generation_id=gen) is E.fenced_instance_id


def test_static_leader_restart_skip_assignment_and_old_versions():
    h = Harness()
    ids, gen, leader = form_static(h)
    leader_instance = next(i for i, mid in ids.items() if mid == leader)
    w = h.join(instance=leader_instance, client=leader_instance, skip=True)
    res = h.reply(w)
    assert res.skip_assignment and res.leader == res.member_id and len(res.members) == 2
    # Before JoinGroup v9: no member list and the previous leader id.
    w2 = h.join(instance=leader_instance, client=leader_instance, skip=False)
    res2 = h.reply(w2)
    assert not res2.skip_assignment and res2.members == [] and res2.leader == res.member_id
    assert res2.member_id != res2.leader
    assert h.group.state is GroupState.STABLE and h.group.generation_id == gen


def test_static_member_rejoin_with_other_protocol_rebalances():
    h = Harness()
    ids, gen, leader = form_static(h)
    follower_instance = next(i for i, mid in ids.items() if mid != leader)
    h.join(instance=follower_instance, client=follower_instance,
           protocols=[("roundrobin", b""), ("range", subscription("t"))])
    assert h.group.state is GroupState.STABLE, "range is still everyone's choice"
    # i1 prefers range, i2 roundrobin: range wins the tie. When i2 comes back supporting
    # roundrobin only, the next generation's protocol would change: rebalance.
    h2 = Harness()
    w1 = h2.join(instance="i1", client="i1", protocols=[("range", b"1"), ("roundrobin", b"1")])
    w2 = h2.join(instance="i2", client="i2", protocols=[("roundrobin", b"2"), ("range", b"2")])
    h2.advance(0)
    r1 = h2.reply(w1)
    assert r1.protocol_name == "range"
    h2.sync(r1.leader, r1.generation_id, {})
    h2.sync(h2.reply(w2).member_id, r1.generation_id)
    assert h2.group.state is GroupState.STABLE
    h2.join(instance="i2", client="i2", protocols=[("roundrobin", b"2")])
    assert h2.group.state is GroupState.PREPARING_REBALANCE


def test_absent_static_member_stays_through_rebalance_until_session_timeout():
    h = Harness()
    long_session = 2 * REBALANCE
    ids, gen, leader = form_static(h, session=long_session)
    dynamic = h.new_member(client="d")
    wd = h.join(dynamic, client="d")
    w1 = h.join(ids["i1"], instance="i1", client="i1", session=long_session)
    h.advance(REBALANCE - 1)
    assert h.reply(wd) is None, "the rebalance waits for the absent static member"
    h.advance(1)  # i2 never rejoined but is static: it keeps its place
    assert h.reply(wd).error is E.none and ids["i2"] in h.group.members
    assert h.reply(w1).error is E.none and h.reply(w1).generation_id == gen + 1
    assert len(h.group.members) == 3
    h.advance(long_session)
    assert ids["i2"] not in h.group.members


def test_leave_by_group_instance_id_only():
    h = Harness()
    ids, gen, leader = form_static(h)
    assert h.leave(("", "i2")) == (E.none, [E.none])
    assert ids["i2"] not in h.group.members and h.group.state is GroupState.PREPARING_REBALANCE
    assert h.leave(("", "nope")) == (E.none, [E.unknown_member_id])
    assert h.leave((ids["i1"], "i-wrong")) == (E.none, [E.unknown_member_id])


# -- persistence, describe, offsets rules -----------------------------------------------------------


def test_snapshot_roundtrip_restores_stable_group_like_a_failover():
    h = Harness()
    (a, b), gen = h.form_group(2)
    doc = snapshot.to_doc(h.group)
    loaded = snapshot.from_doc("g", doc, h.group.config, h.now)
    assert loaded.state is GroupState.STABLE and loaded.generation_id == gen
    assert loaded.leader_id == h.group.leader_id and set(loaded.members) == {a, b}
    assert loaded.members[a].assignment == a.encode()
    assert loaded.subscribed_topics == {"t"}
    assert loaded.heartbeat(h.now, member_id=a, group_instance_id=None, generation_id=gen).result is E.none
    # b never comes back: it expires and the group rebalances.
    loaded.heartbeat(h.now + 1, member_id=a, group_instance_id=None, generation_id=gen)
    loaded.tick(h.now + SESSION)
    assert b not in loaded.members and loaded.state is GroupState.PREPARING_REBALANCE
    empty = snapshot.from_doc("e", {"protocol_type": "consumer", "generation": 4, "members": []}, h.group.config, 0)
    assert empty.state is GroupState.EMPTY and empty.generation_id == 4


def test_describe_reports_metadata_only_when_stable():
    h = Harness()
    (a, b), gen = h.form_group(2)
    d = describe_group(h.group)
    assert d["group_state"] == "Stable" and d["protocol_type"] == "consumer" and d["protocol_data"] == "range"
    m = {x["member_id"]: x for x in d["members"]}
    assert m[a]["member_metadata"] == subscription("t") and m[a]["member_assignment"] == a.encode()
    assert m[a]["client_id"] == "c0" and m[a]["client_host"] == "/127.0.0.1"
    h.join(h.new_member(client="z"), client="z")
    d = describe_group(h.group)
    assert d["group_state"] == "PreparingRebalance" and d["protocol_data"] == ""
    assert all(x["member_metadata"] == b"" and x["member_assignment"] == b"" for x in d["members"])


def test_transitions_follow_kafkas_table_and_others_raise():
    S = GroupState
    # Kafka's ClassicGroupState valid previous states, read forward
    assert TRANSITIONS == {
        S.EMPTY: {S.PREPARING_REBALANCE, S.DEAD},
        S.PREPARING_REBALANCE: {S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD},
        S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE, S.STABLE, S.DEAD},
        S.STABLE: {S.PREPARING_REBALANCE, S.DEAD},
        S.DEAD: {S.DEAD},
    }
    h = Harness()
    h.form_group(1)
    assert h.group.state is S.STABLE and h.group.previous_state is S.COMPLETING_REBALANCE
    with pytest.raises(IllegalTransition, match="group g: Stable -> CompletingRebalance"):
        h.group._transition(S.COMPLETING_REBALANCE)
    assert h.group.state is S.STABLE and h.group.previous_state is S.COMPLETING_REBALANCE  # untouched
    h.group.mark_dead()
    with pytest.raises(IllegalTransition, match="Dead -> Empty"):
        h.group._transition(S.EMPTY)
    h.group.mark_dead()  # Dead -> Dead: deleting twice is allowed, as Kafka
    assert h.group.state is S.DEAD


def test_offset_delete_and_group_delete_rules():
    h = Harness()
    assert h.group.validate_delete() is E.none
    (a,), gen = h.form_group(1)
    assert h.group.validate_delete() is E.non_empty_group
    assert h.group.validate_offset_delete() is E.none  # consumer groups may delete unsubscribed offsets
    assert h.group.is_subscribed_to("t") and not h.group.is_subscribed_to("other")
    other = Harness()
    other.form_group(1, ptype="connect", protocols=[("v1", b"\x00")])
    assert other.group.validate_offset_delete() is E.non_empty_group


def test_parse_subscription_topics():
    assert parse_subscription_topics(subscription("a", "b")) == {"a", "b"}
    assert parse_subscription_topics(subscription("a", version=3) + b"\x00\x00\x00\x00") == {"a"}
    assert parse_subscription_topics(b"\x00") is None
    assert parse_subscription_topics(b"\x00\x00\x00\x00\x00\x05\x00") is None


# -- the asyncio driver ---------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 1_700_000_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def store(tmp_path):
    from kafscale.metadata.sqlite import SqliteKV
    from kafscale.metadata.store import MetadataStore

    return MetadataStore(SqliteKV(tmp_path / "meta.db"))


def make_coordinator(store, clock=None, delay=0, retention_minutes=60, **extra):
    from types import SimpleNamespace

    from kafscale.groups.coordinator import GroupCoordinator

    cfg = SimpleNamespace(group_initial_rebalance_delay_ms=delay, offsets_retention_minutes=retention_minutes, **extra)
    return GroupCoordinator(store, cfg, clock=clock)


JOIN_DEFAULTS = dict(
    group_instance_id=None, client_id="cli", client_host="/127.0.0.1", session_timeout_ms=SESSION,
    rebalance_timeout_ms=REBALANCE, protocol_type="consumer", protocols=[("range", subscription("t"))],
    require_known_member_id=False,
)


async def test_driver_join_sync_persist_and_restart(store):
    from kafscale.metadata.store import CommittedOffset

    coord = make_coordinator(store)
    await coord.start()
    res = await coord.join("g", member_id="", **JOIN_DEFAULTS)  # completes through the real timer
    assert res.error is E.none and res.generation_id == 1
    mid = res.member_id
    sync = await coord.sync("g", member_id=mid, group_instance_id=None, generation_id=1, protocol_type=None,
                            protocol_name=None, assignments={mid: b"A"})
    assert sync.assignment == b"A"
    err = await coord.commit_offsets("g", member_id=mid, group_instance_id=None, generation_id=1,
                                     offsets={("t", 0): CommittedOffset(42, 3, "meta")}, api_version=8)
    assert err is E.none
    await coord.stop()

    again = make_coordinator(store)
    await again.start()
    described = await again.describe("g")
    assert described["group_state"] == "Stable" and described["members"][0]["member_id"] == mid
    assert described["members"][0]["member_assignment"] == b"A"
    assert await again.heartbeat("g", member_id=mid, group_instance_id=None, generation_id=1) is E.none
    offsets = await again.fetch_offsets("g")
    assert offsets[("t", 0)].offset == 42 and offsets[("t", 0)].metadata == "meta"
    assert offsets[("t", 0)].leader_epoch == 3
    await again.stop()


async def _described_empty(coord, group: str) -> dict | None:
    described = await coord.describe(group)
    return described if described["group_state"] == "Empty" else None


async def test_driver_timers_expire_a_silent_member_and_persist_the_empty_group(store):
    import asyncio

    coord = make_coordinator(store, group_min_session_timeout_ms=50)
    await coord.start()
    kw = dict(JOIN_DEFAULTS, session_timeout_ms=200, rebalance_timeout_ms=200)
    res = await coord.join("short", member_id="", **kw)
    await coord.sync("short", member_id=res.member_id, group_instance_id=None, generation_id=res.generation_id,
                     protocol_type=None, protocol_name=None, assignments={})
    assert (await coord.describe("short"))["group_state"] == "Stable"
    await asyncio.sleep(0.15)
    assert await coord.heartbeat("short", member_id=res.member_id, group_instance_id=None,
                                 generation_id=res.generation_id) is E.none
    await asyncio.sleep(0.15)
    assert (await coord.describe("short"))["group_state"] == "Stable", "the heartbeat kept it alive"
    described = await wait_until_async(lambda: _described_empty(coord, "short"), 5, "the silent member to expire")
    assert described["group_state"] == "Empty" and described["members"] == []
    doc = await store.get_group("short")
    assert doc["members"] == [] and doc["generation"] == res.generation_id + 1
    await coord.stop()


async def test_driver_simple_group_commits_and_unknown_group_errors(store):
    from kafscale.metadata.store import CommittedOffset

    coord = make_coordinator(store)
    await coord.start()
    kw = dict(member_id="", group_instance_id=None, offsets={("t", 1): CommittedOffset(7)})
    assert await coord.commit_offsets("simple", generation_id=-1, api_version=8, **kw) is E.none
    assert await coord.list_groups() == [("simple", "", "Empty")]
    assert await coord.commit_offsets("nogroup", generation_id=3, api_version=8, **kw) is E.illegal_generation
    assert await coord.commit_offsets("nogroup", generation_id=3, api_version=9, **kw) is E.group_id_not_found
    assert await coord.heartbeat("nogroup", member_id="m", group_instance_id=None, generation_id=1) is E.unknown_member_id
    assert (await coord.join("nogroup", member_id="m", **JOIN_DEFAULTS)).error is E.unknown_member_id
    assert await coord.leave("nogroup", [("m", None)]) == (E.none, [E.unknown_member_id])
    assert await coord.delete_group("nogroup") is E.group_id_not_found
    assert await coord.describe("nogroup") is None
    assert [g[0] for g in await coord.list_groups()] == ["simple"], "failed lookups create nothing"
    assert await coord.delete_group("simple") is E.none
    assert await coord.fetch_offsets("simple") == {}
    await coord.stop()


async def test_driver_logs_every_refused_commit(store, caplog):
    from kafscale.metadata.store import CommittedOffset

    coord = make_coordinator(store)
    await coord.start()
    res = await coord.join("lg", member_id="", **JOIN_DEFAULTS)
    mid, gen = res.member_id, res.generation_id
    await coord.sync("lg", member_id=mid, group_instance_id=None, generation_id=gen, protocol_type=None,
                     protocol_name=None, assignments={mid: b""})
    kw = dict(offsets={("t", 0): CommittedOffset(3)}, api_version=3)
    caplog.set_level("INFO", logger="kafscale.groups")
    assert await coord.commit_offsets("lg", member_id="", group_instance_id=None, generation_id=-1,
                                      pending_producer_id=7, **kw) is E.none
    assert not [r for r in caplog.records if "refused" in r.getMessage()]
    assert await coord.commit_offsets("lg", member_id=mid, group_instance_id=None, generation_id=gen + 4,
                                      pending_producer_id=7, **kw) is E.illegal_generation
    assert await coord.commit_offsets("lg", member_id="ghost", group_instance_id=None, generation_id=gen, **kw) is E.unknown_member_id
    assert await coord.commit_offsets("lg", member_id="", group_instance_id=None, generation_id=-1, **kw) is E.unknown_member_id
    assert await coord.commit_offsets("none", member_id="m", group_instance_id=None, generation_id=2,
                                      pending_producer_id=7, **kw) is E.illegal_generation
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert all(r.levelname == "INFO" for r in caplog.records if "refused" in r.getMessage())
    assert lines == [
        f"TxnOffsetCommit to group 'lg' by member {mid!r} refused with ILLEGAL_GENERATION: "
        f"generation {gen + 4} is not the group's current generation {gen}",
        f"OffsetCommit to group 'lg' by member 'ghost' refused with UNKNOWN_MEMBER_ID: "
        f"not a member of the group (state Stable, generation {gen})",
        "OffsetCommit to group 'lg' by member '' refused with UNKNOWN_MEMBER_ID: "
        "no member given and the group has members (state Stable)",
        "TxnOffsetCommit to group 'none' by member 'm' refused with ILLEGAL_GENERATION: "
        "generation 2 given but the group does not exist",
    ]
    await coord.stop()


async def test_driver_txn_offset_commit_to_a_consumer_protocol_group(store, caplog):
    """KIP-848 groups: a TxnOffsetCommit with a stale member epoch gets ILLEGAL_GENERATION
    (Kafka's transactional commit has no STALE_MEMBER_EPOCH), an unknown member
    UNKNOWN_MEMBER_ID, one without member while the group has members UNKNOWN_MEMBER_ID."""
    from kafscale.groups.consumer_group import HeartbeatRequest
    from kafscale.metadata.store import CommittedOffset

    coord = make_coordinator(store)
    await coord.start()

    async def lookup(names):
        return {n: ("00000000-0000-0000-0000-00000000000a", 2) for n in names}

    res = await coord.consumer.heartbeat("cg", HeartbeatRequest(
        member_id="m1", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=frozenset()), lookup)
    epoch = res.member_epoch
    kw = dict(group_instance_id=None, offsets={("t", 0): CommittedOffset(4)}, api_version=3, pending_producer_id=9)
    caplog.set_level("INFO", logger="kafscale.groups")
    assert await coord.commit_offsets("cg", member_id="m1", generation_id=epoch, **kw) is E.none
    assert await coord.commit_offsets("cg", member_id="m1", generation_id=epoch - 1, **kw) is E.illegal_generation
    assert await coord.commit_offsets("cg", member_id="ghost", generation_id=epoch, **kw) is E.unknown_member_id
    assert await coord.commit_offsets("cg", member_id="", generation_id=-1, **kw) is E.unknown_member_id
    refused = [r.getMessage() for r in caplog.records if " refused with " in r.getMessage()]
    assert [m.split(" refused with ")[1].split(":")[0] for m in refused] == ["ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "UNKNOWN_MEMBER_ID"]
    assert all(m.startswith("TxnOffsetCommit to group 'cg' by member ") for m in refused)
    await coord.stop()


async def test_driver_offset_retention_for_empty_groups(store):
    from kafscale.metadata.store import CommittedOffset

    clock = FakeClock()
    coord = make_coordinator(store, clock=clock, retention_minutes=1)
    await coord.start()
    kw = dict(member_id="", group_instance_id=None, generation_id=-1, api_version=8)
    await coord.commit_offsets("old", offsets={("t", 0): CommittedOffset(1)}, **kw)
    clock.now += 30_000
    await coord.commit_offsets("young", offsets={("t", 0): CommittedOffset(1)}, **kw)
    clock.now += 30_000
    assert await coord.expire_offsets() == 1
    assert await coord.fetch_offsets("old") == {} and [g[0] for g in await coord.list_groups()] == ["young"]
    assert await store.get_group("old") is None
    clock.now += 30_000
    assert await coord.expire_offsets() == 1 and await coord.list_groups() == []
    await coord.stop()


async def test_driver_delete_non_empty_and_offset_delete(store):
    from kafscale.metadata.store import CommittedOffset

    coord = make_coordinator(store)
    await coord.start()
    res = await coord.join("g", member_id="", **JOIN_DEFAULTS)
    mid = res.member_id
    await coord.sync("g", member_id=mid, group_instance_id=None, generation_id=1, protocol_type=None,
                     protocol_name=None, assignments={})
    offsets = {("t", 0): CommittedOffset(5), ("u", 0): CommittedOffset(6)}
    await coord.commit_offsets("g", member_id=mid, group_instance_id=None, generation_id=1, offsets=offsets,
                               api_version=8)
    assert await coord.delete_group("g") is E.non_empty_group
    error, results = await coord.delete_offsets("g", [("t", 0), ("u", 0)])
    assert error is E.none
    assert results == {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none}
    assert set(await coord.fetch_offsets("g")) == {("t", 0)}
    assert await coord.delete_offsets("absent", [("t", 0)]) == (E.group_id_not_found, {})
    await coord.stop()


# -- handlers: every version encodes ----------------------------------------------------------------


class _FakeBroker:
    def __init__(self, store, data_dir):
        from kafscale.broker.config import BrokerConfig
        from kafscale.cluster.membership import BrokerNode, SingleNodeCluster
        from kafscale.storage.logs import LogManager
        from kafscale.storage.local_store import LocalObjectStore

        self.metadata = store
        self.cluster = SingleNodeCluster(BrokerNode(0, "127.0.0.1", 9092))
        self.groups = make_coordinator(store)
        # the real log manager (never started): requests by topic id resolve through it
        self.logs = LogManager(store, LocalObjectStore(data_dir), BrokerConfig(data_dir=str(data_dir), http=""), self.cluster)


def _ctx(broker, api_key, version):
    from kafscale.broker.router import RequestContext
    from kafscale.protocol.codec import RequestHeader

    return RequestContext(broker, RequestHeader(api_key, version, 1, "unit", 0), "127.0.0.1:5000")


async def _call(broker, api_key, version, **fields):
    from kafscale.broker.handlers import groups as handlers
    from kafscale.protocol.codec import encode_response, kio_versions, schema

    handler = {8: handlers.offset_commit, 9: handlers.offset_fetch, 10: handlers.find_coordinator,
               11: handlers.join_group, 12: handlers.heartbeat, 13: handlers.leave_group,
               14: handlers.sync_group, 15: handlers.describe_groups, 16: handlers.list_groups,
               42: handlers.delete_groups, 47: handlers.offset_delete}[api_key]
    assert kio_versions(api_key)[0] <= version <= kio_versions(api_key)[1]
    req = handlers.build(schema(api_key, version, "request"), **fields)
    resp = await handler(_ctx(broker, api_key, version), req)
    assert type(resp) is schema(api_key, version, "response")
    assert encode_response(api_key, version, 1, resp)[0]  # serializes
    return resp


@pytest.mark.parametrize("api_key", [8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47])
async def test_handlers_answer_every_version(store, api_key, tmp_path):
    from kafscale.metadata.store import CommittedOffset, TopicMeta
    from kafscale.protocol.codec import kio_versions

    await store.create_topic(TopicMeta("t", 2))
    topic_id = (await store.get_topic("t")).uuid
    broker = _FakeBroker(store, tmp_path)
    await broker.groups.start()
    lo, hi = kio_versions(api_key)
    for v in range(lo, hi + 1):
        if api_key == 10:
            r = await _call(broker, 10, v, key="g", key_type=0, coordinator_keys=("g", "h"))
            entries = r.coordinators if v >= 4 else [r]
            assert all(e.error_code is E.none and e.node_id == 0 and e.port == 9092 for e in entries)
            r = await _call(broker, 10, v, key="tx", key_type=1, coordinator_keys=("tx",))
            if v >= 1:
                entries = r.coordinators if v >= 4 else [r]
                assert all(e.error_code is E.invalid_request for e in entries)
        elif api_key == 11:
            r = await _call(broker, 11, v, group_id="", member_id="", protocol_type="consumer",
                            session_timeout=SESSION, rebalance_timeout=REBALANCE, protocols=[])
            assert r.error_code is E.invalid_group_id
            r = await _call(broker, 11, v, group_id=f"j{v}", member_id="", protocol_type="consumer",
                            session_timeout=SESSION, rebalance_timeout=REBALANCE,
                            protocols=[dict(name="range", metadata=subscription("t"))])
            if v >= 4:
                assert r.error_code is E.member_id_required and r.member_id
                r = await _call(broker, 11, v, group_id=f"j{v}", member_id=r.member_id, protocol_type="consumer",
                                session_timeout=SESSION, rebalance_timeout=REBALANCE,
                                protocols=[dict(name="range", metadata=subscription("t"))])
            assert r.error_code is E.none and r.generation_id == 1 and r.leader == r.member_id
            assert r.members[0].metadata == subscription("t") and r.protocol_name == "range"
            assert r.member_id.startswith("unit-")
        elif api_key == 12:
            r = await _call(broker, 12, v, group_id="g", generation_id=1, member_id="m")
            assert r.error_code is E.unknown_member_id
        elif api_key == 13:
            r = await _call(broker, 13, v, group_id="g", member_id="m", members=[dict(member_id="m")])
            if v >= 3:
                assert r.error_code is E.none and r.members[0].error_code is E.unknown_member_id
            else:
                assert r.error_code is E.unknown_member_id
        elif api_key == 14:
            r = await _call(broker, 14, v, group_id="g", generation_id=1, member_id="m", assignments=[])
            assert r.error_code is E.unknown_member_id
        elif api_key == 8:
            topic = dict(name="t", topic_id=topic_id, partitions=[
                dict(partition_index=0, committed_offset=10 + v, committed_metadata="md"),
                dict(partition_index=9, committed_offset=1, committed_metadata=None)])
            r = await _call(broker, 8, v, group_id="c", generation_id_or_member_epoch=-1, member_id="",
                            topics=[topic])
            errs = [p.error_code for p in r.topics[0].partitions]
            assert errs == [E.none, E.unknown_topic_or_partition]
        elif api_key == 9:
            await broker.groups.commit_offsets("f", member_id="", group_instance_id=None, generation_id=-1,
                                               offsets={("t", 1): CommittedOffset(77, 2, "x")}, api_version=8)
            topics = [dict(name="t", topic_id=topic_id, partition_indexes=(0, 1))]
            r = await _call(broker, 9, v, group_id="f", topics=topics,
                            groups=[dict(group_id="f", topics=topics), dict(group_id="f", topics=None)])
            tops = r.groups[0].topics if v >= 8 else r.topics
            parts = {p.partition_index: p for p in tops[0].partitions}
            assert parts[0].committed_offset == -1 and parts[0].metadata == ""
            assert parts[1].committed_offset == 77 and parts[1].metadata == "x"
            if v >= 8:
                assert [p.committed_offset for p in r.groups[1].topics[0].partitions] == [77]
        elif api_key == 15:
            r = await _call(broker, 15, v, groups=("nope",), include_authorized_operations=True)
            if v >= 6:
                assert r.groups[0].error_code is E.group_id_not_found
            else:
                assert r.groups[0].error_code is E.none and r.groups[0].group_state == "Dead"
        elif api_key == 16:
            await broker.groups.commit_offsets("lg", member_id="", group_instance_id=None, generation_id=-1,
                                               offsets={}, api_version=8)
            r = await _call(broker, 16, v, states_filter=("empty",), types_filter=())
            assert "lg" in [g.group_id for g in r.groups]
            if v >= 4:
                r = await _call(broker, 16, v, states_filter=("Stable",))
                assert "lg" not in [g.group_id for g in r.groups]
        elif api_key == 42:
            r = await _call(broker, 42, v, groups_names=("none",))
            assert r.results[0].error_code is E.group_id_not_found
        elif api_key == 47:
            r = await _call(broker, 47, v, group_id="none",
                            topics=[dict(name="t", partitions=[dict(partition_index=0)])])
            assert r.error_code is E.group_id_not_found
    await broker.groups.stop()
