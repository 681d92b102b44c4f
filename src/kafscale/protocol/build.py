"""Build kio response entities without per-version code.

Fields differ between versions of one API; `make` keeps the values the version's class
has, drops the rest, and converts plain ints for timedelta, error-code and UUID fields.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from functools import lru_cache

from kafscale.errors import ErrorCode
from kafscale.protocol.codec import schema


@lru_cache(maxsize=None)
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def nested(cls: type, name: str) -> type:
    """A class defined next to `cls` in its kio module (e.g. the partition entity)."""
    return getattr(sys.modules[cls.__module__], name)


def response(api_key: int, version: int) -> type:
    return schema(api_key, version, "response")


def _convert(f: dataclasses.Field, value):
    kind = f.metadata.get("kafka_type")
    if kind in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kind == "datetime_i64" and isinstance(value, int):
        # Kafka's -1 ("none", e.g. log_append_time under CreateTime) is null in kio.
        return None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, tz=datetime.timezone.utc)
    if kind == "error_code" and isinstance(value, int) and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    if kind == "uuid" and isinstance(value, str):
        return uuid.UUID(value)
    return value


def make(cls: type, **values):
    fields = _fields(cls)
    kwargs = {name: _convert(fields[name], v) for name, v in values.items() if name in fields}
    return cls(**kwargs)


ZERO_UUID = uuid.UUID(int=0)
