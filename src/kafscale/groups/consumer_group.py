"""A consumer-protocol group (KIP-848): the pure state machine behind ConsumerGroupHeartbeat.

No I/O and no clock of its own: the driver (`consumer_coordinator.py`) passes `now` (ms)
and the topics the group subscribes to, persists `to_doc()` when `changed` says so, and
calls `tick()` at `next_deadline()`. Apache Kafka's group coordinator is the reference
(GroupMetadataManager.consumerGroupHeartbeat, CurrentAssignmentBuilder):

- The group epoch goes up whenever what the assignment depends on changes (a member joins
  or leaves, a subscription changes, a subscribed topic's partition count changes). The
  target assignment is recomputed by the assignor when the group epoch is ahead of it, and
  then carries that epoch (`target_epoch`).
- Each member reconciles towards its target on its own heartbeats: partitions it must give
  up are first revoked (the member stays at its epoch, state UNREVOKED_PARTITIONS) until a
  heartbeat no longer lists them; only then does it move to the target epoch, receiving
  the partitions of its target that nobody else still holds (the others wait, state
  UNRELEASED_PARTITIONS, and come with later heartbeats). A partition is therefore never
  held by two members, and members whose partitions stay are never interrupted.
- Member epoch 0 joins, -1 leaves, -2 leaves as a static member (`group.instance.id`)
  that may come back within the session timeout under a new member id and keep its
  partitions; a heartbeat with an epoch the member does not have is FENCED_MEMBER_EPOCH
  (except its previous epoch with no partition it should not own: a lost response).
- Subscriptions are topic names and/or a regex (RE2 syntax, as Kafka's RE2/J, matched
  against whole names, internal topics excluded). The driver re-evaluates regexes against
  the existing topics on each heartbeat (`resolve_regexes`), so a topic created later
  joins the subscription as Kafka's periodic refresh does.
- Sessions and revocations time out: a member silent for the session timeout, or that does
  not revoke within its rebalance timeout, is removed (fenced).
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from enum import Enum
from typing import Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNORS, MemberSpec, TopicPartition, partitions_doc, partitions_of

CONSUMER_GROUP_TYPE = "consumer"  # ListGroups' group type and the doc's "type" in the store
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


class GroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class ConsumerGroupConfig:
    """Broker settings (Kafka's group.consumer.*)."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = DEFAULT_ASSIGNORS


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat, version-independent. `owned` is None when not sent."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: frozenset[TopicPartition] | None = None
    client_id: str = ""
    client_host: str = ""
    version: int = 1


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: frozenset[TopicPartition] | None = None  # None: unchanged, not sent


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    assigned: frozenset[TopicPartition] = frozenset()
    revoking: frozenset[TopicPartition] = frozenset()
    session_deadline: float = 0.0
    revocation_deadline: float | None = None

    def to_doc(self) -> dict:
        return dict(
            member_id=self.member_id, instance_id=self.instance_id, rack_id=self.rack_id, client_id=self.client_id,
            client_host=self.client_host, member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch, state=self.state.value,
            rebalance_timeout_ms=self.rebalance_timeout_ms, subscribed_topic_names=list(self.subscribed_topic_names),
            subscribed_topic_regex=self.subscribed_topic_regex,
            server_assignor=self.server_assignor, assigned=partitions_doc(self.assigned), revoking=partitions_doc(self.revoking),
        )

    @classmethod
    def from_doc(cls, doc: dict, now: float, session_timeout_ms: int) -> "Member":
        # Deadlines restart on load, as Kafka's coordinator re-arms session timers on failover.
        return cls(
            member_id=doc["member_id"], instance_id=doc.get("instance_id"), rack_id=doc.get("rack_id"),
            client_id=doc.get("client_id", ""), client_host=doc.get("client_host", ""),
            member_epoch=doc["member_epoch"], previous_member_epoch=doc.get("previous_member_epoch", -1),
            state=MemberState(doc.get("state", "stable")), rebalance_timeout_ms=doc.get("rebalance_timeout_ms", 300_000),
            subscribed_topic_names=tuple(doc.get("subscribed_topic_names", ())),
            subscribed_topic_regex=doc.get("subscribed_topic_regex"), server_assignor=doc.get("server_assignor"),
            assigned=partitions_of(doc.get("assigned", {})), revoking=partitions_of(doc.get("revoking", {})),
            session_deadline=now + session_timeout_ms,
            revocation_deadline=now + doc.get("rebalance_timeout_ms", 300_000) if doc.get("revoking") else None,
        )


@lru_cache(maxsize=256)
def compile_regex(pattern: str):
    """A subscription regex in RE2 syntax (Kafka resolves them with RE2/J: no lookaround,
    no backreferences); INVALID_REGULAR_EXPRESSION if it does not parse."""
    import re2  # google-re2

    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        raise KafkaError(ErrorCode.invalid_regular_expression, f"SubscribedTopicRegex {pattern!r} is invalid: {e}") from None


def regex_matches(pattern: str, topic_names) -> frozenset[str]:
    """The topics a subscription regex selects: whole-name matches, internal topics excluded."""
    regex = compile_regex(pattern)
    return frozenset(t for t in topic_names if not t.startswith("__") and regex.fullmatch(t))


def validate_request(req: HeartbeatRequest, config: ConsumerGroupConfig) -> None:
    """Kafka's checks of a ConsumerGroupHeartbeat before the group is looked at."""
    def invalid(msg: str):
        raise KafkaError(ErrorCode.invalid_request, msg)

    if req.instance_id is not None and not req.instance_id:
        invalid("InstanceId can't be empty.")
    if req.rack_id is not None and not req.rack_id:
        invalid("RackId can't be empty.")
    if req.member_epoch == JOIN_EPOCH:
        if req.version >= 1 and not req.member_id:
            invalid("MemberId can't be empty.")
        if req.rebalance_timeout_ms == -1:
            invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned:
            invalid("TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None and not req.subscribed_topic_regex:
            invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    elif req.member_epoch == STATIC_LEAVE_EPOCH:
        if not req.member_id:
            invalid("MemberId can't be empty.")
        if req.instance_id is None:
            invalid("InstanceId can't be null.")
    elif req.member_epoch < STATIC_LEAVE_EPOCH:
        invalid(f"MemberEpoch {req.member_epoch} is invalid.")
    elif not req.member_id:
        invalid("MemberId can't be empty.")
    if req.subscribed_topic_regex:
        # (An empty regex, as librdkafka sends beside topic names, means none, as in Kafka.)
        compile_regex(req.subscribed_topic_regex)
    if req.server_assignor is not None and req.server_assignor not in config.assignors:
        raise KafkaError(ErrorCode.unsupported_assignor, f"ServerAssignor {req.server_assignor} is not supported. "
                                                         f"Supported assignors: {', '.join(config.assignors)}.")


class ConsumerGroup:
    def __init__(self, group_id: str, config: ConsumerGroupConfig):
        self.group_id = group_id
        self.config = config
        self.group_epoch = 0
        self.target_epoch = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, frozenset[TopicPartition]] = {}
        # topic name -> (topic id, partitions) of the subscribed topics when the epoch last moved
        self.topics: dict[str, tuple[str, int]] = {}
        # topic id -> each partition's rack (None: no rack), of subscribed topics with any rack
        self.racks: dict[str, tuple[str | None, ...]] = {}
        self.resolved_regexes: dict[str, frozenset[str]] = {}  # regex -> the topics it selects now
        self._joined = False  # the heartbeat being handled added its member
        self.changed = False  # set when the persisted doc would differ; the driver clears it

    # -- views ------------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch != self.target_epoch:
            return GroupState.ASSIGNING
        if any(m.member_epoch != self.target_epoch or m.state is not MemberState.STABLE for m in self.active_members()):
            return GroupState.RECONCILING
        return GroupState.STABLE

    def active_members(self) -> list[Member]:
        return [m for m in self.members.values() if m.member_epoch != STATIC_LEAVE_EPOCH]

    def member_topics(self, m: "Member") -> set[str]:
        """The topic names a member subscribes to: its names and its regex's matches."""
        out = set(m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            out |= self.resolved_regexes.get(m.subscribed_topic_regex, frozenset())
        return out

    def subscribed_topic_names(self) -> set[str]:
        return {t for m in self.members.values() for t in self.member_topics(m)}

    def regexes(self) -> set[str]:
        return {m.subscribed_topic_regex for m in self.members.values() if m.subscribed_topic_regex}

    def resolve_regexes(self, topic_names, extra: str | None = None) -> None:
        """Re-evaluate the members' regexes (and `extra`, a joining member's) against the
        existing topics; a change moves the group epoch on the next heartbeat."""
        self.resolved_regexes = {r: regex_matches(r, topic_names) for r in self.regexes() | ({extra} if extra else set())}

    def static_member(self, instance_id: str) -> Member | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def preferred_assignor(self) -> str:
        """The assignor most members ask for (ties: the configured order), else the default."""
        asked = Counter(m.server_assignor for m in self.members.values() if m.server_assignor in self.config.assignors)
        if not asked:
            return self.config.assignors[0]
        best = max(asked.values())
        return next(a for a in self.config.assignors if asked.get(a) == best)

    def owner_of(self, tp: TopicPartition) -> str | None:
        for m in self.members.values():
            if tp in m.assigned or tp in m.revoking:
                return m.member_id
        return None

    def next_deadline(self) -> float | None:
        deadlines = [m.session_deadline for m in self.members.values()]
        deadlines += [m.revocation_deadline for m in self.members.values() if m.revocation_deadline is not None]
        return min(deadlines, default=None)

    # -- the heartbeat ------------------------------------------------------------------------

    def heartbeat(self, now: float, req: HeartbeatRequest, topics: Mapping[str, tuple[str, int]],
                  racks: Mapping[str, tuple[str | None, ...]] | None = None) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat (validated with `validate_request`). `topics`: name ->
        (topic id, partition count) of the existing topics among the group's subscriptions
        and the request's; `racks`: topic id -> the rack of each partition (its owner
        broker's), for rack-aware assignment. Raises KafkaError for refusals."""
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(now, req)
        full = req.member_epoch == JOIN_EPOCH
        member = self._member_for(now, req)
        before = (member.member_epoch, member.assigned, member.revoking, member.state)
        member.session_deadline = now + self.config.session_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        rack_changed = req.rack_id is not None and req.rack_id != member.rack_id
        if rack_changed:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1 and req.rebalance_timeout_ms != member.rebalance_timeout_ms:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
            self.changed = True
        # One heartbeat moves the group epoch at most once, whatever changed in it.
        bump = self._joined or rack_changed  # a member's rack counts in rack-aware assignment, as in Kafka
        self._joined = False
        if req.server_assignor != member.server_assignor and (req.server_assignor is not None or full):
            member.server_assignor = req.server_assignor
            bump = True
        if req.subscribed_topic_names is not None and tuple(sorted(set(req.subscribed_topic_names))) != member.subscribed_topic_names:
            member.subscribed_topic_names = tuple(sorted(set(req.subscribed_topic_names)))
            bump = True
        if req.subscribed_topic_regex is not None and (req.subscribed_topic_regex or None) != member.subscribed_topic_regex:
            member.subscribed_topic_regex = req.subscribed_topic_regex or None
            bump = True
        wanted = {t: topics[t] for t in sorted(self.subscribed_topic_names()) if t in topics}
        if wanted != self.topics:
            self.topics = wanted
            bump = True
        # Partition racks moving (an owner broker of another rack) redo the assignment, as
        # Kafka's rack topology changes do (KIP-1101).
        ids = {tid for tid, _n in wanted.values()}
        wanted_racks = {tid: r for tid, r in (racks or {}).items() if tid in ids and any(r)}
        if wanted_racks != self.racks:
            self.racks = wanted_racks
            bump = True
        if bump:
            self._bump()
        if self.group_epoch > self.target_epoch:
            self._compute_target()
        self._reconcile(now, member, req.owned)
        after = (member.member_epoch, member.assigned, member.revoking, member.state)
        if after != before:
            self.changed = True
        send = full or after[1] != before[1] or (req.owned is not None and req.owned != member.assigned)
        return HeartbeatResult(
            member_id=member.member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignment=member.assigned if send else None,
        )

    def _member_for(self, now: float, req: HeartbeatRequest) -> Member:
        if req.member_epoch == JOIN_EPOCH:
            if req.instance_id is not None:
                old = self.static_member(req.instance_id)
                if old is not None:
                    if old.member_epoch != STATIC_LEAVE_EPOCH and old.member_id != req.member_id:
                        raise KafkaError(ErrorCode.unreleased_instance_id,
                                         f"Static member {old.member_id} with instance id {req.instance_id} "
                                         f"is present in the consumer group {self.group_id}.")
                    if old.member_id != req.member_id:
                        return self._replace_static(old, req)
            member = self.members.get(req.member_id) if req.member_id else None
            if member is not None:
                return member
            if len(self.members) >= self.config.max_size:
                raise KafkaError(ErrorCode.group_max_size_reached,
                                 f"The consumer group has reached its maximum capacity of {self.config.max_size} members.")
            member_id = req.member_id or str(uuid.uuid4())  # v0: the broker names the member
            member = Member(member_id=member_id, instance_id=req.instance_id, rebalance_timeout_ms=req.rebalance_timeout_ms)
            self.members[member_id] = member
            self._joined = True
            return member
        member = self.members.get(req.member_id)
        if member is None:
            raise KafkaError(ErrorCode.unknown_member_id,
                             f"Member {req.member_id} is not a member of group {self.group_id}.")
        if req.member_epoch > member.member_epoch:
            raise KafkaError(ErrorCode.fenced_member_epoch,
                             f"The consumer group member has a greater member epoch ({req.member_epoch}) than "
                             f"the one known by the group coordinator ({member.member_epoch}).")
        if req.member_epoch < member.member_epoch:
            # A lost response: the member retries at its previous epoch, which is fine as
            # long as it owns nothing it should not.
            if req.member_epoch != member.previous_member_epoch or (
                    req.owned is not None and not req.owned <= member.assigned):
                raise KafkaError(ErrorCode.fenced_member_epoch,
                                 f"The consumer group member has a smaller member epoch ({req.member_epoch}) than "
                                 f"the one known by the group coordinator ({member.member_epoch}).")
        return member

    def _replace_static(self, old: Member, req: HeartbeatRequest) -> Member:
        """A static member back under a new member id takes its predecessor's place,
        epoch and partitions (what it gave up on leaving is gone)."""
        del self.members[old.member_id]
        epoch = old.previous_member_epoch if old.member_epoch == STATIC_LEAVE_EPOCH else old.member_epoch
        member = replace(old, member_id=req.member_id or str(uuid.uuid4()), member_epoch=max(epoch, 0),
                         revoking=frozenset(), revocation_deadline=None, state=MemberState.STABLE)
        self.members[member.member_id] = member
        if old.member_id in self.target:
            self.target[member.member_id] = self.target.pop(old.member_id)
        self.changed = True
        return member

    def _leave(self, now: float, req: HeartbeatRequest) -> HeartbeatResult:
        if req.instance_id is None:
            member = self.members.get(req.member_id)
            if member is None:
                raise KafkaError(ErrorCode.unknown_member_id,
                                 f"Member {req.member_id} is not a member of group {self.group_id}.")
        else:
            member = self.static_member(req.instance_id)
            if member is None:
                raise KafkaError(ErrorCode.unknown_member_id,
                                 f"Instance id {req.instance_id} is unknown in group {self.group_id}.")
            if member.member_id != req.member_id:
                raise KafkaError(ErrorCode.fenced_instance_id,
                                 f"Static member {req.member_id} with instance id {req.instance_id} was fenced "
                                 f"by member {member.member_id}.")
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # Kept, with its partitions, until it comes back or its session expires.
            if member.member_epoch != STATIC_LEAVE_EPOCH:
                member.previous_member_epoch = member.member_epoch
                member.member_epoch = STATIC_LEAVE_EPOCH
                member.revoking = frozenset()
                member.revocation_deadline = None
                member.state = MemberState.STABLE
                self.changed = True
            return HeartbeatResult(member_id=member.member_id, member_epoch=STATIC_LEAVE_EPOCH,
                                   heartbeat_interval_ms=0)
        self.remove_member(member.member_id)
        return HeartbeatResult(member_id=member.member_id, member_epoch=LEAVE_EPOCH, heartbeat_interval_ms=0)

    def remove_member(self, member_id: str) -> None:
        """Fence a member: its partitions are free, the assignment is redone."""
        if self.members.pop(member_id, None) is not None:
            self.target.pop(member_id, None)
            self._bump()

    def _bump(self) -> None:
        self.group_epoch += 1
        self.changed = True

    # -- assignment ----------------------------------------------------------------------------

    def _compute_target(self) -> None:
        specs = {}
        for m in self.members.values():
            subscribed = frozenset(self.topics[t][0] for t in self.member_topics(m) if t in self.topics)
            specs[m.member_id] = MemberSpec(subscribed, self.target.get(m.member_id, frozenset()), m.rack_id)
        counts = {tid: n for tid, n in self.topics.values()}
        racks = {(tid, p): frozenset((r,)) for tid, per in self.racks.items() for p, r in enumerate(per) if r is not None}
        self.target = dict(ASSIGNORS[self.preferred_assignor()](specs, counts, racks))
        self.target_epoch = self.group_epoch
        self.changed = True

    def _reconcile(self, now: float, member: Member, owned: frozenset[TopicPartition] | None) -> None:
        """Kafka's CurrentAssignmentBuilder: move the member one step towards its target."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or owned & member.revoking:
                return  # still waiting for the member to give them up
        elif member.state is MemberState.STABLE and member.member_epoch == self.target_epoch:
            return
        target = self.target.get(member.member_id, frozenset())
        kept = member.assigned & target
        revoke = member.assigned - target
        if revoke:
            member.assigned, member.revoking = kept, revoke
            member.previous_member_epoch = member.member_epoch
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revocation_deadline = now + member.rebalance_timeout_ms
            return
        pending = target - member.assigned
        unreleased = {tp for tp in pending if self.owner_of(tp) not in (None, member.member_id)}
        member.assigned = kept | (pending - unreleased)
        member.revoking = frozenset()
        member.revocation_deadline = None
        if member.member_epoch != self.target_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.target_epoch
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE

    # -- time ------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[tuple[str, str]]:
        """Remove members whose session or revocation timed out: [(member id, why)]."""
        out = []
        for m in list(self.members.values()):
            if m.session_deadline <= now:
                out.append((m.member_id, "session timeout"))
            elif m.revocation_deadline is not None and m.revocation_deadline <= now:
                out.append((m.member_id, "revocation not acknowledged within the rebalance timeout"))
        for member_id, _ in out:
            self.remove_member(member_id)
        return out

    # -- offsets ------------------------------------------------------------------------------

    def validate_offset_commit(self, member_id: str, member_epoch: int, api_version: int, transactional: bool = False) -> None:
        """Kafka's ConsumerGroup.validateOffsetCommit."""
        if member_epoch < 0 and not self.members:
            return  # an admin or a consumer outside the group, while the group is empty
        member = self.members.get(member_id)
        if member is None:
            raise KafkaError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {self.group_id}.")
        if not transactional and api_version < 9:
            raise KafkaError(ErrorCode.unsupported_version,
                             "OffsetCommit version 9 or above must be used by members using the consumer group protocol")
        self._check_epoch(member_epoch, member)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> None:
        """Kafka's ConsumerGroup.validateOffsetFetch: anyone without a member id reads."""
        if member_epoch < 0 and member_id is None:
            return
        member = self.members.get(member_id or "")
        if member is None:
            raise KafkaError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {self.group_id}.")
        self._check_epoch(member_epoch, member)

    @staticmethod
    def _check_epoch(received: int, member: Member) -> None:
        if received != member.member_epoch:
            raise KafkaError(ErrorCode.stale_member_epoch,
                             f"The received member epoch {received} does not match the expected member epoch "
                             f"{member.member_epoch}.")

    def is_subscribed_to(self, topic: str) -> bool:
        return topic in self.subscribed_topic_names()

    @property
    def is_empty(self) -> bool:
        return not self.members

    def validate_offset_delete(self) -> ErrorCode:
        return ErrorCode.none  # Kafka: any consumer group; subscribed topics are refused per partition

    # -- persistence --------------------------------------------------------------------------

    def to_doc(self) -> dict:
        return dict(
            type=CONSUMER_GROUP_TYPE, group_epoch=self.group_epoch, target_epoch=self.target_epoch,
            topics={name: [tid, n] for name, (tid, n) in self.topics.items()},
            **({"racks": {tid: list(r) for tid, r in self.racks.items()}} if self.racks else {}),
            members=[m.to_doc() for m in self.members.values()],
            target={mid: partitions_doc(tps) for mid, tps in self.target.items()},
        )

    @classmethod
    def from_doc(cls, group_id: str, doc: dict, config: ConsumerGroupConfig, now: float) -> "ConsumerGroup":
        group = cls(group_id, config)
        group.group_epoch = doc.get("group_epoch", 0)
        group.target_epoch = doc.get("target_epoch", 0)
        group.topics = {name: (tid, n) for name, (tid, n) in doc.get("topics", {}).items()}
        group.racks = {tid: tuple(r) for tid, r in doc.get("racks", {}).items()}
        for m in doc.get("members", []):
            member = Member.from_doc(m, now, config.session_timeout_ms)
            group.members[member.member_id] = member
        group.target = {mid: partitions_of(tps) for mid, tps in doc.get("target", {}).items()}
        return group


def is_consumer_group_doc(doc: dict | None) -> bool:
    return doc is not None and doc.get("type") == CONSUMER_GROUP_TYPE
