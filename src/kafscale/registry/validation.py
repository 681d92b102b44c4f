"""Schema validation on produce (`confluent.key.schema.validation` /
`confluent.value.schema.validation` topic configs, as Confluent Server and Redpanda name
them): every non-null key or value of a record sent to such a topic must be in
Confluent's wire format, the magic byte 0 and a 4-byte big-endian schema id, and the id
must be that of a live version of the topic's subject (TopicNameStrategy: `<topic>-key`,
`<topic>-value`). Otherwise the whole record set is refused with INVALID_RECORD and
Kafka's record_errors, as check_keys does for compacted topics.

Only topics with a validation config on are looked at (the produce path asks
`LogSettings.schema_validation`, one attribute, for every other topic); their compressed
batches are decompressed for the check (kafscale_schema_check_decompressions_total). Ids are looked up
in this broker's registry state; an id not found there makes it catch up with `_schemas`
once and look again, so a schema registered a moment ago through any broker is accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafscale.errors import ErrorCode
from kafscale.protocol import records
from kafscale.registry.state import RegistryError

if TYPE_CHECKING:
    from kafscale.registry.service import RegistryService

MAGIC_BYTE = 0
PREFIX_BYTES = 5


def schema_ids(data, headers, keys: bool, values: bool) -> list[tuple[int, str, int | None]]:
    """(batch index, "key" or "value", schema id or None when the field is not in the wire
    format) of every non-null field to check, in record order."""
    out: list[tuple[int, str, int | None]] = []
    for header, body in records.batch_bodies(data, headers):
        if header.compression != records.COMPRESSION_NONE:
            records.schema_check_decompressions += 1
        for i, key, value in records.record_keys_values(body, header.record_count):
            for name, field, wanted in (("key", key, keys), ("value", value, values)):
                if wanted and field is not None:
                    ok = len(field) >= PREFIX_BYTES and field[0] == MAGIC_BYTE
                    out.append((i, name, int.from_bytes(field[1:PREFIX_BYTES], "big") if ok else None))
    return out


class ProduceValidator:
    def __init__(self, service: "RegistryService"):
        self.service = service

    def _live_ids(self, subject: str) -> set[int]:
        return {v.id for v in self.service.state.live_versions(subject)}

    async def check(self, topic: str, data, headers, keys: bool, values: bool) -> None:
        """Raise InvalidRecordError (INVALID_RECORD, with record_errors) unless every field
        checked carries a registered id of its subject."""
        found = schema_ids(data, headers, keys, values)
        if not found:
            return
        subjects = {name: f"{topic}-{name}" for name in ("key", "value")}
        ids = {name: self._live_ids(s) for name, s in subjects.items()}
        if any(sid is not None and sid not in ids[name] for _i, name, sid in found):
            try:
                await self.service.catch_up()
            except RegistryError as e:
                raise records.InvalidRecordError(f"schema registry unavailable: {e.message}", ErrorCode.kafka_storage_error) from None
            ids = {name: self._live_ids(s) for name, s in subjects.items()}
        errors = []
        for i, name, sid in found:
            if sid is None:
                errors.append((i, f"The {name} of the record is not in the schema registry's wire format (magic byte 0, 4-byte schema id)"))
            elif sid not in ids[name]:
                errors.append((i, f"Schema id {sid} is not registered under subject {subjects[name]}"))
        if errors:
            raise records.rejected_records(errors)
