"""Well-formed requests of every API the broker serves, built from kio's request schemas
with plausible field values (short names, small counts, a real record batch), for the
validator's unit tests and the fuzz test's seed frames.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import uuid

from kio.serial import entity_writer
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, get_field_tag, is_optional

from kafscale.protocol.records import build_batch
from tests.support.raw import encode_request, schema

NAMES = ("fuzz-topic", "fuzz-group", "t", "member-1", "range", "")


def _primitive(kafka_type: str, name: str, rng: random.Random):
    if kafka_type in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "error_code"):
        if "timeout" in name or "wait" in name:
            return rng.choice((0, 10, 100))
        return rng.choice((-1, 0, 0, 1, 2, 3))
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.choice((0, 10, 100)))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randrange(1_700_000_000, 1_800_000_000), datetime.timezone.utc)
    if kafka_type == "float64":
        return rng.random()
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "uuid":
        return uuid.UUID(int=0) if rng.random() < 0.5 else uuid.UUID(int=rng.getrandbits(128))
    if kafka_type == "string":
        return rng.choice(NAMES)
    if kafka_type == "records":
        return build_batch([(b"k", b"fuzz value %d" % rng.randrange(1000))], timestamp=1_700_000_000_000)
    if kafka_type == "bytes":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12)))
    raise AssertionError(f"no sample for kafka type {kafka_type}")


def sample_entity(cls: type, rng: random.Random, depth: int = 0):
    kwargs = {}
    for f in dataclasses.fields(cls):
        if get_field_tag(f) is not None and f.default is not dataclasses.MISSING and rng.random() < 0.7:
            continue  # a tagged field left at its default is not sent at all
        fc = classify_field(f)
        if is_optional(f) and rng.random() < 0.15 and not (isinstance(fc, EntityField) and get_field_tag(f) is not None):
            kwargs[f.name] = None
            continue
        if isinstance(fc, EntityTupleField):
            kwargs[f.name] = tuple(sample_entity(fc.type_, rng, depth + 1) for _ in range(rng.randrange(0, 3 if depth < 2 else 2)))
        elif isinstance(fc, EntityField):
            kwargs[f.name] = sample_entity(fc.type_, rng, depth + 1)
        elif isinstance(fc, PrimitiveTupleField):
            kwargs[f.name] = tuple(_primitive(f.metadata["kafka_type"], f.name, rng) for _ in range(rng.randrange(0, 3)))
        else:
            kwargs[f.name] = _primitive(f.metadata["kafka_type"], f.name, rng)
    return cls(**kwargs)


def sample_request(api_key: int, version: int, rng: random.Random):
    return sample_entity(schema(api_key, version, "request"), rng)


def sample_body(api_key: int, version: int, rng: random.Random) -> bytes:
    body = sample_request(api_key, version, rng)
    buf = io.BytesIO()
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def sample_payload(api_key: int, version: int, rng: random.Random, correlation_id: int = 1) -> bytes:
    """A whole request payload (header + body), without the length prefix."""
    return encode_request(api_key, version, sample_request(api_key, version, rng), correlation_id, client_id="fuzz")


def served_versions() -> list[tuple[int, int]]:
    """Every (api key, version) the broker's router serves."""
    from kafscale.broker.router import build_router

    from kafscale.protocol.codec import kio_versions

    # versions below kio's (protocol/legacy.py) have no kio schema to sample: tests/test_old_versions.py
    return [(a.key, v) for a in sorted(build_router().apis.values(), key=lambda a: a.key)
            for v in range(max(a.min_version, kio_versions(a.key)[0]), a.max_version + 1)]
