"""A share group (KIP-932): the pure state machine behind ShareGroupHeartbeat.

No I/O and no clock of its own: the driver (`share_coordinator.py`) passes `now` (ms), the
group's settings and the topics its members subscribe to, persists `to_doc()` when
`changed` says so and calls `tick()` at `next_deadline()`. Apache Kafka's group
coordinator is the reference (GroupMetadataManager.shareGroupHeartbeat, ShareGroup):

- Members name themselves (a client-made UUID, v1) and join with epoch 0 and their
  subscribed topic names; epoch -1 leaves. A heartbeat at any other epoch than the
  member's is FENCED_MEMBER_EPOCH; an unknown member is UNKNOWN_MEMBER_ID.
- The group epoch goes up when what the assignment depends on changes (a member joins or
  leaves, a subscription changes, a subscribed topic's partition count changes); the
  assignment is then recomputed by the simple assignor and carries that epoch.
- Unlike a consumer group there is no revocation round: partitions are shared, so a member
  moves to the new assignment (and epoch) on its next heartbeat, and what it no longer has
  simply stops being fetched. Records it had acquired stay locked until acknowledged,
  released, or their lock times out (the share partition's business, not the group's).
- States: Empty (no members) and Stable; Dead once deleted.
- A member silent for the session timeout is removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.assignors import MemberSpec, TopicPartition, partitions_doc, partitions_of, simple

SHARE_GROUP_TYPE = "share"  # ListGroups' group (and protocol) type; the doc's "type" in the store
SHARE_ASSIGNOR = "simple"
JOIN_EPOCH = 0
LEAVE_EPOCH = -1


class ShareGroupState(Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class ShareHeartbeatRequest:
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None  # None: unchanged
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class ShareHeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int = 0
    assignment: frozenset[TopicPartition] | None = None  # None: unchanged, not sent


@dataclass(slots=True)
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_epoch: int = 0
    subscribed_topic_names: tuple[str, ...] = ()
    assigned: frozenset[TopicPartition] = frozenset()
    session_deadline: float = 0.0

    def to_doc(self) -> dict:
        return dict(member_id=self.member_id, rack_id=self.rack_id, client_id=self.client_id,
                    client_host=self.client_host, member_epoch=self.member_epoch,
                    subscribed_topic_names=list(self.subscribed_topic_names), assigned=partitions_doc(self.assigned))

    @classmethod
    def from_doc(cls, doc: dict, now: float, session_timeout_ms: int) -> "ShareMember":
        # Session timers restart on load, as on a coordinator failover in Kafka.
        return cls(member_id=doc["member_id"], rack_id=doc.get("rack_id"), client_id=doc.get("client_id", ""),
                   client_host=doc.get("client_host", ""), member_epoch=doc.get("member_epoch", 0),
                   subscribed_topic_names=tuple(doc.get("subscribed_topic_names", ())),
                   assigned=partitions_of(doc.get("assigned", {})), session_deadline=now + session_timeout_ms)


def validate_request(group_id: str, req: ShareHeartbeatRequest) -> None:
    """Kafka's checks of a ShareGroupHeartbeat before the group is looked at."""
    def invalid(msg: str):
        raise KafkaError(ErrorCode.invalid_request, msg)

    if not group_id:
        invalid("GroupId can't be empty.")
    if req.rack_id is not None and not req.rack_id:
        invalid("RackId can't be empty.")
    if not req.member_id:
        invalid("MemberId can't be empty.")
    if req.member_epoch == JOIN_EPOCH:
        if not req.subscribed_topic_names:
            invalid("SubscribedTopicNames must be set in first request.")
    elif req.member_epoch < LEAVE_EPOCH:
        invalid(f"MemberEpoch is {req.member_epoch}, but must be greater than or equal to -1.")


class ShareGroup:
    def __init__(self, group_id: str):
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ShareMember] = {}
        self.target: dict[str, frozenset[TopicPartition]] = {}
        # topic name -> (topic id, partitions) of the subscribed topics when the epoch last moved
        self.topics: dict[str, tuple[str, int]] = {}
        self.changed = False  # set when the persisted doc would differ; the driver clears it

    @property
    def state(self) -> ShareGroupState:
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    @property
    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topic_names(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names}

    def next_deadline(self) -> float | None:
        return min((m.session_deadline for m in self.members.values()), default=None)

    def heartbeat(self, now: float, req: ShareHeartbeatRequest, topics: Mapping[str, tuple[str, int]],
                  session_timeout_ms: int, heartbeat_interval_ms: int, max_size: int) -> ShareHeartbeatResult:
        """One ShareGroupHeartbeat (validated with `validate_request`). `topics`: name ->
        (topic id, partition count) of the existing topics among the group's subscriptions
        and the request's. Raises KafkaError for refusals."""
        if req.member_epoch == LEAVE_EPOCH:
            if self.members.pop(req.member_id, None) is None:
                raise KafkaError(ErrorCode.unknown_member_id,
                                 f"Member {req.member_id} is not a member of group {self.group_id}.")
            self.target.pop(req.member_id, None)
            self._bump()
            return ShareHeartbeatResult(member_id=req.member_id, member_epoch=LEAVE_EPOCH)
        full = req.member_epoch == JOIN_EPOCH
        member = self.members.get(req.member_id)
        bump = False
        if full:
            if member is None:
                if len(self.members) >= max_size:
                    raise KafkaError(ErrorCode.group_max_size_reached,
                                     f"The share group has reached its maximum capacity of {max_size} members.")
                member = ShareMember(member_id=req.member_id)
                self.members[req.member_id] = member
                bump = True
        elif member is None:
            raise KafkaError(ErrorCode.unknown_member_id,
                             f"Member {req.member_id} is not a member of group {self.group_id}.")
        elif req.member_epoch != member.member_epoch:
            raise KafkaError(ErrorCode.fenced_member_epoch,
                             f"The share group member has a {'greater' if req.member_epoch > member.member_epoch else 'smaller'} "
                             f"member epoch ({req.member_epoch}) than the one known by the group coordinator "
                             f"({member.member_epoch}).")
        before = (member.member_epoch, member.assigned)
        member.session_deadline = now + session_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        if req.rack_id is not None and req.rack_id != member.rack_id:
            member.rack_id = req.rack_id
            self.changed = True
        if req.subscribed_topic_names is not None:
            bump |= self._subscribe(member, tuple(sorted(set(req.subscribed_topic_names))))
        bump |= self._topics_changed(topics)
        if bump:
            self._bump()
        if self.group_epoch > self.assignment_epoch:
            self._compute_target()
        # No revocation in share groups: the member takes its target at once.
        member.assigned = self.target.get(member.member_id, frozenset())
        member.member_epoch = self.assignment_epoch
        if (member.member_epoch, member.assigned) != before:
            self.changed = True
        send = full or member.assigned != before[1]
        return ShareHeartbeatResult(member_id=member.member_id, member_epoch=member.member_epoch,
                                    heartbeat_interval_ms=heartbeat_interval_ms,
                                    assignment=member.assigned if send else None)

    @staticmethod
    def _subscribe(member: ShareMember, names: tuple[str, ...]) -> bool:
        changed = names != member.subscribed_topic_names
        member.subscribed_topic_names = names
        return changed

    def _topics_changed(self, topics: Mapping[str, tuple[str, int]]) -> bool:
        """Keep the subscribed topics that exist (id, partitions); True if they changed."""
        before, self.topics = self.topics, {t: topics[t] for t in sorted(self.subscribed_topic_names()) if t in topics}
        return self.topics != before

    def _bump(self) -> None:
        self.group_epoch += 1
        self.changed = True

    def _compute_target(self) -> None:
        specs = {m.member_id: MemberSpec(frozenset(self.topics[t][0] for t in m.subscribed_topic_names if t in self.topics),
                                         self.target.get(m.member_id, frozenset()))
                 for m in self.members.values()}
        self.target = simple(specs, {tid: n for tid, n in self.topics.values()})
        self.assignment_epoch = self.group_epoch
        self.changed = True

    def tick(self, now: float) -> list[tuple[str, str]]:
        """Remove members whose session timed out: [(member id, why)]."""
        out = [(m.member_id, "session timeout") for m in self.members.values() if m.session_deadline <= now]
        for member_id, _ in out:
            del self.members[member_id]
            self.target.pop(member_id, None)
            self._bump()
        return out

    # -- persistence --------------------------------------------------------------------------

    def to_doc(self) -> dict:
        return dict(type=SHARE_GROUP_TYPE, group_epoch=self.group_epoch, assignment_epoch=self.assignment_epoch,
                    topics={name: [tid, n] for name, (tid, n) in self.topics.items()},
                    members=[m.to_doc() for m in self.members.values()],
                    target={mid: partitions_doc(tps) for mid, tps in self.target.items()})

    @classmethod
    def from_doc(cls, group_id: str, doc: dict, now: float, session_timeout_ms: int) -> "ShareGroup":
        group = cls(group_id)
        group.group_epoch = doc.get("group_epoch", 0)
        group.assignment_epoch = doc.get("assignment_epoch", 0)
        group.topics = {name: (tid, n) for name, (tid, n) in doc.get("topics", {}).items()}
        for m in doc.get("members", []):
            member = ShareMember.from_doc(m, now, session_timeout_ms)
            group.members[member.member_id] = member
        group.target = {mid: partitions_of(tps) for mid, tps in doc.get("target", {}).items()}
        return group


def is_share_group_doc(doc: dict | None) -> bool:
    return doc is not None and doc.get("type") == SHARE_GROUP_TYPE
