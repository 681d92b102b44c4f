"""DescribeAcls (29), CreateAcls (30), DeleteAcls (31).

Without an authorizer (`--authorizer none`) Kafka answers SECURITY_DISABLED; so do we.
With one, creating and deleting need ALTER on the cluster and describing needs DESCRIBE
on it (CLUSTER_AUTHORIZATION_FAILED otherwise), as Kafka. Bindings live in the metadata
store (so every broker enforces them); the rules are kafscale.security.acl."""

from __future__ import annotations

import logging

from kafscale.errors import ErrorCode
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, response
from kafscale.security.acl import (
    CLUSTER_NAME, AclBinding, AclFilter, InvalidAcl, Operation, PatternType, Permission, ResourceType, validate,
)

log = logging.getLogger("kafscale.authz")
DISABLED = "No Authorizer is configured on the broker (--authorizer acls turns it on)"


def _host(ctx) -> str:
    return ctx.peer.rsplit(":", 1)[0] if ":" in ctx.peer else ctx.peer


def _cluster_allowed(ctx, op: Operation) -> bool:
    return ctx.broker.authorizer.authorize(ctx.principal, _host(ctx), op, ResourceType.CLUSTER, CLUSTER_NAME)


def _enum(kind, value):
    try:
        return kind(value)
    except ValueError:
        return kind(0)  # UNKNOWN


def _filter(f) -> AclFilter:
    return AclFilter(
        _enum(ResourceType, f.resource_type_filter), f.resource_name_filter, _enum(PatternType, getattr(f, "pattern_type_filter", 3)),
        f.principal_filter, f.host_filter, _enum(Operation, f.operation), _enum(Permission, f.permission_type),
    )


def _bad_filter(f: AclFilter) -> str | None:
    if ResourceType.UNKNOWN == f.resource_type or PatternType.UNKNOWN == f.pattern_type or Operation.UNKNOWN == f.operation or Permission.UNKNOWN == f.permission:
        return "Filter contains UNKNOWN elements"
    return None


async def describe_acls(ctx, req):
    cls = response(ApiKey.DESCRIBE_ACLS, ctx.version)
    authz = ctx.broker.authorizer
    if not authz.enabled:
        return make(cls, throttle_time=0, error_code=ErrorCode.security_disabled, error_message=DISABLED, resources=[])
    if not _cluster_allowed(ctx, Operation.DESCRIBE):
        return make(cls, throttle_time=0, error_code=ErrorCode.cluster_authorization_failed, error_message=None, resources=[])
    flt = _filter(req)
    bad = _bad_filter(flt)
    if bad:
        return make(cls, throttle_time=0, error_code=ErrorCode.invalid_request, error_message=bad, resources=[])
    await authz.reload()
    groups: dict[tuple, list] = {}
    for b in sorted(authz.current.bindings, key=lambda b: (b.resource_type, b.name, b.pattern_type, b.principal, b.host, b.operation, b.permission)):
        if flt.matches(b):
            groups.setdefault((int(b.resource_type), b.name, int(b.pattern_type)), []).append(
                dict(principal=b.principal, host=b.host, operation=int(b.operation), permission_type=int(b.permission)))
    resources = [dict(resource_type=rt, resource_name=name, pattern_type=pt, acls=acls) for (rt, name, pt), acls in groups.items()]
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, resources=resources)


async def create_acls(ctx, req):
    cls = response(ApiKey.CREATE_ACLS, ctx.version)
    authz = ctx.broker.authorizer
    if not authz.enabled:
        return make(cls, throttle_time=0, results=[dict(error_code=ErrorCode.security_disabled, error_message=DISABLED) for _ in req.creations])
    if not _cluster_allowed(ctx, Operation.ALTER):
        return make(cls, throttle_time=0, results=[dict(error_code=ErrorCode.cluster_authorization_failed, error_message=None) for _ in req.creations])
    results, new = [], []
    for c in req.creations:
        try:
            b = AclBinding(ResourceType(c.resource_type), c.resource_name, PatternType(getattr(c, "resource_pattern_type", 3)), c.principal,
                           c.host, Operation(c.operation), Permission(c.permission_type))
            validate(b)
        except (ValueError, InvalidAcl) as e:
            results.append(dict(error_code=ErrorCode.invalid_request, error_message=str(e)))
            continue
        new.append(b)
        results.append(dict(error_code=ErrorCode.none, error_message=None))
    if new:
        try:
            await ctx.broker.metadata.change_acls([b.to_doc() for b in new], [])
        except MetadataUnavailable as e:
            return make(cls, throttle_time=0, results=[dict(error_code=ErrorCode.request_timed_out if r["error_code"] == ErrorCode.none else r["error_code"],
                                                            error_message=str(e) if r["error_code"] == ErrorCode.none else r["error_message"]) for r in results])
        log.info("ACLs created by %s: %s", ctx.principal, new, extra=ctx.log_fields())
        await authz.reload()
    return make(cls, throttle_time=0, results=results)


async def delete_acls(ctx, req):
    cls = response(ApiKey.DELETE_ACLS, ctx.version)
    authz = ctx.broker.authorizer
    if not authz.enabled:
        return make(cls, throttle_time=0, filter_results=[dict(error_code=ErrorCode.security_disabled, error_message=DISABLED, matching_acls=[]) for _ in req.filters])
    if not _cluster_allowed(ctx, Operation.ALTER):
        return make(cls, throttle_time=0, filter_results=[dict(error_code=ErrorCode.cluster_authorization_failed, error_message=None, matching_acls=[]) for _ in req.filters])
    await authz.reload()
    results, doomed = [], {}
    for f in req.filters:
        flt = _filter(f)
        bad = _bad_filter(flt)
        if bad:
            results.append(dict(error_code=ErrorCode.invalid_request, error_message=bad, matching_acls=[]))
            continue
        matched = [b for b in authz.current.bindings if flt.matches(b)]
        for b in matched:
            doomed[b] = None
        results.append(dict(error_code=ErrorCode.none, error_message=None, matching_acls=[
            dict(error_code=ErrorCode.none, error_message=None, resource_type=int(b.resource_type), resource_name=b.name,
                 pattern_type=int(b.pattern_type), principal=b.principal, host=b.host, operation=int(b.operation), permission_type=int(b.permission))
            for b in matched]))
    if doomed:
        await ctx.broker.metadata.change_acls([], [b.to_doc() for b in doomed])
        log.info("ACLs deleted by %s: %s", ctx.principal, list(doomed), extra=ctx.log_fields())
        await authz.reload()
    return make(cls, throttle_time=0, filter_results=results)


def register(router):
    router.register(ApiKey.DESCRIBE_ACLS, describe_acls)
    router.register(ApiKey.CREATE_ACLS, create_acls)
    router.register(ApiKey.DELETE_ACLS, delete_acls)
