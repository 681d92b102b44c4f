"""The broker's operations endpoint: /metrics, /healthz, /readyz on aiohttp's low-level
HTTP server, plus the background sampling behind the metrics that need awaits.

Wiring (broker/app.py): `self.ops = await start_ops(BrokerOpsView(self))` once the Kafka
listener is up, `await self.ops.stop()` first thing on shutdown. The broker is seen through
the read model of read_model.py, never imported.

The server runs on the broker's own event loop, deliberately: collectors read live broker
structures (dicts of partition logs, the connection set) that are only safe to iterate from
the loop that mutates them. A scrape is a few milliseconds of synchronous work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from prometheus_client.exposition import choose_encoder

from kafscale.ops.metrics import BrokerMetrics
from kafscale.ops.read_model import BrokerReadModel
from kafscale.security.http_basic import basic_auth_ok

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("kafscale.ops")

CHECK_TIMEOUT_S = 2.0  # a hung etcd or S3 must not hang the probe (kubelet timeouts are ~1-5 s)
READY_CACHE_S = 1.0  # probes from several kubelets/load balancers share one check per second
REQUEST_TIMEOUT_S = 5.0  # a connection that has not sent a whole request by then is closed
STOP_TIMEOUT_S = 2.0  # a scrape still being answered when the broker stops


class _OneLineErrors(logging.LoggerAdapter):
    """aiohttp logs a malformed HTTP request (an oversized header, say) with its traceback;
    for bad input one warning line is enough. Handler errors never reach it: `_handle`
    catches and logs those itself."""

    def exception(self, msg, *args, exc_info=None, **kwargs):
        detail = " ".join(str(getattr(exc_info, "message", None) or exc_info).split())
        self.logger.warning("bad HTTP request on the ops endpoint (" + msg + "): %s", *args, detail[:200])


class OpsHandle:
    """What start_ops returns: the HTTP server, the samplers, and the metrics registry."""

    def __init__(self, broker: BrokerReadModel, metrics: BrokerMetrics, lag_interval: float, health_interval: float):
        self.broker = broker
        self.metrics = metrics
        self.lag_interval = lag_interval
        self.health_interval = health_interval
        self.address: tuple[str, int] | None = None  # HTTP address actually bound (None: disabled)
        self._runner: "web.ServerRunner | None" = None
        self._tasks: list[asyncio.Task] = []
        self._ready: tuple[bool, str] | None = None
        self._ready_at = 0.0
        self._ready_check: asyncio.Task | None = None
        self._stopping = False
        self._lag_failing = False

    # -- readiness --------------------------------------------------------------------------

    def _listener_up(self) -> bool:
        return self.broker.listener_serving()

    async def _probe(self, what: str, coro) -> str | None:
        """None when the dependency answered, else the reason it is considered down."""
        try:
            await asyncio.wait_for(coro, CHECK_TIMEOUT_S)
            return None
        except TimeoutError:
            return f"{what} did not answer within {CHECK_TIMEOUT_S:g}s"
        except Exception as e:  # noqa: BLE001 - any failure means "not reachable"
            return f"{what} unreachable: {e}"

    async def _check(self) -> tuple[bool, str]:
        md, st = await asyncio.gather(
            self._probe("metadata store", self.broker.check_metadata()),
            self._probe("object store", self.broker.check_object_store()),
        )
        listener = self._listener_up()
        h = self.metrics.health
        h.update(metadata=md is None, object_store=st is None, listener=listener, checked_at=time.time())
        reasons = [r for r in (md, st) if r]
        if not listener:
            reasons.insert(0, "Kafka listener is not accepting connections")
        if self._stopping:
            reasons.insert(0, "broker is shutting down")
        ok = not reasons
        h["ready"] = ok
        return ok, "; ".join(reasons) if reasons else "ready"

    async def readiness(self, max_age: float = READY_CACHE_S) -> tuple[bool, str]:
        """(ready, reason), from a check at most `max_age` seconds old; concurrent callers
        share one check in flight."""
        if self._stopping:
            return False, "broker is shutting down"
        if self._ready is not None and time.monotonic() - self._ready_at < max_age:
            return self._ready
        if self._ready_check is None or self._ready_check.done():
            self._ready_check = asyncio.get_running_loop().create_task(self._run_check())
        return await asyncio.shield(self._ready_check)

    async def _run_check(self) -> tuple[bool, str]:
        result = await self._check()
        if self._ready is None or result[0] != self._ready[0]:
            log.log(logging.INFO if result[0] else logging.WARNING, "readiness: %s", result[1])
        self._ready, self._ready_at = result, time.monotonic()
        return result

    # -- sampling (consumer lag, group states, topic names) ---------------------------------

    def _coordinates(self, group: str) -> bool:
        # Each group's lag is reported by its coordinator only, so a cluster-wide sum in
        # Prometheus does not count a group once per broker.
        try:
            return bool(self.broker.coordinates_group(group))
        except Exception:  # noqa: BLE001
            return True

    async def _high_watermark(self, topic: str, partition: int, cache: dict) -> int | None:
        key = (topic, partition)
        if key in cache:
            return cache[key]
        hw = cache[key] = await self.broker.high_watermark(topic, partition)
        return hw

    async def sample(self) -> None:
        """One round: consumer lag and group states of the groups coordinated here, and
        the live topic names (to forget series of deleted topics)."""
        # Also loads groups persisted before a restart, so their lag counts too.
        group_ids = set(await self.broker.coordinated_group_states())
        group_ids |= set(self.broker.scrape().group_states)
        lag: dict[tuple[str, str, int], tuple[int, int]] = {}
        hws: dict = {}
        for group in sorted(group_ids):
            if not self._coordinates(group):
                continue
            for (topic, partition), committed in (await self.broker.committed_offsets(group)).items():
                if committed < 0:
                    continue
                hw = await self._high_watermark(topic, partition, hws)
                if hw is not None:
                    lag[(group, topic, partition)] = (committed, max(hw - committed, 0))
        topics = await self.broker.live_topics()
        m = self.metrics
        m.lag, m.lag_sampled_at = lag, time.time()
        m.topic_names = dict(topics)
        m.forget_topics(set(topics.values()))

    async def _lag_loop(self) -> None:
        while True:
            try:
                await self.sample()
                if self._lag_failing:
                    log.info("consumer lag sampling works again")
                self._lag_failing = False
            except Exception as e:  # noqa: BLE001 - metadata outage: keep the last sample
                if not self._lag_failing:
                    log.warning("consumer lag sampling failed (keeping the last sample): %s", e)
                self._lag_failing = True
            await asyncio.sleep(self.lag_interval)

    async def _health_loop(self) -> None:
        # Keeps kafscale_*_up fresh between probes; /readyz reuses a result younger than 1 s.
        while True:
            try:
                await self.readiness(max_age=self.health_interval / 2)
            except Exception:  # noqa: BLE001
                log.debug("health check failed", exc_info=True)
            await asyncio.sleep(self.health_interval)

    # -- HTTP -------------------------------------------------------------------------------

    async def _handle(self, request: "web.BaseRequest") -> "web.Response":
        # One handler for every path and method (aiohttp's low-level server, no router): the
        # 404 and 405 answers keep their own bodies and `Allow: GET, HEAD`.
        from aiohttp import web

        try:
            if request.path == "/metrics" and not self._authorized(request.headers.get("Authorization", "")):
                status, headers, body = 401, {"WWW-Authenticate": 'Basic realm="kafscale metrics"'}, b"authentication required\n"
            else:
                status, headers, body = await self._respond(request.method, request.path, request.headers.get("Accept", ""))
        except Exception as e:  # noqa: BLE001 - an HTTP bug must not take the broker down
            log.error("ops HTTP request failed: %s", e, exc_info=True)
            status, headers, body = 500, {}, f"internal error: {e}\n".encode()
        headers.setdefault("Content-Type", "text/plain; charset=utf-8")
        response = web.Response(status=status, body=body, headers=headers)
        response.force_close()  # one request per connection: nothing idles on the ops port
        return response

    def _authorized(self, header: str) -> bool:
        """--http-basic-auth USER:PASSWORD, when set, guards /metrics."""
        return basic_auth_ok(header, self.broker.settings.http_basic_auth)

    async def _respond(self, method: str, path: str, accept: str) -> tuple[int, dict, bytes]:
        """(status, headers, body) for a request; aiohttp drops the body of a HEAD answer."""
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD"}, b"only GET and HEAD\n"
        if path == "/metrics":
            encoder, content_type = choose_encoder(accept)  # OpenMetrics when the scraper asks
            return 200, {"Content-Type": content_type}, encoder(self.metrics.registry)
        if path == "/healthz":
            # Liveness: the event loop answered, which is all a restart would fix.
            return 200, {}, b"ok\n"
        if path == "/readyz":
            ok, reason = await self.readiness()
            return (200 if ok else 503), {}, (reason + "\n").encode()
        if path == "/":
            return 200, {}, b"kafscale broker: /metrics /healthz /readyz\n"
        return 404, {}, b"not found: try /metrics, /healthz or /readyz\n"

    # -- lifecycle --------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop serving and sampling, unhook from the broker. Safe to call twice."""
        self._stopping = True
        if self._ready_check is not None:
            self._tasks.append(self._ready_check)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.metrics.remove_taps()

    async def start(self) -> None:
        """Hook the metrics into the broker, then serve /metrics, /healthz, /readyz where
        the settings say ('' disables the HTTP server and the samplers). Raises OSError,
        with nothing left hooked, when the address cannot be bound."""
        self.metrics.install_taps()
        settings = self.broker.settings
        if settings.http_address is None:
            return
        # Imported here: aiohttp.web costs ~0.2 s of imports, which brokers without --http skip.
        from aiohttp import web

        self._runner = web.ServerRunner(
            web.Server(self._handle, access_log=None, logger=_OneLineErrors(log, {}), keepalive_timeout=REQUEST_TIMEOUT_S),
            shutdown_timeout=STOP_TIMEOUT_S,
        )
        host, port = settings.http_address
        try:
            await self._runner.setup()
            ssl_context = settings.http_ssl_context() if settings.http_ssl_context is not None else None
            await web.TCPSite(self._runner, host, port, reuse_address=True, ssl_context=ssl_context).start()
        except OSError as e:
            await self.stop()
            raise OSError(e.errno, f"cannot serve /metrics on {settings.http} (--http): {e.strerror or e}") from e
        bound = self._runner.addresses[0]
        self.address = (bound[0], bound[1])
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._lag_loop(), name="ops-lag-sampler"),
            loop.create_task(self._health_loop(), name="ops-health"),
        ]
        log.info("ops endpoint on %s://%s:%d (/metrics /healthz /readyz)", "https" if settings.http_ssl_context else "http", *self.address)


async def start_ops(broker: BrokerReadModel, *, lag_interval: float = 15.0, health_interval: float = 10.0) -> OpsHandle:
    """Register the metrics on `broker` (its read model) and serve its ops endpoint."""
    handle = OpsHandle(broker, BrokerMetrics(broker), lag_interval, health_interval)
    await handle.start()
    return handle
