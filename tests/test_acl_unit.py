"""Kafka's ACL rules without I/O (#17): LITERAL, PREFIXED and `*` patterns, principal and
host wildcards, deny wins, implied DESCRIBE, super users, allow.everyone.if.no.acl.found,
authorized-operation bit fields, DescribeAcls/DeleteAcls filters and CreateAcls checks."""

from __future__ import annotations

import pytest

from kafscale.security.acl import (
    AclBinding, AclFilter, Authorizer, InvalidAcl, Operation as Op, PatternType as Pat, Permission as Perm,
    ResourceType as Res, parse_super_users, validate,
)

ALLOW, DENY = Perm.ALLOW, Perm.DENY


def acl(res, name, principal, op, perm=ALLOW, pattern=Pat.LITERAL, host="*") -> AclBinding:
    return AclBinding(res, name, pattern, principal, host, op, perm)


def test_alice_writes_orders_but_may_not_read_it():
    a = Authorizer([acl(Res.TOPIC, "orders", "User:alice", Op.WRITE)])
    assert a.authorize("User:alice", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders")
    assert not a.authorize("User:alice", "10.0.0.1", Op.READ, Res.TOPIC, "orders")
    assert a.authorize("User:alice", "10.0.0.1", Op.DESCRIBE, Res.TOPIC, "orders")  # implied by WRITE
    assert not a.authorize("User:bob", "10.0.0.1", Op.WRITE, Res.TOPIC, "orders")
    assert not a.authorize("User:alice", "10.0.0.1", Op.WRITE, Res.TOPIC, "payments")  # no ACL: denied by default


def test_bob_reads_with_group_g1_not_g2():
    a = Authorizer([acl(Res.TOPIC, "orders", "User:bob", Op.READ), acl(Res.GROUP, "g1", "User:bob", Op.READ)])
    assert a.authorize("User:bob", "h", Op.READ, Res.GROUP, "g1")
    assert not a.authorize("User:bob", "h", Op.READ, Res.GROUP, "g2")


def test_prefixed_and_wildcard_patterns():
    a = Authorizer([
        acl(Res.TOPIC, "logs-", "User:carol", Op.READ, pattern=Pat.PREFIXED),
        acl(Res.TOPIC, "*", "User:dave", Op.DESCRIBE),
    ])
    assert a.authorize("User:carol", "h", Op.READ, Res.TOPIC, "logs-app")
    assert a.authorize("User:carol", "h", Op.READ, Res.TOPIC, "logs-")
    assert not a.authorize("User:carol", "h", Op.READ, Res.TOPIC, "logs")
    assert not a.authorize("User:carol", "h", Op.READ, Res.TOPIC, "applogs-x")
    assert a.authorize("User:dave", "h", Op.DESCRIBE, Res.TOPIC, "anything")
    assert not a.authorize("User:dave", "h", Op.READ, Res.TOPIC, "anything")


def test_deny_overrides_allow_and_is_not_implied():
    a = Authorizer([
        acl(Res.TOPIC, "*", "User:*", Op.ALL),
        acl(Res.TOPIC, "secret", "User:eve", Op.READ, DENY),
        acl(Res.TOPIC, "hr-", "User:*", Op.ALL, DENY, pattern=Pat.PREFIXED, host="192.168.1.9"),
    ])
    assert a.authorize("User:eve", "h", Op.READ, Res.TOPIC, "public")
    assert not a.authorize("User:eve", "h", Op.READ, Res.TOPIC, "secret")
    assert a.authorize("User:eve", "h", Op.DESCRIBE, Res.TOPIC, "secret")  # a DENY of READ leaves DESCRIBE
    assert not a.authorize("User:frank", "192.168.1.9", Op.DESCRIBE, Res.TOPIC, "hr-pay")  # DENY ALL from that host
    assert a.authorize("User:frank", "192.168.1.8", Op.DESCRIBE, Res.TOPIC, "hr-pay")


def test_host_must_match():
    a = Authorizer([acl(Res.TOPIC, "t", "User:alice", Op.READ, host="10.0.0.1")])
    assert a.authorize("User:alice", "10.0.0.1", Op.READ, Res.TOPIC, "t")
    assert not a.authorize("User:alice", "10.0.0.2", Op.READ, Res.TOPIC, "t")


def test_super_users_and_no_acl_found():
    supers = parse_super_users("User:admin; User:ops;")
    assert supers == {"User:admin", "User:ops"}
    a = Authorizer([acl(Res.TOPIC, "t", "User:alice", Op.READ, DENY)], supers)
    assert a.authorize("User:admin", "h", Op.DELETE, Res.TOPIC, "t")
    assert not a.authorize("User:bob", "h", Op.READ, Res.TOPIC, "other")
    open_ = Authorizer([acl(Res.TOPIC, "t", "User:alice", Op.READ)], allow_everyone_if_no_acl_found=True)
    assert open_.authorize("User:bob", "h", Op.READ, Res.TOPIC, "other")  # nothing applies to "other"
    assert not open_.authorize("User:bob", "h", Op.READ, Res.TOPIC, "t")  # an ACL applies to "t", not to bob


def test_authorized_operations_bits():
    everyone = Authorizer([], allow_everyone_if_no_acl_found=True)
    assert everyone.authorized_operations("User:x", "h", Res.GROUP, "g") == 3400  # READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: Kafka's value
    a = Authorizer([acl(Res.TOPIC, "t", "User:alice", Op.WRITE)])
    assert a.authorized_operations("User:alice", "h", Res.TOPIC, "t") == (1 << Op.WRITE) | (1 << Op.DESCRIBE)


def test_filters():
    bindings = [
        acl(Res.TOPIC, "orders", "User:alice", Op.WRITE),
        acl(Res.TOPIC, "ord", "User:bob", Op.READ, pattern=Pat.PREFIXED),
        acl(Res.TOPIC, "*", "User:carol", Op.DESCRIBE),
        acl(Res.GROUP, "orders", "User:alice", Op.READ),
    ]
    assert [b.principal for b in bindings if AclFilter().matches(b)] == ["User:alice", "User:bob", "User:carol", "User:alice"]
    match = AclFilter(Res.TOPIC, "orders", Pat.MATCH)
    assert [b.principal for b in bindings if match.matches(b)] == ["User:alice", "User:bob", "User:carol"]
    literal = AclFilter(Res.TOPIC, "orders", Pat.LITERAL)
    assert [b.principal for b in bindings if literal.matches(b)] == ["User:alice"]
    by_op = AclFilter(Res.ANY, None, Pat.ANY, "User:alice", None, Op.READ)
    assert [b.resource_type for b in bindings if by_op.matches(b)] == [Res.GROUP]
    assert AclBinding.from_doc(bindings[1].to_doc()) == bindings[1]


@pytest.mark.parametrize("binding, message", [
    (acl(Res.ANY, "t", "User:a", Op.READ), "resource type"),
    (acl(Res.TOPIC, "t", "User:a", Op.READ, pattern=Pat.MATCH), "pattern type"),
    (acl(Res.TOPIC, "t", "User:a", Op.ANY), "operation"),
    (acl(Res.TOPIC, "t", "User:a", Op.READ, Perm.ANY), "permission"),
    (acl(Res.TOPIC, "t", "alice", Op.READ), "principal"),
    (acl(Res.CLUSTER, "c", "User:a", Op.ALTER), "kafka-cluster"),
    (acl(Res.GROUP, "g", "User:a", Op.WRITE), "not an operation"),
    (acl(Res.TOPIC, "*", "User:a", Op.READ, pattern=Pat.PREFIXED), "wildcard"),
])
def test_create_acls_validation(binding, message):
    with pytest.raises(InvalidAcl, match=message):
        validate(binding)
    validate(acl(Res.CLUSTER, "kafka-cluster", "User:a", Op.IDEMPOTENT_WRITE))
