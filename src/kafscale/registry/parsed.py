"""What every schema type's module gives back (types.py dispatches to them): a parsed schema,
or InvalidSchema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class InvalidSchema(ValueError):
    """The schema text does not parse (Confluent's 42201)."""


@dataclass(frozen=True)
class ParsedSchema:
    schema_type: str
    text: str  # the stored form (compact JSON for Avro)
    parsed: Any = field(compare=False)  # the library's object
