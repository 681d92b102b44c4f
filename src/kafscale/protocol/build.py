"""Build kio entities (responses, and requests in tests) without per-version code.

Fields differ between versions of one API; `make` keeps the values the version's class
has, drops the rest, fills required fields not given with Kafka's zero value, builds
nested arrays given as dicts, and converts plain ints for timedelta, datetime,
error-code and UUID fields. A field name that no version of the entity has is a typo
and raises TypeError: before, it was dropped silently and the client saw a zero.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import pkgutil
import sys
import typing
import uuid
from functools import lru_cache

from kafscale.errors import ErrorCode
from kafscale.protocol.codec import schema


@dataclasses.dataclass(frozen=True)
class _FieldSpec:
    name: str
    kind: str | None  # kio's kafka_type
    element: type | None  # entity class of an array of entities
    is_array: bool
    nullable: bool
    required: bool


@lru_cache(maxsize=None)
def _specs(cls: type) -> dict[str, _FieldSpec]:
    hints = typing.get_type_hints(cls)
    specs = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        if nullable:
            hint = next(a for a in args if a is not type(None))
        is_array = typing.get_origin(hint) is tuple
        element = None
        if is_array:
            inner = typing.get_args(hint)[0]
            element = inner if dataclasses.is_dataclass(inner) else None
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        specs[f.name] = _FieldSpec(f.name, f.metadata.get("kafka_type"), element, is_array, nullable, required)
    return specs


def _walk(cls: type, path: tuple[str, ...], out: dict) -> None:
    """Record `cls` under `path` (field names from the root entity) and recurse into its
    entity fields."""
    out.setdefault(cls, set()).add(path)
    for spec in _specs(cls).values():
        child = spec.element
        if child is None and not spec.is_array:
            hint = typing.get_type_hints(cls)[spec.name]
            child = next((a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)), None)
        if child is not None:
            _walk(child, (*path, spec.name), out)


def _version_modules(api_package: str) -> list[str]:
    """kio's version modules of one API (v0, v1, ...), oldest first."""
    package = importlib.import_module(api_package)
    found = [info.name for info in pkgutil.iter_modules(package.__path__) if info.name.startswith("v") and info.name[1:].isdigit()]
    return sorted(found, key=lambda name: int(name[1:]))


@lru_cache(maxsize=None)
def _names_by_holder(api_package: str, kind: str, edges_only: bool = False) -> dict[tuple[str, ...], frozenset[str]]:
    """Field names of the entity at each path of one API's request or response, over all
    versions kio has (kio lays them out as kio.schema.<api>.v<N>.<request|response>), or,
    with `edges_only`, over its oldest and newest version only (see make).
    Nested entities are matched by the field that holds them, not by class name or full
    path: both change between versions (OffsetFetch v1-v7 `topics` of
    OffsetFetchResponseTopic, v8+ `groups` -> `topics` of OffsetFetchResponseTopics)."""
    names: dict[tuple[str, ...], set[str]] = {}
    versions = _version_modules(api_package)
    if edges_only:
        versions = sorted({versions[0], versions[-1]}) if versions else []
    for version in versions:
        try:
            module = importlib.import_module(f"{api_package}.{version}.{kind}")
        except ImportError:
            continue
        for root in vars(module).values():
            if isinstance(root, type) and dataclasses.is_dataclass(root) and root.__module__ == module.__name__ \
                    and root.__name__.endswith(("Request", "Response")):
                paths: dict = {}
                _walk(root, (), paths)
                for entity, entity_paths in paths.items():
                    for path in entity_paths:
                        names.setdefault(path[-1:], set()).update(_specs(entity))
    return {path: frozenset(n) for path, n in names.items()}


@lru_cache(maxsize=None)
def _names_in_any_version(cls: type, edges_only: bool = False) -> frozenset[str]:
    """Field names that `cls`, or the entity in its place in any other version of its
    API, has (with `edges_only`: in its oldest or newest version, a subset)."""
    names = set(_specs(cls))
    parts = cls.__module__.split(".")
    if len(parts) >= 5 and parts[:2] == ["kio", "schema"] and parts[-2].startswith("v"):
        module = sys.modules[cls.__module__]
        by_holder = _names_by_holder(".".join(parts[:-2]), parts[-1], edges_only)
        for root in vars(module).values():
            if isinstance(root, type) and dataclasses.is_dataclass(root) and root.__module__ == module.__name__ \
                    and root.__name__.endswith(("Request", "Response")):
                paths: dict = {}
                _walk(root, (), paths)
                for path in paths.get(cls, ()):
                    names.update(by_holder.get(path[-1:], ()))
    return frozenset(names)


def prepare(api_key: int) -> None:
    """Do now what `make`'s check of absent names would do on an API's first response:
    import its oldest and newest kio versions and read their field names. Called at start-up
    for the data path (Produce, Fetch): done on the first Produce response instead, it cost
    a fresh broker 0.1-0.5 s on the event loop inside the first burst of produces."""
    from kafscale.protocol.codec import kio_versions

    newest = response(api_key, kio_versions(api_key)[1])
    _names_by_holder(newest.__module__.rsplit(".", 2)[0], "response", True)


def nested(cls: type, name: str) -> type:
    """A class defined next to `cls` in its kio module (e.g. the partition entity)."""
    return getattr(sys.modules[cls.__module__], name)


def response(api_key: int, version: int) -> type:
    return schema(api_key, version, "response")


def has_field(cls_or_obj, name: str) -> bool:
    """Does this version of the entity have field `name`?"""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    return name in _specs(cls)


def _zero(spec: _FieldSpec):
    if spec.is_array:
        return ()
    if spec.nullable:
        return None
    return {
        "string": "",
        "bytes": b"",
        "bool": False,
        "error_code": ErrorCode.none,
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "uuid": uuid.UUID(int=0),
        "float64": 0.0,
    }.get(spec.kind, 0)


def _to_timedelta(value):
    return datetime.timedelta(milliseconds=value) if isinstance(value, int) else value


def _to_datetime(value):
    if isinstance(value, int):
        # Kafka's -1 ("none", e.g. log_append_time under CreateTime) is null in kio.
        return None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, tz=datetime.timezone.utc)
    return value


def _to_error_code(value):
    return value if isinstance(value, ErrorCode) else ErrorCode(int(value))


def _to_uuid(value):
    return uuid.UUID(value) if isinstance(value, str) else value


def _to_bytes(value):
    return value if isinstance(value, bytes) else bytes(value)


def _converter(spec: _FieldSpec):
    """The conversion a given value goes through for this field; None: taken as it is."""
    if spec.is_array:
        if spec.element is not None:
            element = spec.element

            def entities(value):
                # A tuple of entities (the usual case) is taken as it is.
                if type(value) is tuple and (not value or not isinstance(value[0], dict)):
                    return value
                return tuple(make(element, **v) if isinstance(v, dict) else v for v in value)

            return entities
        return tuple
    return {
        "timedelta_i32": _to_timedelta,
        "timedelta_i64": _to_timedelta,
        "datetime_i64": _to_datetime,
        "error_code": _to_error_code,
        "uuid": _to_uuid,
        "bytes": _to_bytes,
    }.get(spec.kind)


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    fields: dict[str, tuple[object, object, bool]]  # name -> (converter, value for None, required)
    required: tuple[tuple[str, object], ...]  # (name, Kafka's zero) of fields without a default


@lru_cache(maxsize=None)
def _plan(cls: type) -> _Plan:
    """Computed once per class: make runs for every partition of every Produce response."""
    fields, required = {}, []
    for spec in _specs(cls).values():
        fields[spec.name] = (_converter(spec), None if spec.nullable else _zero(spec), spec.required)
        if spec.required:
            required.append((spec.name, _zero(spec)))
    return _Plan(fields, tuple(required))


def make(cls: type, **values):
    """An instance of kio entity `cls` from `values` (see the module docstring)."""
    plan = _plan(cls)
    fields = plan.fields
    kwargs = {}
    required_given = 0
    absent = None  # names this version lacks: another version's fields, or typos
    for name, value in values.items():
        entry = fields.get(name)
        if entry is None:
            absent = [name] if absent is None else [*absent, name]
            continue
        convert, none_value, required = entry
        if value is None:
            kwargs[name] = none_value
        else:
            kwargs[name] = convert(value) if convert is not None else value
        required_given += required
    if absent is not None:
        # Fields another version has are almost always in the oldest or the newest one:
        # looking there first costs two kio modules instead of all of them (Produce v9's
        # first response read 11 modules: 56 ms on the event loop inside the first burst
        # of produces, +0.4 s/GiB in bench/run.py --quick). Only a name in neither takes
        # the full scan, so what is refused is unchanged.
        edges = _names_in_any_version(cls, True)
        typos = [name for name in absent if name not in edges]
        if typos:
            known = _names_in_any_version(cls)
            typos = [name for name in typos if name not in known]
        if typos:
            raise TypeError(f"{cls.__qualname__} has no field {', '.join(typos)} in any version")
    if required_given < len(plan.required):
        for name, zero in plan.required:
            if name not in kwargs:
                kwargs[name] = zero
    return cls(**kwargs)


ZERO_UUID = uuid.UUID(int=0)
