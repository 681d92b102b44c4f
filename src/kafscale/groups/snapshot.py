"""The group snapshot the coordinator persists (what Kafka's GroupMetadata record holds) and
reads back: a JSON document with base64 subscriptions and assignments."""

from __future__ import annotations

import base64
from typing import Callable

from kafscale.groups.state import Group, GroupConfig, Member, default_member_id


def to_doc(group: Group) -> dict:
    return {
        "protocol_type": group.protocol_type,
        "protocol": group.protocol_name,
        "generation": group.generation_id,
        "leader": group.leader_id,
        "state_ts": int(group.state_timestamp),
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout": m.session_timeout_ms,
                "rebalance_timeout": m.rebalance_timeout_ms,
                "subscription": base64.b64encode(m.metadata(group.protocol_name)).decode(),
                "assignment": base64.b64encode(m.assignment).decode(),
            }
            for m in group.members.values()
        ],
    }


def from_doc(
    group_id: str,
    doc: dict,
    config: GroupConfig,
    now: float,
    new_member_id: Callable[[str, str | None], str] = default_member_id,
) -> Group:
    """The group a snapshot describes, loaded as after a coordinator failover (`Group.restored`)."""
    protocol_type = doc.get("protocol_type") or None
    protocol_name = doc.get("protocol")
    members = [
        Member(
            md["member_id"], md.get("group_instance_id"), md.get("client_id", ""), md.get("client_host", ""),
            int(md["session_timeout"]), int(md.get("rebalance_timeout", md["session_timeout"])),
            protocol_type or "",
            [(protocol_name or "", base64.b64decode(md.get("subscription", "")))],
            base64.b64decode(md.get("assignment", "")),
        )
        for md in doc.get("members", [])
    ]
    return Group.restored(
        group_id, config, now, generation_id=int(doc.get("generation", 0)), protocol_type=protocol_type,
        protocol_name=protocol_name, state_timestamp=doc.get("state_ts", now), members=members,
        leader_id=doc.get("leader"), new_member_id=new_member_id,
    )
