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
from tests.support.wait import wait_until, wait_until_async
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


def test_aiokafka_consume_transform_produce_in_transactions_from_a_group(broker):
    """aiokafka 0.14, as Faust's exactly-once uses it: a subscribed group member reads, a
    transactional producer writes the transformed records and sends the consumed offsets with
    send_offsets_to_transaction (TxnOffsetCommit v0, no member id), ~60 records a transaction;
    one transaction in the middle is aborted and its records read again."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    src, dst = f"eos-in-{uuid.uuid4().hex[:8]}", f"eos-out-{uuid.uuid4().hex[:8]}"
    group = f"eos-g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, src, partitions=2)
    create_topic(broker.bootstrap, dst, partitions=2)
    n = 500

    async def go():
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await plain.start()
        try:
            for i in range(n):
                await plain.send(src, key=b"k%d" % (i % 7), value=b"in-%d" % i, partition=i % 2)
            await plain.flush()
        finally:
            await plain.stop()

        consumer = AIOKafkaConsumer(src, bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", isolation_level="read_committed")
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"{group}-tx")
        await consumer.start()
        await producer.start()
        done, transactions, aborted = 0, 0, []
        try:
            deadline = asyncio.get_running_loop().time() + 90
            while done < n:
                assert asyncio.get_running_loop().time() < deadline, f"transformed {done} of {n} records"
                batch = await consumer.getmany(timeout_ms=500, max_records=60)
                records = [r for recs in batch.values() for r in recs]
                if not records:
                    continue
                abort = transactions == 3
                await producer.begin_transaction()
                for r in records:
                    value = (b"aborted-" if abort else b"out-") + r.value[len(b"in-"):]
                    await producer.send(dst, key=r.key, value=value, partition=r.partition)
                offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items()}
                await producer.send_offsets_to_transaction(offsets, group)
                if abort:
                    await producer.abort_transaction()
                    aborted += [r.value for r in records]
                    for tp, recs in batch.items():  # read them again, as an exactly-once app does
                        consumer.seek(tp, recs[0].offset)
                else:
                    await producer.commit_transaction()
                    done += len(records)
                transactions += 1
            ends = await consumer.end_offsets([TopicPartition(src, p) for p in (0, 1)])
            assert {tp.partition: end for tp, end in ends.items()} == {0: n // 2, 1: n // 2}

            async def committed():
                got = {p: await consumer.committed(TopicPartition(src, p)) for p in (0, 1)}
                return got if got == {0: n // 2, 1: n // 2} else None

            # The last transaction's offsets are moved in once its markers are written, just after EndTxn's answer.
            assert await wait_until_async(committed, 10, "the group's offsets at the input's end")
        finally:
            await producer.stop()
            await consumer.stop()
        assert aborted and transactions >= 9, (transactions, len(aborted))

        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            listed = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        assert {tp.partition: meta.offset for tp, meta in listed.items()} == {0: n // 2, 1: n // 2}

        async def read(isolation: str) -> list[bytes]:
            c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation, enable_auto_commit=False)
            await c.start()
            try:
                tps = [TopicPartition(dst, p) for p in (0, 1)]
                c.assign(tps)
                await c.seek_to_beginning()
                ends = await c.end_offsets(tps)
                out = []
                deadline = asyncio.get_running_loop().time() + 30
                while any(position < ends[tp] for tp, position in [(tp, await c.position(tp)) for tp in tps]):
                    assert asyncio.get_running_loop().time() < deadline, f"read {len(out)} records ({isolation})"
                    for recs in (await c.getmany(timeout_ms=500)).values():
                        out += [r.value for r in recs]
                return out
            finally:
                await c.stop()

        read_committed = await read("read_committed")
        assert sorted(read_committed) == sorted(b"out-%d" % i for i in range(n)), "each transformed record exactly once"
        everything = await read("read_uncommitted")
        assert sorted(v for v in everything if v.startswith(b"aborted-")) == sorted(b"aborted-" + v[3:] for v in aborted)

    asyncio.run(go())
