"""Avro schemas for the registry: parsing (with references), the stored form, and
reader/writer compatibility, all with Apache Avro's own Python library (`avro`, the
project's maintained implementation, whose `avro.compatibility` is a port of the Java
SchemaCompatibility checker Confluent's registry uses). Why this library and not fastavro:
docs/schema-registry.md.

Pure functions, no I/O.
"""

from __future__ import annotations

import json

import avro.errors
import avro.name
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from kafscale.registry.parsed import InvalidSchema, ParsedSchema

SCHEMA_TYPE = "AVRO"


def _load_json(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise InvalidSchema(f"Invalid schema: not JSON: {e}") from None


def stored_form(text: str, normalize: bool = False) -> str:
    """The text the registry keeps and compares: the schema's JSON without whitespace
    (Confluent compares Avro's compact rendering, so spacing never makes a new version);
    with normalize, object keys sorted too (field order, an array, is kept)."""
    return json.dumps(_load_json(text), separators=(",", ":"), sort_keys=normalize, ensure_ascii=False)


def parse(text: str, references: list[str] = (), normalize: bool = False) -> ParsedSchema:
    """Parse `text`; `references` are the texts of the schemas it names (already resolved,
    each after those it needs), whose named types it may use. Raises InvalidSchema."""
    data = _load_json(text)
    names = avro.name.Names(validate_names=True)
    try:
        for ref in references:
            avro.schema.make_avsc_object(_load_json(ref), names)
        parsed = avro.schema.make_avsc_object(data, names)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError, AttributeError) as e:
        raise InvalidSchema(f"Invalid schema: {e}") from None
    return ParsedSchema(SCHEMA_TYPE, stored_form(text, normalize), parsed)


def incompatibilities(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` ([] when it can)."""
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader.parsed, writer.parsed)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted(k.name.upper() for k in result.incompatibilities)) or "INCOMPATIBLE"
    where = ", ".join(sorted(result.locations))
    detail = "; ".join(sorted(result.messages))
    return [f"{kinds} at {where}: {detail}"]
