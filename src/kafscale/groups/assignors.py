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

Rack awareness, as Kafka's assignors (KIP-881 / KIP-1101): when members say their racks
(`client.rack`) and partitions have racks (KafScale: the rack of the broker owning the
partition, `--broker-rack`), and not every partition is on every rack, a partition goes
to a member in one of its racks where balance allows (balance first, then racks, then
stickiness: a member keeps a partition of another rack only while no balanced assignment
would give it to one of the partition's racks).

Partitions are `(topic_id, partition)` pairs; topic ids are strings (UUIDs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

TopicPartition = tuple[str, int]
# the racks of the partitions that have any (Kafka's SubscribedTopicDescriber.racksForPartition)
Racks = Mapping[TopicPartition, frozenset[str]]


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
    rack: str | None = None


def use_racks(members: Mapping[str, MemberSpec], partitions: Mapping[str, int], racks: Racks | None) -> bool:
    """Kafka's rule: racks count when members have racks, some partition is on one of them,
    and the partitions are not all on the same racks (then racks could not matter)."""
    member_racks = {m.rack for m in members.values() if m.rack}
    if not member_racks or not racks:
        return False
    tps = [(t, p) for t in {t for m in members.values() for t in m.subscribed if t in partitions} for p in range(partitions[t])]
    per_partition = [racks.get(tp, frozenset()) for tp in tps]
    all_racks = frozenset().union(*per_partition)
    return bool(member_racks & all_racks) and any(r != all_racks for r in per_partition)


def _matches(spec: MemberSpec, tp: TopicPartition, racks: Racks) -> bool:
    return spec.rack is not None and spec.rack in racks.get(tp, ())


def uniform(members: Mapping[str, MemberSpec], partitions: Mapping[str, int], racks: Racks | None = None) -> dict[str, frozenset[TopicPartition]]:
    """Balanced and sticky. Each member's quota is its fair share of the partitions it can
    take; it keeps current partitions up to that quota, then free partitions go one at a
    time to the eligible member with the fewest (ties: member id), which for identical
    subscriptions gives counts that differ by at most one. With racks (`use_racks`) a
    member keeps only partitions of its rack, and free partitions go first to members of
    their racks with room under their quota."""
    if not members:
        return {}
    rack_aware = use_racks(members, partitions, racks)
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
            if (tp in valid and tp[0] in spec.subscribed and tp not in taken and len(owned[mid]) < quota[mid]
                    and (not rack_aware or _matches(spec, tp, racks))):
                owned[mid].append(tp)
                taken.add(tp)
    if rack_aware:
        # first the free partitions a member of their racks has room for
        for tp in all_partitions:
            local = [m for m in subscribers[tp[0]] if tp not in taken and _matches(members[m], tp, racks) and len(owned[m]) < quota[m]]
            if local:
                mid = min(local, key=lambda m: (len(owned[m]), m))
                owned[mid].append(tp)
                taken.add(tp)
    for tp in all_partitions:
        if tp in taken:
            continue
        eligible = [m for m in subscribers[tp[0]] if not rack_aware or len(owned[m]) < quota[m]] or subscribers[tp[0]]
        mid = min(eligible, key=lambda m: (len(owned[m]), m))
        owned[mid].append(tp)
        taken.add(tp)
    if not n_identical:
        _rebalance(owned, members, subscribers, racks if rack_aware else None)
    return {mid: frozenset(tps) for mid, tps in owned.items()}


def _rebalance(owned: dict[str, list[TopicPartition]], members: Mapping[str, MemberSpec],
               subscribers: Mapping[str, list[str]], racks: Racks | None = None) -> None:
    """Heterogeneous subscriptions: move partitions from the most to the least loaded member
    that may take them until no move lowers the spread (with racks: first the partitions
    off the giver's rack, to a taker of their rack where one can take them)."""
    def order(giver):
        mine = sorted(owned[giver], reverse=True)
        return mine if racks is None else sorted(mine, key=lambda tp: _matches(members[giver], tp, racks))

    moved = True
    while moved:
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for tp in order(giver):
                takers = [m for m in subscribers[tp[0]] if len(owned[m]) + 1 < len(owned[giver])]
                if takers:
                    taker = min(takers, key=lambda m: (racks is not None and not _matches(members[m], tp, racks), len(owned[m]), m))
                    owned[giver].remove(tp)
                    owned[taker].append(tp)
                    moved = True
                    break
            if moved:
                break


def range_(members: Mapping[str, MemberSpec], partitions: Mapping[str, int], racks: Racks | None = None) -> dict[str, frozenset[TopicPartition]]:
    """Per topic: contiguous ranges over its subscribers sorted by member id. With racks
    (`use_racks`), as Kafka's rack-aware range: each member (in that order) first takes the
    lowest free partitions of its rack up to its count, then the remaining partitions fill
    the remaining counts in order (so co-partitioned topics on the same racks still line up)."""
    owned: dict[str, set[TopicPartition]] = {mid: set() for mid in members}
    rack_aware = use_racks(members, partitions, racks)
    topics = sorted({t for spec in members.values() for t in spec.subscribed if t in partitions})
    for topic in topics:
        subs = sorted(m for m in members if topic in members[m].subscribed)
        base, extra = divmod(partitions[topic], len(subs))
        counts = {mid: base + (1 if i < extra else 0) for i, mid in enumerate(subs)}
        if not rack_aware:
            start = 0
            for mid in subs:
                owned[mid].update((topic, p) for p in range(start, start + counts[mid]))
                start += counts[mid]
            continue
        free = list(range(partitions[topic]))
        for mid in subs:
            mine = [p for p in free if _matches(members[mid], (topic, p), racks)][:counts[mid]]
            owned[mid].update((topic, p) for p in mine)
            free = [p for p in free if p not in mine]
        for mid in subs:
            room = counts[mid] - _count(owned[mid], topic)
            owned[mid].update((topic, p) for p in free[:room])
            free = free[room:]
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
