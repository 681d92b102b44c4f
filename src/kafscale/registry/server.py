"""Serving the registry: `kafscale broker --schema-registry HOST:PORT` runs it on the
broker's event loop (like the ops endpoint, ops/http.py), over TLS with
--schema-registry-tls and behind HTTP basic auth with --schema-registry-basic-auth.

Wiring (broker/app.py): `self.registry = await start_registry(self)` once the Kafka
listener is up, `await self.registry.stop()` first thing on shutdown.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafscale.registry.rest import RegistryApi
from kafscale.registry.service import RegistryService

if TYPE_CHECKING:
    from aiohttp import web

    from kafscale.broker.router import BrokerServices

log = logging.getLogger("kafscale.registry")

STOP_TIMEOUT_S = 2.0


class RegistryHandle:
    def __init__(self, service: RegistryService, api: RegistryApi, runner: "web.AppRunner"):
        self.service = service
        self.api = api
        self.runner = runner
        self.address: tuple[str, int] | None = None
        self.url = ""

    async def stop(self) -> None:
        await self.api.close()
        await self.runner.cleanup()


async def start_registry(broker: "BrokerServices", service: RegistryService) -> RegistryHandle:
    """Serve `service` (the broker's registry state) on --schema-registry."""
    from aiohttp import web

    config = broker.config
    host, port = config.split_hostport(config.schema_registry)
    api = RegistryApi(service, getattr(config, "schema_registry_basic_auth", ""))
    app = web.Application(middlewares=[api.middleware()], client_max_size=16 << 20)
    app.add_routes(api.routes())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_TIMEOUT_S)
    await runner.setup()
    ssl_context = None
    if getattr(config, "schema_registry_tls", False):
        import dataclasses

        from kafscale.security.tls import server_context

        ssl_context = server_context(dataclasses.replace(config.tls_settings(), client_auth="none", ca="", truststore=""))
    try:
        await web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context).start()
    except OSError as e:
        await runner.cleanup()
        raise OSError(e.errno, f"cannot serve the schema registry on {config.schema_registry}: {e.strerror or e}") from e
    handle = RegistryHandle(service, api, runner)
    bound = runner.addresses[0]
    handle.address = (bound[0], bound[1])
    # Other brokers forward writes here: --schema-registry-advertise, else the bound address
    # (the broker's advertised Kafka host when bound to all interfaces).
    scheme = "https" if ssl_context is not None else "http"
    if getattr(config, "schema_registry_advertise", ""):
        handle.url = f"{scheme}://{config.schema_registry_advertise}"
    else:
        public = handle.address[0] if handle.address[0] not in ("0.0.0.0", "::", "") else broker.cluster.local.host
        handle.url = f"{scheme}://{public}:{handle.address[1]}"
    await service.start(handle.url)
    log.info("schema registry on %s (topic _schemas)", handle.url)
    return handle
