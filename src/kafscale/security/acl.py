"""Kafka's ACL model and authorization decision, without I/O.

An ACL binding is (resource type, resource name, pattern type) x (principal, host,
operation, permission). Kafka's rules, as its StandardAuthorizer applies them:

- A binding applies to a resource when its pattern does: LITERAL with the same name,
  LITERAL `*` (every resource of the type), or PREFIXED with a prefix of the name.
- ... and to a request when the principal is the binding's or the binding's is `User:*`,
  the host is the binding's or the binding's is `*`, and the operation is the binding's
  or the binding's is ALL.
- Super users (`--super-users User:a;User:b`) may do everything.
- A DENY that applies wins over every ALLOW.
- An ALLOW of READ, WRITE, DELETE or ALTER implies DESCRIBE; an ALLOW of ALTER_CONFIGS
  implies DESCRIBE_CONFIGS (implication holds for ALLOW only: a DENY of READ does not deny
  DESCRIBE).
- Nothing applies to the resource at all (no binding of any principal, host or operation
  matches its name): allowed only with `allow.everyone.if.no.acl.found`.

Enum values are the protocol's (CreateAcls, DescribeAcls, DeleteAcls).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# What an ALLOW of each operation also allows.
_IMPLIED_BY = {
    Operation.DESCRIBE: (Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER),
    Operation.DESCRIBE_CONFIGS: (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}

# Operations each resource type has (the authorized-operations bit fields list these).
OPERATIONS_OF = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER,
                         Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                           Operation.IDEMPOTENT_WRITE, Operation.ALTER, Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
    ResourceType.DELEGATION_TOKEN: (Operation.DESCRIBE,),
    ResourceType.USER: (Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS),
}


class InvalidAcl(ValueError):
    """A binding CreateAcls must refuse (INVALID_REQUEST with this message)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.name == name or self.name == WILDCARD
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.name)
        return False

    def to_doc(self) -> dict:
        return {"resource_type": int(self.resource_type), "name": self.name, "pattern_type": int(self.pattern_type),
                "principal": self.principal, "host": self.host, "operation": int(self.operation), "permission": int(self.permission)}

    @classmethod
    def from_doc(cls, doc: dict) -> "AclBinding":
        return cls(ResourceType(doc["resource_type"]), doc["name"], PatternType(doc["pattern_type"]), doc["principal"],
                   doc["host"], Operation(doc["operation"]), Permission(doc["permission"]))


def validate(b: AclBinding) -> None:
    """What CreateAcls refuses, with Kafka's reasons."""
    if b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAcl(f"Invalid resource type {b.resource_type.name}")
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid pattern type {b.pattern_type.name}: only LITERAL and PREFIXED bindings can be created")
    if b.operation in (Operation.UNKNOWN, Operation.ANY):
        raise InvalidAcl(f"Invalid operation {b.operation.name}")
    if b.permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAcl(f"Invalid permission type {b.permission.name}")
    if not b.name:
        raise InvalidAcl("Resource name must not be empty")
    if b.pattern_type == PatternType.PREFIXED and b.name == WILDCARD:
        raise InvalidAcl("A PREFIXED binding cannot have the wildcard name '*': use LITERAL")
    kind, sep, who = b.principal.partition(":")
    if not sep or not kind or not who:
        raise InvalidAcl(f"Could not parse principal from `{b.principal}` (no colon is present separating the principal type from the principal name)")
    if not b.host:
        raise InvalidAcl("Host must not be empty (use '*' for every host)")
    if b.resource_type == ResourceType.CLUSTER and b.name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if b.operation != Operation.ALL and b.operation not in OPERATIONS_OF.get(b.resource_type, ()):
        raise InvalidAcl(f"{b.operation.name} is not an operation on {b.resource_type.name} resources")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls / DeleteAcls: None and ANY match everything; pattern MATCH matches the
    bindings that apply to the named resource (literal, wildcard and prefixed)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.name is not None and not b.matches_resource(b.resource_type, self.name):
                return False
        else:
            if self.pattern_type != PatternType.ANY and b.pattern_type != self.pattern_type:
                return False
            if self.name is not None and b.name != self.name:
                return False
        if self.principal is not None and b.principal != self.principal:
            return False
        if self.host is not None and b.host != self.host:
            return False
        if self.operation != Operation.ANY and b.operation != self.operation:
            return False
        if self.permission != Permission.ANY and b.permission != self.permission:
            return False
        return True


def parse_super_users(text: str) -> frozenset[str]:
    """Kafka's `super.users`: principals separated by ';' (`User:admin;User:ops`)."""
    return frozenset(p.strip() for p in (text or "").split(";") if p.strip())


class Authorizer:
    """The decision for one set of bindings (rebuilt when the stored bindings change)."""

    def __init__(self, bindings: list[AclBinding] | tuple = (), super_users: frozenset[str] = frozenset(), allow_everyone_if_no_acl_found: bool = False):
        self.super_users = super_users
        self.allow_if_no_acl = allow_everyone_if_no_acl_found
        self.bindings = tuple(bindings)
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[ResourceType, list[AclBinding]] = {}
        for b in self.bindings:
            if b.pattern_type == PatternType.LITERAL:
                self._literal.setdefault((b.resource_type, b.name), []).append(b)
            elif b.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(b.resource_type, []).append(b)

    def applying(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """Every binding whose pattern covers the resource (any principal, host, operation)."""
        out = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        out += [b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.name)]
        return out

    def authorize(self, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        acls = self.applying(resource_type, name)
        if not acls:
            return self.allow_if_no_acl
        mine = [b for b in acls if b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (host, WILDCARD)]
        if any(b.permission == Permission.DENY and b.operation in (operation, Operation.ALL) for b in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, (operation,))
        return any(b.permission == Permission.ALLOW and (b.operation == Operation.ALL or b.operation in allowing) for b in mine)

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """The bit field of include_*_authorized_operations: bit n set when operation n is allowed."""
        bits = 0
        for op in OPERATIONS_OF.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << int(op)
        return bits
