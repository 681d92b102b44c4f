"""HTTP basic auth against one configured USER:PASSWORD, for the broker's HTTP endpoints
(/metrics with --http-basic-auth, the schema registry with --schema-registry-basic-auth)."""

from __future__ import annotations

import base64
import hmac


def basic_auth_ok(header: str, expected: str) -> bool:
    """Whether an Authorization header carries `expected` (USER:PASSWORD); anything goes
    when nothing is expected. Compared in constant time."""
    if not expected:
        return True
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(value.strip(), validate=True)
    except ValueError:
        return False
    return hmac.compare_digest(given, expected.encode())
