"""DescribeClientQuotas (48) and AlterClientQuotas (49): client quotas kept in the metadata
store, one document per entity, validated as Kafka's controller does (metadata/quotas.py).
Stored and described only: brokers do not throttle by them yet (throttle_time_ms is 0)."""

from __future__ import annotations

import logging

from kafscale.errors import ErrorCode
from kafscale.metadata import quotas
from kafscale.metadata.store import ConflictError
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import STORE_FAILURES, StorageError

log = logging.getLogger("kafscale.admin")
_STORE_DOWN = (*STORE_FAILURES, StorageError, ConflictError)


async def describe_client_quotas(ctx, req):
    cls = response(ApiKey.DESCRIBE_CLIENT_QUOTAS, ctx.version)
    entry_cls, entity_cls, value_cls = nested(cls, "EntryData"), nested(cls, "EntityData"), nested(cls, "ValueData")
    try:
        matches = quotas.matcher([(c.entity_type, c.match_type, c.match) for c in req.components], req.strict)
        stored = await ctx.broker.metadata.list_client_quotas()
    except quotas.QuotaError as e:
        return make(cls, throttle_time=0, error_code=e.code, error_message=str(e), entries=None)
    except _STORE_DOWN as e:
        return make(cls, throttle_time=0, error_code=ErrorCode.request_timed_out, error_message=f"metadata store unavailable: {e}", entries=None)
    entries = []
    for entity, values in sorted(stored, key=lambda e: repr(e[0])):
        if matches(entity):
            components, pairs = quotas.kafka_order(entity, values)
            entries.append(make(
                entry_cls,
                entity=tuple(make(entity_cls, entity_type=k, entity_name=n) for k, n in components),
                values=tuple(make(value_cls, key=k, value=v) for k, v in pairs),
            ))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, entries=tuple(entries))


async def alter_client_quotas(ctx, req):
    cls = response(ApiKey.ALTER_CLIENT_QUOTAS, ctx.version)
    entry_cls, entity_cls = nested(cls, "EntryData"), nested(cls, "EntityData")
    out = []
    for e in req.entries:
        code, msg = ErrorCode.none, None
        try:
            entity = quotas.entity_of([(x.entity_type, x.entity_name) for x in e.entity])
            keys = [op.key for op in e.ops]
            if len(set(keys)) != len(keys):
                raise quotas.QuotaError(ErrorCode.invalid_request, "duplicate quota key in one entity")
            ops = [(op.key, op.value, op.remove) for op in e.ops]
            quotas.change(entity, {}, ops)  # every value checked before anything is stored
            if not req.validate_only:
                await ctx.broker.metadata.alter_client_quota(entity, lambda old: quotas.change(entity, old, ops))
                log.info("altered client quotas of %s (client %s)", dict(entity), ctx.client_id)
        except quotas.QuotaError as err:
            code, msg = err.code, str(err)
        except _STORE_DOWN as err:
            code, msg = ErrorCode.request_timed_out, f"metadata store unavailable: {err}"
        out.append(make(entry_cls, error_code=code, error_message=msg, entity=tuple(make(entity_cls, entity_type=x.entity_type, entity_name=x.entity_name) for x in e.entity)))
    if not req.validate_only and any(e.error_code == ErrorCode.none for e in out):
        await ctx.broker.quotas.reload()  # enforced here at once; other brokers within --quota-refresh-ms
    return make(cls, throttle_time=0, entries=tuple(out))


def register(router):
    router.register(ApiKey.DESCRIBE_CLIENT_QUOTAS, describe_client_quotas)
    router.register(ApiKey.ALTER_CLIENT_QUOTAS, alter_client_quotas)
