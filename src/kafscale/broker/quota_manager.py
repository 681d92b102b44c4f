"""Client quota enforcement (#18), Kafka's ClientQuotaManager on top of the pure decisions
in `quota_sensor.py`.

The quotas come from the metadata store (AlterClientQuotas through any broker), read at
start, after a local change and every `--quota-refresh-ms`. Per request the server asks
`throttle_ms`: Produce records its request bytes against `producer_byte_rate`, Fetch its
response's record bytes against `consumer_byte_rate`, and every request but the ones
Kafka exempts records its handling time against `request_percentage` (a percentage of one
thread: 100 = one second of handling per second). The longest throttle wins; the server
puts it in the response's throttle_time_ms and mutes the connection that long (KIP-219).
A quota that applies to an entity with <default> names is measured per matching user /
client id; a quota for named entities is shared by every connection matching it (Kafka's
semantics).
"""

from __future__ import annotations

import asyncio
import logging
import time

from kafscale.broker.quota_sensor import Rate, quota_entity, throttle_ms
from kafscale.metadata.quotas import CLIENT_ID, USER
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.metadata.refresh import reload_every
from kafscale.protocol.api_keys import ApiKey

log = logging.getLogger("kafscale.quotas")

# Kafka exempts these from request quotas (the client must always be able to learn how to
# talk to the broker, authenticate, and control its session).
REQUEST_QUOTA_EXEMPT = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.API_VERSIONS, ApiKey.SASL_AUTHENTICATE})
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")
MAX_SENSORS = 100_000  # (key, entity) rate sensors kept before the idle ones are dropped


class QuotaManager:
    def __init__(self, metadata, refresh_s: float = 1.0, clock=time.monotonic, window_ms: int = 1000, samples: int = 11):
        self.metadata = metadata
        self.refresh_s = refresh_s
        self.window_ms, self.samples = window_ms, samples  # Kafka's quota.window.size.seconds / quota.window.num
        self.clock = clock
        self.quotas: dict[tuple, dict[str, float]] = {}
        self._sensors: dict[tuple, Rate] = {}
        self._task: asyncio.Task | None = None
        self.throttled = 0  # responses that carried a throttle time (kafscale_quota_throttles_total)

    @property
    def active(self) -> bool:
        return bool(self.quotas)

    async def start(self) -> None:
        try:
            await self.reload()
        except MetadataUnavailable as e:
            log.warning("client quotas not loaded yet: %s", e)
        self._task = asyncio.get_running_loop().create_task(reload_every(self.refresh_s, self.reload, "quota", log), name="quota-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def reload(self) -> None:
        quotas = {tuple(sorted(entity)): values for entity, values in await self.metadata.list_client_quotas()}
        if quotas != self.quotas:
            self.quotas = quotas
            self._sensors.clear()  # new bounds: measure afresh, as Kafka re-creates sensors

    def applies(self, user: str | None, client_id: str | None) -> bool:
        """Whether any quota applies to this client (its connections are then served one
        request at a time, see KafkaConnection.mute)."""
        return any(quota_entity(self.quotas, key, user, client_id) is not None for key in QUOTA_KEYS)

    def throttle_ms(self, api_key: int, user: str | None, client_id: str | None, request_bytes: int, response_bytes: int, handling_ms: float) -> int:
        """Record one request and return how long its client must wait (0: within quota)."""
        if not self.quotas:
            return 0
        now = int(self.clock() * 1000)
        out = 0
        if api_key == ApiKey.PRODUCE:
            out = max(out, self._record("producer_byte_rate", user, client_id, request_bytes, now))
        elif api_key == ApiKey.FETCH:
            out = max(out, self._record("consumer_byte_rate", user, client_id, response_bytes, now))
        if api_key not in REQUEST_QUOTA_EXEMPT:
            # request_percentage P allows P/100 s of handling per second: P * 10 ms/s
            out = max(out, self._record("request_percentage", user, client_id, handling_ms, now, scale=10.0))
        if out:
            self.throttled += 1
        return out

    def _record(self, key: str, user: str | None, client_id: str | None, value: float, now: int, scale: float = 1.0) -> int:
        found = quota_entity(self.quotas, key, user, client_id)
        if found is None:
            return 0
        entity, bound = found
        # <default> names stand for each user / client id: one sensor each
        actual = {USER: user, CLIENT_ID: client_id}
        sensor_key = (key, tuple((kind, name if name is not None else actual.get(kind)) for kind, name in entity))
        rate = self._sensors.get(sensor_key)
        if rate is None:
            if len(self._sensors) >= MAX_SENSORS:
                self._sensors.clear()
            rate = self._sensors[sensor_key] = Rate(self.window_ms, self.samples)
        rate.record(value, now)
        return throttle_ms(rate, bound * scale, now)
