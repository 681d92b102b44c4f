"""HTTP basic auth for the broker's HTTP endpoints (/metrics with --http-basic-auth, the
schema registry with --schema-registry-basic-auth or, with ACLs on, the broker's users)."""

from __future__ import annotations

import base64
import binascii
import hmac


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic ...` header, None for anything else."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def basic_auth_ok(header: str, expected: str) -> bool:
    """Whether an Authorization header carries `expected` (USER:PASSWORD); anything goes
    when nothing is expected. Compared in constant time."""
    if not expected:
        return True
    given = basic_credentials(header)
    return given is not None and hmac.compare_digest(f"{given[0]}:{given[1]}".encode(), expected.encode())
