"""ApiVersions (18): advertise exactly what the router has."""

import re

from kafscale.errors import ErrorCode
from kafscale.protocol.build import make, nested, response

API_VERSIONS = 18
# What Kafka's ApiVersionsRequest.isValid() requires of client_software_name / _version (v3+)
SOFTWARE_NAME_OR_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


async def api_versions(ctx, req):
    cls = response(API_VERSIONS, ctx.version)
    if ctx.version >= 3 and not (
        SOFTWARE_NAME_OR_VERSION.fullmatch(req.client_software_name) and SOFTWARE_NAME_OR_VERSION.fullmatch(req.client_software_version)
    ):
        # Kafka answers INVALID_REQUEST with no API list (KafkaApis.handleApiVersionsRequest)
        return make(cls, error_code=ErrorCode.invalid_request, api_keys=(), throttle_time=0)
    entry = nested(cls, "ApiVersion")
    keys = tuple(
        make(entry, api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(ctx.broker.router.apis.values(), key=lambda a: a.key)
    )
    return make(cls, error_code=ErrorCode.none, api_keys=keys, throttle_time=0)


def register(router):
    router.register(API_VERSIONS, api_versions)
