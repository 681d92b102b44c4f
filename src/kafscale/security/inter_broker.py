"""How a broker reaches other brokers (WriteTxnMarkers, KIP-890 verification): the listener
it connects to on them and that listener's security, as Kafka's `inter.broker.listener.name`
and `sasl.mechanism.inter.broker.protocol`.

Every broker of a cluster is assumed to have the same listener names and security protocols
(Kafka assumes it too). TLS towards a peer checks its certificate and host name against
`--inter-broker-ssl-ca` (default `--ssl-ca` / `--ssl-truststore-location`, else the system's CAs)
and presents this broker's certificate (`--ssl-cert` or `--ssl-keystore-location`) for listeners that ask for client certificates. SASL authenticates as
`--inter-broker-sasl-username` with PLAIN or SCRAM; that principal needs CLUSTER_ACTION on the
cluster under `--authorizer acls` (or to be a super user), as Kafka's brokers do.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make
from kafscale.protocol.codec import decode_response, encode_request, schema
from kafscale.security.scram import MECHANISMS as SCRAM_MECHANISMS, ScramClient, ScramError
from kafscale.security.tls import load_identity, load_trust

PASSWORD_ENV = "KAFSCALE_INTER_BROKER_SASL_PASSWORD"


class InterBrokerAuthError(ConnectionError):
    """A peer refused this broker's credentials (or is not who it claims to be)."""


@dataclass(frozen=True)
class InterBrokerSecurity:
    listener: str  # the listener name to connect to on peers
    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = ""

    @classmethod
    def from_config(cls, config) -> "InterBrokerSecurity":
        """From the broker's settings; raises ValueError for settings that cannot work."""
        bound, _adv = config.resolved_listeners()
        wanted = (getattr(config, "inter_broker_listener_name", "") or "").strip().upper()
        if wanted:
            listener = next((l for l in bound if l.name == wanted), None)
            if listener is None:
                raise ValueError(f"--inter-broker-listener-name {wanted} is not one of this broker's listeners ({', '.join(l.name for l in bound)})")
        else:
            listener = next((l for l in bound if l.name == "PLAINTEXT"), bound[0])
        ctx = None
        if listener.tls:
            per_listener = getattr(config, "listener_tls_settings", None)
            tls = per_listener(bound)[listener.name] if per_listener else config.tls_settings()  # its --listener-ssl, else --ssl-*
            ca = getattr(config, "inter_broker_ssl_ca", "")
            if ca or not (tls.ca or tls.truststore):
                ctx = ssl.create_default_context(cafile=ca or None)
            else:  # --ssl-ca / --ssl-truststore-location
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                load_trust(ctx, tls)
            if (tls.cert and tls.key) or tls.keystore:
                load_identity(ctx, tls)  # for listeners requiring client certificates
        mechanism = (getattr(config, "sasl_mechanism_inter_broker_protocol", "") or "PLAIN").upper()
        username = getattr(config, "inter_broker_sasl_username", "") or ""
        password = getattr(config, "inter_broker_sasl_password", "") or os.environ.get(PASSWORD_ENV, "")
        if listener.sasl:
            if mechanism != "PLAIN" and mechanism not in SCRAM_MECHANISMS:
                raise ValueError(f"--sasl-mechanism-inter-broker-protocol must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, not {mechanism}")
            if not username or not password:
                raise ValueError(
                    f"the inter-broker listener {listener.name} is {listener.protocol}: give --inter-broker-sasl-username and "
                    f"its password (--inter-broker-sasl-password or ${PASSWORD_ENV})"
                )
        return cls(listener.name, listener.protocol, ctx, mechanism, username, password)

    async def connect(self, host: str, port: int, timeout: float, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a peer's inter-broker listener, authenticated when it takes SASL."""
        if self.ssl_context is not None:
            coro = asyncio.open_connection(host, port, ssl=self.ssl_context, server_hostname=host)
        else:
            coro = asyncio.open_connection(host, port)
        reader, writer = await asyncio.wait_for(coro, timeout)
        if self.protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            try:
                await asyncio.wait_for(self._authenticate(reader, writer, client_id), timeout)
            except BaseException:
                writer.close()
                raise
        return reader, writer

    async def _authenticate(self, reader, writer, client_id: str) -> None:
        hs = await _call(reader, writer, client_id, ApiKey.SASL_HANDSHAKE, 1, make(schema(ApiKey.SASL_HANDSHAKE, 1, "request"), mechanism=self.mechanism))
        if hs.error_code != ErrorCode.none:
            raise InterBrokerAuthError(f"the peer does not offer SASL {self.mechanism} (it offers {', '.join(hs.mechanisms)})")
        if self.mechanism == "PLAIN":
            await self._step(reader, writer, client_id, f"\0{self.username}\0{self.password}".encode())
            return
        scram = ScramClient(self.mechanism, self.username, self.password)
        server_first = await self._step(reader, writer, client_id, scram.first())
        try:
            server_final = await self._step(reader, writer, client_id, scram.final(server_first))
            scram.verify(server_final)
        except ScramError as e:
            raise InterBrokerAuthError(f"SCRAM with the peer failed: {e}") from None

    async def _step(self, reader, writer, client_id: str, token: bytes) -> bytes:
        resp = await _call(reader, writer, client_id, ApiKey.SASL_AUTHENTICATE, 2, make(schema(ApiKey.SASL_AUTHENTICATE, 2, "request"), auth_bytes=token))
        if resp.error_code != ErrorCode.none:
            raise InterBrokerAuthError(f"the peer refused this broker's credentials ({resp.error_message or resp.error_code})")
        return resp.auth_bytes


async def _call(reader, writer, client_id: str, api_key: int, version: int, body):
    writer.write(encode_request(api_key, version, 0, client_id, body))
    await writer.drain()
    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
    _correlation, resp = decode_response(api_key, version, await reader.readexactly(size))
    return resp
