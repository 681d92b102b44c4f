"""The schema types the registry knows, behind one small interface: parse (with the texts
of referenced schemas) into a ParsedSchema whose `text` is what is stored and compared,
and list the incompatibilities of a reader with a writer. Avro only for now: JSON Schema
and Protobuf are left out until they can be done well (docs/schema-registry.md)."""

from __future__ import annotations

from kafscale.registry.parsed import InvalidSchema, ParsedSchema


def _modules() -> dict:
    from kafscale.registry import avro_schema

    return {avro_schema.SCHEMA_TYPE: avro_schema}


SCHEMA_TYPES = ("AVRO",)


def module_for(schema_type: str):
    mod = _modules().get(schema_type)
    if mod is None:
        raise InvalidSchema(f"Invalid schema type {schema_type!r}: this registry supports {', '.join(SCHEMA_TYPES)}")
    return mod


def parse(schema_type: str, text: str, references: list[str] = (), normalize: bool = False) -> ParsedSchema:
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchema("Invalid schema: empty")
    return module_for(schema_type).parse(text, list(references), normalize)


def incompatibilities(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    if reader.schema_type != writer.schema_type:
        return [f"schema type {reader.schema_type} cannot read {writer.schema_type}"]
    return module_for(reader.schema_type).incompatibilities(reader, writer)
