"""The broker's authorizer: Kafka's ACL rules (kafscale.security.acl) over the bindings in
the metadata store, with `--authorizer acls`; with `none` (the default) everything is
allowed, as Kafka without an authorizer.

Bindings are read at start, after every change made through this broker, and every
--acl-refresh-ms (changes made through other brokers of a cluster). Denials are counted
and logged at most once per second per (principal, operation, resource)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from kafscale.metadata.refresh import reload_every
from kafscale.security.acl import OPERATIONS_OF, WILDCARD_PRINCIPAL, AclBinding, Authorizer, Operation, Permission, ResourceType, parse_super_users

if TYPE_CHECKING:
    from kafscale.broker.config import BrokerConfig
    from kafscale.metadata.store import MetadataStore

log = logging.getLogger("kafscale.authz")
DENIAL_LOG_INTERVAL_S = 1.0


class BrokerAuthorizer:
    def __init__(self, config: "BrokerConfig", metadata: "MetadataStore"):
        self.enabled = config.authorizer == "acls"
        self.config = config
        self.metadata = metadata
        self.super_users = parse_super_users(config.super_users)
        self.current = Authorizer((), self.super_users, config.allow_everyone_if_no_acl_found)
        self.denials = 0
        self.denials_by_operation: dict[str, int] = {}
        self._logged: dict[tuple, float] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if not self.enabled:
            return
        await self.reload()
        self._task = asyncio.get_running_loop().create_task(reload_every(max(0.05, self.config.acl_refresh_ms / 1000), self.reload, "ACL", log), name="acl-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def reload(self) -> None:
        docs = await self.metadata.list_acls()
        bindings = []
        for doc in docs:
            try:
                bindings.append(AclBinding.from_doc(doc))
            except (KeyError, ValueError) as e:
                log.warning("ignoring a stored ACL this broker cannot read: %r (%s)", doc, e)
        if set(bindings) != set(self.current.bindings):
            self.current = Authorizer(bindings, self.super_users, self.config.allow_everyone_if_no_acl_found)

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str, log_denial: bool = True) -> bool:
        if not self.enabled:
            return True
        if self.current.authorize(principal, host, operation, resource_type, name):
            return True
        if not log_denial:
            return False
        self.denials += 1
        self.denials_by_operation[operation.name] = self.denials_by_operation.get(operation.name, 0) + 1
        key = (principal, operation, resource_type, name)
        now = time.monotonic()
        if now - self._logged.get(key, -1e9) >= DENIAL_LOG_INTERVAL_S:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged[key] = now
            log.info("denied: %s from %s may not %s %s %s", principal, host, operation.name, resource_type.name, name)
        return False

    def may_write_some_topic(self, principal: str, host: str) -> bool:
        """Kafka lets a producer without IDEMPOTENT_WRITE on the cluster be idempotent when
        it may write some topic."""
        if not self.enabled or principal in self.super_users:
            return True
        return any(
            b.resource_type == ResourceType.TOPIC and b.permission == Permission.ALLOW and b.operation in (Operation.WRITE, Operation.ALL)
            and b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, "*")
            for b in self.current.bindings
        )

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """The bit field for include_*_authorized_operations: what the ACLs allow, or every
        operation of the resource type without an authorizer (as Kafka answers)."""
        if not self.enabled:
            return sum(1 << int(op) for op in OPERATIONS_OF.get(resource_type, ()))
        return self.current.authorized_operations(principal, host, resource_type, name)
