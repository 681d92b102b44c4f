"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44) for topic configs,
plus read-only broker configs."""

from __future__ import annotations

import logging

from kafscale.broker import topics
from kafscale.errors import ErrorCode
from kafscale.metadata import topic_config
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import StorageError

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC, BROKER = 2, 4
# config_source values
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
log = logging.getLogger("kafscale.admin")


def _broker_configs(broker) -> dict[str, tuple[str, int, str]]:
    c = broker.config
    return {
        "broker.id": (str(c.broker_id), topic_config.INT, "This broker's node id"),
        "advertised.listeners": (",".join(f"{n}://{h}:{p}" for n, h, p in broker.cluster.local.endpoints) or f"PLAINTEXT://{c.advertise}", topic_config.STRING, "Address given to clients"),
        "listeners": (",".join(str(l) for l in broker.listeners), topic_config.STRING, "Addresses the broker accepts clients on"),
        "auto.create.topics.enable": (str(c.auto_create_topics).lower(), 1, "Create unknown topics on Metadata requests"),
        "num.partitions": (str(c.default_partitions), topic_config.INT, "Partitions of auto-created topics"),
        "log.segment.bytes": (str(c.segment_bytes), topic_config.INT, "Default segment size"),
        "kafscale.flush.interval.ms": (str(c.flush_interval_ms), topic_config.LONG, "Longest wait in the write buffer"),
        "kafscale.min.flush.interval.ms": (str(c.min_flush_interval_ms), topic_config.LONG, "Least time between uploads of one partition"),
        "kafscale.storage": (c.storage, topic_config.STRING, "Object store URL"),
        "kafscale.namespace": (c.namespace, topic_config.STRING, "Object key namespace"),
        "group.initial.rebalance.delay.ms": (str(c.group_initial_rebalance_delay_ms), topic_config.INT, "Delay before the first rebalance of a new group"),
        "group.min.session.timeout.ms": (str(c.group_min_session_timeout_ms), topic_config.INT, "Least session timeout of a group member"),
        "group.max.session.timeout.ms": (str(c.group_max_session_timeout_ms), topic_config.INT, "Greatest session timeout of a group member"),
        "offsets.retention.minutes": (str(c.offsets_retention_minutes), topic_config.INT, "Expiry of committed offsets of empty groups"),
        "socket.request.max.bytes": (str(c.max_frame_bytes), topic_config.INT, "Largest request frame"),
    }


async def describe_configs(ctx, req):
    cls = response(DESCRIBE_CONFIGS, ctx.version)
    res_cls = nested(cls, "DescribeConfigsResult")
    entry_cls = nested(cls, "DescribeConfigsResourceResult")
    results = []
    for r in req.resources:
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        entries = []
        if r.resource_type == TOPIC:
            try:
                meta = await ctx.broker.logs.topics.get(r.resource_name, refresh=True)
            except StorageError as e:  # metadata store unreachable: retriable
                results.append(make(res_cls, error_code=ErrorCode.request_timed_out, error_message=str(e), resource_type=r.resource_type, resource_name=r.resource_name, configs=()))
                continue
            if meta is None:
                results.append(make(res_cls, error_code=ErrorCode.unknown_topic_or_partition, error_message=f"topic {r.resource_name!r} does not exist", resource_type=r.resource_type, resource_name=r.resource_name, configs=()))
                continue
            for name, d in sorted(topic_config.TOPIC_CONFIGS.items()):
                if keys is not None and name not in keys:
                    continue
                dynamic = name in meta.configs
                entries.append(
                    make(
                        entry_cls,
                        name=name,
                        value=meta.configs.get(name, d.default),
                        read_only=False,
                        config_source=DYNAMIC_TOPIC_CONFIG if dynamic else DEFAULT_CONFIG,
                        is_sensitive=False,
                        synonyms=(),
                        config_type=d.kind,
                        documentation=d.doc if getattr(req, "include_documentation", False) else None,
                    )
                )
        elif r.resource_type == BROKER:
            if r.resource_name not in ("", str(ctx.broker.config.broker_id)):
                results.append(make(res_cls, error_code=ErrorCode.invalid_request, error_message=f"unknown broker {r.resource_name!r}", resource_type=r.resource_type, resource_name=r.resource_name, configs=()))
                continue
            for name, (value, kind, doc) in sorted(_broker_configs(ctx.broker).items()):
                if keys is not None and name not in keys:
                    continue
                entries.append(
                    make(entry_cls, name=name, value=value, read_only=True, config_source=STATIC_BROKER_CONFIG, is_sensitive=False, synonyms=(), config_type=kind,
                         documentation=doc if getattr(req, "include_documentation", False) else None)
                )
        else:
            results.append(make(res_cls, error_code=ErrorCode.invalid_request, error_message=f"resource type {r.resource_type} is not supported", resource_type=r.resource_type, resource_name=r.resource_name, configs=()))
            continue
        results.append(make(res_cls, error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type, resource_name=r.resource_name, configs=tuple(entries)))
    return make(cls, throttle_time=0, results=tuple(results))


async def _alter(ctx, req, api_key: int, change_for):
    cls = response(api_key, ctx.version)
    r_cls = nested(cls, "AlterConfigsResourceResponse")
    results = []
    for r in req.resources:
        code, msg = ErrorCode.none, None
        if r.resource_type == TOPIC:
            try:
                await topics.alter_configs(ctx.broker, r.resource_name, change_for(r), req.validate_only)
                if not req.validate_only:
                    log.info("altered configs of topic %s (client %s)", r.resource_name, ctx.client_id)
            except topics.TopicError as e:
                code, msg = e.code, str(e)
        elif r.resource_type == BROKER:
            code, msg = ErrorCode.invalid_request, "broker configs are read-only; set them with flags or KAFSCALE_* variables"
        else:
            code, msg = ErrorCode.invalid_request, f"resource type {r.resource_type} is not supported"
        results.append(make(r_cls, error_code=code, error_message=msg, resource_type=r.resource_type, resource_name=r.resource_name))
    return make(cls, throttle_time=0, responses=tuple(results))


async def alter_configs(ctx, req):
    # AlterConfigs replaces the whole set of dynamic configs of the resource.
    return await _alter(ctx, req, ALTER_CONFIGS, lambda r: (lambda _old: {c.name: c.value for c in r.configs if c.value is not None}))


def _incremental(r):
    def change(old: dict[str, str]) -> dict[str, str]:
        new = dict(old)
        for c in r.configs:
            op = c.config_operation
            if op == SET:
                new[c.name] = c.value
            elif op == DELETE:
                new.pop(c.name, None)
            elif op in (APPEND, SUBTRACT):
                d = topic_config.TOPIC_CONFIGS.get(c.name)
                if d is None or d.kind != topic_config.LIST:
                    raise topics.TopicError(ErrorCode.invalid_config, f"{c.name} is not a list config")
                items = [x for x in new.get(c.name, d.default).split(",") if x]
                if op == APPEND:
                    items += [x for x in (c.value or "").split(",") if x and x not in items]
                else:
                    items = [x for x in items if x not in (c.value or "").split(",")]
                new[c.name] = ",".join(items)
            else:
                raise topics.TopicError(ErrorCode.invalid_request, f"unknown config operation {op}")
        return new

    return change


async def incremental_alter_configs(ctx, req):
    return await _alter(ctx, req, INCREMENTAL_ALTER_CONFIGS, _incremental)


def register(router):
    router.register(DESCRIBE_CONFIGS, describe_configs)
    router.register(ALTER_CONFIGS, alter_configs)
    router.register(INCREMENTAL_ALTER_CONFIGS, incremental_alter_configs)
