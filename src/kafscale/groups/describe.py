"""DescribeGroups' view of a group (what handlers/groups.py answers with)."""

from __future__ import annotations

from kafscale.groups.state import Group, GroupState


def describe_group(group: Group) -> dict:
    stable = group.state is GroupState.STABLE
    return {
        "group_state": group.state.value,
        "protocol_type": group.protocol_type or "",
        # Kafka reports the protocol and member metadata/assignments only when Stable.
        "protocol_data": (group.protocol_name or "") if stable else "",
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata(group.protocol_name) if stable else b"",
                "member_assignment": m.assignment if stable else b"",
            }
            for m in group.members.values()
        ],
    }
