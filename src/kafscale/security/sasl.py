"""SASL on a connection, without I/O: the session state machine (SaslHandshake v0-1,
SaslAuthenticate v0-2, KIP-368 re-authentication), PLAIN (RFC 4616) token parsing, the
PLAIN users file, and the per-address limiter that makes password guessing slow.

States: a SASL listener's connection starts unauthenticated and may then send only
ApiVersions, SaslHandshake and SaslAuthenticate. SaslHandshake picks a mechanism; v0
means the tokens that follow come as bare length-prefixed frames (Kafka's original
protocol), v1 that they come in SaslAuthenticate requests. A successful exchange sets the
principal and, with a session lifetime, when the session ends; an authenticated client
re-authenticates (KIP-368) with SaslHandshake v1 + SaslAuthenticate on the same
connection, with the same mechanism and as the same principal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kafscale.protocol.api_keys import ApiKey
from kafscale.security.principal import ANONYMOUS

BEFORE_AUTHENTICATION = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
KNOWN_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class SaslError(Exception):
    """Authentication failed; the message is safe to send to the client."""


class IllegalSaslState(Exception):
    """A request the SASL state does not allow here (Kafka closes the connection)."""


def parse_mechanisms(text: str) -> tuple[str, ...]:
    out = tuple(m.strip().upper() for m in (text or "").split(",") if m.strip())
    for m in out:
        if m not in KNOWN_MECHANISMS:
            raise ValueError(f"unsupported SASL mechanism {m!r} in --sasl-mechanisms (supported: {', '.join(KNOWN_MECHANISMS)})")
    return out


def parse_plain(token: bytes) -> tuple[str, str, str]:
    """RFC 4616: [authzid] NUL authcid NUL passwd -> (authzid, user, password)."""
    parts = bytes(token).split(b"\x00")
    if len(parts) != 3:
        raise SaslError("Invalid SASL/PLAIN response: expected 3 tokens")
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise SaslError("Invalid SASL/PLAIN response: not UTF-8") from None
    if not user:
        raise SaslError("Authentication failed: username not specified")
    if not password:
        raise SaslError("Authentication failed: password not specified")
    if authzid and authzid != user:
        raise SaslError("Authentication failed: Client requested an authorization id that is different from username")
    return authzid, user, password


def load_users_file(path: str) -> dict[str, str]:
    """`NAME:PASSWORD` per line (the first ':' splits; '#' starts a comment line)."""
    users: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, password = line.partition(":")
            if not sep or not name.strip():
                raise ValueError(f"{path}:{n}: expected NAME:PASSWORD")
            users[name.strip()] = password
    return users


@dataclass
class SaslSession:
    """One connection's SASL state."""

    enabled: tuple[str, ...]
    mechanism: str | None = None
    raw_tokens: bool = False  # after SaslHandshake v0: bare token frames follow
    exchange: object | None = None  # the mechanism's server state (ScramServer) mid-exchange
    principal: str = ANONYMOUS
    authenticated: bool = False
    expires_at: float | None = None  # monotonic end of the session (KIP-368), None: never
    reauthenticating: bool = False
    failed: bool = False  # the exchange failed: the connection closes after the answer
    reauthentications: int = 0  # successful exchanges so far
    token_expiry: float | None = None  # OAUTHBEARER: the token's exp (UNIX time)

    def handshake(self, mechanism: str, version: int) -> bool:
        """SaslHandshake: False when the mechanism is not enabled (UNSUPPORTED_SASL_MECHANISM).
        Raises IllegalSaslState where Kafka closes the connection."""
        if self.mechanism is not None and not self.authenticated:
            raise IllegalSaslState("SaslHandshake received twice")
        if self.authenticated:
            if version < 1:
                raise IllegalSaslState("re-authentication needs SaslHandshake v1")
            if mechanism != self.mechanism:
                raise IllegalSaslState(f"re-authentication must use the same mechanism ({self.mechanism}, not {mechanism})")
            self.reauthenticating = True
        if mechanism not in self.enabled:
            return False
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        self.exchange = None
        return True

    def expect_authenticate(self) -> None:
        if self.mechanism is None or self.raw_tokens or (self.authenticated and not self.reauthenticating):
            raise IllegalSaslState("SaslAuthenticate received before SaslHandshake" if self.mechanism is None else "unexpected SaslAuthenticate")

    def succeeded(self, principal: str, lifetime_ms: int, now: float | None = None) -> None:
        """Authenticated as `principal`; the session ends after `lifetime_ms` (0: never)."""
        if self.reauthenticating and principal != self.principal:
            raise SaslError(f"Cannot change principals during re-authentication from {self.principal} to {principal}")
        now = time.monotonic() if now is None else now
        self.principal = principal
        self.authenticated = True
        self.reauthenticating = False
        self.raw_tokens = False
        self.exchange = None
        self.expires_at = now + lifetime_ms / 1000 if lifetime_ms > 0 else None

    def expired(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.authenticated and not self.reauthenticating and self.expires_at is not None and now >= self.expires_at

    @property
    def in_exchange(self) -> bool:
        return not self.authenticated or self.reauthenticating


@dataclass
class FailureLimiter:
    """Slows failed authentications down for addresses that failed recently.

    Each failure from an address doubles the least gap between that address's failure
    answers (from `base_s`, up to `max_s`); `slot(address)` says how long a failure's answer
    must wait for its turn, so parallel failing connections from one address are answered
    one at a time. A success forgets the address; so does a quiet period of `forget_s`."""

    base_s: float = 0.1
    max_s: float = 5.0
    forget_s: float = 300.0
    max_addresses: int = 10_000
    _state: dict[str, list[float]] = field(default_factory=dict)  # address -> [failures, next slot, last failure]

    def slot(self, address: str, now: float) -> float:
        st = self._state.get(address)
        if st is None:
            return 0.0
        failures, next_slot, last = st
        if now - last > self.forget_s:
            del self._state[address]
            return 0.0
        start = max(now, next_slot)
        st[1] = start + self._gap(failures)
        return start - now

    def failed(self, address: str, now: float) -> None:
        st = self._state.get(address)
        if st is None:
            if len(self._state) >= self.max_addresses:
                self._state.pop(next(iter(self._state)))
            st = self._state[address] = [0, now, now]
        st[0] += 1
        st[1] = max(st[1], now + self._gap(st[0]))
        st[2] = now

    def succeeded(self, address: str) -> None:
        self._state.pop(address, None)

    def _gap(self, failures: int) -> float:
        return min(self.max_s, self.base_s * (2 ** max(0, failures - 1))) if failures > 0 else 0.0
