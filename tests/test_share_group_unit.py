"""The share group state machine (groups/share_group.py) and the simple assignor, without
I/O: joins, leaves, epochs, Kafka's refusals, assignment sharing, session timeouts."""

from __future__ import annotations

import pytest

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import MemberSpec, simple
from kafscale.groups.share_group import ShareGroup, ShareGroupState, ShareHeartbeatRequest, validate_request
from kafscale.share.settings import ShareGroupSettings, ShareSettings

T1 = "00000000-0000-0000-0000-000000000001"
T2 = "00000000-0000-0000-0000-000000000002"
TOPICS = {"orders": (T1, 1), "events": (T2, 4)}


def beat(g: ShareGroup, now: float, member: str, epoch: int, topics=None, max_size: int = 200, known=TOPICS):
    req = ShareHeartbeatRequest(member_id=member, member_epoch=epoch,
                                subscribed_topic_names=tuple(topics) if topics is not None else None)
    validate_request(g.group_id, req)
    return g.heartbeat(now, req, known, session_timeout_ms=1_000, heartbeat_interval_ms=100, max_size=max_size)


def refused(code: ErrorCode, fn, *args, **kw) -> str:
    with pytest.raises(KafkaError) as e:
        fn(*args, **kw)
    assert e.value.code is code, e.value
    return e.value.message


def test_join_gets_every_partition_of_a_small_topic_and_shares_it():
    g = ShareGroup("g")
    assert g.state is ShareGroupState.EMPTY
    a = beat(g, 0, "a", 0, ["orders"])
    assert (a.member_epoch, a.assignment, a.heartbeat_interval_ms) == (1, frozenset({(T1, 0)}), 100)
    b = beat(g, 0, "b", 0, ["orders"])
    assert (b.member_epoch, b.assignment) == (2, frozenset({(T1, 0)}))
    assert g.state is ShareGroupState.STABLE and g.group_epoch == 2
    # a moves to the new epoch without any revocation; its partition did not change, so none is sent
    again = beat(g, 1, "a", 1)
    assert (again.member_epoch, again.assignment) == (2, None)


def test_partitions_are_spread_when_members_are_fewer():
    g = ShareGroup("g")
    beat(g, 0, "a", 0, ["events"])
    b = beat(g, 0, "b", 0, ["events"])
    a = beat(g, 0, "a", 1)
    assert a.assignment | b.assignment == {(T2, p) for p in range(4)}
    assert not a.assignment & b.assignment and len(a.assignment) == len(b.assignment) == 2


def test_epochs_and_refusals_as_kafka():
    g = ShareGroup("g")
    beat(g, 0, "a", 0, ["orders"])
    assert "greater" in refused(ErrorCode.fenced_member_epoch, beat, g, 0, "a", 5)
    beat(g, 0, "b", 0, ["orders"])
    assert "smaller" in refused(ErrorCode.fenced_member_epoch, beat, g, 0, "b", 1)
    refused(ErrorCode.unknown_member_id, beat, g, 0, "nobody", 1)
    refused(ErrorCode.invalid_request, beat, g, 0, "", 0, ["orders"])
    refused(ErrorCode.invalid_request, beat, g, 0, "c", 0)  # no subscription on join
    refused(ErrorCode.invalid_request, beat, g, 0, "c", -2)
    refused(ErrorCode.group_max_size_reached, beat, g, 0, "c", 0, ["orders"], max_size=2)


def test_leave_and_session_timeout_remove_members():
    g = ShareGroup("g")
    beat(g, 0, "a", 0, ["orders"])
    beat(g, 0, "b", 0, ["orders"])
    left = beat(g, 10, "a", -1)
    assert left.member_epoch == -1 and set(g.members) == {"b"}
    refused(ErrorCode.unknown_member_id, beat, g, 10, "a", -1)
    assert g.next_deadline() == 1_000
    assert g.tick(999) == []
    assert g.tick(1_000) == [("b", "session timeout")] and g.state is ShareGroupState.EMPTY


def test_subscription_change_and_new_topics_move_the_epoch():
    g = ShareGroup("g")
    beat(g, 0, "a", 0, ["orders", "later"])
    epoch = g.group_epoch
    r = beat(g, 0, "a", epoch, known={**TOPICS, "later": ("00000000-0000-0000-0000-000000000003", 2)})
    assert r.member_epoch == epoch + 1 and len(r.assignment) == 3
    r = beat(g, 0, "a", epoch + 1, ["events"])
    assert r.assignment == {(T2, p) for p in range(4)}


def test_doc_round_trip():
    g = ShareGroup("g")
    beat(g, 0, "a", 0, ["events"])
    beat(g, 0, "b", 0, ["events"])
    h = ShareGroup.from_doc("g", g.to_doc(), now=50, session_timeout_ms=1_000)
    assert h.to_doc() == g.to_doc() and h.next_deadline() == 1_050


def test_simple_assignor_shares_partitions_among_more_members():
    spec = MemberSpec(frozenset({T2}), frozenset())
    out = simple({m: spec for m in "abcdefgh"}, {T2: 4})
    assert all(len(tps) == 1 for tps in out.values())
    per_partition = [sum((T2, p) in tps for tps in out.values()) for p in range(4)]
    assert per_partition == [2, 2, 2, 2]
    # sticky: a member keeps its partition when another joins
    again = simple({**{m: MemberSpec(frozenset({T2}), out[m]) for m in out}, "i": spec}, {T2: 4})
    assert all(again[m] == out[m] for m in out)


def test_settings_resolve_group_overrides():
    defaults = ShareGroupSettings(record_lock_duration_ms=2_000)
    assert ShareGroupSettings().delivery_count_limit == 5

    async def configs(group_id):
        return {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "15000"} if group_id == "x" else {}

    import asyncio
    settings = ShareSettings(defaults, configs)
    x = asyncio.run(settings.for_group("x"))
    assert (x.auto_offset_reset, x.record_lock_duration_ms, x.delivery_count_limit) == ("earliest", 15_000, 5)
    assert asyncio.run(settings.for_group("y")) == defaults
