"""ACL administration (#17): CreateAcls / DescribeAcls / DeleteAcls through confluent-kafka's
and kafka-python's admin clients, stored in the metadata store; SECURITY_DISABLED without
an authorizer; CLUSTER_AUTHORIZATION_FAILED for a principal without ALTER on the cluster."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ResourcePatternType, ResourceType,
)

from tests.support.broker import AclBroker


@pytest.fixture(scope="module")
def acl_broker():
    b = AclBroker(("admin", "alice"), "User:admin;User:ANONYMOUS").start()
    yield b
    b.stop()


def test_confluent_create_describe_delete(acl_broker):
    admin = AdminClient(acl_broker.sasl_conf("admin"))
    bindings = [
        AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "logs-", ResourcePatternType.PREFIXED, "User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "g1", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW),
    ]
    for fut in admin.create_acls(bindings).values():
        fut.result(10)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
    got = admin.describe_acls(everything).result(10)
    assert {(a.restype, a.name, a.resource_pattern_type, a.principal, a.operation) for a in got} == {
        (ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", AclOperation.WRITE),
        (ResourceType.TOPIC, "logs-", ResourcePatternType.PREFIXED, "User:bob", AclOperation.READ),
        (ResourceType.GROUP, "g1", ResourcePatternType.LITERAL, "User:bob", AclOperation.READ),
    }
    match = AclBindingFilter(ResourceType.TOPIC, "logs-app", ResourcePatternType.MATCH, None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert [a.name for a in admin.describe_acls(match).result(10)] == ["logs-"]
    # invalid binding: a CLUSTER resource must be named kafka-cluster
    bad = AclBinding(ResourceType.BROKER, "x", ResourcePatternType.LITERAL, "User:a", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(Exception, match="kafka-cluster"):
        list(admin.create_acls([bad]).values())[0].result(10)
    bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = list(admin.delete_acls([bob]).values())[0].result(10)
    assert sorted(a.name for a in deleted) == ["g1", "logs-"]
    assert [a.name for a in admin.describe_acls(everything).result(10)] == ["orders"]
    # a principal without ALTER on the cluster may not create ACLs
    alice = AdminClient(acl_broker.sasl_conf("alice"))
    with pytest.raises(Exception, match="(?i)cluster.*authoriz|authoriz.*cluster"):
        list(alice.create_acls([bindings[1]]).values())[0].result(10)


def test_kafka_python_admin(acl_broker):
    from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, KafkaAdminClient, ResourcePattern, ResourcePatternFilter
    from kafka.admin import ACLResourcePatternType, ResourceType as KPResource

    admin = KafkaAdminClient(bootstrap_servers=acl_broker.bootstrap)  # anonymous, a super user here
    try:
        acl = ACL("User:carol", "*", ACLOperation.DESCRIBE, ACLPermissionType.ALLOW,
                  ResourcePattern(KPResource.TOPIC, "kp-topic", ACLResourcePatternType.LITERAL))
        result = admin.create_acls([acl])
        assert result["succeeded"] and not result["failed"]
        flt = ACLFilter("User:carol", None, ACLOperation.ANY, ACLPermissionType.ANY, ResourcePatternFilter(KPResource.ANY, None, ACLResourcePatternType.ANY))
        described, error = admin.describe_acls(flt)
        assert [(a.principal, a.resource_pattern.resource_name) for a in described] == [("User:carol", "kp-topic")]
        deleted = admin.delete_acls([flt])
        assert len(deleted[0][1]) == 1
    finally:
        admin.close()


def test_security_disabled_without_authorizer(broker):
    from kafscale.errors import ErrorCode
    from tests.support import raw

    with raw.RawClient(broker.bootstrap) as c:
        r = c.request(29, 3, raw.req(29, 3, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                     principal_filter=None, host_filter=None, operation=1, permission_type=1))
        assert r.error_code == ErrorCode.security_disabled and "No Authorizer" in r.error_message
        r = c.request(30, 3, raw.req(30, 3, creations=[raw.req(30, 3, "AclCreation", resource_type=2, resource_name="t", resource_pattern_type=3,
                                                               principal="User:a", host="*", operation=3, permission_type=3)]))
        assert [x.error_code for x in r.results] == [ErrorCode.security_disabled]
