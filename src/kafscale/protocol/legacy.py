"""Request versions below the ones kio has (sans-I/O).

kio is generated from Apache Kafka 4's message specs, which dropped the oldest versions
(KIP-896); Kafka 3.9 still accepted them and clients shipped with Linux distributions
still send them (librdkafka 2.0 Produce v0 to compress, sarama's defaults, kafka-go,
Burrow's ListOffsets v0). Their bodies are read and written with kafka-python's
definitions of the old versions (`kafka.protocol.old`, a maintained source: see the
README's dependency notes), never with codecs of our own.

One request shape for the handlers: an old request is turned into the kio request of the
lowest version kio has (fields matched by name, the fields the old version lacks at the
value Kafka gives them for it), the handler answers that version, and its response is
turned back into the old version's response (fields matched by name; what the old
version lacks is dropped; what it has and the newer one lost is filled in here). A few
APIs change meaning between versions; their adapters below say how.

kafka-python is imported on the first old-version request, not with this module: its
package imports its whole client, a third of a broker's import time.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib
import io
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from kafscale.protocol import codec, legacy_records
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make


class LegacyResponse:
    """An old version's response body, already encoded (the server frames it)."""

    __slots__ = ("body",)

    def __init__(self, body: bytes):
        self.body = body


@dataclass(frozen=True)
class Adapter:
    api_key: int
    lowest: int  # the lowest version Apache Kafka 3.9 accepted
    kio_version: int  # the version the handler sees
    # kafka-python's old versions: (module under kafka.protocol, message name) of its classes
    # <name>Request_v<N> and <name>Response_v<N>; None: the old version's bytes are the kio
    # version's (decoded and encoded with kio)
    old_names: tuple[str, str] | None
    # kio request field -> value for fields the old versions lack (by field name, any depth)
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    # version, old request values, kio request, kio response -> the old response's values
    down: Callable | None = None
    # version, payload, body offset -> kio request: a decoder of its own (Produce: zero copy)
    decoder: Callable | None = None
    # (module under kafka.protocol, request class, response class) of kafka-python's schemas
    # generated from Kafka's JSON message specs (which keep the fields of the old versions):
    # for APIs kafka.protocol.old lacks, used instead of `classes`
    json_classes: tuple[str, str, str] | None = None

    @property
    def classes(self) -> dict[int, tuple[type, type]] | None:
        """version -> (kafka-python request class, response class)."""
        if self.old_names is None:
            return None
        return {v: _old_classes(self, v) for v in range(self.lowest, self.kio_version)}


def _old_classes(adapter: Adapter, version: int) -> tuple[type, type]:
    """kafka-python's (request class, response class) of an old version."""
    module_name, name = adapter.old_names
    module = importlib.import_module(f"kafka.protocol.{module_name}")
    return getattr(module, f"{name}Request_v{version}"), getattr(module, f"{name}Response_v{version}")


def _json_classes(adapter: Adapter) -> tuple[type, type]:
    module_name, request, response = adapter.json_classes
    module = importlib.import_module(f"kafka.protocol.{module_name}")
    return getattr(module, request), getattr(module, response)


# ------------------------------------------------------------------------------------
# Matching fields by name between kafka-python's old schemas and kio's entities.


def _norm(name: str) -> str:
    n = name.lower().replace("_", "")
    return n[:-2] if n.endswith("ms") else n


@lru_cache(maxsize=None)
def _kio_fields(cls: type) -> tuple[tuple[str, Any, type | None], ...]:
    """(name, type hint, entity class of the field or of its array elements) of a kio entity."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        candidates = [hint, *typing.get_args(hint)]
        for a in list(candidates):
            candidates.extend(typing.get_args(a))
        element = next((a for a in candidates if isinstance(a, type) and dataclasses.is_dataclass(a)), None)
        out.append((f.name, f.metadata.get("kafka_type"), element))
    return tuple(out)


def _to_kio(cls: type, schema: Schema, values, defaults: dict) -> Any:
    """The kio entity `cls` from an old schema's decoded values (matched by name)."""
    from kafka.protocol.old.types import Array, Schema

    old = {_norm(n): (t, v) for n, t, v in zip(schema.names, schema.fields, values)}
    kwargs = {}
    for name, kind, element in _kio_fields(cls):
        hit = old.get(_norm(name))
        if hit is None:
            if name in defaults:
                kwargs[name] = defaults[name]
            continue
        typ, value = hit
        if element is not None and isinstance(typ, Array) and isinstance(typ.array_of, Schema):
            value = None if value is None else tuple(_to_kio(element, typ.array_of, v, defaults) for v in value)
        elif isinstance(typ, Array):
            value = None if value is None else tuple(value)
        elif kind == "bytes" and value is not None:
            value = bytes(value)
        kwargs[name] = value
    return make(cls, **kwargs)


def _plain(value):
    """A kio value as kafka-python's old types write it."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _zero(typ):
    from kafka.protocol.old.types import Array, Boolean, Bytes, String

    if isinstance(typ, Array):
        return []
    if isinstance(typ, String):
        return ""
    if typ is Boolean:
        return False
    if typ is Bytes:
        return b""
    return 0


def _from_kio(schema: Schema, entity, fill: dict) -> tuple:
    """An old schema's values from a kio entity (matched by name; `fill` by old field name
    for what the kio entity lacks)."""
    from kafka.protocol.old.types import Array, Int8, Int16, Int32, Int64, Schema

    have = {_norm(f.name): f.name for f in dataclasses.fields(entity)} if entity is not None else {}
    out = []
    for name, typ in zip(schema.names, schema.fields):
        if name in fill:
            value = fill[name]
            out.append(value(entity) if callable(value) else value)
            continue
        attr = have.get(_norm(name))
        if attr is None:
            out.append(_zero(typ))
            continue
        value = getattr(entity, attr)
        if isinstance(typ, Array) and isinstance(typ.array_of, Schema):
            value = [] if value is None else [_from_kio(typ.array_of, v, fill) for v in value]
        elif isinstance(typ, Array):
            value = None if value is None else [_plain(v) for v in value]
        else:
            value = _plain(value)
            if value is None and typ in (Int8, Int16, Int32, Int64):
                value = -1  # kio's null for Kafka's -1 (a log append time under CreateTime)
        out.append(value)
    return tuple(out)


def _dict_to_kio(cls: type, values: dict, defaults: dict) -> Any:
    """The kio entity `cls` from kafka-python's to_dict() of a JSON-schema message."""
    old = {_norm(k): v for k, v in values.items()}
    kwargs = {}
    for name, kind, element in _kio_fields(cls):
        key = _norm(name)
        if key not in old:
            if name in defaults:
                kwargs[name] = defaults[name]
            continue
        value = old[key]
        if element is not None and isinstance(value, list):
            value = tuple(_dict_to_kio(element, v, defaults) for v in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return make(cls, **kwargs)


def _json_from_kio(dc_cls: type, entity, version: int):
    """kafka-python's JSON-schema message `dc_cls` (at `version`) from a kio entity."""
    have = {_norm(f.name): f.name for f in dataclasses.fields(entity)}
    kwargs = {}
    for field in dc_cls._struct._fields:
        if not field.for_version_q(version):
            continue
        attr = have.get(_norm(field.name))
        if attr is None:
            continue
        value = getattr(entity, attr)
        if field.is_struct_array() or field.is_struct():
            child = field.data_class if field.data_class is not None else getattr(dc_cls, field.type_str)
            if field.is_struct_array():
                value = None if value is None else [_json_from_kio(child, v, version) for v in value]
            else:
                value = None if value is None else _json_from_kio(child, value, version)
        elif isinstance(value, tuple):
            value = [_plain(v) for v in value]
        else:
            value = _plain(value)
        kwargs[field.name] = value
    return dc_cls(**kwargs)


# ------------------------------------------------------------------------------------
# Decoding and encoding


def decode(adapter: Adapter, version: int, payload: memoryview, offset: int) -> tuple[Any, Any]:
    """(old request values or None, kio request of adapter.kio_version)."""
    if adapter.decoder is not None:
        return None, adapter.decoder(version, payload, offset)
    kio_cls = codec.schema(adapter.api_key, adapter.kio_version, "request")
    if adapter.json_classes is not None:
        req_cls = _json_classes(adapter)[0]
        try:
            values = req_cls.decode(io.BytesIO(bytes(payload[offset:])), version=version).to_dict(json=False)
        except Exception as e:  # noqa: BLE001 - short or garbled input
            raise codec.MalformedRequest(f"cannot decode {req_cls.__name__} v{version}: {e!r}") from None
        return None, _dict_to_kio(kio_cls, values, adapter.defaults)
    if adapter.old_names is None:
        return None, codec.decode_body(adapter.api_key, adapter.kio_version, payload, offset)
    req_cls, _ = _old_classes(adapter, version)
    try:
        values = req_cls.SCHEMA.decode(io.BytesIO(bytes(payload[offset:])))
    except Exception as e:  # noqa: BLE001 - short or garbled input: kafka-python raises several kinds
        raise codec.MalformedRequest(f"cannot decode {req_cls.__name__}: {e!r}") from None
    return values, _to_kio(kio_cls, req_cls.SCHEMA, values, adapter.defaults)


def encode_response(adapter: Adapter, version: int, correlation_id: int, old_request, request, response) -> list:
    """The frame of the old version's response to a handler's kio response."""
    if isinstance(response, LegacyResponse):
        return [codec.encode_raw_response(correlation_id, response.body)]
    if adapter.json_classes is not None:
        body = _json_from_kio(_json_classes(adapter)[1], response, version).encode(version=version)
        return [codec.encode_raw_response(correlation_id, bytes(body))]
    if adapter.old_names is None:
        return codec.encode_response(adapter.api_key, adapter.kio_version, correlation_id, response)
    _, resp_cls = _old_classes(adapter, version)
    if adapter.down is not None:
        values = adapter.down(version, old_request, request, response)
    else:
        values = _from_kio(resp_cls.SCHEMA, response, {})
    return [codec.encode_raw_response(correlation_id, resp_cls.SCHEMA.encode(values))]


# ------------------------------------------------------------------------------------
# The APIs


def _produce_decode(version, payload, offset):
    from kafscale.protocol import produce_request

    return produce_request.decode(version, payload, offset)


def _fetch_down(version, old, request, response) -> tuple:
    """Fetch v0-v3: the stored v2 batches as message format v0 (Fetch v0-1) or v1 (v2-3)
    message sets, within the request's byte limits."""
    magic = 0 if version < 2 else 1
    limits = {(t.topic, p.partition): p.partition_max_bytes for t in request.topics for p in t.partitions}
    offsets = {(t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions}
    budget = request.max_bytes
    topics = []
    for t in response.responses:
        parts = []
        for p in t.partitions:
            data, error = b"", int(p.error_code)
            if p.records:
                limit = min(limits.get((t.topic, p.partition_index), budget), budget)
                try:
                    data = legacy_records.down_convert(p.records, magic, limit, offsets.get((t.topic, p.partition_index), -1))
                except legacy_records.InvalidRecordError as e:  # zstd: Kafka's error for old fetchers
                    error = int(e.error_code)
                budget -= len(data)
            parts.append((p.partition_index, error, p.high_watermark, data))
        topics.append((t.topic, parts))
    if version == 0:
        return (topics,)
    throttle = getattr(response, "throttle_time_ms", None)
    if throttle is None:  # a kio response (an error answer built for the kio version)
        throttle = _plain(response.throttle_time)
    return (throttle, topics)


def _list_offsets_down(version, old, request, response) -> tuple:
    """ListOffsets v0: an array of offsets (at most max_num_offsets). The latest (-1) and
    earliest (-2) offsets and the offset for a timestamp come from the v1 answer; Kafka
    added the base offsets of older segments for -1 and a timestamp, which a log in
    object storage does not have in that sense: the one offset is the answer."""
    wanted = {(t[0], p[0]): p[2] for t in old[1] for p in t[1]}
    topics = []
    for t in response.topics:
        parts = []
        for p in t.partitions:
            n = wanted.get((t.name, p.partition_index), 1)
            offsets = [p.offset] if p.offset >= 0 and n > 0 else []
            parts.append((p.partition_index, int(p.error_code), offsets))
        topics.append((t.name, parts))
    return (topics,)


def _describe_configs_down(version, old, request, response) -> tuple:
    from kafscale.protocol.build import has_field

    from kafka.protocol.old.admin import DescribeConfigsResponse_v0

    schema = DescribeConfigsResponse_v0.SCHEMA

    def is_default(config) -> bool:
        if has_field(config, "config_source"):
            return int(config.config_source) == 5  # DEFAULT_CONFIG
        return False

    return _from_kio(schema, response, {"is_default": is_default})


ADAPTERS: dict[int, Adapter] = {
    a.api_key: a
    for a in (
        Adapter(ApiKey.PRODUCE, 0, 3, ("old.produce", "Produce"), decoder=_produce_decode),
        Adapter(ApiKey.FETCH, 0, 4, ("old.fetch", "Fetch"), defaults={"max_bytes": 0x7FFFFFFF, "isolation_level": 0}, down=_fetch_down),
        Adapter(ApiKey.LIST_OFFSETS, 0, 1, ("old.list_offsets", "ListOffsets"), down=_list_offsets_down),
        Adapter(ApiKey.OFFSET_COMMIT, 0, 2, ("old.commit", "OffsetCommit"),
                # v0 has no group generation: a commit outside a group (simple consumers).
                # Kafka 3.9 kept v0 commits (and answered OffsetFetch v0) in ZooKeeper, apart
                # from the offsets v1+ see, and a KRaft cluster refused them; here they are the
                # same offsets as v1+ (there is one offsets store, and no ZooKeeper).
                # v1's per-partition commit timestamp is not kept: the broker's time is the
                # commit time (Kafka 3.9 took the client's, which only moves when an
                # offsets-only group's offset expires: offsets.retention.minutes after it).
                defaults={"generation_id_or_member_epoch": -1, "member_id": "", "retention_time": -1}),
        Adapter(ApiKey.OFFSET_FETCH, 0, 1, ("old.commit", "OffsetFetch")),
        Adapter(ApiKey.CREATE_TOPICS, 0, 2, ("old.admin", "CreateTopics"), defaults={"validate_only": False}),
        Adapter(ApiKey.DELETE_TOPICS, 0, 1, ("old.admin", "DeleteTopics")),
        Adapter(ApiKey.OFFSET_FOR_LEADER_EPOCH, 0, 2, ("old.offset_for_leader_epoch", "OffsetForLeaderEpoch"), defaults={"current_leader_epoch": -1}),
        # ACLs v0 know literal resource names only (KIP-290 added patterns in v1)
        # v0 is v1 without flexible encoding; kafka.protocol.old has no WriteTxnMarkers
        Adapter(ApiKey.WRITE_TXN_MARKERS, 0, 1, None, json_classes=("producer.transaction", "WriteTxnMarkersRequest", "WriteTxnMarkersResponse")),
        Adapter(ApiKey.DESCRIBE_ACLS, 0, 1, ("old.admin", "DescribeAcls"), defaults={"pattern_type_filter": 3}),
        Adapter(ApiKey.CREATE_ACLS, 0, 1, ("old.admin", "CreateAcls"), defaults={"resource_pattern_type": 3}),
        Adapter(ApiKey.DELETE_ACLS, 0, 1, ("old.admin", "DeleteAcls"), defaults={"pattern_type_filter": 3}),
        Adapter(ApiKey.DESCRIBE_CONFIGS, 0, 1, ("old.admin", "DescribeConfigs"), defaults={"include_synonyms": False}, down=_describe_configs_down),
        # v0 and v1 of these are the same bytes ("Version 1 is the same as version 0")
        Adapter(ApiKey.ALTER_REPLICA_LOG_DIRS, 0, 1, None),
        Adapter(ApiKey.DESCRIBE_LOG_DIRS, 0, 1, None),
    )
}


def adapter(api_key: int) -> Adapter | None:
    return ADAPTERS.get(api_key)
