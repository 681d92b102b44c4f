"""Online migration between the classic and the consumer group protocol (KIP-848's upgrade
and downgrade paths), pure: the policy and the two conversions, without I/O or a clock.

As Apache Kafka 4.x does it (GroupMetadataManager's validateOnlineUpgrade /
convertToConsumerGroup / convertToClassicGroup):
- Upgrade: a classic group of the embedded consumer protocol with members becomes a
  consumer group when a member using the consumer protocol joins it (ConsumerGroupHeartbeat
  with epoch 0), if the policy allows upgrades and its members fit `group.consumer.max.size`;
  otherwise the heartbeat gets GROUP_ID_NOT_FOUND. Every classic member is kept, at the
  classic generation as its member epoch, with its last assignment as both its current and
  target assignment; the group epoch is the generation. The joining member then moves the
  group epoch, and the classic members learn of the rebalance from their heartbeats.
- Downgrade: when the last member using the consumer protocol leaves (or is fenced) and
  classic members remain, the group becomes a classic group if the policy allows
  downgrades: the remaining members, Stable at the group epoch as generation, each with its
  target assignment, and a rebalance starts at once (their heartbeats say
  REBALANCE_IN_PROGRESS and they rejoin as a classic group). Likewise, without a
  rebalance, when a classic static member joining takes the instance id of the last
  consumer-protocol member (it takes that member's place and assignment).
- An empty group of either kind is simply replaced by the other kind, whatever the policy.
"""

from __future__ import annotations

from enum import Enum

from kafscale.errors import ErrorCode, KafkaError
from kafscale.groups.consumer_group import (
    ClassicMetadata,
    ConsumerGroup,
    ConsumerGroupConfig,
    Member as ConsumerMember,
    MemberState,
)
from kafscale.groups.consumer_protocol import MalformedProtocol, encode_assignment, parse_assignment, parse_subscription, subscription_version
from kafscale.groups.state import CONSUMER_PROTOCOL_TYPE, Group, GroupConfig, Member as ClassicMember


class MigrationPolicy(Enum):
    """Kafka's group.consumer.migration.policy."""

    BIDIRECTIONAL = "bidirectional"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    DISABLED = "disabled"

    @classmethod
    def parse(cls, name: str) -> "MigrationPolicy":
        """Case-insensitive, as Kafka's setting; ValueError for anything else."""
        try:
            return cls(str(name).strip().lower())
        except ValueError:
            raise ValueError(f"group.consumer.migration.policy: {name!r} is not one of "
                             f"{', '.join(p.value for p in cls)}") from None

    @property
    def upgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.UPGRADE)

    @property
    def downgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.DOWNGRADE)


DEFAULT_POLICY = MigrationPolicy.BIDIRECTIONAL  # Kafka 4.0's default


def upgrade_refusal(policy: MigrationPolicy, classic: Group, max_size: int) -> str | None:
    """Why a classic group with members may not become a consumer group (None: it may)."""
    if not policy.upgrades:
        return f"the online upgrade is disabled (group.consumer.migration.policy={policy.value})"
    if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return f"the group does not use the consumer embedded protocol (protocol type {classic.protocol_type!r})"
    if len(classic.members) > max_size:
        return f"its {len(classic.members)} members exceed group.consumer.max.size {max_size}"
    return None


def downgrade_allowed(policy: MigrationPolicy, group: ConsumerGroup, leaving_member_id: str) -> bool:
    """Does the consumer-protocol member leaving (or fenced) turn the group back into a
    classic group? Only if it is the last member using the consumer protocol, classic
    members remain, and the policy allows downgrades."""
    leaving = group.members.get(leaving_member_id)
    if leaving is None or leaving.uses_classic or not policy.downgrades:
        return False
    others = [m for m in group.members.values() if m.member_id != leaving_member_id]
    return bool(others) and all(m.uses_classic for m in others)


def replaced_by_classic(policy: MigrationPolicy, group: ConsumerGroup, instance_id: str | None, member_id: str) -> str | None:
    """The member id of the group's last consumer-protocol member when a classic JoinGroup
    (a static member joining anew) takes its instance id: the group then becomes a classic
    group at once, with the joining member in its place (Kafka's
    validateOnlineDowngradeWithReplacedMemberId); None otherwise."""
    if instance_id is None or member_id or not policy.downgrades:
        return None
    old = group.static_member(instance_id)
    if old is None or old.uses_classic:
        return None
    return old.member_id if all(m.uses_classic for m in group.members.values() if m is not old) else None


def to_consumer_group(classic: Group, config: ConsumerGroupConfig, topics: dict[str, tuple[str, int]],
                      now: float) -> ConsumerGroup:
    """The consumer group a classic group becomes. `topics`: name -> (topic id, partition
    count) of the existing topics among its members' subscriptions. GROUP_ID_NOT_FOUND when
    a member's subscription or assignment is not the consumer protocol (as Kafka)."""
    group = ConsumerGroup(classic.group_id, config)
    epoch = classic.generation_id
    group.group_epoch = group.target_epoch = epoch
    for m in classic.members.values():
        try:
            sub = parse_subscription(m.metadata(classic.protocol_name) or (m.protocols[0][1] if m.protocols else b""))
            assigned = parse_assignment(m.assignment)
        except MalformedProtocol as e:
            raise KafkaError(ErrorCode.group_id_not_found, f"Cannot upgrade the classic group {classic.group_id} to a "
                                                           f"consumer group: the embedded consumer protocol is malformed ({e}).") from None
        partitions = frozenset((topics[t][0], p) for t, p in assigned if t in topics and p < topics[t][1])
        member = ConsumerMember(
            member_id=m.member_id, instance_id=m.group_instance_id, rack_id=sub.rack_id, client_id=m.client_id,
            client_host=m.client_host, member_epoch=epoch, previous_member_epoch=epoch, state=MemberState.STABLE,
            rebalance_timeout_ms=m.rebalance_timeout_ms, subscribed_topic_names=tuple(sorted(set(sub.topics))),
            assigned=partitions, session_deadline=now + m.session_timeout_ms,
            classic=ClassicMetadata(m.session_timeout_ms, tuple((n, bytes(meta)) for n, meta in m.protocols)),
        )
        group.members[member.member_id] = member
        group.target[member.member_id] = partitions
    group.topics = {t: topics[t] for t in sorted(group.subscribed_topic_names()) if t in topics}
    group.changed = True
    return group


def to_classic_group(group: ConsumerGroup, leaving_member_id: str | None, config: GroupConfig, now: float) -> Group:
    """The classic group a consumer group becomes when `leaving_member_id`, its last
    consumer-protocol member, leaves: the other members (all classic), Stable at the group
    epoch with their target assignments, and already preparing a rebalance. With no member
    leaving (a classic static member replaced the last consumer-protocol one), Stable."""
    names = {tid: name for name, (tid, _n) in group.topics.items()}
    members = [
        ClassicMember(m.member_id, m.instance_id, m.client_id, m.client_host, m.classic.session_timeout_ms,
                      m.rebalance_timeout_ms, CONSUMER_PROTOCOL_TYPE, list(m.classic.protocols))
        for m in group.members.values() if m.member_id != leaving_member_id
    ]
    classic = Group.converted(group.group_id, config, now, generation_id=group.group_epoch, members=members,
                              rebalance=leaving_member_id is not None)
    for m in classic.members.values():
        # In the version of the member's subscription for the protocol the group selected.
        target = group.target.get(m.member_id, frozenset())
        m.assignment = encode_assignment([(names[t], p) for t, p in target if t in names],
                                         subscription_version(m.metadata(classic.protocol_name)))
    return classic
