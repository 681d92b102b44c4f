"""The `_schemas` topic's records, keys and values as Confluent's registry writes them
(compact JSON, keys in the order keytype, subject, version, magic), so a topic written by
either can be read by the other:

  SCHEMA          {"keytype":"SCHEMA","subject":S,"version":V,"magic":1}
                  -> {"subject","version","id","schemaType" (not for AVRO),"references"
                     (when any),"schema","deleted"}; null: the version was hard-deleted
  CONFIG          {"keytype":"CONFIG","subject":S|null,"magic":0} -> {"compatibilityLevel"}; null: removed
  MODE            {"keytype":"MODE","subject":S|null,"magic":0} -> {"mode"}; null: removed
  DELETE_SUBJECT  {"keytype":"DELETE_SUBJECT","subject":S,"magic":0} -> {"subject","version"}:
                  every version up to `version` soft-deleted
  NOOP            {"keytype":"NOOP","magic":0} -> null (ignored)

Pure functions; a record is (key dict, value dict or None).
"""

from __future__ import annotations

import json

Record = tuple[dict, dict | None]


class BadRecord(ValueError):
    """A `_schemas` record this registry cannot read (skipped, logged by the reader)."""


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def schema_key(subject: str, version: int) -> dict:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}


def config_key(subject: str | None) -> dict:
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}


def mode_key(subject: str | None) -> dict:
    return {"keytype": "MODE", "subject": subject, "magic": 0}


def delete_subject_key(subject: str) -> dict:
    return {"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0}


def schema_value(subject: str, version: int, schema_id: int, schema_type: str, schema: str,
                 references: list[dict], deleted: bool) -> dict:
    doc: dict = {"subject": subject, "version": version, "id": schema_id}
    if schema_type != "AVRO":
        doc["schemaType"] = schema_type
    if references:
        doc["references"] = references
    doc["schema"] = schema
    doc["deleted"] = deleted
    return doc


def encode(record: Record) -> tuple[bytes, bytes | None]:
    key, value = record
    return _dumps(key), (None if value is None else _dumps(value))


def decode(key: bytes | None, value: bytes | None) -> Record:
    """Raises BadRecord for a key or value that is not the JSON object Confluent writes."""
    try:
        k = json.loads(key) if key is not None else None
        v = json.loads(value) if value is not None else None
    except (TypeError, ValueError) as e:
        raise BadRecord(f"not JSON: {e}") from None
    if not isinstance(k, dict) or not isinstance(k.get("keytype"), str):
        raise BadRecord(f"key without keytype: {key!r:.200}")
    if v is not None and not isinstance(v, dict):
        raise BadRecord(f"value is not an object: {value!r:.200}")
    return k, v
