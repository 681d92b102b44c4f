"""The consumer-group state machine: Kafka's classic group protocol, without any I/O.

One `Group` holds members, generation, selected protocol, leader and state
(Empty, PreparingRebalance, CompletingRebalance, Stable, Dead). Each public method takes
the current time in milliseconds and returns an `Outcome`: an immediate result, or a
waiter id for a parked JoinGroup/SyncGroup, plus effects for the driver to carry out in
order (`PERSIST` the group, `Reply` to a parked request). Timers are deadlines the driver
reads with `next_deadline()` and fires with `tick(now)`; tests drive them with a fake clock.
States move only as `TRANSITIONS` allows (`IllegalTransition` otherwise).

Beside it: `snapshot.py` (the persisted document), `describe.py` (DescribeGroups' view),
`subscription.py` (the topics of a consumer's subscription).

The rules follow Apache Kafka's group coordinator (GroupMetadataManager / ClassicGroup):
MEMBER_ID_REQUIRED on a first dynamic join, the initial rebalance delay for groups that
were Empty, the rebalance timeout that drops members who did not rejoin, session timeouts,
the pending-sync timeout, static membership, and protocol selection by vote.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterable

from kafscale.errors import ErrorCode
from kafscale.groups.subscription import parse_subscription_topics

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(str, Enum):
    # The values are the names Kafka reports in DescribeGroups / ListGroups.
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# The states each state may move to (Kafka's ClassicGroupState, read the other way round:
# its valid previous states); `Group._transition` refuses any other move.
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.COMPLETING_REBALANCE, GroupState.EMPTY, GroupState.DEAD}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE, GroupState.STABLE, GroupState.DEAD}),
    GroupState.STABLE: frozenset({GroupState.PREPARING_REBALANCE, GroupState.DEAD}),
    GroupState.DEAD: frozenset({GroupState.DEAD}),
}


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow: a bug in the state machine, not input."""


@dataclass(frozen=True)
class GroupConfig:
    initial_rebalance_delay_ms: int = 3000
    # Kafka's group.min.session.timeout.ms / group.max.session.timeout.ms defaults.
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    # A new member's JoinGroup is parked without heartbeats; Kafka drops it after 5 min.
    new_member_join_timeout_ms: int = 300_000
    # Kafka has no join-time cap and fails later when the group record is too large for
    # the offsets topic; we refuse an oversized member up front so the group stays usable.
    max_member_metadata_bytes: int = 1024 * 1024


@dataclass
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # (id, instance id, metadata)
    skip_assignment: bool = False


@dataclass
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True)
class Reply:
    """Effect: answer the parked request `waiter` with `result`."""

    waiter: int
    result: JoinResult | SyncResult


class _Persist:
    def __repr__(self) -> str:
        return "PERSIST"


PERSIST = _Persist()
"""Effect: write the group's snapshot (`snapshot.to_doc(group)`) to the metadata store."""


@dataclass
class Outcome:
    result: JoinResult | SyncResult | ErrorCode | None = None
    waiter: int | None = None  # set when the request is parked until a Reply effect
    effects: list = field(default_factory=list)


@dataclass
class _Joining:
    """What a JoinGroup says of its member: the fields a join request and a member share."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]


@dataclass
class Member(_Joining):
    assignment: bytes = b""
    join_waiter: int | None = None
    sync_waiter: int | None = None
    is_new: bool = False
    heartbeat_deadline: float | None = None  # None: no expiry scheduled

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        return next(name for name, _ in self.protocols if name in candidates)

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None


_waiter_ids = itertools.count(1)


def default_member_id(client_id: str, group_instance_id: str | None) -> str:
    return f"{group_instance_id or client_id}-{uuid.uuid4()}"


@dataclass
class _JoinTimer:
    deadline: float
    initial: bool = False  # the initial-rebalance delay (extends while new members arrive)
    delay_ms: int = 0
    remaining_ms: int = 0


class Group:
    def __init__(
        self,
        group_id: str,
        config: GroupConfig,
        now: float,
        new_member_id: Callable[[str, str | None], str] = default_member_id,
    ):
        self.group_id = group_id
        self.config = config
        self.new_member_id = new_member_id
        self.state = GroupState.EMPTY
        self.previous_state = GroupState.EMPTY
        self.state_timestamp = now
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_members: dict[str, float] = {}  # member id issued by MEMBER_ID_REQUIRED -> deadline
        self.pending_sync: set[str] = set()
        self.new_member_added = False
        self.join_timer: _JoinTimer | None = None
        self.sync_deadline: float | None = None
        self.subscribed_topics: set[str] | None = None
        self.now = now
        self._effects: list = []

    # -- public operations ----------------------------------------------------------------

    def join(
        self,
        now: float,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
        supports_skip_assignment: bool = False,
    ) -> Outcome:
        self._begin(now)
        protocols = [(name, bytes(meta)) for name, meta in protocols]
        req = _JoinRequest(
            member_id, group_instance_id, client_id, client_host, session_timeout_ms,
            # 0 or less means "not given" (kafkajs sends 0): like JoinGroup v0, use the session timeout.
            rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms,
            protocol_type, protocols, require_known_member_id, supports_skip_assignment,
        )
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return self._done(JoinResult(ErrorCode.invalid_session_timeout, member_id))
        if sum(len(m) for _, m in protocols) > cfg.max_member_metadata_bytes:
            return self._done(JoinResult(ErrorCode.invalid_request, member_id))
        if member_id == "":
            return self._join_new_member(req)
        return self._join_existing_member(req)

    def sync(
        self,
        now: float,
        *,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> Outcome:
        self._begin(now)
        if self.state is GroupState.DEAD:
            return self._done(SyncResult(ErrorCode.coordinator_not_available))
        error = self._validate_member(member_id, group_instance_id)
        if error is not ErrorCode.none:
            return self._done(SyncResult(error))
        if generation_id != self.generation_id:
            return self._done(SyncResult(ErrorCode.illegal_generation))
        if _inconsistent(protocol_type, self.protocol_type) or _inconsistent(protocol_name, self.protocol_name):
            return self._done(SyncResult(ErrorCode.inconsistent_group_protocol))
        if self.state is GroupState.EMPTY:
            return self._done(SyncResult(ErrorCode.unknown_member_id))
        if self.state is GroupState.PREPARING_REBALANCE:
            return self._done(SyncResult(ErrorCode.rebalance_in_progress))
        member = self.members[member_id]
        self._remove_pending_sync(member_id)
        if self.state is GroupState.STABLE:
            return self._done(SyncResult(ErrorCode.none, member.assignment, self.protocol_type, self.protocol_name))
        # CompletingRebalance: park until the leader's assignment arrives.
        if member.sync_waiter is not None:
            self._reply(member.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress))
        waiter = member.sync_waiter = next(_waiter_ids)
        if member_id == self.leader_id:
            # Only the leader's assignments count; anything a follower sends is ignored.
            for m in self.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            self._effects.append(PERSIST)
            self._propagate_assignment(ErrorCode.none)
            self._transition(GroupState.STABLE)
        return self._done(None, waiter)

    def heartbeat(self, now: float, *, member_id: str, group_instance_id: str | None, generation_id: int) -> Outcome:
        self._begin(now)
        if self.state is GroupState.DEAD:
            return self._done(ErrorCode.coordinator_not_available)
        error = self._validate_member(member_id, group_instance_id)
        if error is not ErrorCode.none:
            return self._done(error)
        if generation_id != self.generation_id:
            return self._done(ErrorCode.illegal_generation)
        if self.state is GroupState.EMPTY:
            return self._done(ErrorCode.unknown_member_id)
        self._reschedule_heartbeat(self.members[member_id])
        if self.state is GroupState.PREPARING_REBALANCE:
            return self._done(ErrorCode.rebalance_in_progress)
        # CompletingRebalance counts as alive too: clients heartbeat right after JoinGroup.
        return self._done(ErrorCode.none)

    def leave(self, now: float, members: Iterable[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode], list]:
        """LeaveGroup for (member id, group instance id) pairs: (group error, per-member errors, effects)."""
        self._begin(now)
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, [], []
        errors: list[ErrorCode] = []
        for member_id, instance_id in members:
            if member_id == "":
                # Admin removal by group instance id alone.
                if instance_id is not None and instance_id in self.static_members:
                    self._remove_member_for_leave(self.static_members[instance_id])
                    errors.append(ErrorCode.none)
                else:
                    errors.append(ErrorCode.unknown_member_id)
            elif member_id in self.pending_members:
                del self.pending_members[member_id]
                errors.append(ErrorCode.none)
            else:
                error = self._validate_member(member_id, instance_id)
                if error is ErrorCode.none:
                    self._remove_member_for_leave(member_id)
                errors.append(error)
        if any(e is ErrorCode.none for e in errors):
            if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join()
            elif self.state is GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join_phase()
        return ErrorCode.none, errors, self._take_effects()

    def validate_offset_commit(
        self, now: float, *, member_id: str, group_instance_id: str | None, generation_id: int,
        transactional: bool = False,
    ) -> ErrorCode:
        """May these offsets be committed? As Kafka's classic group: a commit that names a
        member (id, instance id or generation) must be that member at the current generation;
        one that names none is an admin or assign() commit, allowed only while the group is
        Empty. A `transactional` commit (TxnOffsetCommit) naming none is allowed in any state:
        below v3 that request cannot carry a member, so Kafka does not ask for one; nor does
        it hold transactional commits back while a rebalance completes. Only an OffsetCommit
        of a valid member counts as its heartbeat."""
        self.now = now
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and self.state is GroupState.EMPTY:
            # Admin client or a consumer using assign(): allowed while nobody is a member.
            return ErrorCode.none
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = self._validate_member(member_id, group_instance_id)
            if error is not ErrorCode.none:
                return error
            if generation_id != self.generation_id:
                return ErrorCode.illegal_generation
        elif not transactional and self.state is not GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if transactional:
            return ErrorCode.none
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        if self.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE) and member_id in self.members:
            self._reschedule_heartbeat(self.members[member_id])
        return ErrorCode.none

    def validate_offset_delete(self) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found
        if not self.is_empty and self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return ErrorCode.non_empty_group
        return ErrorCode.none

    def validate_delete(self) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.group_id_not_found
        if not self.is_empty:
            return ErrorCode.non_empty_group
        return ErrorCode.none

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    def mark_dead(self) -> list:
        """The group was deleted or expired: fail anything still parked."""
        self._begin(self.now)
        for m in self.members.values():
            self._complete_join(m, JoinResult(ErrorCode.coordinator_not_available, m.member_id))
            self._complete_sync(m, SyncResult(ErrorCode.coordinator_not_available))
        self._transition(GroupState.DEAD)
        self.join_timer = None
        self.sync_deadline = None
        return self._take_effects()

    def unload(self, error: ErrorCode = ErrorCode.not_coordinator) -> list:
        """This broker stops coordinating the group: answer parked requests with `error`."""
        self._begin(self.now)
        for m in self.members.values():
            self._complete_join(m, JoinResult(error, m.member_id))
            self._complete_sync(m, SyncResult(error))
        return self._take_effects()

    # -- timers -------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadlines = [m.heartbeat_deadline for m in self.members.values() if m.heartbeat_deadline is not None]
        deadlines += self.pending_members.values()
        if self.join_timer is not None:
            deadlines.append(self.join_timer.deadline)
        if self.sync_deadline is not None:
            deadlines.append(self.sync_deadline)
        return min(deadlines) if deadlines else None

    def tick(self, now: float) -> list:
        """Fire every timer due at `now`, earliest first; returns the effects."""
        self._begin(now)
        for _ in range(10_000):  # bounded: each step removes or moves a deadline
            due = self._earliest_due(now)
            if due is None:
                break
            kind, key = due
            if kind == "join":
                self._on_join_timer()
            elif kind == "sync":
                self._on_sync_timer()
            elif kind == "pending":
                del self.pending_members[key]
                if self.state is GroupState.PREPARING_REBALANCE and self._all_members_joined():
                    self._complete_join_phase()
            else:
                self._on_heartbeat_expired(self.members[key])
        return self._take_effects()

    def _earliest_due(self, now: float):
        best = None
        if self.join_timer is not None and self.join_timer.deadline <= now:
            best = (self.join_timer.deadline, "join", None)
        if self.sync_deadline is not None and self.sync_deadline <= now and (best is None or self.sync_deadline < best[0]):
            best = (self.sync_deadline, "sync", None)
        for mid, deadline in self.pending_members.items():
            if deadline <= now and (best is None or deadline < best[0]):
                best = (deadline, "pending", mid)
        for m in self.members.values():
            d = m.heartbeat_deadline
            if d is not None and d <= now and (best is None or d < best[0]):
                best = (d, "member", m.member_id)
        return None if best is None else (best[1], best[2])

    def _on_join_timer(self) -> None:
        t = self.join_timer
        if t.initial and self.new_member_added and t.remaining_ms != 0:
            # Members keep arriving at a new group: wait a little longer (bounded by the rebalance timeout).
            self.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, t.remaining_ms)
            remaining = max(t.remaining_ms - t.delay_ms, 0)
            self.join_timer = _JoinTimer(self.now + delay, True, delay, remaining)
        else:
            self._complete_join_phase()

    def _on_sync_timer(self) -> None:
        self.sync_deadline = None
        if self.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) and self.pending_sync:
            # Members that never sent SyncGroup for this generation are dropped.
            for mid in list(self.pending_sync):
                if mid in self.members:
                    self._remove_member(mid)
            self._prepare_rebalance()

    def _on_heartbeat_expired(self, member: Member) -> None:
        if not member.is_new and (member.join_waiter is not None or member.sync_waiter is not None):
            # A member parked in JoinGroup/SyncGroup cannot heartbeat; its timer restarts later.
            member.heartbeat_deadline = None
            return
        self._complete_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._remove_member(member.member_id)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join()
        elif self.state is GroupState.PREPARING_REBALANCE and self._all_members_joined():
            self._complete_join_phase()

    # -- join internals -----------------------------------------------------------------

    def _join_new_member(self, req: "_JoinRequest") -> Outcome:
        if self.state is GroupState.DEAD:
            return self._done(JoinResult(ErrorCode.coordinator_not_available, ""))
        if not self._supports_protocols(req.protocol_type, req.protocols):
            return self._done(JoinResult(ErrorCode.inconsistent_group_protocol, ""))
        new_id = self.new_member_id(req.client_id, req.group_instance_id)
        if req.group_instance_id is not None:
            old_id = self.static_members.get(req.group_instance_id)
            if old_id is not None:
                return self._replace_static_member(req, old_id, new_id)
            return self._add_member_and_rebalance(req, new_id)
        if req.require_known_member_id:
            # Hand out the id first; the member joins again with it (KIP-394).
            self.pending_members[new_id] = self.now + req.session_timeout_ms
            return self._done(JoinResult(ErrorCode.member_id_required, new_id))
        return self._add_member_and_rebalance(req, new_id)

    def _join_existing_member(self, req: "_JoinRequest") -> Outcome:
        member_id = req.member_id
        if self.state is GroupState.DEAD:
            return self._done(JoinResult(ErrorCode.coordinator_not_available, member_id))
        if not self._supports_protocols(req.protocol_type, req.protocols):
            return self._done(JoinResult(ErrorCode.inconsistent_group_protocol, member_id))
        if member_id in self.pending_members:
            return self._add_member_and_rebalance(req, member_id)
        error = self._validate_member(member_id, req.group_instance_id)
        if error is not ErrorCode.none:
            return self._done(JoinResult(error, member_id))
        member = self.members[member_id]
        if self.state is GroupState.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(member, req)
        if self.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # A retry of a JoinGroup whose response was lost: answer with the current generation.
                return self._done(self._join_result(member, self._is_leader(member_id)))
            return self._update_member_and_rebalance(member, req)
        if self.state is GroupState.STABLE:
            if self._is_leader(member_id) or not member.matches(req.protocols):
                # The leader rejoining forces a rebalance (it may have seen metadata changes).
                return self._update_member_and_rebalance(member, req)
            return self._done(self._join_result(member, False))
        # Empty with a member id we do not know: let it reset and rejoin.
        return self._done(JoinResult(ErrorCode.unknown_member_id, member_id))

    def _add_member_and_rebalance(self, req: "_JoinRequest", member_id: str) -> Outcome:
        waiter = next(_waiter_ids)
        member = Member(
            member_id, req.group_instance_id, req.client_id, req.client_host, req.session_timeout_ms,
            req.rebalance_timeout_ms, req.protocol_type, list(req.protocols), join_waiter=waiter, is_new=True,
        )
        if self.state is GroupState.PREPARING_REBALANCE and self.previous_state is GroupState.EMPTY:
            self.new_member_added = True
        self._add(member)
        # A parked new member cannot heartbeat; drop it if the join takes absurdly long.
        member.heartbeat_deadline = self.now + self.config.new_member_join_timeout_ms
        self._maybe_prepare_rebalance_or_complete_join()
        return self._done(None, waiter)

    def _update_member_and_rebalance(self, member: Member, req: "_JoinRequest") -> Outcome:
        waiter = self._update_member(member, req)
        self._maybe_prepare_rebalance_or_complete_join()
        return self._done(None, waiter)

    def _update_member(self, member: Member, req: "_JoinRequest") -> int:
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        if member.join_waiter is not None:
            # A duplicate JoinGroup supersedes the first; answer that one so nothing dangles.
            self._reply(member.join_waiter, JoinResult(ErrorCode.rebalance_in_progress, member.member_id))
        member.join_waiter = next(_waiter_ids)
        return member.join_waiter

    def _replace_static_member(self, req: "_JoinRequest", old_id: str, new_id: str) -> Outcome:
        current_leader = self.leader_id
        old = self.members.pop(old_id)
        # Whoever still waits with the old id is a fenced duplicate of this instance.
        self._complete_join(old, JoinResult(ErrorCode.fenced_instance_id, old_id))
        self._complete_sync(old, SyncResult(ErrorCode.fenced_instance_id))
        member = Member(
            new_id, old.group_instance_id, old.client_id, old.client_host, old.session_timeout_ms,
            old.rebalance_timeout_ms, old.protocol_type, old.protocols, old.assignment,
        )
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        self.static_members[req.group_instance_id] = new_id
        self._reschedule_heartbeat(member)
        waiter = self._update_member(member, req)

        if self.state is GroupState.STABLE:
            if self.protocol_name == self._select_protocol():
                # Same protocol: keep the generation and the old assignment, no rebalance.
                self._effects.append(PERSIST)
                if req.supports_skip_assignment:
                    is_leader = self._is_leader(new_id)
                    result = self._join_result(member, is_leader, skip_assignment=is_leader)
                else:
                    # Old clients: report the previous leader id so the rejoined member does
                    # not compute an assignment that a Stable group would ignore.
                    result = self._join_result(member, False)
                    result.leader = current_leader or ""
                self._complete_join(member, result)
            else:
                self._maybe_prepare_rebalance_or_complete_join()
        elif self.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already have been given the old id; rebalance to resync.
            self._prepare_rebalance()
        else:
            self._maybe_complete_join_phase()
        return self._done(None, waiter)

    def _maybe_prepare_rebalance_or_complete_join(self) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance()
        else:
            self._maybe_complete_join_phase()

    def _prepare_rebalance(self) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            for m in self.members.values():
                m.assignment = b""
            self._propagate_assignment(ErrorCode.rebalance_in_progress)
        self.pending_sync.clear()
        self.sync_deadline = None
        initial = self.state is GroupState.EMPTY
        self._transition(GroupState.PREPARING_REBALANCE)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(self._rebalance_timeout_ms() - delay, 0)
            self.join_timer = _JoinTimer(self.now + delay, True, delay, remaining)
        elif self._all_members_joined():
            self._complete_join_phase()
        else:
            self.join_timer = _JoinTimer(self.now + self._rebalance_timeout_ms())

    def _maybe_complete_join_phase(self) -> None:
        # The initial rebalance of a formerly Empty group always waits out its delay.
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and self._all_members_joined()
            and self.previous_state is not GroupState.EMPTY
        ):
            self._complete_join_phase()

    def _complete_join_phase(self) -> None:
        self.join_timer = None
        for m in list(self.members.values()):
            # Dynamic members that did not rejoin are out; static ones keep their place.
            if not m.awaiting_join and m.group_instance_id is None:
                self._remove_member(m.member_id)
        if self.state is GroupState.DEAD:
            return
        if not self._elect_joined_leader() and self.members:
            # Nobody rejoined (only absent static members): wait another rebalance timeout.
            self.join_timer = _JoinTimer(self.now + self._rebalance_timeout_ms())
            return
        self.generation_id += 1
        if self.members:
            self.protocol_name = self._select_protocol()
            self.subscribed_topics = self._compute_subscribed_topics()
            self._transition(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.subscribed_topics = self._compute_subscribed_topics()
            self._transition(GroupState.EMPTY)
        self.pending_sync.clear()
        if self.state is GroupState.EMPTY:
            self._effects.append(PERSIST)
            return
        for m in self.members.values():
            self._complete_join(m, self._join_result(m, self._is_leader(m.member_id)))
            self._reschedule_heartbeat(m)
            m.is_new = False
            self.pending_sync.add(m.member_id)
        self.sync_deadline = self.now + self._pending_sync_timeout_ms()

    def _elect_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        return False

    def _join_result(self, member: Member, with_members: bool, skip_assignment: bool = False) -> JoinResult:
        members = []
        if with_members:
            members = [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]
        return JoinResult(
            ErrorCode.none, member.member_id, self.generation_id, self.protocol_type, self.protocol_name,
            self.leader_id or "", members, skip_assignment,
        )

    # -- sync internals -----------------------------------------------------------------

    def _propagate_assignment(self, error: ErrorCode) -> None:
        ptype = self.protocol_type if error is ErrorCode.none else None
        pname = self.protocol_name if error is ErrorCode.none else None
        for m in self.members.values():
            if self._complete_sync(m, SyncResult(error, m.assignment, ptype, pname)):
                self._reschedule_heartbeat(m)

    def _remove_pending_sync(self, member_id: str) -> None:
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self.sync_deadline = None

    # -- members ------------------------------------------------------------------------

    def _add(self, member: Member) -> None:
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        self.pending_members.pop(member.member_id, None)
        if self.leader_id is None:
            self.leader_id = member.member_id

    def _remove_member(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
            self._complete_sync(member, SyncResult(ErrorCode.unknown_member_id))
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)

    def _remove_member_for_leave(self, member_id: str) -> None:
        member = self.members[member_id]
        # A member leaving while its JoinGroup is parked gets UNKNOWN_MEMBER_ID there.
        self._complete_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._remove_member(member_id)

    def _validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
            return ErrorCode.none
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    def _reschedule_heartbeat(self, member: Member) -> None:
        member.heartbeat_deadline = self.now + member.session_timeout_ms

    def _all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def _rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _pending_sync_timeout_ms(self) -> int:
        """Kafka waits a rebalance timeout for SyncGroup; never less than a session timeout
        here, which is what clients assume: a shorter wait evicts members still on their
        way from JoinGroup to SyncGroup."""
        return max((max(m.rebalance_timeout_ms, m.session_timeout_ms) for m in self.members.values()), default=0)

    def _is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    # -- protocols ----------------------------------------------------------------------

    def _supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        if self.protocol_type != protocol_type:
            return False
        counts = self._protocol_counts()
        return any(counts[name] == len(self.members) for name, _ in protocols)

    def _protocol_counts(self) -> Counter:
        counts: Counter = Counter()
        for m in self.members.values():
            counts.update({name for name, _ in m.protocols})
        return counts

    def _select_protocol(self) -> str:
        """Among protocols every member supports, the one most members prefer."""
        counts = self._protocol_counts()
        candidates = {name for name, n in counts.items() if n == len(self.members)}
        votes = Counter(m.vote(candidates) for m in self.members.values())
        # Counter.most_common keeps first-seen order among equal counts: deterministic ties.
        return votes.most_common(1)[0][0]

    def _compute_subscribed_topics(self) -> set[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_subscription_topics(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics

    # -- state and effects --------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return self.state is GroupState.EMPTY

    def _transition(self, state: GroupState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"group {self.group_id}: {self.state.value} -> {state.value}")
        self.previous_state = self.state
        self.state = state
        self.state_timestamp = self.now

    def _begin(self, now: float) -> None:
        self.now = max(self.now, now)
        self._effects = []

    def _done(self, result, waiter: int | None = None) -> Outcome:
        return Outcome(result, waiter, self._take_effects())

    def _take_effects(self) -> list:
        effects, self._effects = self._effects, []
        return effects

    def _reply(self, waiter: int, result) -> None:
        self._effects.append(Reply(waiter, result))

    def _complete_join(self, member: Member, result: JoinResult) -> bool:
        if member.join_waiter is None:
            return False
        self._reply(member.join_waiter, result)
        member.join_waiter = None
        return True

    def _complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_waiter is None:
            return False
        self._reply(member.sync_waiter, result)
        member.sync_waiter = None
        return True

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def restored(
        cls,
        group_id: str,
        config: GroupConfig,
        now: float,
        *,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
        state_timestamp: float,
        members: Iterable[Member],
        leader_id: str | None,
        new_member_id: Callable[[str, str | None], str] = default_member_id,
    ) -> "Group":
        """A group as its snapshot (groups/snapshot.py) left it, loaded as after a coordinator
        failover: members come back in a Stable group with fresh session timers; those who
        do not heartbeat expire and rebalance. A group without members is Empty."""
        group = cls(group_id, config, now, new_member_id)
        group.generation_id = generation_id
        group.protocol_type = protocol_type
        group.protocol_name = protocol_name
        group.state_timestamp = state_timestamp
        for member in members:
            group._add(member)
            group._reschedule_heartbeat(member)
        if group.members:
            group.leader_id = leader_id if leader_id in group.members else next(iter(group.members))
            group.state = group.previous_state = GroupState.STABLE  # where loading starts, not a transition
        group.subscribed_topics = group._compute_subscribed_topics()
        return group

    @classmethod
    def converted(cls, group_id: str, config: GroupConfig, now: float, *, generation_id: int,
                  members: list[Member], rebalance: bool = True) -> "Group":
        """A consumer group turned classic (KIP-848's downgrade, `migration.py`): Stable at
        `generation_id` with these members (the driver sets their assignments), the protocol
        selected by vote, and (`rebalance`) a rebalance prepared at once, so the members'
        heartbeats say REBALANCE_IN_PROGRESS and they rejoin as a classic group."""
        group = cls.restored(group_id, config, now, generation_id=generation_id, protocol_type=CONSUMER_PROTOCOL_TYPE,
                             protocol_name=None, state_timestamp=now, members=members, leader_id=None)
        group.protocol_name = group._select_protocol()
        group.subscribed_topics = group._compute_subscribed_topics()
        if rebalance:
            group._begin(now)
            group._prepare_rebalance()
            group._take_effects()  # (nobody is parked yet)
        return group


@dataclass
class _JoinRequest(_Joining):
    require_known_member_id: bool
    supports_skip_assignment: bool


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
