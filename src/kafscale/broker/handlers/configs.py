"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44) for topic and group
configs (metadata/group_config.py, kept by groups/group_configs.py), broker logger levels,
plus read-only broker configs."""

from __future__ import annotations

import logging

from kafscale.broker import topics
from kafscale.broker.config import KAFKA_NAMES, BrokerConfig
from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata import group_config, topic_config
from kafscale.ops import log_levels
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import STORE_FAILURES, StorageError

TOPIC, BROKER, BROKER_LOGGER, GROUP = 2, 4, 8, 32
DYNAMIC_BROKER_LOGGER_CONFIG = 6
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
log = logging.getLogger("kafscale.admin")
tc = topic_config

# Broker configs that are BrokerConfig fields (KAFKA_NAMES) besides the log.* ones of
# topic_config: type and documentation. The value is the field's; its source is
# STATIC_BROKER_CONFIG when the operator gave it (a flag or KAFSCALE_* variable), else
# DEFAULT_CONFIG with KafScale's default, as Kafka reports settings from server.properties.
_BROKER_DOCS: dict[str, tuple[int, str]] = {
    "broker.id": (tc.INT, "This broker's node id (--broker-id)."),
    "auto.create.topics.enable": (tc.BOOLEAN, "Create unknown topics named by Metadata requests (--auto-create-topics)."),
    "num.partitions": (tc.INT, "Partitions of topics created without a count (--default-partitions)."),
    "log.segment.bytes": (tc.INT, "Default segment.bytes of topics (--segment-bytes; KafScale's default is 4 MiB)."),
    "socket.request.max.bytes": (tc.INT, "Largest request frame accepted (--max-frame-bytes)."),
    "queued.max.request.bytes": (tc.LONG, "Bytes of requests being read or handled at once (--max-request-memory)."),
    "max.connections": (tc.INT, "Client connections accepted at once (--max-connections; 0: no limit)."),
    "max.connections.per.ip": (tc.INT, "Client connections accepted at once from one address (--max-connections-per-ip; 0: no limit)."),
    "connections.max.idle.ms": (tc.LONG, "Idle connections are closed after this long (--connections-max-idle-ms)."),
    "log.retention.check.interval.ms": (tc.LONG, "How often retention runs (--retention-check-interval-ms)."),
    "group.initial.rebalance.delay.ms": (tc.INT, "Wait for more members before the first rebalance of a new group."),
    "group.min.session.timeout.ms": (tc.INT, "Least session timeout a group member may ask for."),
    "group.max.session.timeout.ms": (tc.INT, "Greatest session timeout a group member may ask for."),
    "group.consumer.session.timeout.ms": (tc.INT, "Session timeout of consumer-protocol (KIP-848) group members, set by the broker (--group-consumer-session-timeout-ms)."),
    "group.consumer.heartbeat.interval.ms": (tc.INT, "How often consumer-protocol group members heartbeat (--group-consumer-heartbeat-interval-ms)."),
    "group.consumer.max.size": (tc.INT, "Most members of a consumer-protocol group; more get GROUP_MAX_SIZE_REACHED (--group-consumer-max-size)."),
    "group.consumer.assignors": (tc.LIST, "Server-side assignors of consumer-protocol groups, the first the default (--group-consumer-assignors)."),
    "group.consumer.migration.policy": (tc.STRING, "Online migration between the classic and the consumer group protocol: bidirectional, upgrade, downgrade or disabled (--group-consumer-migration-policy)."),
    "group.consumer.min.session.timeout.ms": (tc.INT, "Least consumer.session.timeout.ms a group config may set (--group-consumer-min-session-timeout-ms)."),
    "group.consumer.max.session.timeout.ms": (tc.INT, "Greatest consumer.session.timeout.ms a group config may set (--group-consumer-max-session-timeout-ms)."),
    "group.consumer.min.heartbeat.interval.ms": (tc.INT, "Least consumer.heartbeat.interval.ms a group config may set (--group-consumer-min-heartbeat-interval-ms)."),
    "group.consumer.max.heartbeat.interval.ms": (tc.INT, "Greatest consumer.heartbeat.interval.ms a group config may set (--group-consumer-max-heartbeat-interval-ms)."),
    "group.share.session.timeout.ms": (tc.INT, "Session timeout of share group members, the default of the group config share.session.timeout.ms (--group-share-session-timeout-ms)."),
    "group.share.min.session.timeout.ms": (tc.INT, "Least share.session.timeout.ms a group config may set (--group-share-min-session-timeout-ms)."),
    "group.share.max.session.timeout.ms": (tc.INT, "Greatest share.session.timeout.ms a group config may set (--group-share-max-session-timeout-ms)."),
    "group.share.heartbeat.interval.ms": (tc.INT, "How often share group members heartbeat, the default of the group config share.heartbeat.interval.ms (--group-share-heartbeat-interval-ms)."),
    "group.share.min.heartbeat.interval.ms": (tc.INT, "Least share.heartbeat.interval.ms a group config may set (--group-share-min-heartbeat-interval-ms)."),
    "group.share.max.heartbeat.interval.ms": (tc.INT, "Greatest share.heartbeat.interval.ms a group config may set (--group-share-max-heartbeat-interval-ms)."),
    "group.share.max.size": (tc.INT, "Most members of a share group (--group-share-max-size)."),
    "group.share.delivery.count.limit": (tc.INT, "Deliveries of a record to a share group before it is archived (--group-share-delivery-count-limit)."),
    "group.share.partition.max.record.locks": (tc.INT, "Most records of one share-partition delivered and not yet acknowledged at once (--group-share-partition-max-record-locks)."),
    "group.share.record.lock.duration.ms": (tc.INT, "How long a record delivered to a share group member stays locked to it, the default of the group config share.record.lock.duration.ms (--group-share-record-lock-duration-ms)."),
    "group.share.min.record.lock.duration.ms": (tc.INT, "Least share.record.lock.duration.ms a group config may set (--group-share-min-record-lock-duration-ms)."),
    "group.share.max.record.lock.duration.ms": (tc.INT, "Greatest share.record.lock.duration.ms a group config may set (--group-share-max-record-lock-duration-ms)."),
    "offsets.retention.minutes": (tc.INT, "Committed offsets of empty groups expire after this."),
    "offsets.retention.check.interval.ms": (tc.LONG, "How often expired committed offsets are removed."),
    "offsets.topic.num.partitions": (tc.INT, "Partitions of __consumer_offsets when the broker creates it; a group's coordinator owns its partition."),
    "offsets.topic.segment.bytes": (tc.INT, "segment.bytes of __consumer_offsets when the broker creates it."),
    "producer.id.expiration.ms": (tc.INT, "An idempotent producer's state is forgotten after this long without writes."),
    "transaction.max.timeout.ms": (tc.INT, "Greatest transaction timeout a transactional producer may ask for."),
    "transactional.id.expiration.ms": (tc.INT, "A transactional id is forgotten after this long without a transaction."),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (tc.INT, "How often transactions past their timeout are aborted."),
}


# The TLS settings of the listeners by Kafka's name (BrokerConfig field, name, type, doc).
# Passwords are PASSWORD configs: reported as sensitive with a null value, as Kafka does.
_SSL_CONFIGS = (
    ("ssl_keystore_location", "ssl.keystore.location", tc.STRING, "PKCS#12 or PEM keystore of the TLS listeners (--ssl-keystore-location)."),
    ("ssl_keystore_type", "ssl.keystore.type", tc.STRING, "PKCS12 or PEM (--ssl-keystore-type; default: from the file)."),
    ("ssl_keystore_password", "ssl.keystore.password", tc.PASSWORD, "Password of the keystore."),
    ("ssl_key_password", "ssl.key.password", tc.PASSWORD, "Password of the private key."),
    ("ssl_truststore_location", "ssl.truststore.location", tc.STRING, "CA certificates of client certificates, PEM or PKCS#12 (--ssl-truststore-location)."),
    ("ssl_truststore_type", "ssl.truststore.type", tc.STRING, "PKCS12 or PEM (--ssl-truststore-type; default: from the file)."),
    ("ssl_truststore_password", "ssl.truststore.password", tc.PASSWORD, "Password of the truststore."),
    ("ssl_client_auth", "ssl.client.auth", tc.STRING, "none, requested or required (--ssl-client-auth)."),
    ("ssl_cipher_suites", "ssl.cipher.suites", tc.LIST, "OpenSSL cipher list for TLS 1.2 (--ssl-cipher-suites)."),
    ("ssl_principal_mapping_rules", "ssl.principal.mapping.rules", tc.STRING, "Client certificate subject to principal (--ssl-principal-mapping-rules)."),
)


# --listener-ssl keys by Kafka's name (the PEM file paths cert/key/ca have none: Kafka's PEM
# settings hold the certificates themselves, not paths).
_LISTENER_SSL_NAMES = {
    "keystore-location": ("ssl.keystore.location", tc.STRING), "keystore-type": ("ssl.keystore.type", tc.STRING),
    "keystore-password": ("ssl.keystore.password", tc.PASSWORD), "key-password": ("ssl.key.password", tc.PASSWORD),
    "truststore-location": ("ssl.truststore.location", tc.STRING), "truststore-type": ("ssl.truststore.type", tc.STRING),
    "truststore-password": ("ssl.truststore.password", tc.PASSWORD), "client-auth": ("ssl.client.auth", tc.STRING),
    "cipher-suites": ("ssl.cipher.suites", tc.LIST), "principal-mapping-rules": ("ssl.principal.mapping.rules", tc.STRING),
}


def _listener_ssl_entries(c) -> list[tuple]:
    """Kafka's listener.name.<name>.ssl.* for what --listener-ssl (and the listeners' password
    variables) set: (name, value, type); passwords with no value."""
    import os

    from kafscale.security.tls import parse_listener_ssl, password_env

    try:
        overrides = parse_listener_ssl(getattr(c, "listener_ssl", ""))
    except ValueError:
        return []
    out = []
    for listener, keys in sorted(overrides.items()):
        keys = dict(keys)
        for key in ("key-password", "keystore-password", "truststore-password"):
            if key not in keys and os.environ.get(password_env(listener, key)):
                keys[key] = "<set>"
        for key, value in sorted(keys.items()):
            if key in _LISTENER_SSL_NAMES:
                name, kind = _LISTENER_SSL_NAMES[key]
                out.append((f"listener.name.{listener.lower()}.{name}", None if kind == tc.PASSWORD else value, kind))
    return out


def _broker_entries(broker) -> list[tuple]:
    """(name, value, source, synonyms, type, documentation) of every broker config reported."""
    c = broker.config
    given = c.given()
    static = c.kafka_static_configs()
    out = []

    def add(name, value, kind, doc, is_given, default=None):
        if is_given:
            syns = [tc.Synonym(name, value, tc.STATIC_BROKER_CONFIG)]
            if default is not None:
                syns.append(tc.Synonym(name, default, tc.DEFAULT_CONFIG))
        else:
            syns = [tc.Synonym(name, value, tc.DEFAULT_CONFIG)] if value is not None else []
        out.append((name, value, syns[0].source if syns else tc.DEFAULT_CONFIG, tuple(syns), kind, doc))

    defaults = BrokerConfig.__dataclass_fields__
    for fname, kname in KAFKA_NAMES.items():
        if kname in tc.BROKER_TOPIC_DEFAULTS:
            continue
        kind, doc = _BROKER_DOCS[kname]
        d = defaults[fname].default
        add(kname, _value(getattr(c, fname)), kind, doc, fname in given, _value(d))
    add("node.id", str(c.broker_id), tc.INT, "Same as broker.id.", "broker_id" in given, None)
    add("broker.rack", c.broker_rack or None, tc.STRING, "This broker's rack (--broker-rack): in Metadata, and the rack of the partitions it owns "
        "for rack-aware assignment of consumer groups.", "broker_rack" in given)
    advertised = ",".join(f"{n}://{h}:{p}" for n, h, p in broker.cluster.local.endpoints) or f"PLAINTEXT://{c.advertise}"
    add("advertised.listeners", advertised, tc.STRING, "Addresses given to clients (--advertised-listeners or --advertise).", True)
    add("listeners", ",".join(str(x) for x in broker.listeners), tc.STRING, "Addresses the broker accepts clients on (--listeners or --listen).", True)
    add("log.dirs", c.storage, tc.STRING, "Where partition data lives: the object store (--storage). DescribeLogDirs reports it as the broker's one log dir.",
        bool({"storage", "data_dir"} & given))
    add("default.replication.factor", "1", tc.INT, "Replication factor of auto-created topics; every partition has one replica here (the object store keeps the copies).", False)
    for fname, kname, kind, doc in _SSL_CONFIGS:
        value = getattr(c, fname, "")
        add(kname, None if kind == tc.PASSWORD else (value or None), kind, doc, fname in given)
    for kname, value, kind in _listener_ssl_entries(c):
        add(kname, value, kind, f"This listener's {kname.split('.ssl.', 1)[1]} (--listener-ssl).", True)
    for name in sorted(tc.BROKER_TOPIC_DEFAULTS):
        r = tc.resolve_broker(name, static)
        topic = next(d for d in tc.TOPIC_CONFIGS.values() if name in d.synonyms)
        doc = f"Broker default of the topic config {topic.name}: {topic.doc}"
        out.append((name, r.value, r.source, r.synonyms, tc.BROKER_TOPIC_DEFAULTS[name][1], doc))
    for name, value, doc in (
        ("kafscale.flush.interval.ms", str(c.flush_interval_ms), "Longest time a record waits in the write buffer."),
        ("kafscale.min.flush.interval.ms", str(c.min_flush_interval_ms), "Least time between two uploads of one partition."),
        ("kafscale.storage", c.storage, "Object store URL."),
        ("kafscale.namespace", c.namespace, "First component of every object key."),
    ):
        field = name.removeprefix("kafscale.").replace(".", "_")
        add(name, value, tc.LONG if name.endswith(".ms") else tc.STRING, doc, field in given)
    return out


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _wanted(keys, name: str) -> bool:
    # Kafka: a null or empty key list asks for every config
    return not keys or name in keys


async def describe_configs(ctx, req):
    cls = response(ApiKey.DESCRIBE_CONFIGS, ctx.version)
    res_cls = nested(cls, "DescribeConfigsResult")
    entry_cls = nested(cls, "DescribeConfigsResourceResult")
    syn_cls = nested(cls, "DescribeConfigsSynonym")
    with_synonyms = bool(getattr(req, "include_synonyms", False))
    with_docs = bool(getattr(req, "include_documentation", False))

    def entry(name, value, source, synonyms, kind, doc, read_only):
        return make(
            entry_cls,
            name=name,
            value=value,
            read_only=read_only,
            config_source=source,
            is_sensitive=kind == tc.PASSWORD,  # its value (and its synonyms') is None
            synonyms=tuple(make(syn_cls, name=s.name, value=s.value, source=s.source) for s in synonyms) if with_synonyms else (),
            config_type=kind,
            documentation=doc if with_docs else None,
        )

    def failed(r, code, msg):
        return make(res_cls, error_code=code, error_message=msg, resource_type=r.resource_type, resource_name=r.resource_name, configs=())

    results = []
    for r in req.resources:
        keys = set(r.configuration_keys or ())
        entries = []
        if r.resource_type == TOPIC:
            try:
                topics.check_name(r.resource_name)
                meta = await ctx.broker.logs.topics.get(r.resource_name, refresh=True)
            except topics.TopicError as e:
                results.append(failed(r, e.code, str(e)))
                continue
            except StorageError as e:  # metadata store unreachable: retriable
                results.append(failed(r, ErrorCode.request_timed_out, str(e)))
                continue
            if meta is None:
                results.append(failed(r, ErrorCode.unknown_topic_or_partition, f"topic {r.resource_name!r} does not exist"))
                continue
            static = ctx.broker.config.kafka_static_configs()
            for name in tc.listed(meta.configs, keys):
                d = tc.TOPIC_CONFIGS[name]
                v = tc.resolve(name, meta.configs, static)
                entries.append(entry(name, v.value, v.source, v.synonyms, d.kind, d.doc, False))
        elif r.resource_type == BROKER:
            if r.resource_name == "":
                # Kafka: the cluster-wide dynamic defaults; KafScale has none
                results.append(make(res_cls, error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type, resource_name=r.resource_name, configs=()))
                continue
            if r.resource_name != str(ctx.broker.config.broker_id):
                results.append(failed(r, ErrorCode.invalid_request, f"unexpected broker id {r.resource_name!r}: this is broker {ctx.broker.config.broker_id}"))
                continue
            for name, value, source, synonyms, kind, doc in sorted(_broker_entries(ctx.broker), key=lambda e: e[0]):
                if _wanted(keys, name):
                    # read-only: broker configs are set by flags and KAFSCALE_* variables only
                    entries.append(entry(name, value, source, synonyms, kind, doc, True))
        elif r.resource_type == BROKER_LOGGER:
            if r.resource_name != str(ctx.broker.config.broker_id):
                results.append(failed(r, ErrorCode.invalid_request, f"unexpected broker id {r.resource_name!r}: this is broker {ctx.broker.config.broker_id}"))
                continue
            for name, level in log_levels.levels().items():
                if _wanted(keys, name):
                    # as Kafka: no synonyms, type or documentation for logger levels
                    entries.append(make(entry_cls, name=name, value=level, read_only=False, config_source=DYNAMIC_BROKER_LOGGER_CONFIG, is_sensitive=False,
                                        synonyms=(), config_type=topic_config.UNKNOWN, documentation=None))
        elif r.resource_type == GROUP:
            if not r.resource_name:
                results.append(failed(r, ErrorCode.invalid_request, "Group name must not be empty"))
                continue
            try:
                resolved = await ctx.broker.groups.configs.describe(r.resource_name)
            except STORE_FAILURES as e:
                results.append(failed(r, ErrorCode.request_timed_out, f"metadata store unavailable: {e}"))
                continue
            # Kafka answers any group, existing or not: its overrides, else the broker's values
            for v in resolved:
                if _wanted(keys, v.name):
                    d = group_config.GROUP_CONFIGS[v.name]
                    entries.append(entry(v.name, v.value, v.source, v.synonyms, d.kind, d.doc, False))
        else:
            results.append(failed(r, ErrorCode.invalid_request, f"resource type {r.resource_type} is not supported"))
            continue
        results.append(make(res_cls, error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type, resource_name=r.resource_name, configs=tuple(entries)))
    return make(cls, throttle_time=0, results=tuple(results))


async def _alter(ctx, req, api_key: int, change_for):
    cls = response(api_key, ctx.version)
    r_cls = nested(cls, "AlterConfigsResourceResponse")
    results = []
    for r in req.resources:
        code, msg = ErrorCode.none, None
        if r.resource_type == GROUP:
            code, msg = await _alter_group(ctx, r, api_key, req.validate_only)
        elif r.resource_type == TOPIC:
            try:
                await topics.alter_configs(ctx.broker, r.resource_name, change_for(r), req.validate_only)
                if not req.validate_only:
                    log.info("altered configs of topic %s (client %s)", r.resource_name, ctx.client_id)
            except topics.TopicError as e:
                code, msg = e.code, str(e)
        elif r.resource_type == BROKER:
            code, msg = ErrorCode.invalid_request, "broker configs are read-only; set them with flags or KAFSCALE_* variables"
        elif r.resource_type == BROKER_LOGGER and api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS:
            try:
                if r.resource_name != str(ctx.broker.config.broker_id):
                    raise KafkaError(ErrorCode.invalid_request, f"unexpected broker id {r.resource_name!r}: this is broker {ctx.broker.config.broker_id}")
                log_levels.change([(c.name, c.config_operation, c.value) for c in r.configs], req.validate_only)
                if not req.validate_only:
                    log.warning("logger levels changed: %s (client %s)", {c.name: c.value for c in r.configs}, ctx.client_id)
            except KafkaError as e:
                code, msg = e.code, str(e)
        else:
            code, msg = ErrorCode.invalid_request, f"resource type {r.resource_type} is not supported"
        results.append(make(r_cls, error_code=code, error_message=msg, resource_type=r.resource_type, resource_name=r.resource_name))
    return make(cls, throttle_time=0, responses=tuple(results))


async def _alter_group(ctx, r, api_key: int, validate_only: bool) -> tuple[ErrorCode, str | None]:
    """One GROUP resource of AlterConfigs (its configs replace the group's) or
    IncrementalAlterConfigs, with Kafka's checks in Kafka's order."""
    incremental = api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS
    names = [c.name for c in r.configs]
    if len(set(names)) != len(names):
        return ErrorCode.invalid_request, "Error due to duplicate config keys"
    nulls = [c.name for c in r.configs if c.value is None and not (incremental and c.config_operation == DELETE)]
    if nulls:
        return ErrorCode.invalid_request, "Null value not supported for : " + ", ".join(nulls)
    if not r.resource_name:
        return ErrorCode.invalid_request, "Default group resources are not allowed."
    if incremental:
        for c in r.configs:
            if c.config_operation in (APPEND, SUBTRACT):  # no group config is a LIST
                return ErrorCode.invalid_config, f"Can't {'APPEND' if c.config_operation == APPEND else 'SUBTRACT'} to key {c.name} because its type is not LIST."
            if c.config_operation not in (SET, DELETE):
                return ErrorCode.invalid_request, f"Unknown operations type {c.config_operation}"

    def change(old: dict[str, str]) -> dict[str, str]:
        if not incremental:
            return {c.name: c.value for c in r.configs}
        new = dict(old)
        for c in r.configs:
            if c.config_operation == SET:
                new[c.name] = c.value
            else:
                new.pop(c.name, None)
        return new

    try:
        new = await ctx.broker.groups.configs.alter(r.resource_name, change, validate_only)
    except topic_config.InvalidConfigError as e:
        return ErrorCode.invalid_config, str(e)
    except STORE_FAILURES as e:
        return ErrorCode.request_timed_out, f"metadata store unavailable: {e}"
    if not validate_only:
        log.info("configs of group %s are now %s (client %s)", r.resource_name, new, ctx.client_id)
    return ErrorCode.none, None


async def alter_configs(ctx, req):
    # AlterConfigs replaces the whole set of dynamic configs of the resource.
    return await _alter(ctx, req, ApiKey.ALTER_CONFIGS, lambda r: (lambda _old: {c.name: c.value for c in r.configs if c.value is not None}))


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
                    raise topics.TopicError(ErrorCode.invalid_config, f"Can't {'APPEND' if op == APPEND else 'SUBTRACT'} to key {c.name} because its type is not LIST.")
                # as Kafka: the override (an empty one is the empty list), else the default
                old_value = new[c.name] if new.get(c.name) is not None else topic_config.resolve(c.name, {}).value
                items = [x for x in (old_value or "").split(",") if x]
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
    return await _alter(ctx, req, ApiKey.INCREMENTAL_ALTER_CONFIGS, _incremental)


def register(router):
    router.register(ApiKey.DESCRIBE_CONFIGS, describe_configs)
    router.register(ApiKey.ALTER_CONFIGS, alter_configs)
    router.register(ApiKey.INCREMENTAL_ALTER_CONFIGS, incremental_alter_configs)
