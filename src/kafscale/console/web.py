"""The console's HTTP side: an aiohttp application, server-side jinja2 templates, htmx and
uPlot shipped in static/ (no CDN), and the middleware every request goes through (session,
login, CSRF on every POST, read-only mode).

Views are thin: they read the request, call the cluster (blocking, so in a thread) and render.
Every action that changes the cluster is logged on `kafscale.console.audit` with the
console user.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict, deque
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from kafscale.console.auth import COOKIE, Sessions, csrf_ok
from kafscale.console.cluster import QUOTA_DEFAULT, Cluster, ClusterError
from kafscale.console.metrics import MetricsReader
from kafscale.registry.client import RegistryClient, RegistryClientError

log = logging.getLogger("kafscale.console")
audit = logging.getLogger("kafscale.console.audit")

HERE = Path(__file__).parent
PER_PAGE = 50
LAG_HISTORY = 120  # points per group
LAG_GROUPS = 500  # groups whose lag history is kept (least recently viewed dropped)
LAG_FOLLOWED = 20  # groups viewed last whose lag the sampler keeps adding to
PROBLEM_WINDOW_S = 60.0  # failed flushes and store calls stay a problem this long

CLUSTER, METRICS, SESSIONS, STATE, TEMPLATES = (web.AppKey(n, object) for n in ("cluster", "metrics", "sessions", "state", "templates"))
REGISTRY = web.AppKey("registry", object)  # a RegistryClient (--schema-registry) or None


# -- rendering -----------------------------------------------------------------------------


def _ts(ms) -> str:
    if ms is None or ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def show_bytes(b: bytes | None, fmt: str = "auto") -> str:
    """A key or value as the browser shows it: text, pretty JSON or hex."""
    if b is None:
        return "null"
    if fmt == "hex":
        return b.hex(" ")
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return b.hex(" ")
    if fmt in ("auto", "json") and text.lstrip()[:1] in ("{", "["):
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            pass
    return text


def _size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["ts"] = _ts
    env.filters["size"] = _size
    env.filters["show"] = show_bytes
    env.filters["q"] = lambda s: quote(str(s), safe="")
    env.filters["num"] = lambda v: "-" if v is None else f"{v:,}"
    return env


def render(request: web.Request, name: str, status: int = 200, **ctx) -> web.Response:
    app = request.app
    ctx.update(session=request.get("session"), read_only=app[STATE]["read_only"], auth=app[SESSIONS].required, schemas=app[REGISTRY] is not None,
               path=request.path, ok=request.query.get("ok", ""), request_query=request.query)
    html = app[TEMPLATES].get_template(name).render(**ctx)
    return web.Response(text=html, content_type="text/html", status=status)


def fail(request: web.Request, message: str, status: int = 400) -> web.Response:
    return render(request, "error.html", status=status, message=message)


async def run(request: web.Request, fn, *args):
    return await asyncio.to_thread(fn, *args)


def back(location: str, ok: str = "") -> web.HTTPSeeOther:
    """To `location` (which may have a query of its own) with the flash message `ok`."""
    sep = "&" if "?" in location else "?"
    return web.HTTPSeeOther(location + (sep + urlencode({"ok": ok}) if ok else ""))


def act(request: web.Request, what: str) -> None:
    audit.info("user=%s %s", request["session"].user, what)


def _page(request: web.Request) -> int:
    try:
        return max(int(request.query.get("page", "0")), 0)
    except ValueError:
        return 0


# -- middleware ----------------------------------------------------------------------------

OPEN = ("/login", "/static/")


@web.middleware
async def sessions_mw(request: web.Request, handler):
    sessions: Sessions = request.app[SESSIONS]
    sid = request.cookies.get(COOKIE)
    session = sessions.get(sid)
    new_sid = None
    if session is None:
        new_sid, session = sessions.new(None)
    request["session"] = session
    if request.method == "POST":
        form = await request.post()
        token = request.headers.get("X-CSRF-Token") or form.get("csrf_token")
        if not csrf_ok(session, token if isinstance(token, str) else None):
            log.warning("refused %s %s: missing or wrong CSRF token", request.method, request.path)
            resp = fail(request, "This form is out of date (missing or wrong CSRF token): reload the page and try again.", 403)
            return _with_cookie(request, resp, new_sid)
    if sessions.required and session.user is None and not request.path.startswith(OPEN):
        if request.method == "POST":
            resp = fail(request, "Log in first.", 401)
        else:
            resp = web.HTTPSeeOther("/login?" + urlencode({"next": request.path_qs}))
        return _with_cookie(request, resp, new_sid)
    if request.method == "POST" and request.app[STATE]["read_only"] and request.path not in ("/login", "/logout"):
        log.warning("refused %s %s by %s: the console is read-only", request.method, request.path, session.user)
        return _with_cookie(request, fail(request, "The console is read-only (--read-only): nothing can be changed from here.", 403), new_sid)
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        resp = e
    except ClusterError as e:
        resp = fail(request, str(e), 502 if "answer" in str(e) or "metadata" in str(e) else 400)
    return _with_cookie(request, resp, new_sid)


def _with_cookie(request: web.Request, resp, sid: str | None):
    if sid is not None:
        resp.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", secure=request.secure, path="/")
    resp.headers.setdefault("Cache-Control", "no-store")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
    if isinstance(resp, web.HTTPException):
        raise resp
    return resp


# -- login ---------------------------------------------------------------------------------


async def login_page(request: web.Request):
    return render(request, "login.html", next=request.query.get("next", "/"), error="")


async def login(request: web.Request):
    form = await request.post()
    sessions: Sessions = request.app[SESSIONS]
    name, password = form.get("user", ""), form.get("password", "")
    nxt = form.get("next", "/")
    if not str(nxt).startswith("/") or str(nxt).startswith("//"):
        nxt = "/"
    if not sessions.required:
        raise web.HTTPSeeOther(nxt)
    if not await asyncio.to_thread(sessions.login, name, password):
        log.warning("console login failed for %r from %s", name, request.remote)
        return render(request, "login.html", status=401, next=nxt, error="Wrong user name or password.")
    sessions.drop(request.cookies.get(COOKIE))
    sid, session = sessions.new(name)
    request["session"] = session
    audit.info("user=%s logged in from %s", name, request.remote)
    resp = web.HTTPSeeOther(nxt)
    resp.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", secure=request.secure, path="/")
    raise resp


async def logout(request: web.Request):
    request.app[SESSIONS].drop(request.cookies.get(COOKIE))
    audit.info("user=%s logged out", request["session"].user)
    resp = web.HTTPSeeOther("/login" if request.app[SESSIONS].required else "/")
    resp.del_cookie(COOKIE, path="/")
    raise resp


# -- overview and charts -------------------------------------------------------------------


async def overview(request: web.Request):
    state = request.app[STATE]
    cluster: Cluster = request.app[CLUSTER]
    metrics: MetricsReader = request.app[METRICS]
    error = ""
    try:
        # At most METADATA_TTL_S old: the sampler asks for a fresh one every interval.
        ov = await run(request, cluster.overview, False)
        state["known"] = ov["brokers"]
        state["cluster_id"] = ov["cluster_id"]
    except ClusterError as e:
        error = str(e)
        ov = {"cluster_id": state.get("cluster_id"), "controller": None, "brokers": [], "topics": None, "partitions": None, "offline": []}
    listed = {b["id"] for b in ov["brokers"]}
    stats = metrics.by_broker(state.get("known", []))
    brokers = []
    problems = []
    for b in state.get("known", []):
        st = stats.get(b["id"])
        last = st.history[-1][1] if st and st.history else {}
        up = b["id"] in listed and (st is None or st.up is not False)
        ready = st.ready if st is not None else None
        brokers.append({**b, "up": up, "ready": ready if up else False, "metrics": st.url if st else None,
                        "produce_bytes": last.get("produce_bytes"), "fetch_bytes": last.get("fetch_bytes"),
                        "owned": st.gauge("kafscale_partitions_owned") if st and st.up else None,
                        "snapshot_age": st.gauge("kafscale_metadata_snapshot_age_seconds") if st and st.up else None})
        if not up:
            problems.append(f"broker {b['id']} ({b['address']}) is down" + (f": {st.error}" if st and st.error else ""))
        elif ready is False:
            problems.append(f"broker {b['id']} ({b['address']}) is not ready")
        if st and st.up and st.gauge("kafscale_object_store_up") == 0:
            problems.append(f"broker {b['id']}: object store unreachable")
        if st and st.up and st.gauge("kafscale_metadata_store_up") == 0:
            problems.append(f"broker {b['id']}: metadata store unreachable")
        for key, what in (("flush_failures", "flushes"), ("store_failures", "object-store calls")):
            failed = int(st.recent_count(key, PROBLEM_WINDOW_S)) if st else 0
            if failed:
                problems.append(f"broker {b['id']}: {failed} {what} failed in the last {PROBLEM_WINDOW_S:.0f} s")
    if error:
        problems.insert(0, f"no broker answers: {error}")
    if ov["offline"]:
        problems.append(f"{len(ov['offline'])} partitions without an owner: {', '.join(ov['offline'][:10])}")
    return render(request, "overview.html", ov=ov, brokers=brokers, problems=problems, metrics_on=bool(metrics.stats))


async def charts(request: web.Request):
    return web.json_response(request.app[METRICS].series())


# -- topics --------------------------------------------------------------------------------


async def topics(request: web.Request):
    q, page = request.query.get("q", ""), _page(request)
    data = await run(request, request.app[CLUSTER].topics_page, q, page, PER_PAGE)
    return render(request, "topics.html", q=q, page=page, per_page=PER_PAGE, **data)


async def topic_create(request: web.Request):
    form = await request.post()
    name = str(form.get("name", "")).strip()
    try:
        partitions, replication = int(form.get("partitions") or 1), int(form.get("replication") or -1)
    except ValueError:
        return fail(request, "partitions and replication factor are numbers")
    configs = {}
    for line in str(form.get("configs", "")).splitlines():
        if line.strip():
            k, sep, v = line.partition("=")
            if not sep:
                return fail(request, f"config {line!r} is not key=value")
            configs[k.strip()] = v.strip()
    if not name:
        return fail(request, "a topic needs a name")
    act(request, f"create topic {name} partitions={partitions} replication={replication} configs={configs}")
    await run(request, request.app[CLUSTER].create_topic, name, partitions, replication, configs)
    raise back(f"/topics/{quote(name, safe='')}", f"created topic {name}")


def _browse_params(query) -> dict:
    part = query.get("partition", "")
    try:
        limit = int(query.get("limit") or 50)
    except ValueError:
        limit = 50
    return {"partition": int(part) if part.lstrip("-").isdigit() else None, "start": query.get("start") or "latest",
            "value": query.get("value", ""), "limit": limit, "grep": query.get("filter", ""), "format": query.get("format") or "auto"}


async def topic(request: web.Request):
    name = request.match_info["topic"]
    cluster: Cluster = request.app[CLUSTER]
    info = await run(request, cluster.topic, name)
    # Segment counts have no Kafka API (DescribeLogDirs gives bytes only): the owners'
    # /metrics report them, from the segment list every backend shares.
    segments = request.app[METRICS].per_partition("kafscale_partition_segments", name)
    for p in info["partitions"]:
        # A partition with no bytes in the store has no segment (its owner may not have loaded it).
        p["segments"] = 0 if p["size"] == 0 else segments.get(p["partition"])
    params = _browse_params(request.query)
    records, browse_error = [], ""
    try:
        records = (await run(request, cluster.browse, name, params["partition"], params["start"], params["value"], params["limit"], params["grep"],
                             info["offsets"]))["records"]
    except ClusterError as e:
        browse_error = str(e)
    return render(request, "topic.html", t=info, records=records, params=params, browse_error=browse_error)


async def topic_records(request: web.Request):
    name = request.match_info["topic"]
    params = _browse_params(request.query)
    try:
        res = await run(request, request.app[CLUSTER].browse, name, params["partition"], params["start"], params["value"], params["limit"], params["grep"])
        return render(request, "records.html", records=res["records"], params=params, browse_error="")
    except ClusterError as e:
        return render(request, "records.html", records=[], params=params, browse_error=str(e))


async def topic_produce(request: web.Request):
    name = request.match_info["topic"]
    form = await request.post()
    part = str(form.get("partition", "")).strip()
    key = str(form.get("key", ""))
    headers = []
    for line in str(form.get("headers", "")).splitlines():
        if line.strip():
            k, sep, v = line.partition("=")
            if not sep:
                return fail(request, f"header {line!r} is not key=value")
            headers.append((k.strip(), v.strip().encode()))
    act(request, f"produce to {name} partition={part or 'any'} key={key!r} bytes={len(str(form.get('value', '')))}")
    p, off = await run(request, request.app[CLUSTER].produce, name, int(part) if part.isdigit() else None,
                       key.encode() if key else None, str(form.get("value", "")).encode(), headers)
    raise back(f"/topics/{quote(name, safe='')}", f"produced a record to partition {p} at offset {off}")


async def topic_config(request: web.Request):
    name = request.match_info["topic"]
    form = await request.post()
    key, value = str(form.get("key", "")).strip(), str(form.get("value", ""))
    reset = form.get("reset") == "1"
    if not key:
        return fail(request, "which config?")
    act(request, f"set config of topic {name}: {key}={'(default)' if reset else value}")
    await run(request, request.app[CLUSTER].set_config, name, key, None if reset else value)
    raise back(f"/topics/{quote(name, safe='')}", f"{key} {'reset to its default' if reset else 'set to ' + value}")


async def topic_delete(request: web.Request):
    name = request.match_info["topic"]
    form = await request.post()
    if form.get("confirm") != name:
        return fail(request, f"type the topic's name ({name}) to confirm deleting it")
    act(request, f"delete topic {name}")
    await run(request, request.app[CLUSTER].delete_topic, name)
    raise back("/topics", f"deleted topic {name}")


# -- groups --------------------------------------------------------------------------------


async def groups(request: web.Request):
    q, page = request.query.get("q", ""), _page(request)
    data = await run(request, request.app[CLUSTER].groups_page, q, page, PER_PAGE)
    return render(request, "groups.html", q=q, page=page, per_page=PER_PAGE, **data)


def _remember_lag(app: web.Application, group: str, lag: int, touch: bool = True) -> list:
    """Add a point to the group's lag history; `touch`: it was viewed (most recent last)."""
    hist: OrderedDict = app[STATE]["lag"]
    points = hist.pop(group, None) if touch else hist.get(group)
    if points is None:
        if not touch:
            return []  # dropped since: followed no more
        points = deque(maxlen=LAG_HISTORY)
    hist[group] = points
    while len(hist) > LAG_GROUPS:
        hist.popitem(last=False)
    points.append((round(time.time()), lag))
    return list(points)


async def group(request: web.Request, plan=None, reset_topic: str = "", reset_to: str = "", reset_value: str = ""):
    name = request.match_info["group"]
    g = await run(request, request.app[CLUSTER].group, name)
    _remember_lag(request.app, name, g["lag"])
    topics = sorted({r["topic"] for r in g["partitions"]})
    return render(request, "group.html", g=g, topics=topics, plan=plan, reset_topic=reset_topic or (topics[0] if topics else ""),
                  reset_to=reset_to or "earliest", reset_value=reset_value)


async def group_lag(request: web.Request):
    name = request.match_info["group"]
    g = await run(request, request.app[CLUSTER].group, name)
    points = _remember_lag(request.app, name, g["lag"])
    return web.json_response({"t": [p[0] for p in points], "lag": [p[1] for p in points]})


async def group_reset(request: web.Request):
    name = request.match_info["group"]
    form = await request.post()
    topic_name, to, value = str(form.get("topic", "")), str(form.get("to", "")), str(form.get("value", ""))
    cluster: Cluster = request.app[CLUSTER]
    if form.get("execute") != "1":
        plan = await run(request, cluster.reset_plan, name, topic_name, to, value)
        return await group(request, plan=plan, reset_topic=topic_name, reset_to=to, reset_value=value)
    # Apply exactly the plan that was shown.
    plan = []
    for item in str(form.get("plan", "")).split(","):
        p, sep, off = item.partition(":")
        if not sep or not p.isdigit() or not off.isdigit():
            return fail(request, f"not a plan: {form.get('plan')!r}")
        plan.append({"topic": topic_name, "partition": int(p), "new": int(off)})
    act(request, f"reset offsets of group {name} on {topic_name}: " + ", ".join(f"{r['partition']}->{r['new']}" for r in plan))
    await run(request, cluster.reset, name, plan)
    raise back(f"/groups/{quote(name, safe='')}", f"offsets of {name} on {topic_name} reset")


async def group_delete(request: web.Request):
    name = request.match_info["group"]
    act(request, f"delete group {name}")
    await run(request, request.app[CLUSTER].delete_group, name)
    raise back("/groups", f"deleted group {name}")


# -- security ------------------------------------------------------------------------------

ACL_FIELDS = ("resource_type", "name", "pattern", "principal", "host", "operation", "permission")


# -- schemas (the registry's REST API, read only) -------------------------------------------


async def schemas(request: web.Request):
    client = request.app[REGISTRY]
    if client is None:
        return fail(request, "no schema registry: start the console with --schema-registry URL", 404)
    q = request.query.get("q", "")
    try:
        latest = await run(request, client.latest_versions, q)
        level = await run(request, client.compatibility_level)
    except RegistryClientError as e:
        return fail(request, str(e), 502)
    return render(request, "schemas.html", subjects=latest, q=q, level=level, registry_url=client.url)


async def schema_subject(request: web.Request):
    client = request.app[REGISTRY]
    if client is None:
        return fail(request, "no schema registry: start the console with --schema-registry URL", 404)
    subject = request.match_info["subject"]
    try:
        versions = await run(request, client.versions, subject)
        v = await run(request, client.version, subject, request.query.get("version", "latest"))
        level = await run(request, client.compatibility_level, subject)
    except RegistryClientError as e:
        return fail(request, str(e), 404 if e.status == 404 else 502)
    return render(request, "schema.html", subject=subject, versions=versions, v=v, level=level, schema=show_bytes(v["schema"].encode(), "json"))


async def acls(request: web.Request):
    return render(request, "acls.html", acls=await run(request, request.app[CLUSTER].acls))


async def acl_change(request: web.Request):
    form = await request.post()
    a = {k: str(form.get(k, "")).strip() for k in ACL_FIELDS}
    delete = request.path.endswith("/delete")
    act(request, f"{'delete' if delete else 'create'} ACL {a}")
    await run(request, request.app[CLUSTER].delete_acl if delete else request.app[CLUSTER].create_acl, a)
    raise back("/acls", "ACL deleted" if delete else "ACL created")


async def users(request: web.Request):
    return render(request, "users.html", users=await run(request, request.app[CLUSTER].users))


async def user_change(request: web.Request):
    form = await request.post()
    user, mech = str(form.get("user", "")).strip(), str(form.get("mechanism", "SCRAM-SHA-512"))
    if not user:
        return fail(request, "which user?")
    if request.path.endswith("/delete"):
        act(request, f"delete {mech} credentials of {user}")
        await run(request, request.app[CLUSTER].delete_user, user, mech)
        raise back("/users", f"deleted {mech} credentials of {user}")
    password = str(form.get("password", ""))
    if not password:
        return fail(request, "a password is needed")
    act(request, f"set {mech} credentials of {user}")
    await run(request, request.app[CLUSTER].set_user, user, mech, password)
    raise back("/users", f"{mech} credentials of {user} set")


async def transactions(request: web.Request):
    cluster: Cluster = request.app[CLUSTER]
    topic = request.query.get("topic", "").strip()
    open_txns = await run(request, cluster.open_transactions, topic) if topic else []
    return render(request, "transactions.html", txns=await run(request, cluster.transactions), topic=topic, open_txns=open_txns)


async def transaction_abort(request: web.Request):
    form = await request.post()
    topic = str(form.get("topic", ""))
    try:
        partition, producer_id, start = (int(str(form.get(k, ""))) for k in ("partition", "producer_id", "start_offset"))
    except ValueError:
        return fail(request, "partition, producer id and start offset are numbers")
    act(request, f"abort the transaction of producer {producer_id} on {topic}-{partition} from offset {start}")
    await run(request, request.app[CLUSTER].abort_transaction, topic, partition, producer_id, start)
    raise back(f"/transactions?topic={quote(topic, safe='')}", f"aborted the transaction of producer {producer_id} on {topic}-{partition}")


QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate", "connection_creation_rate")
QUOTA_ENTITIES = ("user", "client-id", "ip")


async def quotas(request: web.Request):
    return render(request, "quotas.html", quotas=await run(request, request.app[CLUSTER].quotas), keys=QUOTA_KEYS, default=QUOTA_DEFAULT)


async def quota_change(request: web.Request):
    form = await request.post()
    # An empty field is no part of the entity; <default> is the default of its kind.
    entity = {t: (None if v == QUOTA_DEFAULT else v) for t in QUOTA_ENTITIES if (v := str(form.get(t, "")).strip())}
    key, remove = str(form.get("key", "")), form.get("remove") == "1"
    if not entity:
        return fail(request, "a quota is for a user, a client id, both, or an IP")
    if key not in QUOTA_KEYS:
        return fail(request, f"unknown quota {key!r} ({', '.join(QUOTA_KEYS)})")
    value = None
    if not remove:
        try:
            value = float(str(form.get("value", "")))
        except ValueError:
            return fail(request, f"{key} is a number, not {form.get('value')!r}")
    shown = ", ".join(f"{t}={QUOTA_DEFAULT if n is None else n}" for t, n in entity.items())
    act(request, f"{'remove' if remove else 'set'} quota {key}{'' if remove else '=' + str(value)} of {shown}")
    await run(request, request.app[CLUSTER].set_quota, entity, key, value)
    raise back("/quotas", f"{key} of {shown} removed" if remove else f"{key} of {shown} set to {value:g}")


# -- the application -----------------------------------------------------------------------


async def _sampler(app: web.Application) -> None:
    """Scrape the brokers' metrics every interval, for the charts and broker states."""
    metrics: MetricsReader = app[METRICS]
    cluster: Cluster = app[CLUSTER]
    state = app[STATE]
    while True:
        try:
            ov = await asyncio.to_thread(cluster.overview)
            state["known"], state["cluster_id"] = ov["brokers"], ov["cluster_id"]
        except ClusterError:
            pass  # keep the brokers seen last: they are shown as down
        try:
            await metrics.scrape(state.get("known", []))
        except Exception:  # noqa: BLE001 - a sampler bug must not stop the console
            log.exception("scraping broker metrics failed")
        # The lag charts of the groups viewed last go on while nobody looks at them.
        for name in list(state["lag"])[-LAG_FOLLOWED:]:
            try:
                g = await asyncio.to_thread(cluster.group, name)
                _remember_lag(app, name, g["lag"], touch=False)
            except ClusterError:
                pass  # gone, or no broker answers: the chart just has a gap
        await asyncio.sleep(metrics.interval)


async def _start_sampler(app: web.Application) -> None:
    app[STATE]["sampler"] = asyncio.get_running_loop().create_task(_sampler(app))


async def _stop(app: web.Application) -> None:
    task = app[STATE].get("sampler")
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await app[METRICS].close()
    await asyncio.to_thread(app[CLUSTER].close)


def make_app(cluster: Cluster, metrics: MetricsReader, logins: dict[str, str] | None = None, read_only: bool = False,
             registry: RegistryClient | None = None) -> web.Application:
    app = web.Application(middlewares=[sessions_mw], client_max_size=2 * 1024 * 1024)
    app[CLUSTER], app[METRICS], app[SESSIONS], app[REGISTRY] = cluster, metrics, Sessions(logins), registry
    app[STATE] = {"read_only": read_only, "lag": OrderedDict(), "known": []}
    app[TEMPLATES] = _templates()
    r = app.router
    r.add_get("/", overview)
    r.add_get("/charts.json", charts)
    r.add_get("/login", login_page)
    r.add_post("/login", login)
    r.add_post("/logout", logout)
    r.add_get("/topics", topics)
    r.add_post("/topics", topic_create)
    r.add_get("/topics/{topic}", topic)
    r.add_get("/topics/{topic}/records", topic_records)
    r.add_post("/topics/{topic}/produce", topic_produce)
    r.add_post("/topics/{topic}/config", topic_config)
    r.add_post("/topics/{topic}/delete", topic_delete)
    r.add_get("/groups", groups)
    r.add_get("/groups/{group}", group)
    r.add_get("/groups/{group}/lag.json", group_lag)
    r.add_post("/groups/{group}/reset", group_reset)
    r.add_post("/groups/{group}/delete", group_delete)
    r.add_get("/schemas", schemas)
    r.add_get("/schemas/{subject}", schema_subject)
    r.add_get("/acls", acls)
    r.add_post("/acls", acl_change)
    r.add_post("/acls/delete", acl_change)
    r.add_get("/users", users)
    r.add_post("/users", user_change)
    r.add_post("/users/delete", user_change)
    r.add_get("/quotas", quotas)
    r.add_post("/quotas", quota_change)
    r.add_get("/transactions", transactions)
    r.add_post("/transactions/abort", transaction_abort)
    r.add_static("/static/", HERE / "static")
    app.on_startup.append(_start_sampler)
    app.on_cleanup.append(_stop)
    return app
