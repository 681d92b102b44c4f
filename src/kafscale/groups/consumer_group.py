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
- Classic members (JoinGroup/SyncGroup/Heartbeat clients, KIP-848's online migration) live
  in the same group (`classic_join` ...): the broker's assignor assigns for them too, they
  reconcile on each JoinGroup with the owned partitions their subscription lists, get their
  assignment in SyncGroup, and learn of a rebalance from REBALANCE_IN_PROGRESS on Heartbeat
  (Kafka's classicGroup*ToConsumerGroup). The conversions themselves: `migration.py`.
"""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from enum import Enum
from typing import Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNORS, MemberSpec, TopicPartition, partitions_doc, partitions_of
from kafscale.groups.consumer_protocol import MalformedProtocol, encode_assignment, parse_subscription, subscription_version
from kafscale.groups.state import CONSUMER_PROTOCOL_TYPE, JoinResult, SyncResult

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


@dataclass(frozen=True, slots=True)
class ClassicMetadata:
    """What a member using the classic protocol joined with (Kafka's ClassicMemberMetadata)."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, subscription) in the member's order

    @property
    def protocol_name(self) -> str:
        return self.protocols[0][0]

    def to_doc(self) -> dict:
        return dict(session_timeout_ms=self.session_timeout_ms,
                    protocols=[[name, base64.b64encode(meta).decode()] for name, meta in self.protocols])

    @classmethod
    def from_doc(cls, doc: dict) -> "ClassicMetadata":
        return cls(int(doc["session_timeout_ms"]), tuple((n, base64.b64decode(m)) for n, m in doc["protocols"]))


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
    classic: ClassicMetadata | None = None  # set for members using the classic protocol
    # Classic members only (not persisted, as Kafka's timers): rejoin after REBALANCE_IN_PROGRESS,
    # SyncGroup after JoinGroup, each within the rebalance timeout.
    join_deadline: float | None = None
    sync_deadline: float | None = None

    @property
    def uses_classic(self) -> bool:
        return self.classic is not None

    def to_doc(self) -> dict:
        extra = {"classic": self.classic.to_doc()} if self.classic is not None else {}
        return dict(**extra,
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
        classic = ClassicMetadata.from_doc(doc["classic"]) if doc.get("classic") else None
        if classic is not None:
            session_timeout_ms = classic.session_timeout_ms
        return cls(classic=classic,
            member_id=doc["member_id"], instance_id=doc.get("instance_id"), rack_id=doc.get("rack_id"),
            client_id=doc.get("client_id", ""), client_host=doc.get("client_host", ""),
            member_epoch=doc["member_epoch"], previous_member_epoch=doc.get("previous_member_epoch", -1),
            state=MemberState(doc.get("state", "stable")), rebalance_timeout_ms=doc.get("rebalance_timeout_ms", 300_000),
            subscribed_topic_names=tuple(doc.get("subscribed_topic_names", ())),
            subscribed_topic_regex=doc.get("subscribed_topic_regex"), server_assignor=doc.get("server_assignor"),
            assigned=partitions_of(doc.get("assigned", {})), revoking=partitions_of(doc.get("revoking", {})),
            session_deadline=now + session_timeout_ms,
            revocation_deadline=now + doc.get("rebalance_timeout_ms", 300_000) if doc.get("revoking") and classic is None else None,
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
        for m in self.members.values():
            deadlines += [d for d in (m.revocation_deadline, m.join_deadline, m.sync_deadline) if d is not None]
        return min(deadlines, default=None)

    def uses_consumer_protocol(self) -> bool:
        """Has the group any member using the consumer protocol (not classic)?"""
        return any(not m.uses_classic for m in self.members.values())

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
        self._advance(now, member, bump, topics, racks, req.owned)
        after = (member.member_epoch, member.assigned, member.revoking, member.state)
        if after != before:
            self.changed = True
        send = full or after[1] != before[1] or (req.owned is not None and req.owned != member.assigned)
        return HeartbeatResult(
            member_id=member.member_id, member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignment=member.assigned if send else None,
        )

    def _advance(self, now: float, member: Member, bump: bool, topics: Mapping[str, tuple[str, int]],
                 racks: Mapping[str, tuple[str | None, ...]] | None, owned: frozenset[TopicPartition] | None) -> None:
        """After a member's request updated it (`bump`: its subscription or rack changed):
        move the group epoch if what the assignment depends on changed, recompute the target
        when behind, and reconcile the member one step."""
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
        self._reconcile(now, member, owned)

    def _member_for(self, now: float, req: HeartbeatRequest) -> Member:
        if req.member_epoch == JOIN_EPOCH:
            if req.instance_id is not None:
                old = self.static_member(req.instance_id)
                if old is not None:
                    # (A classic static member is replaced without having left, as in Kafka.)
                    if old.member_epoch != STATIC_LEAVE_EPOCH and old.member_id != req.member_id and not old.uses_classic:
                        raise KafkaError(ErrorCode.unreleased_instance_id,
                                         f"Static member {old.member_id} with instance id {req.instance_id} "
                                         f"is present in the consumer group {self.group_id}.")
                    if old.member_id != req.member_id:
                        return self._replace_static(old, req.member_id or str(uuid.uuid4()))
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

    def _replace_static(self, old: Member, member_id: str, epoch: int | None = None) -> Member:
        """A static member back under a new member id takes its predecessor's place,
        epoch (`epoch` if given) and partitions (what it gave up on leaving is gone)."""
        del self.members[old.member_id]
        if epoch is None:
            epoch = old.previous_member_epoch if old.member_epoch == STATIC_LEAVE_EPOCH else old.member_epoch
        member = replace(old, member_id=member_id, member_epoch=max(epoch, 0), classic=None,
                         revoking=frozenset(), revocation_deadline=None, state=MemberState.STABLE,
                         join_deadline=None, sync_deadline=None)
        self.members[member.member_id] = member
        if old.member_id in self.target:
            self.target[member.member_id] = self.target.pop(old.member_id)
        self.changed = True
        return member

    def _leave(self, now: float, req: HeartbeatRequest) -> HeartbeatResult:
        member = self.leaving(req)
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

    def leaving(self, req: HeartbeatRequest) -> Member:
        """The member a leave heartbeat (epoch -1 or -2) is about; refusals raise KafkaError."""
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
        return member

    def remove_member(self, member_id: str, bump: bool = True) -> None:
        """Fence a member: its partitions are free, the assignment is redone (`bump`)."""
        if self.members.pop(member_id, None) is not None:
            self.target.pop(member_id, None)
            if bump:
                self._bump()
            self.changed = True

    # -- classic members (KIP-848's online migration; Kafka's classicGroup*ToConsumerGroup) ------

    def supports_classic_protocols(self, protocol_type: str, names) -> bool:
        """May a classic member with these protocols join? The type must be "consumer" and,
        once the group has members, one protocol every classic member has."""
        names = list(names)
        if protocol_type != CONSUMER_PROTOCOL_TYPE:
            return False
        if not self.members:
            return bool(names)
        classic = [{n for n, _ in m.classic.protocols} for m in self.members.values() if m.uses_classic]
        return any(all(n in ps for ps in classic) for n in names)

    def classic_join(self, now: float, *, member_id: str, group_instance_id: str | None, client_id: str,
                     client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                     protocols: list[tuple[str, bytes]], require_known_member_id: bool,
                     topics: Mapping[str, tuple[str, int]], racks: Mapping[str, tuple[str | None, ...]] | None = None,
                     **_ignored) -> JoinResult:
        """A JoinGroup: answered at once with the member's epoch as the generation (it is a
        follower: the broker assigns); its assignment comes with SyncGroup. `topics`: name ->
        (topic id, partitions) of the existing topics among the group's subscriptions and the
        member's. Raises KafkaError for refusals."""
        protocols = [(name, bytes(meta)) for name, meta in protocols]
        unknown = not member_id
        member_id = member_id or str(uuid.uuid4())
        if member_id not in self.members and len(self.members) >= self.config.max_size:
            raise KafkaError(ErrorCode.group_max_size_reached,
                             f"The consumer group has reached its maximum capacity of {self.config.max_size} members.")
        if not self.supports_classic_protocols(protocol_type, (n for n, _ in protocols)):
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"Member {member_id}'s protocols are not supported.")
        if require_known_member_id and unknown:
            # KIP-394: the member joins again with this id (nothing is kept of it meanwhile).
            return JoinResult(ErrorCode.member_id_required, member_id)
        try:
            sub = parse_subscription(protocols[0][1])
        except MalformedProtocol as e:
            raise KafkaError(ErrorCode.unknown_server_error, f"Member {member_id}: {e}") from None
        member, bump = self._classic_member_for(member_id, group_instance_id, unknown, rebalance_timeout_ms)
        if sub.rack_id is not None and sub.rack_id != member.rack_id:
            member.rack_id = sub.rack_id
            bump = True
        if rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = rebalance_timeout_ms
        names = tuple(sorted(set(sub.topics)))
        if names != member.subscribed_topic_names:
            member.subscribed_topic_names = names
            bump = True
        member.client_id, member.client_host = client_id, client_host
        member.classic = ClassicMetadata(session_timeout_ms, tuple(protocols))
        owned = frozenset((topics[t][0], p) for t, p in sub.owned if t in topics)
        self._advance(now, member, bump, topics, racks, owned)
        member.session_deadline = now + session_timeout_ms
        member.join_deadline = None
        member.sync_deadline = now + member.rebalance_timeout_ms
        self.changed = True
        return JoinResult(ErrorCode.none, member.member_id, member.member_epoch, CONSUMER_PROTOCOL_TYPE,
                          member.classic.protocol_name, leader="")

    def _classic_member_for(self, member_id: str, instance_id: str | None, unknown: bool,
                            rebalance_timeout_ms: int) -> tuple[Member, bool]:
        """(the member a classic JoinGroup is about, whether it is new to the group)."""
        if instance_id is not None:
            old = self.static_member(instance_id)
            if not unknown:
                if old is None:
                    raise KafkaError(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
                if old.member_id != member_id:
                    raise KafkaError(ErrorCode.fenced_instance_id, f"Static member {member_id} with instance id "
                                                                   f"{instance_id} was fenced by member {old.member_id}.")
                return old, False
            if old is not None:
                # Takes the place (and partitions) of the instance's previous member, at epoch 0.
                return self._replace_static(old, member_id, epoch=0), False
        member = self.members.get(member_id)
        if member is not None:
            return member, False
        member = Member(member_id=member_id, instance_id=instance_id, rebalance_timeout_ms=rebalance_timeout_ms)
        self.members[member_id] = member
        return member, True

    def _classic(self, member_id: str, instance_id: str | None) -> Member:
        """Kafka's validateConsumerGroupMember + throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is None:
            member = self.members.get(member_id)
            if member is None:
                raise KafkaError(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {self.group_id}.")
        else:
            member = self.static_member(instance_id)
            if member is None:
                raise KafkaError(ErrorCode.unknown_member_id,
                                 f"Member with instance id {instance_id} is not a member of group {self.group_id}.")
            if member.member_id != member_id:
                raise KafkaError(ErrorCode.fenced_instance_id, f"Static member {member_id} with instance id "
                                                               f"{instance_id} was fenced by member {member.member_id}.")
        if not member.uses_classic:
            raise KafkaError(ErrorCode.unknown_member_id, f"Member {member.member_id} does not use the classic protocol.")
        return member

    def _classic_generation(self, member: Member, generation_id: int) -> None:
        if generation_id != member.member_epoch:
            raise KafkaError(ErrorCode.illegal_generation, f"The request generation id {generation_id} is not equal "
                                                           f"to the member epoch {member.member_epoch} of member {member.member_id}.")

    def _rejoin(self, now: float, member: Member) -> None:
        """The member is told REBALANCE_IN_PROGRESS: it must rejoin within its rebalance timeout."""
        if member.join_deadline is None:
            member.join_deadline = now + member.rebalance_timeout_ms

    def classic_sync(self, now: float, *, member_id: str, group_instance_id: str | None, generation_id: int,
                     protocol_type: str | None, protocol_name: str | None, **_ignored) -> SyncResult:
        """A SyncGroup: the member's current assignment (what the broker reconciled it to
        at its JoinGroup), in its subscription's version. Raises KafkaError for refusals."""
        member = self._classic(member_id, group_instance_id)
        self._classic_generation(member, generation_id)
        if protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE:
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"The protocol type {protocol_type} from member "
                                                                    f"{member_id} is not {CONSUMER_PROTOCOL_TYPE}.")
        if protocol_name is not None and protocol_name != member.classic.protocol_name:
            raise KafkaError(ErrorCode.inconsistent_group_protocol, f"The protocol name {protocol_name} from member "
                                                                    f"{member_id} is not {member.classic.protocol_name}.")
        if self.group_epoch > member.member_epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
            self._rejoin(now, member)
            raise KafkaError(ErrorCode.rebalance_in_progress, f"A new rebalance is triggered in group {self.group_id} "
                                                              f"and member {member_id} should rejoin to catch up.")
        member.sync_deadline = None
        member.session_deadline = now + member.classic.session_timeout_ms
        names = {tid: name for name, (tid, _n) in self.topics.items()}
        assignment = encode_assignment([(names[t], p) for t, p in member.assigned if t in names],
                                       subscription_version(member.classic.protocols[0][1]))
        return SyncResult(ErrorCode.none, assignment, protocol_type, protocol_name)

    def classic_heartbeat(self, now: float, *, member_id: str, group_instance_id: str | None, generation_id: int,
                          **_ignored) -> ErrorCode:
        """A Heartbeat: REBALANCE_IN_PROGRESS when the member must rejoin (the group epoch
        moved past it, it has partitions to give up, or partitions it waits for are free)."""
        member = self._classic(member_id, group_instance_id)
        self._classic_generation(member, generation_id)
        member.session_deadline = now + member.classic.session_timeout_ms
        if (member.member_epoch < self.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS
                or (member.state is MemberState.UNRELEASED_PARTITIONS and not self._waiting_on_unreleased(member))):
            self._rejoin(now, member)
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def _waiting_on_unreleased(self, member: Member) -> bool:
        return any(self.owner_of(tp) is not None for tp in self.target.get(member.member_id, frozenset()) - member.assigned)

    def classic_leave(self, members: list[tuple[str, str | None]]) -> list[ErrorCode]:
        """LeaveGroup of classic members (by member id, or by instance id with member id ""):
        each one's error; the group epoch moves once for all who left."""
        errors = []
        for member_id, instance_id in members:
            try:
                if instance_id is None:
                    member = self._classic(member_id, None)
                else:
                    member = self.static_member(instance_id)
                    if member is None:
                        raise KafkaError(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
                    member = self._classic(member.member_id if member_id == "" else member_id, instance_id)
            except KafkaError as e:
                errors.append(e.code)
                continue
            self.remove_member(member.member_id, bump=False)
            errors.append(ErrorCode.none)
        if ErrorCode.none in errors:
            self._bump()
        return errors

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
        if revoke and (owned is None or owned & revoke):
            # (A member whose owned partitions, when it sends them, no longer hold any of
            # these has given them up already: an eager classic member rejoining, say.)
            member.assigned, member.revoking = kept, revoke
            member.previous_member_epoch = member.member_epoch
            member.state = MemberState.UNREVOKED_PARTITIONS
            # Classic members have no revocation timer: they must rejoin within their
            # rebalance timeout after REBALANCE_IN_PROGRESS instead (`join_deadline`).
            member.revocation_deadline = None if member.uses_classic else now + member.rebalance_timeout_ms
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

    def expired(self, now: float) -> list[tuple[str, str]]:
        """Members whose session, revocation, rejoin or sync timed out: [(member id, why)]."""
        out = []
        for m in list(self.members.values()):
            if m.session_deadline <= now:
                out.append((m.member_id, "session timeout"))
            elif m.revocation_deadline is not None and m.revocation_deadline <= now:
                out.append((m.member_id, "revocation not acknowledged within the rebalance timeout"))
            elif m.join_deadline is not None and m.join_deadline <= now:
                out.append((m.member_id, "the classic member did not rejoin within the rebalance timeout"))
            elif m.sync_deadline is not None and m.sync_deadline <= now:
                out.append((m.member_id, "the classic member did not send SyncGroup within the rebalance timeout"))
        return out

    def tick(self, now: float) -> list[tuple[str, str]]:
        """Remove the members `expired` names: [(member id, why)]."""
        out = self.expired(now)
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
        if not transactional and api_version < 9 and not member.uses_classic:
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
        if received != member.member_epoch and member.uses_classic:
            # A classic member's generation is its member epoch (Kafka: ILLEGAL_GENERATION).
            raise KafkaError(ErrorCode.illegal_generation, f"The received generation id {received} does not match "
                                                           f"the expected member epoch {member.member_epoch}.")
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
