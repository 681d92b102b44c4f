"""SASL/OAUTHBEARER (RFC 7628, KIP-255) on the server: the client's message and JWT
validation against a JWKS (a file, re-read when it changes, or an https URL, cached),
with issuer, audience, expiry and a claim naming the principal. Unsecured tokens
(`alg: none`) are refused unless explicitly allowed. JWT and JWK handling is joserfc's.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from dataclasses import dataclass

from kafscale.security.sasl import SaslError

JWKS_URL_CACHE_S = 300.0
SIGNED_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


def parse_client_message(data: bytes) -> tuple[str, dict[str, str]]:
    """`n,[a=authzid],` 0x01 key=value 0x01 ... 0x01 -> (bearer token, other key/values)."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("Invalid OAUTHBEARER client message: not UTF-8") from None
    gs2, sep, rest = text.partition("\x01")
    if not sep or not gs2.startswith(("n,", "y,")) or not gs2.endswith(","):
        raise SaslError("Invalid OAUTHBEARER client message: bad GS2 header")
    if not rest.endswith("\x01\x01") and rest != "\x01":
        raise SaslError("Invalid OAUTHBEARER client message: not terminated")
    pairs = {}
    for kv in rest.split("\x01"):
        if not kv:
            continue
        key, eq, value = kv.partition("=")
        if not eq:
            raise SaslError("Invalid OAUTHBEARER client message: bad key/value pair")
        pairs[key] = value
    auth = pairs.pop("auth", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise SaslError("Invalid OAUTHBEARER client message: no Bearer token")
    return token.strip(), pairs


class InvalidToken(SaslError):
    """The token is refused (signature, expiry, issuer, audience, claims): answered with
    RFC 7628's error challenge, not at once."""


# RFC 7628 section 3.2.2 and Kafka's OAuthBearerSaslServer: a refused token gets this JSON
# as a server challenge (error code NONE); the client answers with a lone %x01, and only
# then does the exchange fail, with this JSON as SaslAuthenticate's error message.
INVALID_TOKEN_CHALLENGE = '{"status":"invalid_token"}'
CLIENT_ERROR_ACK = b"\x01"


@dataclass(frozen=True)
class ErrorChallengeSent:
    """The session's exchange state after the error challenge: the next client message ends it."""

    message: str = INVALID_TOKEN_CHALLENGE


def _b64json(part: str) -> dict:
    padded = part + "=" * (-len(part) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode()))


@dataclass
class JwtSettings:
    jwks: str = ""  # file path or http(s) URL
    issuer: str = ""
    audience: str = ""
    principal_claim: str = "sub"
    allow_unsecured: bool = False
    clock_skew_s: int = 30


class JwtValidator:
    def __init__(self, settings: JwtSettings):
        self.settings = settings
        self._keys = None
        self._seen = None
        self._fetched_at = 0.0

    def _keyset(self):
        from joserfc.jwk import KeySet

        src = self.settings.jwks
        if not src:
            raise SaslError("Authentication failed: no JWKS configured (--oauth-jwks)")
        if src.startswith(("http://", "https://")):
            if self._keys is None or time.monotonic() - self._fetched_at > JWKS_URL_CACHE_S:
                with urllib.request.urlopen(src, timeout=10) as r:  # noqa: S310 - an operator-given URL
                    self._keys = KeySet.import_key_set(json.loads(r.read()))
                self._fetched_at = time.monotonic()
            return self._keys
        st = os.stat(src)
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen != self._seen:
            with open(src, encoding="utf-8") as f:
                self._keys = KeySet.import_key_set(json.load(f))
            self._seen = seen
        return self._keys

    def validate(self, token: str, now: float | None = None) -> tuple[str, float]:
        """(principal name, expiry as a UNIX time) of a valid token; raises InvalidToken (the
        token is refused) or SaslError (the server cannot check it: the JWKS is unreadable)."""
        now = time.time() if now is None else now
        parts = token.split(".")
        if len(parts) != 3:
            raise InvalidToken("Authentication failed: the token is not a JWS compact serialization")
        try:
            header = _b64json(parts[0])
        except Exception:  # noqa: BLE001
            raise InvalidToken("Authentication failed: unreadable token header") from None
        if str(header.get("alg", "")).lower() == "none":
            if not self.settings.allow_unsecured:
                raise InvalidToken("Authentication failed: unsecured tokens (alg none) are not accepted")
            try:
                claims = _b64json(parts[1])
            except Exception:  # noqa: BLE001
                raise InvalidToken("Authentication failed: unreadable token claims") from None
        else:
            from joserfc import jwt
            from joserfc.errors import JoseError

            try:
                claims = jwt.decode(token, self._keyset(), algorithms=SIGNED_ALGORITHMS).claims
            except JoseError as e:
                raise InvalidToken(f"Authentication failed: invalid token ({e.error or type(e).__name__})") from None
            except (OSError, ValueError) as e:
                raise SaslError(f"Authentication failed: cannot read the JWKS ({e})") from None
        return self._check_claims(claims, now)

    def _check_claims(self, claims: dict, now: float) -> tuple[str, float]:
        s = self.settings
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)):
            raise InvalidToken("Authentication failed: the token has no expiry (exp)")
        if exp + s.clock_skew_s < now:
            raise InvalidToken("Authentication failed: the token expired")
        nbf = claims.get("nbf")
        if isinstance(nbf, (int, float)) and nbf - s.clock_skew_s > now:
            raise InvalidToken("Authentication failed: the token is not valid yet")
        if s.issuer and claims.get("iss") != s.issuer:
            raise InvalidToken("Authentication failed: wrong token issuer")
        if s.audience:
            aud = claims.get("aud")
            auds = aud if isinstance(aud, list) else [aud]
            if s.audience not in auds:
                raise InvalidToken("Authentication failed: wrong token audience")
        name = claims.get(s.principal_claim)
        if not isinstance(name, str) or not name:
            raise InvalidToken(f"Authentication failed: the token has no {s.principal_claim} claim")
        return name, float(exp)
