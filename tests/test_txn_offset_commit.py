"""TxnOffsetCommit against a consumer group with members, over raw frames on the session
broker, as Apache Kafka's classic group coordinator (issue #31): v0-v2 carry no member id or
generation, so the offsets of a transaction are taken without them whatever the group's
state (aiokafka's send_offsets_to_transaction sends v0); from v3 on (KIP-447) a member id or
generation given is checked, a stale generation gets ILLEGAL_GENERATION and an unknown
member UNKNOWN_MEMBER_ID. Every refusal is logged at INFO with group, member and reason.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until
from tests.test_produce_fetch import create_topic
from tests.test_txn_coordinator import add_offsets, end, fetch_offset, init, txn_offset_commit

JOIN_GROUP, SYNC_GROUP, OFFSET_COMMIT, DESCRIBE_GROUPS = 11, 14, 8, 15
TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE = 5  # transactions v2 (the broker finalizes transaction.version 2)


def join_alone(c: RawClient, group: str, topic: str) -> tuple[str, int]:
    """One dynamic member forms a Stable group: (member id, generation)."""
    meta = b"\x00\x00\x00\x00\x00\x01" + len(topic).to_bytes(2, "big") + topic.encode() + b"\xff\xff\xff\xff"
    protocol = req(JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=meta)

    def join(member_id: str):
        return c.request(JOIN_GROUP, 5, req(JOIN_GROUP, 5, group_id=group, session_timeout=120_000, rebalance_timeout=120_000,
                                            member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                            protocols=(protocol,)))

    first = join("")
    assert error_code(first.error_code) == ErrorCode.member_id_required
    joined = join(first.member_id)
    assert error_code(joined.error_code) == 0 and joined.leader == joined.member_id
    mid, gen = joined.member_id, joined.generation_id
    assignment = req(SYNC_GROUP, 3, "SyncGroupRequestAssignment", member_id=mid, assignment=b"")
    synced = c.request(SYNC_GROUP, 3, req(SYNC_GROUP, 3, group_id=group, generation_id=gen, member_id=mid,
                                          group_instance_id=None, assignments=(assignment,)))
    assert error_code(synced.error_code) == 0
    return mid, gen


def group_state(c: RawClient, group: str) -> tuple[str, list[str]]:
    g = c.request(DESCRIBE_GROUPS, 5, req(DESCRIBE_GROUPS, 5, groups=(group,), include_authorized_operations=False)).groups[0]
    return g.group_state, [m.member_id for m in g.members]


def committed(c: RawClient, group: str, topic: str) -> int:
    """The group's offset once no transaction holds one pending (EndTxn completes after its answer)."""
    error, offset = wait_until(lambda: (got := fetch_offset(c, group, topic, require_stable=True))[0] == 0 and got, 10,
                               f"the committed offset of {group}")
    return offset


def begin(c: RawClient, tid: str, group: str, version: int) -> tuple[int, int]:
    """A producer id for `tid`, and the group in its transaction as clients of that version do it."""
    err, pid, epoch = init(c, tid)
    assert err == 0
    if version < TXN_OFFSET_COMMIT_ADDS_GROUP_SINCE:
        assert add_offsets(c, tid, pid, epoch, group) == 0
    return pid, epoch


def test_txn_offset_commit_without_member_goes_into_a_group_with_members(broker):
    topic, group = f"tocm-{uuid.uuid4().hex[:8]}", f"tocm-g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    with RawClient(broker.bootstrap) as c:
        mid, gen = join_alone(c, group, topic)
        # An OffsetCommit naming no member is refused while the group has members ...
        p = req(OFFSET_COMMIT, 2, "OffsetCommitRequestPartition", partition_index=0, committed_offset=1, committed_metadata="")
        t = req(OFFSET_COMMIT, 2, "OffsetCommitRequestTopic", name=topic, partitions=(p,))
        r = c.request(OFFSET_COMMIT, 2, req(OFFSET_COMMIT, 2, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                            retention_time=-1, topics=(t,)))
        assert error_code(r.topics[0].partitions[0].error_code) == ErrorCode.unknown_member_id
        # ... a transaction's offsets are not (v0-v2 cannot name one; v3+ need not).
        for version in range(6):
            tid = f"{group}-v{version}"
            pid, epoch = begin(c, tid, group, version)
            offset = 100 + version
            assert txn_offset_commit(c, tid, pid, epoch, group, topic, offset, version=version) == 0, version
            assert fetch_offset(c, group, topic, require_stable=True)[0] == ErrorCode.unstable_offset_commit
            assert end(c, tid, pid, epoch, commit=True) == 0
            assert committed(c, group, topic) == offset
        assert group_state(c, group) == ("Stable", [mid]), "the member is untouched"
    assert f"OffsetCommit to group {group!r} by member '' refused with UNKNOWN_MEMBER_ID" in broker.log_text()


def test_txn_offset_commit_v3_plus_checks_member_and_generation_and_logs_refusals(broker):
    topic, group = f"tocg-{uuid.uuid4().hex[:8]}", f"tocg-g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    with RawClient(broker.bootstrap) as c:
        mid, gen = join_alone(c, group, topic)
        for version in (3, 4, 5):
            tid = f"{group}-v{version}"
            pid, epoch = begin(c, tid, group, version)
            stale = txn_offset_commit(c, tid, pid, epoch, group, topic, 1, version=version, member_id=mid, generation_id=gen - 1)
            assert stale == ErrorCode.illegal_generation, version
            ahead = txn_offset_commit(c, tid, pid, epoch, group, topic, 2, version=version, member_id=mid, generation_id=gen + 1)
            assert ahead == ErrorCode.illegal_generation, version
            ghost = txn_offset_commit(c, tid, pid, epoch, group, topic, 3, version=version, member_id=f"ghost-v{version}",
                                      generation_id=gen)
            assert ghost == ErrorCode.unknown_member_id, version
            good = 10 + version
            assert txn_offset_commit(c, tid, pid, epoch, group, topic, good, version=version, member_id=mid, generation_id=gen) == 0
            assert end(c, tid, pid, epoch, commit=True) == 0
            assert committed(c, group, topic) == good, "only the accepted offsets count"
        # A group that does not exist, with a generation: ILLEGAL_GENERATION (Kafka, all versions).
        tid = f"{group}-nogroup"
        pid, epoch = begin(c, tid, f"{group}-none", 3)
        assert txn_offset_commit(c, tid, pid, epoch, f"{group}-none", topic, 5, version=3, member_id="m-none",
                                 generation_id=1) == ErrorCode.illegal_generation
        assert end(c, tid, pid, epoch, commit=False) == 0
        assert group_state(c, group) == ("Stable", [mid])

    def logged() -> list[str] | None:
        lines = [line for line in broker.log_text().splitlines() if " refused with " in line and group in line]
        return lines if len(lines) >= 10 else None  # 3 versions x 3 refusals, and the group that does not exist

    lines = wait_until(logged, 10, "the refusals in the broker log")
    assert all(" INFO kafscale.groups: TxnOffsetCommit to group " in line for line in lines), lines
    stale = f"by member {mid!r} refused with ILLEGAL_GENERATION: generation {gen - 1} is not the group's current generation {gen}"
    ahead = f"by member {mid!r} refused with ILLEGAL_GENERATION: generation {gen + 1} is not the group's current generation {gen}"
    assert sum(stale in line for line in lines) == 3 and sum(ahead in line for line in lines) == 3, lines
    for version in (3, 4, 5):
        assert sum(f"by member 'ghost-v{version}' refused with UNKNOWN_MEMBER_ID: not a member of the group" in line
                   for line in lines) == 1, lines
    assert any(f"group '{group}-none' by member 'm-none' refused with ILLEGAL_GENERATION: generation 1 given but the group "
               "does not exist" in line for line in lines), lines
