"""Confluent's Schema Registry REST API on aiohttp: its paths, its content type
(application/vnd.schemaregistry.v1+json) and its error bodies
({"error_code": 40401, "message": ...}). Handlers are thin: parse the request, ask the
service (a read on the caught-up state, or a change), answer JSON.

A change arriving at a broker that does not own `_schemas` is forwarded as it came
(method, path, query, body, Authorization) to the owner's registry and its answer passed
back (Confluent forwards to its primary the same way); a forwarded request is never
forwarded again (50003 instead, the client retries).

Who may do what (docs/schema-registry.md, "ACLs"): with --schema-registry-basic-auth one
user; else, with the broker's ACLs on, HTTP basic auth checked against the broker's users
(SASL/PLAIN's users file and SCRAM credentials), User:ANONYMOUS without credentials. With
ACLs on, a subject stands for its topic (TopicNameStrategy: `orders-value` and
`orders-key` for `orders`, any other subject for the topic of its own name): reading it
needs DESCRIBE on the topic, changing it (register, delete, its config or mode) WRITE;
global config and mode changes need ALTER_CONFIGS on the cluster. Lists and lookups by id
show only subjects the principal may DESCRIBE.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from kafscale.registry import types
from kafscale.registry.state import RegistryError, RegistryState, check_references, parse_version, schema_not_found
from kafscale.security.http_basic import basic_auth_ok, basic_credentials

if TYPE_CHECKING:
    from aiohttp import web

    from kafscale.registry.service import RegistryService

log = logging.getLogger("kafscale.registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
FORWARDED_HEADER = "X-KafScale-Registry-Forwarded"
FORWARD_TIMEOUT_S = 30.0
ANONYMOUS = "User:ANONYMOUS"

# (method, route) -> the operation needed on the subject's topic (on the cluster for a
# route without a subject). Routes not listed are open, or filter what they show.
DESCRIBE, WRITE = "DESCRIBE", "WRITE"
ACCESS = {
    ("GET", "/subjects/{subject}/versions"): DESCRIBE,
    ("GET", "/subjects/{subject}/versions/{version}"): DESCRIBE,
    ("GET", "/subjects/{subject}/versions/{version}/schema"): DESCRIBE,
    ("GET", "/subjects/{subject}/versions/{version}/referencedby"): DESCRIBE,
    ("POST", "/subjects/{subject}"): DESCRIBE,
    ("POST", "/compatibility/subjects/{subject}/versions"): DESCRIBE,
    ("POST", "/compatibility/subjects/{subject}/versions/{version}"): DESCRIBE,
    ("GET", "/config/{subject}"): DESCRIBE,
    ("GET", "/mode/{subject}"): DESCRIBE,
    ("POST", "/subjects/{subject}/versions"): WRITE,
    ("DELETE", "/subjects/{subject}"): WRITE,
    ("DELETE", "/subjects/{subject}/versions/{version}"): WRITE,
    ("PUT", "/config/{subject}"): WRITE,
    ("DELETE", "/config/{subject}"): WRITE,
    ("PUT", "/mode/{subject}"): WRITE,
    ("DELETE", "/mode/{subject}"): WRITE,
    ("PUT", "/config"): WRITE,
    ("DELETE", "/config"): WRITE,
    ("PUT", "/mode"): WRITE,
}


def subject_topic(subject: str) -> str:
    """The topic a subject stands for under TopicNameStrategy."""
    for suffix in ("-value", "-key"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return subject


def _flag(request: "web.Request", name: str, default: bool = False) -> bool:
    value = request.query.get(name)
    return default if value is None else value.strip().lower() == "true"


def _json(body, status: int = 200) -> "web.Response":
    from aiohttp import web

    return web.Response(status=status, body=json.dumps(body).encode(), content_type=CONTENT_TYPE)


def _error(e: RegistryError) -> "web.Response":
    return _json({"error_code": e.error_code, "message": e.message}, e.status)


def _schema_id(request: "web.Request") -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise schema_not_found(request.match_info["id"]) from None


async def _body(request: "web.Request") -> dict:
    try:
        doc = await request.json(loads=json.loads)
    except ValueError as e:
        raise RegistryError(400, 400, f"Unrecognized request body: {e}") from None
    if not isinstance(doc, dict):
        raise RegistryError(400, 400, "the request body must be a JSON object")
    return doc


def _schema_of(doc: dict) -> tuple[str, object, tuple]:
    schema_type = doc.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str):
        raise RegistryError(422, 42201, "Invalid schema type")
    if "schema" not in doc:
        raise RegistryError(422, 42201, "Empty schema")
    return schema_type.upper(), doc["schema"], check_references(doc.get("references"))


def _schema_body(v) -> dict:
    doc = v.to_json()
    return {k: doc[k] for k in ("schemaType", "references", "schema") if k in doc}


class RegistryApi:
    def __init__(self, service: "RegistryService", basic_auth: str = ""):
        self.service = service
        self.basic_auth = basic_auth  # USER:PASSWORD every request must carry ('' : open)
        self._session = None  # aiohttp.ClientSession for forwarding, made on first use

    def routes(self) -> list:
        from aiohttp import web

        r = self
        return [
            web.get("/", r.root),
            web.get("/schemas/types", r.schema_types),
            web.get("/schemas", r.schemas),
            web.get("/schemas/ids/{id}", r.schema_by_id),
            web.get("/schemas/ids/{id}/schema", r.raw_schema_by_id),
            web.get("/schemas/ids/{id}/subjects", r.subjects_by_id),
            web.get("/schemas/ids/{id}/versions", r.versions_by_id),
            web.get("/subjects", r.subjects),
            web.post("/subjects/{subject}", r.lookup),
            web.delete("/subjects/{subject}", r.delete_subject),
            web.get("/subjects/{subject}/versions", r.versions),
            web.post("/subjects/{subject}/versions", r.register),
            web.get("/subjects/{subject}/versions/{version}", r.version),
            web.delete("/subjects/{subject}/versions/{version}", r.delete_version),
            web.get("/subjects/{subject}/versions/{version}/schema", r.raw_version),
            web.get("/subjects/{subject}/versions/{version}/referencedby", r.referenced_by),
            web.post("/compatibility/subjects/{subject}/versions", r.compatibility),
            web.post("/compatibility/subjects/{subject}/versions/{version}", r.compatibility),
            web.get("/config", r.get_config),
            web.put("/config", r.put_config),
            web.delete("/config", r.delete_config),
            web.get("/config/{subject}", r.get_config),
            web.put("/config/{subject}", r.put_config),
            web.delete("/config/{subject}", r.delete_config),
            web.get("/mode", r.get_mode),
            web.put("/mode", r.put_mode),
            web.get("/mode/{subject}", r.get_mode),
            web.put("/mode/{subject}", r.put_mode),
            web.delete("/mode/{subject}", r.delete_mode),
            web.get("/contexts", r.contexts),
        ]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- plumbing --------------------------------------------------------------------------

    async def _principal(self, request: "web.Request") -> str | None:
        """Who sent the request; None: credentials given and wrong (or missing where
        --schema-registry-basic-auth requires them)."""
        header = request.headers.get("Authorization", "")
        if self.basic_auth:
            return f"User:{self.basic_auth.partition(':')[0]}" if basic_auth_ok(header, self.basic_auth) else None
        if not self._acls_on() or not header:
            return ANONYMOUS
        given = basic_credentials(header)
        if given is None or not await self.service.broker.auth.verify_password(*given):
            return None
        return f"User:{given[0]}"

    def _acls_on(self) -> bool:
        authorizer = getattr(self.service.broker, "authorizer", None)
        return bool(authorizer is not None and authorizer.enabled)

    def allowed(self, request: "web.Request", operation: str, subject: str | None, log_denial: bool = True) -> bool:
        """Whether the request's principal may `operation` the subject's topic (the
        cluster's configs when subject is None)."""
        if not self._acls_on():
            return True
        from kafscale.security.acl import CLUSTER_NAME, Operation, ResourceType

        if subject is None:
            what = (Operation.ALTER_CONFIGS if operation == WRITE else Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)
        else:
            what = (Operation[operation], ResourceType.TOPIC, subject_topic(subject))
        return self.service.broker.authorizer.authorize(request["principal"], request.remote or "", *what, log_denial=log_denial)

    def visible(self, request: "web.Request", subject: str) -> bool:
        return self.allowed(request, DESCRIBE, subject, log_denial=False)

    def middleware(self):
        from aiohttp import web

        @web.middleware
        async def errors(request, handler):
            try:
                principal = await self._principal(request)
                if principal is None:
                    response = _error(RegistryError(401, 401, "Unauthorized"))
                    response.headers["WWW-Authenticate"] = 'Basic realm="kafscale schema registry"'
                    return response
                request["principal"] = principal
                route = request.match_info.route.resource
                operation = ACCESS.get((request.method, route.canonical)) if route is not None else None
                subject = request.match_info.get("subject")
                if operation is not None and not self.allowed(request, operation, subject):
                    target = f"topic {subject_topic(subject)}" if subject else "the cluster"
                    raise RegistryError(403, 40301, f"{principal} is not allowed to {operation if subject else 'ALTER_CONFIGS'} {target}")
                return await handler(request)
            except RegistryError as e:
                return _error(e)
            except web.HTTPException as e:
                if e.status in (404, 405):  # an unknown path or method: Confluent's JSON body too
                    return _error(RegistryError(e.status, e.status, f"HTTP {e.status} {e.reason}"))
                raise
            except Exception as e:  # noqa: BLE001 - a bug answers 500, the broker keeps serving
                log.error("schema registry request %s %s failed: %s", request.method, request.path, e, exc_info=True)
                return _error(RegistryError(500, 50001, f"Error in the backend: {e}"))

        return errors

    async def _read(self, query):
        return _json(await self.service.read(query))

    async def _write(self, request: "web.Request", change):
        """Run a change here when this broker writes `_schemas`, else forward it."""
        if self.service.is_writer():
            return _json(await change())
        return await self._forward(request)

    async def _forward(self, request: "web.Request") -> "web.Response":
        from aiohttp import ClientError, ClientSession, ClientTimeout, web

        url = None if request.headers.get(FORWARDED_HEADER) else await self.service.writer_url()
        if url is None:
            raise RegistryError(500, 50003, "Error while forwarding the request to the primary: no registry owns _schemas now")
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=FORWARD_TIMEOUT_S))
        headers = {FORWARDED_HEADER: "1", "Content-Type": request.headers.get("Content-Type", CONTENT_TYPE)}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        try:
            async with self._session.request(request.method, url.rstrip("/") + request.path_qs, data=await request.read(),
                                             headers=headers, ssl=False) as resp:
                body = await resp.read()
                return web.Response(status=resp.status, body=body, content_type=CONTENT_TYPE)
        except (ClientError, TimeoutError) as e:
            raise RegistryError(500, 50003, f"Error while forwarding the request to the primary {url}: {e}") from None

    # -- schemas ---------------------------------------------------------------------------

    async def root(self, request):
        return _json({})

    async def schema_types(self, request):
        return _json(list(types.SCHEMA_TYPES))

    async def contexts(self, request):
        return _json(["."])

    async def schemas(self, request):
        prefix = request.query.get("subjectPrefix", "")
        deleted, latest_only = _flag(request, "deleted"), _flag(request, "latestOnly")

        def query(st: RegistryState):
            out = []
            for s in (s for s in st.subjects(deleted=deleted, prefix=prefix) if self.visible(request, s)):
                vs = [v for _, v in sorted(st.versions[s].items()) if deleted or not v.deleted]
                out += [v.to_json() for v in (vs[-1:] if latest_only else vs)]
            return out

        return await self._read(query)

    def _by_id(self, request, st: RegistryState, schema_id: int):
        """The schema with this id, if the principal may DESCRIBE one of its subjects."""
        v = st.by_id(schema_id)
        if not any(self.visible(request, u.subject) for u in st.id_uses(schema_id, deleted=True)):
            raise RegistryError(403, 40301, f"{request['principal']} may not DESCRIBE the topic of any subject of schema {schema_id}")
        return v

    async def schema_by_id(self, request):
        schema_id = _schema_id(request)
        return await self._read(lambda st: _schema_body(self._by_id(request, st, schema_id)))

    async def raw_schema_by_id(self, request):
        from aiohttp import web

        schema_id = _schema_id(request)
        text = await self.service.read(lambda st: self._by_id(request, st, schema_id).schema)
        return web.Response(body=text.encode(), content_type=CONTENT_TYPE)

    async def _id_uses(self, request, render):
        """GET /schemas/ids/{id}/subjects and /versions: the subject-versions holding the id."""
        schema_id, deleted = _schema_id(request), _flag(request, "deleted")

        def query(st: RegistryState):
            uses = [v for v in st.id_uses(schema_id, deleted) if self.visible(request, v.subject)]
            if not uses:
                raise schema_not_found(str(schema_id))
            return render(uses)

        return await self._read(query)

    async def subjects_by_id(self, request):
        return await self._id_uses(request, lambda uses: sorted({v.subject for v in uses}))

    async def versions_by_id(self, request):
        return await self._id_uses(request, lambda uses: [{"subject": v.subject, "version": v.version} for v in uses])

    # -- subjects --------------------------------------------------------------------------

    async def subjects(self, request):
        prefix, deleted = request.query.get("subjectPrefix", ""), _flag(request, "deleted")
        return await self._read(lambda st: [s for s in st.subjects(deleted=deleted, prefix=prefix) if self.visible(request, s)])

    async def versions(self, request):
        subject, deleted = request.match_info["subject"], _flag(request, "deleted")
        return await self._read(lambda st: st.version_numbers(subject, deleted))

    async def version(self, request):
        subject, spec, deleted = request.match_info["subject"], request.match_info["version"], _flag(request, "deleted")
        return await self._read(lambda st: st.get_version(subject, spec, deleted).to_json())

    async def raw_version(self, request):
        from aiohttp import web

        subject, spec, deleted = request.match_info["subject"], request.match_info["version"], _flag(request, "deleted")
        text = await self.service.read(lambda st: st.get_version(subject, spec, deleted).schema)
        return web.Response(body=text.encode(), content_type=CONTENT_TYPE)

    async def referenced_by(self, request):
        subject, spec = request.match_info["subject"], request.match_info["version"]

        def query(st: RegistryState):
            v = st.get_version(subject, spec)
            return st.referenced_by(subject, v.version)

        return await self._read(query)

    async def lookup(self, request):
        subject = request.match_info["subject"]
        doc = await _body(request)
        schema_type, text, refs = _schema_of(doc)
        normalize, deleted = _flag(request, "normalize"), _flag(request, "deleted")

        def query(st: RegistryState):
            st.version_numbers(subject, deleted=True)  # 40401 before the schema is even parsed
            return st.lookup(subject, st.parse(schema_type, text, refs, normalize), refs, deleted).to_json()

        return await self._read(query)

    async def register(self, request):
        subject = request.match_info["subject"]
        doc = await _body(request)
        schema_type, text, refs = _schema_of(doc)
        schema_id = doc.get("id") if isinstance(doc.get("id"), int) and doc.get("id", 0) > 0 else None
        version = doc.get("version") if isinstance(doc.get("version"), int) and doc.get("version", 0) > 0 else None
        normalize = _flag(request, "normalize")
        return await self._write(request, lambda: self.service.register(subject, schema_type, text, refs, normalize, schema_id, version))

    async def delete_subject(self, request):
        subject, permanent = request.match_info["subject"], _flag(request, "permanent")
        return await self._write(request, lambda: self.service.change(lambda st: st.delete_subject(subject, permanent)))

    async def delete_version(self, request):
        subject, spec, permanent = request.match_info["subject"], request.match_info["version"], _flag(request, "permanent")
        parse_version(spec)  # 42202 before anything else
        return await self._write(request, lambda: self.service.change(lambda st: st.delete_version(subject, spec, permanent)))

    async def compatibility(self, request):
        subject, spec = request.match_info["subject"], request.match_info.get("version")
        if spec is not None:
            parse_version(spec)
        doc = await _body(request)
        schema_type, text, refs = _schema_of(doc)
        verbose = _flag(request, "verbose")

        def query(st: RegistryState):
            if spec is not None:
                st.version_numbers(subject)  # 40401 for a subject without live versions
            messages = st.check_compatibility(subject, spec, st.parse(schema_type, text, refs, _flag(request, "normalize")))
            body: dict = {"is_compatible": not messages}
            if verbose:
                body["messages"] = messages
            return body

        return await self._read(query)

    # -- config and mode -------------------------------------------------------------------

    async def _get_setting(self, request, table: str, effective, error_code: int, what: str, field: str):
        """GET /config[/{s}] and /mode[/{s}]: the subject's own setting (40408/40409 when it
        has none, unless defaultToGlobal), or the global one."""
        subject = request.match_info.get("subject")
        default_to_global = _flag(request, "defaultToGlobal")

        def query(st: RegistryState):
            if subject is not None and subject not in getattr(st, table) and not default_to_global:
                raise RegistryError(404, error_code, f"Subject '{subject}' does not have subject-level {what} configured")
            return {field: effective(st, subject)}

        return await self._read(query)

    async def get_config(self, request):
        return await self._get_setting(request, "configs", RegistryState.compatibility, 40408, "compatibility", "compatibilityLevel")

    async def put_config(self, request):
        subject = request.match_info.get("subject")
        doc = await _body(request)
        level = doc.get("compatibility", doc.get("compatibilityLevel"))
        RegistryState().set_config(subject, level)  # 42203 here, before any forwarding
        return await self._write(request, lambda: self.service.change(lambda st: st.set_config(subject, level)))

    async def delete_config(self, request):
        subject = request.match_info.get("subject")
        return await self._write(request, lambda: self.service.change(lambda st: st.delete_config(subject)))

    async def get_mode(self, request):
        return await self._get_setting(request, "modes", RegistryState.mode, 40409, "mode", "mode")

    async def put_mode(self, request):
        subject = request.match_info.get("subject")
        doc = await _body(request)
        mode, force = doc.get("mode"), _flag(request, "force")
        return await self._write(request, lambda: self.service.change(lambda st: st.set_mode(subject, mode, force)))

    async def delete_mode(self, request):
        subject = request.match_info["subject"]
        return await self._write(request, lambda: self.service.change(lambda st: st.delete_mode(subject)))
