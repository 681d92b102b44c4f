"""`kafscale schemas list|get|register|delete|compat|config`: the schema registry's REST
API (`kafscale broker --schema-registry`, docs/schema-registry.md) from the command line.

Talks HTTP (registry/client.py, over the standard library's urllib) to --registry URL,
with --user USER:PASSWORD for basic auth and --ca for a registry served over TLS. Exit
codes as the other admin commands: 0 done, 1 refused (the registry's message and
error_code are printed; `compat` also exits 1 for an incompatible schema), 2 the registry
could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kafscale.cli.common import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, CliError, command_family, print_json, run_command, table
from kafscale.registry.client import RegistryClient, RegistryClientError

DEFAULT_URL = "http://127.0.0.1:8081"


def registry_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("registry and output")
    g.add_argument("--registry", "-r", default=os.environ.get("KAFSCALE_SCHEMA_REGISTRY_URL", DEFAULT_URL),
                   help=f"the registry's URL (env KAFSCALE_SCHEMA_REGISTRY_URL, default {DEFAULT_URL})")
    g.add_argument("--user", default=os.environ.get("KAFSCALE_SCHEMA_REGISTRY_USER_INFO"),
                   help="USER:PASSWORD for HTTP basic auth (env KAFSCALE_SCHEMA_REGISTRY_USER_INFO)")
    g.add_argument("--ca", help="CA certificate file (PEM) to verify an https registry with")
    g.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the registry (default 10)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _client(args) -> RegistryClient:
    return RegistryClient(args.registry, args.user, args.ca, args.timeout)


def call(args, method: str, path: str, body=None, query: dict | None = None):
    """The registry's JSON answer; CliError with its message and error_code otherwise."""
    try:
        return _client(args).call(method, path, body, query)
    except RegistryClientError as e:
        raise CliError(str(e), EXIT_UNREACHABLE if e.unreachable else EXIT_FAILED) from None


def _quote(subject: str) -> str:
    return RegistryClient.quote(subject)


def _read_schema(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None


def _references(items: list[str]) -> list[dict]:
    out = []
    for item in items or ():
        name, sep, rest = item.partition("=")
        subject, sep2, version = rest.rpartition(":")
        if not (sep and sep2 and name and subject and version.isdigit()):
            raise CliError(f"--reference {item!r}: expected NAME=SUBJECT:VERSION")
        out.append({"name": name, "subject": subject, "version": int(version)})
    return out


def _schema_request(args) -> dict:
    body: dict = {"schema": _read_schema(args.file)}
    if args.type.upper() != "AVRO":
        body["schemaType"] = args.type.upper()
    refs = _references(args.reference)
    if refs:
        body["references"] = refs
    return body


def schemas_list(args) -> int:
    latest = call(args, "GET", "/schemas", query={"subjectPrefix": args.prefix, "deleted": str(args.deleted).lower(), "latestOnly": "true"})
    rows = [{"subject": s["subject"], "latest_version": s["version"], "id": s["id"], "type": s.get("schemaType", "AVRO")} for s in latest]
    if args.json:
        print_json(rows)
    else:
        table(["SUBJECT", "LATEST VERSION", "ID", "TYPE"], [[r["subject"], r["latest_version"], r["id"], r["type"]] for r in rows])
    return EXIT_OK


def schemas_get(args) -> int:
    if (args.subject is None) == (args.id is None):
        raise CliError("give a SUBJECT (with --version, default latest) or --id")
    if args.id is not None:
        doc = call(args, "GET", f"/schemas/ids/{args.id}")
        doc = {"id": args.id, **doc, "used_by": call(args, "GET", f"/schemas/ids/{args.id}/versions")}
    else:
        doc = call(args, "GET", f"/subjects/{_quote(args.subject)}/versions/{args.version}", query={"deleted": str(args.deleted).lower()})
        doc["versions"] = call(args, "GET", f"/subjects/{_quote(args.subject)}/versions", query={"deleted": str(args.deleted).lower()})
    if args.json:
        print_json(doc)
        return EXIT_OK
    for key in ("subject", "version", "versions", "id", "schemaType", "references", "used_by"):
        if key in doc:
            print(f"{key}: {json.dumps(doc[key]) if isinstance(doc[key], (list, dict)) else doc[key]}")
    try:
        print(json.dumps(json.loads(doc["schema"]), indent=2))
    except ValueError:
        print(doc["schema"])
    return EXIT_OK


def schemas_register(args) -> int:
    doc = call(args, "POST", f"/subjects/{_quote(args.subject)}/versions", _schema_request(args))
    found = call(args, "POST", f"/subjects/{_quote(args.subject)}", _schema_request(args))
    if args.json:
        print_json({"subject": args.subject, "id": doc["id"], "version": found.get("version")})
    else:
        print(f"registered under {args.subject}: id {doc['id']}, version {found.get('version')}")
    return EXIT_OK


def schemas_delete(args) -> int:
    query = {"permanent": "true" if args.permanent else None}
    if args.version is not None:
        deleted = [call(args, "DELETE", f"/subjects/{_quote(args.subject)}/versions/{args.version}", query=query)]
    else:
        deleted = call(args, "DELETE", f"/subjects/{_quote(args.subject)}", query=query)
    if args.json:
        print_json({"subject": args.subject, "deleted_versions": deleted, "permanent": args.permanent})
    else:
        print(f"{'hard' if args.permanent else 'soft'}-deleted {args.subject} versions {', '.join(map(str, deleted))}")
    return EXIT_OK


def schemas_compat(args) -> int:
    path = f"/compatibility/subjects/{_quote(args.subject)}/versions" + (f"/{args.version}" if args.version else "")
    doc = call(args, "POST", path, _schema_request(args), query={"verbose": "true"})
    if args.json:
        print_json(doc)
    else:
        print("compatible" if doc["is_compatible"] else "incompatible")
        for m in doc.get("messages") or ():
            print(f"  {m}")
    return EXIT_OK if doc["is_compatible"] else EXIT_FAILED


def schemas_config(args) -> int:
    path = "/config" + (f"/{_quote(args.subject)}" if args.subject else "")
    if args.set:
        call(args, "PUT", path, {"compatibility": args.set})
    doc = call(args, "GET", path, query={"defaultToGlobal": "true"})
    if args.json:
        print_json({"subject": args.subject, "compatibility": doc["compatibilityLevel"]})
    else:
        print(f"{args.subject or '(global)'}: {doc['compatibilityLevel']}")
    return EXIT_OK


def add_commands(subparsers) -> None:
    fam = command_family(subparsers, "schemas", "the schema registry (kafscale broker --schema-registry): subjects, versions, compatibility")

    def leaf(name: str, fn, help_text: str) -> argparse.ArgumentParser:
        p = fam.add_parser(name, parents=[registry_options()], help=help_text, description=help_text)
        p.set_defaults(func=run_command(fn))
        return p

    def schema_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", metavar="FILE", help="the schema (e.g. an .avsc file); - reads stdin")
        p.add_argument("--type", default="AVRO", help="schema type (AVRO, the one this registry supports)")
        p.add_argument("--reference", action="append", default=[], metavar="NAME=SUBJECT:VERSION",
                       help="a schema this one uses, by its full name (repeatable)")

    p = leaf("list", schemas_list, "subjects with their latest version and schema id")
    p.add_argument("--prefix", default="", help="only subjects starting with this")
    p.add_argument("--deleted", action="store_true", help="include soft-deleted subjects")
    p = leaf("get", schemas_get, "a subject's version (default latest), or a schema by --id")
    p.add_argument("subject", metavar="SUBJECT", nargs="?")
    p.add_argument("--version", default="latest", help="version number or latest (default)")
    p.add_argument("--id", type=int, help="a schema by its global id instead of a subject")
    p.add_argument("--deleted", action="store_true", help="also soft-deleted versions")
    p = leaf("register", schemas_register, "register a schema under a subject (a new version if it is new and compatible)")
    p.add_argument("subject", metavar="SUBJECT")
    schema_args(p)
    p = leaf("delete", schemas_delete, "soft-delete a subject or one --version; --permanent hard-deletes what was soft-deleted")
    p.add_argument("subject", metavar="SUBJECT")
    p.add_argument("--version", help="one version (number or latest) instead of the whole subject")
    p.add_argument("--permanent", action="store_true", help="hard delete (after a soft delete)")
    p = leaf("compat", schemas_compat, "check a schema against a subject's compatibility level (exit 1 if incompatible)")
    p.add_argument("subject", metavar="SUBJECT")
    schema_args(p)
    p.add_argument("--version", help="check against this version only (default: as a registration would)")
    p = leaf("config", schemas_config, "show or --set the compatibility level, global or of a SUBJECT")
    p.add_argument("subject", metavar="SUBJECT", nargs="?")
    p.add_argument("--set", metavar="LEVEL", help="NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE")
