"""SaslHandshake (17) v0-1, SaslAuthenticate (36) v0-2, DescribeUserScramCredentials (50)
and AlterUserScramCredentials (51).

The connection's SASL state is `ctx.session` (kafscale.security.sasl.SaslSession; None on
a listener without SASL, where both SASL APIs answer ILLEGAL_SASL_STATE as Kafka does).
States that Kafka answers by closing the connection raise IllegalSaslState, which the
server turns into a closed connection. The exchange itself runs in broker/auth.py.
"""

from __future__ import annotations

import logging

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, response
from kafscale.security import scram

log = logging.getLogger("kafscale.auth")


def _address(peer: str) -> str:
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


async def sasl_handshake(ctx, req):
    cls = response(ApiKey.SASL_HANDSHAKE, ctx.version)
    auth = ctx.broker.auth
    session = ctx.session
    if session is None:
        return make(cls, error_code=ErrorCode.illegal_sasl_state, mechanisms=list(auth.mechanisms))
    ok = session.handshake(req.mechanism.upper(), ctx.version)
    return make(cls, error_code=ErrorCode.none if ok else ErrorCode.unsupported_sasl_mechanism, mechanisms=list(auth.mechanisms))


async def sasl_authenticate(ctx, req):
    cls = response(ApiKey.SASL_AUTHENTICATE, ctx.version)
    session = ctx.session
    if session is None:
        return make(cls, error_code=ErrorCode.illegal_sasl_state, error_message="SaslAuthenticate on a listener without SASL",
                    auth_bytes=b"", session_lifetime=0)
    session.expect_authenticate()
    reply, failure = await ctx.broker.auth.step(session, bytes(req.auth_bytes), ctx.peer, _address(ctx.peer))
    if failure is not None:
        return make(cls, error_code=ErrorCode.sasl_authentication_failed, error_message=failure, auth_bytes=b"", session_lifetime=0)
    lifetime = ctx.broker.auth.session_lifetime_ms if session.authenticated else 0
    return make(cls, error_code=ErrorCode.none, error_message=None, auth_bytes=reply, session_lifetime=lifetime)


# -- SCRAM credential administration -------------------------------------------------------


async def describe_user_scram_credentials(ctx, req):
    cls = response(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ctx.version)
    stored = await ctx.broker.metadata.list_scram_credentials()
    by_user: dict[str, list] = {}
    for (user, mech), doc in sorted(stored.items()):
        if mech in scram.MECHANISM_IDS:
            by_user.setdefault(user, []).append(dict(mechanism=scram.MECHANISM_IDS[mech], iterations=int(doc["iterations"])))
    results = []
    if req.users is None or len(req.users) == 0:
        for user, infos in by_user.items():
            results.append(dict(user=user, error_code=ErrorCode.none, error_message=None, credential_infos=infos))
    else:
        seen: dict[str, int] = {}
        for u in req.users:
            seen[u.name] = seen.get(u.name, 0) + 1
        for name, count in seen.items():
            if count > 1:
                results.append(dict(user=name, error_code=ErrorCode.duplicate_resource, error_message=f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}", credential_infos=[]))
            elif name in by_user:
                results.append(dict(user=name, error_code=ErrorCode.none, error_message=None, credential_infos=by_user[name]))
            else:
                results.append(dict(user=name, error_code=ErrorCode.resource_not_found, error_message=f"Attempt to describe a user credential that does not exist: {name}", credential_infos=[]))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, results=results)


async def alter_user_scram_credentials(ctx, req):
    cls = response(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ctx.version)
    stored = await ctx.broker.metadata.list_scram_credentials()
    errors: dict[str, tuple[int, str]] = {}
    users = [d.name for d in req.deletions] + [u.name for u in req.upsertions]
    pairs = [(d.name, d.mechanism) for d in req.deletions] + [(u.name, u.mechanism) for u in req.upsertions]
    for name, mech_id in pairs:
        if not name:
            errors.setdefault(name, (ErrorCode.unacceptable_credential, "Username must not be empty"))
        elif mech_id not in scram.MECHANISM_NAMES:
            errors.setdefault(name, (ErrorCode.unsupported_sasl_mechanism, f"Unknown SCRAM mechanism {mech_id}"))
    for name in set(users):
        mechs = [m for n, m in pairs if n == name]
        if len(mechs) != len(set(mechs)):
            errors.setdefault(name, (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request"))
    for d in req.deletions:
        mech = scram.MECHANISM_NAMES.get(d.mechanism)
        if mech is not None and (d.name, mech) not in stored:
            errors.setdefault(d.name, (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"))
    for u in req.upsertions:
        if not scram.MIN_ITERATIONS <= u.iterations <= scram.MAX_ITERATIONS:
            errors.setdefault(u.name, (ErrorCode.unacceptable_credential, f"Iterations must be between {scram.MIN_ITERATIONS} and {scram.MAX_ITERATIONS}"))
        elif not u.salt or not u.salted_password:
            errors.setdefault(u.name, (ErrorCode.unacceptable_credential, "Salt and salted password must not be empty"))
    puts = {}
    for u in req.upsertions:
        if u.name not in errors:
            mech = scram.MECHANISM_NAMES[u.mechanism]
            cred = scram.credential_from_salted(mech, bytes(u.salted_password), bytes(u.salt), u.iterations)
            puts[(u.name, mech)] = cred.to_doc()
    deletes = [(d.name, scram.MECHANISM_NAMES[d.mechanism]) for d in req.deletions if d.name not in errors]
    if puts or deletes:
        await ctx.broker.metadata.change_scram_credentials(puts, deletes)
        log.info("SCRAM credentials changed by %s: set %s, deleted %s", ctx.principal, sorted(puts), sorted(deletes), extra=ctx.log_fields())
    results = []
    for name in dict.fromkeys(users):
        code, message = errors.get(name, (ErrorCode.none, None))
        results.append(dict(user=name, error_code=code, error_message=message))
    return make(cls, throttle_time=0, results=results)


def register(router):
    router.register(ApiKey.SASL_HANDSHAKE, sasl_handshake, max_version=1)
    router.register(ApiKey.SASL_AUTHENTICATE, sasl_authenticate, max_version=2)
    router.register(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, describe_user_scram_credentials)
    router.register(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, alter_user_scram_credentials)
