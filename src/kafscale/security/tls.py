"""TLS for the Kafka listeners with Python's `ssl`: a server context from PEM files
(TLS 1.2 or newer, optional client authentication), reloaded when the files change.

Reloading: asyncio binds a listening socket to one SSLContext. The context given to it
(`base`) carries an `sni_callback`, which OpenSSL calls for every ClientHello (with or
without a server name); it moves the connection onto the newest context, so a certificate,
key or CA file replaced on disk is used by the next handshake, without a restart. A
reload that fails (a key that does not match its certificate, a half-written file) keeps
the previous context and is logged; the next check tries again.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger("kafscale.tls")

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """TLS settings that cannot work (the broker refuses to start)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert: str
    key: str
    ca: str = ""
    client_auth: str = "none"
    ciphers: str = ""  # OpenSSL cipher list for TLS 1.2 ("" keeps Python's secure default)

    def check(self) -> None:
        if not self.cert or not self.key:
            raise TlsConfigError("a TLS listener needs --ssl-cert and --ssl-key")
        if self.client_auth not in CLIENT_AUTH:
            raise TlsConfigError(f"--ssl-client-auth must be one of {', '.join(CLIENT_AUTH)}, not {self.client_auth!r}")
        if self.client_auth != "none" and not self.ca:
            raise TlsConfigError(f"--ssl-client-auth {self.client_auth} needs --ssl-ca (the CA that signs client certificates)")
        for what, path in (("--ssl-cert", self.cert), ("--ssl-key", self.key), ("--ssl-ca", self.ca)):
            if path and not os.path.isfile(path):
                raise TlsConfigError(f"{what} {path}: no such file")

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert, self.key, self.ca) if p)


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server-side context: TLS 1.2+, the certificate chain and key, and the CA for
    client certificates when client authentication is on. Raises ssl.SSLError / OSError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if settings.ciphers:
        ctx.set_ciphers(settings.ciphers)
    ctx.load_cert_chain(settings.cert, settings.key)
    if settings.ca:
        ctx.load_verify_locations(cafile=settings.ca)
    ctx.verify_mode = CLIENT_AUTH[settings.client_auth]
    return ctx


def _signature(paths: tuple[str, ...]) -> tuple:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((p, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((p, None))
    return tuple(out)


class ReloadingContext:
    """The context for a TLS listener, swapped for a new one when its files change."""

    def __init__(self, settings: TlsSettings):
        settings.check()
        self.settings = settings
        self.base = server_context(settings)
        self.current = self.base
        self._seen = _signature(settings.files)
        self.reloads = 0
        self.reload_failures = 0
        self.base.sni_callback = self._select

    def _select(self, ssl_object, _server_name, _ctx) -> None:
        current = self.current
        if current is not self.base:
            ssl_object.context = current
        return None

    def check(self) -> bool:
        """Reload if a file changed since the last look; True when a new context is in use."""
        seen = _signature(self.settings.files)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            ctx = server_context(self.settings)
        except (OSError, ssl.SSLError, ValueError) as e:
            self.reload_failures += 1
            log.error("TLS files changed but cannot be loaded, keeping the previous certificate: %s", e)
            return False
        # The swap target must itself carry no callback: the base's callback picks it.
        self.current = ctx
        self.reloads += 1
        log.info("TLS certificate, key and CA reloaded from %s", ", ".join(self.settings.files))
        return True
