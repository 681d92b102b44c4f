"""Which APIs the broker implements, at which versions, and who handles them.

ApiVersions is answered from this table, so the broker advertises exactly what is
registered. Each handler module under `handlers/` has a `register(router)` function.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from kafscale.protocol import legacy
from kafscale.protocol.codec import RequestHeader, kio_versions

if TYPE_CHECKING:
    from kafscale.broker.auth import Authenticator
    from kafscale.broker.authz import BrokerAuthorizer
    from kafscale.broker.config import BrokerConfig
    from kafscale.broker.quota_manager import QuotaManager
    from kafscale.cluster.membership import Cluster
    from kafscale.groups.coordinator import GroupCoordinator
    from kafscale.share.manager import SharePartitionManager
    from kafscale.metadata.producer_ids import ProducerIdAllocator
    from kafscale.metadata.store import MetadataStore
    from kafscale.storage.logs import LogManager
    from kafscale.storage.objectstore import ObjectStore
    from kafscale.transactions.coordinator import TransactionCoordinator


class BrokerServices(Protocol):
    """What handlers, the request path and the broker's helpers reach through `ctx.broker`:
    the `Broker` (app.py) has these. Named here, below app.py, so that nothing the broker
    is built from imports it back, not even for type checking."""

    config: "BrokerConfig"
    metadata: "MetadataStore"
    store: "ObjectStore"
    logs: "LogManager"
    cluster: "Cluster"
    producer_ids: "ProducerIdAllocator"
    router: "Router"
    groups: "GroupCoordinator"
    shares: "SharePartitionManager"
    transactions: "TransactionCoordinator | None"
    auth: "Authenticator"
    authorizer: "BrokerAuthorizer"
    quotas: "QuotaManager"
    schema_validator: Any  # registry/validation.py ProduceValidator (the registry is built over the broker)


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request besides its body."""

    broker: BrokerServices
    header: RequestHeader
    peer: str = ""
    # Kafka handles a connection's requests in order. Ours run concurrently, so a handler
    # whose effects must keep that order (Produce: offsets) waits for its predecessor's
    # turn and ends its own; the server chains them per connection.
    turn_before: asyncio.Future | None = None
    turn: asyncio.Future | None = None
    listener: str | None = None  # name of the listener the request came in on
    principal: str = "User:ANONYMOUS"  # who sent it (kafscale.security.principal)
    session: Any = None  # the connection's SaslSession on a SASL listener (handlers/sasl.py)
    # The version on the wire when it is older than kio's (protocol/legacy.py); the header
    # (and `version`) then says the kio version the request was converted to.
    wire_version: int | None = None

    async def wait_turn(self) -> None:
        if self.turn_before is not None:
            await self.turn_before

    def end_turn(self) -> None:
        if self.turn is not None and not self.turn.done():
            self.turn.set_result(None)

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def client_id(self) -> str | None:
        return self.header.client_id

    def log_fields(self, topic: str | None = None, partition: int | None = None) -> dict:
        """`extra=` for log lines: structured (JSON) logs carry these as fields."""
        from kio.schema.index import api_key_map

        out = {"client_id": self.client_id, "api": api_key_map.get(self.header.api_key, self.header.api_key), "peer": self.peer}
        if topic is not None:
            out["topic"] = topic
        if partition is not None:
            out["partition"] = partition
        return out


# A handler takes the context and the decoded kio request; it returns the kio response,
# or None when no response is sent (Produce with acks=0).
Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler
    # decoder(version, payload, body_offset) -> request; None: kio's generated decoder
    decoder: Callable[[int, memoryview, int], Any] | None = None
    # versions below kio's (min_version up to the adapter's kio_version - 1): protocol/legacy.py
    legacy: legacy.Adapter | None = None
    # Kafka handles a connection's requests in order; ours run concurrently. An API whose
    # effects must keep that order (Produce: offsets) waits for its predecessor's turn.
    in_order: bool = False


class Router:
    def __init__(self) -> None:
        self.apis: dict[int, Api] = {}

    def register(self, key: int, handler: Handler, min_version: int | None = None, max_version: int | None = None, decoder=None,
                 in_order: bool = False) -> None:
        key = int(key)  # plain ints: the request path looks them up by the header's number
        kmin, kmax = kio_versions(key)
        lo = kmin if min_version is None else max(kmin, min_version)
        hi = kmax if max_version is None else min(kmax, max_version)
        adapter = legacy.adapter(key)
        if adapter is not None and adapter.kio_version == lo:
            # The versions Kafka 3.9 still accepted below kio's, read through the adapter.
            lo = adapter.lowest if min_version is None else max(adapter.lowest, min_version)
        else:
            adapter = None
        self.apis[key] = Api(key, lo, hi, handler, decoder, adapter, in_order)

    def unregister(self, key: int) -> None:
        self.apis.pop(key, None)

    def get(self, key: int) -> Api | None:
        return self.apis.get(key)


def build_router() -> Router:
    """The broker's full API table: every handler module registers its APIs here."""
    import importlib
    import pkgutil

    from kafscale.broker import handlers

    router = Router()
    for info in sorted(pkgutil.iter_modules(handlers.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{handlers.__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(router)
    return router
