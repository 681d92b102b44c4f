"""An error response for any API and version, built on kio's response schemas.

What Apache Kafka's `AbstractRequest.getErrorResponse(e)` does per request class, done
generically: every topic / partition / group / resource the request named comes back in
the response with the error code, and so does the top-level error code where the
response has one. Used by the server as the last resort when a handler raises: the
client gets an error it can act on (retry, look up the coordinator again) instead of a
dropped connection.

The request's entity arrays are matched to the response's by field name (`topics` ->
`topics`), by the usual request/response pairs (`topic_data` -> `responses`,
`coordinator_keys` -> `coordinators`, `partition_indexes` -> `partitions`, ...), or as the
only array left on both sides. Key fields (names, ids, partition indexes) are copied
from the request element; request arrays of plain values (group ids, partition indexes)
fill the response element's first field of that kind.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, get_field_tag, is_optional

from kafscale.errors import ErrorCode, KafkaError
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.codec import schema


# response array field -> request array fields it answers, in order of preference
_ARRAY_PAIRS = {
    "responses": ("topic_data", "topics", "resources", "topic_names"),
    "results": ("resources", "topics", "groups_names", "topic_names"),
    "partition_responses": ("partition_data", "partitions"),
    "partitions": ("partitions", "partition_indexes"),
    "coordinators": ("coordinator_keys",),
    "groups": ("groups",),
    "topics": ("topics",),
    "members": ("members",),
}
# response key field -> request element fields it copies, in order of preference; other
# fields are not copied (a request's log_start_offset is not the response's)
_KEY_PAIRS = {
    "partition_index": ("partition_index", "partition", "index"),
    "index": ("index", "partition_index", "partition"),
    "partition": ("partition", "partition_index", "index"),
    "name": ("name", "topic", "resource_name"),
    "topic": ("topic", "name"),
    "topic_id": ("topic_id",),
    "group_id": ("group_id",),
    "member_id": ("member_id",),
    "group_instance_id": ("group_instance_id",),
    "resource_type": ("resource_type",),
    "resource_name": ("resource_name",),
    "key": ("key",),
}
# int fields whose "nothing" is -1 in Kafka's error responses (offsets, ids, epochs)
_MINUS_ONE_HINTS = ("offset", "watermark", "epoch", "leader", "generation", "replica", "timestamp", "_id")


class RequestError(KafkaError):
    """Raised by a handler for a request it refuses as a whole (Kafka's
    InvalidRequestException and kin): the server answers it with `error_code` everywhere,
    one log line and no traceback."""


def error_code_for(exc: BaseException) -> int:
    """The Kafka error code an exception stands for: its own code when it is a KafkaError
    (storage, record, topic and request errors are), UNKNOWN_SERVER_ERROR otherwise."""
    if isinstance(exc, KafkaError):
        return exc.code.value
    return ErrorCode.unknown_server_error.value


def build(api_key: int, version: int, request: Any, error_code: int) -> Any | None:
    """The kio response for `request` (may be None: nothing to mirror) with `error_code`
    everywhere; None when the request gets no response at all (Produce with acks=0)."""
    if api_key == ApiKey.PRODUCE and request is not None and getattr(request, "acks", -1) == 0:
        return None
    return _entity(schema(api_key, version, "response"), request, ErrorCode(error_code), top=True)


def _entity(cls: type, source: Any, code: ErrorCode, top: bool = False) -> Any:
    fields = dataclasses.fields(cls)
    source_fields = _array_fields(source)
    paired = _pair_arrays(cls, source_fields)
    kwargs = {}
    for f in fields:
        if get_field_tag(f) is not None and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING):
            continue  # tagged fields keep their defaults (left out on the wire)
        fc = classify_field(f)
        if isinstance(fc, EntityTupleField):
            items = paired.get(f.name, ())
            kwargs[f.name] = tuple(_element(fc.type_, item, code) for item in items)
        elif isinstance(fc, PrimitiveTupleField):
            kwargs[f.name] = ()
        elif isinstance(fc, EntityField):
            kwargs[f.name] = None if is_optional(f) else _entity(fc.type_, None, code)
        else:
            kwargs[f.name] = _primitive(f, source, code, top)
    return cls(**kwargs)


def _element(cls: type, item: Any, code: ErrorCode) -> Any:
    if dataclasses.is_dataclass(item):
        return _entity(cls, item, code)
    # a plain value (a group id, a partition index): it fills the first field of its kind
    out = _entity(cls, None, code)
    kind = "string" if isinstance(item, str) else "int32"
    for f in dataclasses.fields(cls):
        if f.metadata.get("kafka_type") == kind:
            return dataclasses.replace(out, **{f.name: item})
    return out


def _array_fields(source: Any) -> dict[str, tuple]:
    if source is None or not dataclasses.is_dataclass(source):
        return {}
    out = {}
    for f in dataclasses.fields(source):
        value = getattr(source, f.name, None)
        if isinstance(value, (tuple, list)):
            out[f.name] = tuple(value)
    return out


def _pair_arrays(cls: type, source_arrays: dict[str, tuple]) -> dict[str, tuple]:
    targets = [f.name for f in dataclasses.fields(cls) if isinstance(classify_field(f), EntityTupleField)]
    paired, used = {}, set()
    for name in targets:
        for candidate in (name, *_ARRAY_PAIRS.get(name, ())):
            if candidate in source_arrays and candidate not in used:
                paired[name] = source_arrays[candidate]
                used.add(candidate)
                break
    left_targets = [t for t in targets if t not in paired]
    # only entity arrays pair by elimination (DescribeConfigs' configuration_keys are not
    # its configs)
    left_sources = [s for s, v in source_arrays.items() if s not in used and v and dataclasses.is_dataclass(v[0])]
    if len(left_targets) == 1 and len(left_sources) == 1:
        paired[left_targets[0]] = source_arrays[left_sources[0]]
    return paired


def _primitive(f: dataclasses.Field, source: Any, code: ErrorCode, top: bool) -> Any:
    kind = f.metadata["kafka_type"]
    if kind == "error_code":
        return code
    # Nested elements echo what the request named; the top level only carries the error
    # (a member id or generation echoed back would read as a valid one).
    if source is not None and not top:
        for candidate in _KEY_PAIRS.get(f.name, ()):
            value = getattr(source, candidate, None)
            if value is not None and _fits(kind, value):
                return value
    nullable = is_optional(f)
    if kind == "string":
        return None if nullable else ""
    if kind == "records":
        # Empty, never null, as Kafka's error responses (MemoryRecords.EMPTY): librdkafka
        # fails to parse a null record set in a Fetch answer ("invalid MessageSetSize -1")
        # and the consumer sees a protocol error instead of the partition's error code.
        return b""
    if kind == "bytes":
        return None if nullable else b""
    if kind == "bool":
        return False
    if kind == "uuid":
        return None if nullable else uuid.UUID(int=0)
    if kind in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kind == "datetime_i64":
        return None if nullable else datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    if kind == "float64":
        return 0.0
    if any(hint in f.name for hint in _MINUS_ONE_HINTS) and not kind.startswith("uint"):
        return -1
    return 0


def _fits(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "uuid":
        return isinstance(value, uuid.UUID)
    if kind in ("int8", "int16", "int32", "int64"):
        return isinstance(value, int) and not isinstance(value, bool)
    return False
