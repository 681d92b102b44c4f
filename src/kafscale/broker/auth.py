"""SASL authentication for the broker's connections: runs one step of a client's SASL
exchange (PLAIN against --sasl-users-file and the SCRAM credentials in the metadata
store; SCRAM-SHA-256/512 against the metadata store), with the per-address failure
limiter, one log line per failure and the hooks ops/metrics counts with.

The rules are in `kafscale.security` (sasl.py, scram.py); this is the I/O around them.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from typing import TYPE_CHECKING

from kafscale.metadata.kv import MetadataUnavailable
from kafscale.security import scram
from kafscale.security.oauth import CLIENT_ERROR_ACK, INVALID_TOKEN_CHALLENGE, ErrorChallengeSent, InvalidToken, JwtSettings, JwtValidator, parse_client_message
from kafscale.security.principal import user as user_principal
from kafscale.security.sasl import FailureLimiter, SaslError, SaslSession, load_users_file, parse_mechanisms, parse_plain

if TYPE_CHECKING:
    from kafscale.broker.config import BrokerConfig
    from kafscale.metadata.store import MetadataStore

log = logging.getLogger("kafscale.auth")


class Authenticator:
    def __init__(self, config: "BrokerConfig", metadata: "MetadataStore"):
        self.config = config
        self.metadata = metadata
        self.mechanisms = parse_mechanisms(config.sasl_mechanisms)
        self.limiter = FailureLimiter(base_s=config.sasl_failed_authentication_delay_ms / 1000)
        self.hooks: list = []  # hook(mechanism, succeeded: bool), by ops/metrics
        self._users: dict[str, str] = {}
        self.jwt = JwtValidator(JwtSettings(config.oauth_jwks, config.oauth_issuer, config.oauth_audience,
                                            config.oauth_principal_claim, config.oauth_allow_unsecured))
        self._users_seen: tuple | None = None

    def new_session(self) -> SaslSession:
        return SaslSession(self.mechanisms)

    @property
    def session_lifetime_ms(self) -> int:
        return max(0, self.config.connections_max_reauth_ms)

    def _plain_users(self) -> dict[str, str]:
        """The users file, read again when it changed (no restart to add a user)."""
        path = self.config.sasl_users_file
        if not path:
            return {}
        try:
            st = os.stat(path)
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            if seen != self._users_seen:
                self._users = load_users_file(path)
                self._users_seen = seen
        except (OSError, ValueError) as e:
            log.error("cannot read --sasl-users-file, keeping the users read before: %s", e)
        return self._users

    async def step(self, session: SaslSession, token: bytes, peer: str, address: str) -> tuple[bytes, str | None]:
        """One client token -> (reply token, None) or (b"", failure message). The session
        records success (principal, lifetime); the caller closes the connection on failure."""
        mechanism = session.mechanism or "?"
        try:
            if mechanism == "PLAIN":
                reply, user = b"", await self._plain(token)
            elif mechanism == "OAUTHBEARER":
                if isinstance(session.exchange, ErrorChallengeSent):
                    # the client's %x01 after our error challenge (anything else ends it too):
                    # the failure was logged and counted when the token was refused
                    if bytes(token) != CLIENT_ERROR_ACK:
                        log.warning("SASL OAUTHBEARER from %s: expected %%x01 after the error challenge", peer, extra={"peer": peer})
                    session.failed = True
                    message, session.exchange = session.exchange.message, None
                    return await self._refusal(address, message)
                try:
                    reply, user = b"", await self._oauth(session, token)
                except InvalidToken as e:
                    # RFC 7628 / Kafka: the error as a challenge; the exchange fails after the client's %x01
                    self._failed(mechanism, peer, address, e)
                    session.exchange = ErrorChallengeSent()
                    return INVALID_TOKEN_CHALLENGE.encode(), None
            else:
                reply, user = await self._scram(session, token)
            if user is None:
                return reply, None  # mid-exchange (SCRAM server-first)
            lifetime = self.session_lifetime_ms
            token_exp = getattr(session, "token_expiry", None)
            if token_exp is not None and lifetime > 0:
                # KIP-368: an OAUTHBEARER session ends with its token at the latest.
                lifetime = max(1, min(lifetime, int((token_exp - time.time()) * 1000)))
            session.succeeded(user_principal(user), lifetime)
        except (SaslError, scram.ScramError) as e:
            message = str(e) if isinstance(e, SaslError) else (
                f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
                if str(e) == "invalid credentials" else f"Authentication failed: {e}")
            session.failed = True
            self._failed(mechanism, peer, address, e)
            return await self._refusal(address, message)
        except MetadataUnavailable as e:
            session.failed = True
            log.warning("SASL %s authentication from %s: the credential store is unavailable: %s", mechanism, peer, e, extra={"peer": peer})
            return b"", "Authentication failed: the credential store is unavailable, try again"
        self.limiter.succeeded(address)
        for hook in self.hooks:
            hook(mechanism, True)
        log.info("%s authenticated %s with SASL %s%s", peer, session.principal, mechanism,
                 " (re-authentication)" if session.reauthentications else "", extra={"peer": peer})
        session.reauthentications += 1
        return reply, None

    async def _refusal(self, address: str, message: str) -> tuple[bytes, str]:
        """A failed authentication's answer, held back by the address's failure limiter, as
        Kafka delays the answer of a failed authentication (connection.failed.authentication.delay.ms).
        Only failures wait: holding back every attempt from the address locked a correct client
        out behind a failing one on the same host (each of its attempts timed out in the queue)."""
        wait = self.limiter.slot(address, time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)
        return b"", message

    def _failed(self, mechanism: str, peer: str, address: str, reason: Exception) -> None:
        """One failed authentication: slower next attempts from the address, one log line, counted."""
        self.limiter.failed(address, time.monotonic())
        log.warning("SASL %s authentication from %s failed: %s", mechanism, peer, reason, extra={"peer": peer})
        for hook in self.hooks:
            hook(mechanism, False)

    async def _plain(self, token: bytes) -> str:
        _authzid, name, password = parse_plain(token)
        if await self.verify_password(name, password):
            return name
        raise SaslError("Authentication failed: Invalid username or password")

    async def verify_password(self, name: str, password: str) -> bool:
        """A user's password as SASL/PLAIN checks it: the users file, else the user's SCRAM
        credentials (also the schema registry's HTTP basic auth with ACLs on)."""
        known = self._plain_users().get(name)
        if known is not None and hmac.compare_digest(known.encode(), password.encode()):
            return True
        for mech in ("SCRAM-SHA-512", "SCRAM-SHA-256"):  # users made with AlterUserScramCredentials
            doc = await self.metadata.get_scram_credential(name, mech)
            if doc is not None:
                cred = scram.ScramCredential.from_doc(doc)
                return await asyncio.to_thread(scram.check_password, mech, cred, password)
        return False

    async def _oauth(self, session: SaslSession, token: bytes) -> str:
        bearer, _extensions = parse_client_message(token)
        name, exp = await asyncio.to_thread(self.jwt.validate, bearer)
        session.token_expiry = exp
        return name

    async def _scram(self, session: SaslSession, token: bytes) -> tuple[bytes, str | None]:
        server = session.exchange
        if server is None:
            server = scram.ScramServer(session.mechanism)
            name = server.client_first(token)
            doc = await self.metadata.get_scram_credential(name, session.mechanism)
            if doc is None:
                raise SaslError(f"Authentication failed during authentication due to invalid credentials with SASL mechanism {session.mechanism}")
            session.exchange = server
            return server.server_first(scram.ScramCredential.from_doc(doc)), None
        final = server.client_final(token)
        return final, server.user
