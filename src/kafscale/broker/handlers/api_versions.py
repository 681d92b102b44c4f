"""ApiVersions (18): advertise exactly what the router has."""

from kafscale.protocol.build import make, nested, response

API_VERSIONS = 18


async def api_versions(ctx, req):
    cls = response(API_VERSIONS, ctx.version)
    entry = nested(cls, "ApiVersion")
    keys = tuple(
        make(entry, api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(ctx.broker.router.apis.values(), key=lambda a: a.key)
    )
    return make(cls, error_code=0, api_keys=keys, throttle_time=0)


def register(router):
    router.register(API_VERSIONS, api_versions)
