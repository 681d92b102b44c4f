"""The registry's state machine: subjects, versions, global ids, soft and hard deletes,
compatibility config, mode and references, as Confluent's Schema Registry has them.

Pure: no I/O, no asyncio. The state is what replaying the `_schemas` log (`apply`) gives;
a change is decided here as the records to append (`codec.Record`s) plus the answer, and
the driver (service.py) appends them and applies them back by reading the log, so every
broker's state is the log's. The one decision needing I/O, a fresh global id, is split
out: `plan_register` says whether one is needed, the driver allocates it, and
`register_records` writes the version with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from kafscale.registry import codec, types
from kafscale.registry.parsed import InvalidSchema, ParsedSchema

COMPATIBILITY_LEVELS = (
    "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE",
)
DEFAULT_COMPATIBILITY = "BACKWARD"
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
DEFAULT_MODE = "READWRITE"
MAX_VERSION = 2**31 - 1


class RegistryError(Exception):
    """An answer other than success: HTTP status, Confluent's error_code, message."""

    def __init__(self, status: int, error_code: int, message: str):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


# Confluent's error codes (its Errors class), one constructor each.
def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def schema_not_found(what: str = "") -> RegistryError:
    return RegistryError(404, 40403, f"Schema {what} not found".replace("  ", " ").strip() + ".")


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, 42201, message)


def invalid_version(version) -> RegistryError:
    return RegistryError(
        422, 42202,
        f"The specified version '{version}' is not a valid version id. Allowed values are between [1, {MAX_VERSION}] and the string \"latest\"",
    )


def read_only(subject: str | None) -> RegistryError:
    return RegistryError(422, 42205, f"Subject {subject or '(global)'} is in read-only mode")


@dataclass(frozen=True)
class Version:
    """One subject-version: what a SCHEMA record holds."""

    subject: str
    version: int
    id: int
    schema_type: str
    schema: str
    references: tuple  # of {"name", "subject", "version"} dicts, as registered
    deleted: bool = False

    def to_json(self) -> dict:
        """The body of GET /subjects/{s}/versions/{v} and POST /subjects/{s} (lookup)."""
        doc: dict = {"subject": self.subject, "version": self.version, "id": self.id}
        if self.schema_type != "AVRO":
            doc["schemaType"] = self.schema_type
        if self.references:
            doc["references"] = list(self.references)
        doc["schema"] = self.schema
        return doc


@dataclass(frozen=True)
class RegisterPlan:
    subject: str
    parsed: ParsedSchema
    references: tuple
    version: int
    id: int | None  # None: a new global id is needed
    existing: Version | None = None  # already registered: nothing to write


def parse_version(spec, allow_latest: bool = True) -> int:
    """A version in a path: 'latest' or -1 (returned as -1), or 1..2^31-1; else 42202."""
    text = str(spec)
    if allow_latest and text.lower() == "latest":
        return -1
    try:
        v = int(text)
    except ValueError:
        raise invalid_version(spec) from None
    if v == -1 and allow_latest:
        return -1
    if not 1 <= v <= MAX_VERSION:
        raise invalid_version(spec)
    return v


def check_references(refs) -> tuple:
    """The request's `references`, checked: a list of {name, subject, version}."""
    if refs is None:
        return ()
    if not isinstance(refs, list):
        raise invalid_schema("Invalid schema: references must be a list")
    out = []
    for r in refs:
        if not (isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("subject"), str)
                and isinstance(r.get("version"), int) and not isinstance(r.get("version"), bool)):
            raise invalid_schema(f"Invalid schema: bad reference {r!r}")
        out.append({"name": r["name"], "subject": r["subject"], "version": r["version"]})
    return tuple(out)


class RegistryState:
    def __init__(self) -> None:
        self.versions: dict[str, dict[int, Version]] = {}
        self.configs: dict[str | None, str] = {}
        self.modes: dict[str | None, str] = {}
        self.max_id = 0  # highest id seen in the log (hard deletes do not lower it)
        self._parsed: dict[tuple, ParsedSchema] = {}

    # -- replay ----------------------------------------------------------------------------

    def apply(self, record: codec.Record) -> None:
        """Apply one `_schemas` record. Raises codec.BadRecord for a malformed one."""
        key, value = record
        kind = key["keytype"]
        subject = key.get("subject")
        try:
            if kind == "SCHEMA":
                version = int(key["version"])
                if value is None:
                    self.versions.get(subject, {}).pop(version, None)
                    if subject in self.versions and not self.versions[subject]:
                        del self.versions[subject]
                    return
                v = Version(
                    subject=value.get("subject", subject), version=int(value.get("version", version)), id=int(value["id"]),
                    schema_type=value.get("schemaType") or "AVRO", schema=value["schema"],
                    references=tuple(value.get("references") or ()), deleted=bool(value.get("deleted", False)),
                )
                self.versions.setdefault(subject, {})[version] = v
                self.max_id = max(self.max_id, v.id)
            elif kind == "CONFIG":
                self._set_or_clear(self.configs, subject, value, ("compatibilityLevel", "compatibility"))
            elif kind == "MODE":
                self._set_or_clear(self.modes, subject, value, ("mode",))
            elif kind == "DELETE_SUBJECT" and value is not None:
                upto = int(value["version"])
                for n, v in list(self.versions.get(subject, {}).items()):
                    if n <= upto and not v.deleted:
                        self.versions[subject][n] = replace(v, deleted=True)
        except (KeyError, TypeError, ValueError) as e:
            raise codec.BadRecord(f"{kind} record: {e!r}") from None

    @staticmethod
    def _set_or_clear(table: dict, subject, value: dict | None, fields: tuple[str, ...]) -> None:
        if value is None:
            table.pop(subject, None)
            return
        for f in fields:
            if isinstance(value.get(f), str):
                table[subject] = value[f].upper()
                return
        raise KeyError(fields[0])

    # -- queries ---------------------------------------------------------------------------

    def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        return sorted(
            s for s, vs in self.versions.items()
            if s.startswith(prefix) and any(deleted or not v.deleted for v in vs.values())
        )

    def _all_versions(self, subject: str) -> dict[int, Version]:
        vs = self.versions.get(subject)
        if not vs:
            raise subject_not_found(subject)
        return vs

    def live_versions(self, subject: str) -> list[Version]:
        return [v for _, v in sorted(self.versions.get(subject, {}).items()) if not v.deleted]

    def version_numbers(self, subject: str, deleted: bool = False) -> list[int]:
        vs = self._all_versions(subject)
        out = [n for n, v in sorted(vs.items()) if deleted or not v.deleted]
        if not out:
            raise subject_not_found(subject)
        return out

    def get_version(self, subject: str, spec, deleted: bool = False) -> Version:
        """A subject's version by path spec ('latest', -1 or a number); soft-deleted ones
        only with `deleted`."""
        n = parse_version(spec)
        vs = self._all_versions(subject)
        candidates = {k: v for k, v in vs.items() if deleted or not v.deleted}
        if n == -1:
            if not candidates:
                raise subject_not_found(subject)
            return candidates[max(candidates)]
        if n not in candidates:
            raise version_not_found(n)
        return candidates[n]

    def by_id(self, schema_id: int) -> Version:
        """Some subject-version holding the id (soft-deleted ones count, as in Confluent)."""
        found = None
        for vs in self.versions.values():
            for v in vs.values():
                if v.id == schema_id and (found is None or (found.deleted and not v.deleted)):
                    found = v
        if found is None:
            raise schema_not_found(str(schema_id))
        return found

    def id_uses(self, schema_id: int, deleted: bool = False) -> list[Version]:
        return sorted(
            (v for vs in self.versions.values() for v in vs.values() if v.id == schema_id and (deleted or not v.deleted)),
            key=lambda v: (v.subject, v.version),
        )

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of live schemas that reference subject-version."""
        return sorted({
            v.id for vs in self.versions.values() for v in vs.values()
            if not v.deleted and any(r["subject"] == subject and r["version"] == version for r in v.references)
        })

    def compatibility(self, subject: str | None) -> str:
        if subject is not None and subject in self.configs:
            return self.configs[subject]
        return self.configs.get(None, DEFAULT_COMPATIBILITY)

    def mode(self, subject: str | None) -> str:
        if subject is not None and subject in self.modes:
            return self.modes[subject]
        return self.modes.get(None, DEFAULT_MODE)

    # -- parsing with references -----------------------------------------------------------

    def _reference_texts(self, refs: tuple, seen: frozenset = frozenset()) -> list[str]:
        """Texts of the referenced schemas, each after the ones it references itself."""
        out: list[str] = []
        for r in refs:
            key = (r["subject"], r["version"])
            if key in seen:
                raise invalid_schema(f"Invalid schema: circular reference to {r['subject']} version {r['version']}")
            try:
                target = self.get_version(r["subject"], r["version"], deleted=False)
            except RegistryError:
                raise invalid_schema(
                    f"Invalid schema: reference {r['name']!r} to subject {r['subject']!r} version {r['version']} not found"
                ) from None
            for text in self._reference_texts(target.references, seen | {key}) + [target.schema]:
                if text not in out:
                    out.append(text)
        return out

    def parse(self, schema_type: str, text, refs: tuple, normalize: bool = False) -> ParsedSchema:
        if not isinstance(text, str):
            raise invalid_schema("Invalid schema: the schema must be a string")
        key = (schema_type, text, json.dumps(refs), normalize)
        parsed = self._parsed.get(key)
        if parsed is None:
            try:
                parsed = types.parse(schema_type, text, self._reference_texts(refs), normalize)
            except InvalidSchema as e:
                raise invalid_schema(str(e)) from None
            if len(self._parsed) > 10_000:
                self._parsed.clear()
            self._parsed[key] = parsed
        return parsed

    def parsed_version(self, v: Version) -> ParsedSchema:
        return self.parse(v.schema_type, v.schema, v.references)

    def lookup(self, subject: str, parsed: ParsedSchema, refs: tuple, deleted: bool = False) -> Version:
        """POST /subjects/{s}: the subject's version holding this schema."""
        vs = self._all_versions(subject)
        for _, v in sorted(vs.items(), reverse=True):
            if (deleted or not v.deleted) and self._same(v, parsed, refs):
                return v
        raise schema_not_found()

    @staticmethod
    def _same(v: Version, parsed: ParsedSchema, refs: tuple) -> bool:
        return v.schema_type == parsed.schema_type and v.schema == parsed.text and tuple(v.references) == refs

    # -- compatibility ---------------------------------------------------------------------

    def incompatibilities(self, level: str, new: ParsedSchema, previous: list[Version]) -> list[str]:
        """What stops `new` under `level` against `previous` (oldest first): the latest
        only, or all of them for the transitive levels."""
        if level == "NONE" or not previous:
            return []
        against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
        messages: list[str] = []
        for old in reversed(against):
            parsed_old = self.parsed_version(old)
            if level.startswith(("BACKWARD", "FULL")):
                messages += [f"{m} (new schema cannot read version {old.version})" for m in types.incompatibilities(new, parsed_old)]
            if level.startswith(("FORWARD", "FULL")):
                messages += [f"{m} (version {old.version} cannot read the new schema)" for m in types.incompatibilities(parsed_old, new)]
        return messages

    def check_compatibility(self, subject: str, spec, parsed: ParsedSchema) -> list[str]:
        """POST /compatibility/subjects/{s}/versions[/{v}]: spec None checks as a
        registration would (the level's versions), else against that one version."""
        level = self.compatibility(subject)
        if spec is None:
            return self.incompatibilities(level, parsed, self.live_versions(subject))
        target = self.get_version(subject, spec)
        return self.incompatibilities(level.removesuffix("_TRANSITIVE"), parsed, [target])

    # -- changes: each returns (records to append, answer) ---------------------------------

    def _writable(self, subject: str | None) -> None:
        if self.mode(subject) in ("READONLY", "READONLY_OVERRIDE"):
            raise read_only(subject)

    def plan_register(self, subject: str, schema_type: str, text, refs: tuple, normalize: bool = False,
                      schema_id: int | None = None, version: int | None = None) -> RegisterPlan:
        """POST /subjects/{s}/versions, up to the id: the existing version when the
        schema is already the subject's (live), else the checks (mode, compatibility) and
        the version and id it will get (id None: a new one is needed). In IMPORT mode an
        explicit id and version are taken and compatibility is not checked."""
        self._writable(subject)
        parsed = self.parse(schema_type, text, refs, normalize)
        mode = self.mode(subject)
        if (schema_id is not None or version is not None) and mode != "IMPORT":
            raise RegistryError(422, 42205, "Subject is not in import mode: id and version cannot be given")
        live = self.live_versions(subject)
        for v in reversed(live):
            if self._same(v, parsed, refs) and (schema_id is None or v.id == schema_id):
                return RegisterPlan(subject, parsed, refs, v.version, v.id, existing=v)
        if mode != "IMPORT":
            messages = self.incompatibilities(self.compatibility(subject), parsed, live)
            if messages:
                raise RegistryError(
                    409, 409,
                    f"Schema being registered is incompatible with an earlier schema for subject \"{subject}\", details: {messages}",
                )
        if version is not None:
            version = parse_version(version, allow_latest=False)
            if version in self.versions.get(subject, {}):
                raise RegistryError(422, 42205, f"Version {version} of subject {subject} already exists")
        else:
            version = max(self.versions.get(subject, {}) or [0]) + 1
        if schema_id is not None:
            for other in self.id_uses(schema_id, deleted=True):
                if not self._same(other, parsed, refs):
                    raise RegistryError(422, 42205, f"Schema id {schema_id} is already used by a different schema")
        else:
            schema_id = self._id_of(parsed, refs)
        return RegisterPlan(subject, parsed, refs, version, schema_id)

    def _id_of(self, parsed: ParsedSchema, refs: tuple) -> int | None:
        """The global id the same schema has in any subject (ids are per schema)."""
        for vs in self.versions.values():
            for v in vs.values():
                if self._same(v, parsed, refs):
                    return v.id
        return None

    @staticmethod
    def register_records(plan: RegisterPlan, schema_id: int) -> list[codec.Record]:
        value = codec.schema_value(plan.subject, plan.version, schema_id, plan.parsed.schema_type, plan.parsed.text,
                                   list(plan.references), deleted=False)
        return [(codec.schema_key(plan.subject, plan.version), value)]

    def delete_version(self, subject: str, spec, permanent: bool) -> tuple[list[codec.Record], int]:
        """DELETE /subjects/{s}/versions/{v}[?permanent=true]: soft first, then hard."""
        self._writable(subject)
        n = parse_version(spec)
        vs = self._all_versions(subject)
        if n == -1:
            live = self.live_versions(subject)
            if not live:
                raise subject_not_found(subject)
            n = live[-1].version
        v = vs.get(n)
        if v is None:
            raise version_not_found(n)
        if not permanent and v.deleted:
            raise RegistryError(404, 40406, f"Subject '{subject}' Version {n} was soft deleted.Set permanent=true to delete permanently")
        if permanent and not v.deleted:
            raise RegistryError(404, 40407, f"Subject '{subject}' Version {n} was not deleted first before being permanently deleted")
        if self.referenced_by(subject, n):
            raise RegistryError(422, 42206, f"One or more references exist to the schema {{subject={subject},version={n}}}.")
        key = codec.schema_key(subject, n)
        if permanent:
            return [(key, None)], n
        value = codec.schema_value(subject, n, v.id, v.schema_type, v.schema, list(v.references), deleted=True)
        return [(key, value)], n

    def delete_subject(self, subject: str, permanent: bool) -> tuple[list[codec.Record], list[int]]:
        """DELETE /subjects/{s}[?permanent=true]: soft-delete every live version (one
        DELETE_SUBJECT record), or hard-delete a soft-deleted subject (tombstones)."""
        self._writable(subject)
        vs = self._all_versions(subject)
        live = [n for n, v in sorted(vs.items()) if not v.deleted]
        for n in sorted(vs):
            if self.referenced_by(subject, n):
                raise RegistryError(422, 42206, f"One or more references exist to the schema {{subject={subject},version={n}}}.")
        if not permanent:
            if not live:
                raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")
            value = {"subject": subject, "version": live[-1]}
            return [(codec.delete_subject_key(subject), value)], live
        if live:
            raise RegistryError(404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted")
        records: list[codec.Record] = [(codec.schema_key(subject, n), None) for n in sorted(vs)]
        # The DELETE_SUBJECT record goes too: versions registered under the name later
        # start at 1 again and must not look deleted to a reader replaying the log.
        records.append((codec.delete_subject_key(subject), None))
        if subject in self.configs:
            records.append((codec.config_key(subject), None))
        if subject in self.modes:
            records.append((codec.mode_key(subject), None))
        return records, sorted(vs)

    def set_config(self, subject: str | None, level) -> tuple[list[codec.Record], dict]:
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise RegistryError(
                422, 42203,
                "Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive",
            )
        level = level.upper()
        return [(codec.config_key(subject), {"compatibilityLevel": level})], {"compatibility": level}

    def delete_config(self, subject: str | None) -> tuple[list[codec.Record], dict]:
        previous = self.compatibility(subject)
        if subject is not None and subject not in self.configs:
            if subject not in self.versions:
                raise subject_not_found(subject)
            raise RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
        if subject is None and None not in self.configs:
            return [], {"compatibilityLevel": previous}
        return [(codec.config_key(subject), None)], {"compatibilityLevel": previous}

    def set_mode(self, subject: str | None, mode, force: bool = False) -> tuple[list[codec.Record], dict]:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise RegistryError(422, 42204, "Invalid mode. Valid values are READWRITE, READONLY, READONLY_OVERRIDE and IMPORT")
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            has = self.versions.get(subject) if subject is not None else self.versions
            if has:
                raise RegistryError(422, 42205, "Cannot import since found existing subjects")
        return [(codec.mode_key(subject), {"mode": mode})], {"mode": mode}

    def delete_mode(self, subject: str) -> tuple[list[codec.Record], dict]:
        if subject not in self.modes:
            raise RegistryError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")
        return [(codec.mode_key(subject), None)], {"mode": self.modes[subject]}

