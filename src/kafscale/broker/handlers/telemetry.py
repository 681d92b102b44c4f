"""GetTelemetrySubscriptions (71) and PushTelemetry (72), KIP-714, answered with an empty
subscription: clients (librdkafka >= 2.5, Java clients) get a client instance id and no
requested metrics, which tells them to push nothing. KafScale collects no client metrics;
its own metrics are on /metrics. A push that comes anyway (a client's terminating push) is
acknowledged and dropped."""

from __future__ import annotations

import uuid

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, response

SUBSCRIPTION_ID = 0  # the empty subscription never changes
PUSH_INTERVAL_MS = 300_000  # Kafka's default client metrics push interval
TELEMETRY_MAX_BYTES = 1024 * 1024  # Kafka's telemetry.max.bytes default


async def get_telemetry_subscriptions(ctx, req):
    instance = req.client_instance_id
    if instance is None or instance.int == 0:
        instance = uuid.uuid4()  # as Kafka: the broker assigns the id on the first request
    return make(
        response(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ctx.version),
        throttle_time=0,
        error_code=ErrorCode.none,
        client_instance_id=instance,
        subscription_id=SUBSCRIPTION_ID,
        accepted_compression_types=(),
        push_interval=PUSH_INTERVAL_MS,
        telemetry_max_bytes=TELEMETRY_MAX_BYTES,
        delta_temporality=True,
        requested_metrics=(),
    )


async def push_telemetry(ctx, req):
    return make(response(ApiKey.PUSH_TELEMETRY, ctx.version), throttle_time=0, error_code=ErrorCode.none)


def register(router):
    router.register(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, get_telemetry_subscriptions)
    router.register(ApiKey.PUSH_TELEMETRY, push_telemetry)
