"""What the drivers of KIP-848 consumer groups and KIP-932 share groups have in common:
they live inside the classic `GroupCoordinator` (its per-group locks, clock, timer table
and store), keep their groups in memory, write a group's document after each change and
expire members on the group's one timer."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("kafscale.groups")


class GroupDriver:
    kind = "group"  # how logs name the groups of this driver

    def __init__(self, parent):
        # parent: the GroupCoordinator; not imported here, as it imports the drivers
        self.parent = parent
        self.metadata = parent.metadata
        self.groups: dict = {}

    async def stop(self) -> None:
        # (their timers are the classic coordinator's, stopped with it)
        self.groups.clear()

    def forget(self, group_id: str) -> None:
        """This broker no longer coordinates the group (call with its lock held)."""
        if self.groups.pop(group_id, None) is not None:
            self.parent.cancel_timer(group_id)

    def is_doc(self, doc: dict | None) -> bool:
        """Is this stored group document one of this driver's groups?"""
        raise NotImplementedError

    def state_of_doc(self, group_id: str, doc: dict) -> str:
        """The state of a stored group not loaded here."""
        raise NotImplementedError

    async def describe(self, group_id: str):
        async with self.parent._locks[group_id]:
            return await self.loaded(group_id)

    async def loaded(self, group_id: str):
        raise NotImplementedError

    async def list_groups(self, owned, docs: dict[str, dict] | None = None) -> list[tuple[str, str]]:
        """(group id, state) of this driver's groups this broker coordinates (`docs`: the
        stored group documents, when the caller has read them already)."""
        out = []
        if docs is None:
            docs = await self.metadata.list_groups()
        for group_id, doc in docs.items():
            if self.is_doc(doc) and owned(group_id):
                group = self.groups.get(group_id)
                out.append((group_id, group.state.value if group is not None else self.state_of_doc(group_id, doc)))
        return sorted(out)

    async def _settle(self, group) -> None:
        if group.changed:
            group.changed = False
            doc = group.to_doc()
            try:
                await self.metadata.put_group(group.group_id, doc)
            except Exception:
                # The group keeps working from memory; only failover recovery is affected.
                log.exception("could not persist %s %s", self.kind, group.group_id)
            else:
                await self._written(group.group_id, doc)
        self._reschedule(group)

    async def _written(self, group_id: str, doc: dict) -> None:
        """The store has the group's document `doc` now (a driver may mirror it elsewhere)."""

    # -- timers (the classic coordinator's table: one timer per group id) -----------------------

    def _reschedule(self, group) -> None:
        if self.groups.get(group.group_id) is group:
            self.parent.arm_timer(group.group_id, group.next_deadline())
        else:
            self.parent.cancel_timer(group.group_id)

    async def members_removed(self, group_id: str, member_ids: list[str]) -> None:
        """Members left the group or timed out (after the group's lock is released)."""

    async def on_timer(self, group_id: str) -> None:
        try:
            async with self.parent._locks[group_id]:
                group = self.groups.get(group_id)
                if group is None:
                    return
                if not self.parent.owns(group_id):
                    self.forget(group_id)
                    return
                removed = await self._expire(group, self.parent.clock())
            if removed:
                await self.members_removed(group_id, removed)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s timer failed", self.kind, group_id)

    async def _expire(self, group, now: float) -> list[str] | None:
        """Remove the members whose timers ran out (call with the group's lock held); their ids."""
        removed = group.tick(now)
        for member_id, why in removed:
            log.info("%s %s: member %s removed (%s)", self.kind, group.group_id, member_id, why)
        await self._settle(group)
        return [member_id for member_id, _ in removed]
