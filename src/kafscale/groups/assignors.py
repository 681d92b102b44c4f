"""Server-side assignors of consumer-protocol groups (KIP-848): `uniform` and `range`.

An assignor maps each member to the partitions it should own (the group's target
assignment). Both are pure functions of the members' subscriptions, the topics' partition
counts and the current target, and both are sticky: a partition stays where it is unless
balance requires it to move, so a join or a leave moves as few partitions as possible
(every move costs a revocation round trip).

- `uniform` (Kafka's default): the partitions of each member's subscribed topics spread
  so that member loads differ by at most one where subscriptions allow it.
- `range`: per topic, the subscribed members (sorted by member id) get contiguous ranges
  of partitions, the first `partitions % members` one partition more; members subscribed
  to co-partitioned topics get the same partition numbers of each.

Partitions are `(topic_id, partition)` pairs; topic ids are strings (UUIDs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

TopicPartition = tuple[str, int]


def partitions_doc(tps) -> dict[str, list[int]]:
    """Partitions as stored in a group's document: topic id -> sorted partition numbers."""
    out: dict[str, list[int]] = {}
    for topic, p in sorted(tps):
        out.setdefault(topic, []).append(p)
    return out


def partitions_of(doc: Mapping[str, list[int]]) -> frozenset[TopicPartition]:
    return frozenset((t, p) for t, ps in doc.items() for p in ps)


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of a member: the topic ids it subscribes to (that exist) and
    its partitions in the current target assignment."""

    subscribed: frozenset[str]
    current: frozenset[TopicPartition]


def uniform(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, frozenset[TopicPartition]]:
    """Balanced and sticky. Each member's quota is its fair share of the partitions it can
    take; it keeps current partitions up to that quota, then free partitions go one at a
    time to the eligible member with the fewest (ties: member id), which for identical
    subscriptions gives counts that differ by at most one."""
    if not members:
        return {}
    subscribers: dict[str, list[str]] = {}
    for mid in sorted(members):
        for topic in members[mid].subscribed:
            if topic in partitions:
                subscribers.setdefault(topic, []).append(mid)
    all_partitions = [(t, p) for t in sorted(subscribers) for p in range(partitions[t])]
    # Quota: the partitions a member could take, shared with the members that could take
    # them too. For identical subscriptions this is total / members, rounded up for the
    # first `total % members` members (the ones keeping the most, to move the fewest).
    reachable = {mid: sum(partitions[t] for t in members[mid].subscribed if t in subscribers) for mid in members}
    n_identical = len(members) if len({members[m].subscribed for m in members}) == 1 else 0
    owned: dict[str, list[TopicPartition]] = {mid: [] for mid in members}
    taken: set[TopicPartition] = set()
    if n_identical:
        total = len(all_partitions)
        base, extra = divmod(total, n_identical)
        order = sorted(members, key=lambda m: (-len(members[m].current), m))
        quota = {mid: base + (1 if i < extra else 0) for i, mid in enumerate(order)}
    else:
        quota = {mid: reachable[mid] for mid in members}
    valid = set(all_partitions)
    for mid in sorted(members):
        spec = members[mid]
        for tp in sorted(spec.current):
            if tp in valid and tp[0] in spec.subscribed and tp not in taken and len(owned[mid]) < quota[mid]:
                owned[mid].append(tp)
                taken.add(tp)
    for tp in all_partitions:
        if tp in taken:
            continue
        eligible = [m for m in subscribers[tp[0]]]
        mid = min(eligible, key=lambda m: (len(owned[m]), m))
        owned[mid].append(tp)
        taken.add(tp)
    if not n_identical:
        _rebalance(owned, members, subscribers)
    return {mid: frozenset(tps) for mid, tps in owned.items()}


def _rebalance(owned: dict[str, list[TopicPartition]], members: Mapping[str, MemberSpec],
               subscribers: Mapping[str, list[str]]) -> None:
    """Heterogeneous subscriptions: move partitions from the most to the least loaded member
    that may take them until no move lowers the spread."""
    moved = True
    while moved:
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[giver], reverse=True):
                takers = [m for m in subscribers[tp[0]] if len(owned[m]) + 1 < len(owned[giver])]
                if takers:
                    taker = min(takers, key=lambda m: (len(owned[m]), m))
                    owned[giver].remove(tp)
                    owned[taker].append(tp)
                    moved = True
                    break
            if moved:
                break


def range_(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, frozenset[TopicPartition]]:
    """Per topic: contiguous ranges over its subscribers sorted by member id."""
    owned: dict[str, set[TopicPartition]] = {mid: set() for mid in members}
    topics = sorted({t for spec in members.values() for t in spec.subscribed if t in partitions})
    for topic in topics:
        subs = sorted(m for m in members if topic in members[m].subscribed)
        base, extra = divmod(partitions[topic], len(subs))
        start = 0
        for i, mid in enumerate(subs):
            count = base + (1 if i < extra else 0)
            owned[mid].update((topic, p) for p in range(start, start + count))
            start += count
    return {mid: frozenset(tps) for mid, tps in owned.items()}


def simple(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, frozenset[TopicPartition]]:
    """Share groups' assignor (Kafka's `simple`): partitions are shared, not owned. Per
    topic, with no more subscribers than partitions each partition goes to one member
    (counts differing by at most one); with more subscribers than partitions each member
    gets one partition and each partition is shared by as equal a number of members as can
    be (so every member of a group larger than a one-partition topic reads that partition).
    Sticky: a member keeps what it had while that stays within balance."""
    owned: dict[str, set[TopicPartition]] = {mid: set() for mid in members}
    for topic in sorted({t for spec in members.values() for t in spec.subscribed if t in partitions}):
        n = partitions[topic]
        subs = sorted(m for m in members if topic in members[m].subscribed)
        if not n:
            continue
        if len(subs) <= n:
            base, extra = divmod(n, len(subs))
            order = sorted(subs, key=lambda m: (-sum(1 for tp in members[m].current if tp[0] == topic), m))
            quota = {mid: base + (1 if i < extra else 0) for i, mid in enumerate(order)}
            taken: set[int] = set()
            for mid in subs:
                for t, p in sorted(members[mid].current):
                    if t == topic and p < n and p not in taken and _count(owned[mid], topic) < quota[mid]:
                        owned[mid].add((t, p))
                        taken.add(p)
            for p in range(n):
                if p not in taken:
                    mid = min(subs, key=lambda m: (_count(owned[m], topic) - quota[m], _count(owned[m], topic), m))
                    owned[mid].add((topic, p))
        else:
            cap = -(-len(subs) // n)  # members per partition at most
            sharing = [0] * n
            placed: set[str] = set()
            for mid in subs:
                mine = sorted(p for t, p in members[mid].current if t == topic and p < n)
                if mine and sharing[mine[0]] < cap:
                    owned[mid].add((topic, mine[0]))
                    sharing[mine[0]] += 1
                    placed.add(mid)
            for mid in subs:
                if mid not in placed:
                    p = min(range(n), key=lambda i: (sharing[i], i))
                    owned[mid].add((topic, p))
                    sharing[p] += 1
    return {mid: frozenset(tps) for mid, tps in owned.items()}


def _count(tps, topic: str) -> int:
    return sum(1 for t, _ in tps if t == topic)


ASSIGNORS = {"uniform": uniform, "range": range_}
DEFAULT_ASSIGNORS = ("uniform", "range")  # Kafka's group.consumer.assignors: the first is the default
