"""SASL/OAUTHBEARER (#17): tokens signed by a test key, validated against a JWKS file
(issuer, audience, expiry, the principal claim); confluent-kafka produces and consumes
with a valid token, fails with its authentication error with an expired one, one signed
by another key, or an unsecured one; the client message parser and validator without I/O."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from joserfc import jwt
from joserfc.jwk import RSAKey

from kafscale.security.oauth import JwtSettings, JwtValidator, parse_client_message
from kafscale.security.sasl import SaslError
from tests.support.broker import BrokerProcess, free_port
from tests.support.clients import kcat_roundtrip
from tests.support.wait import wait_until

KEY = RSAKey.generate_key(2048, parameters={"kid": "test-1"})
OTHER = RSAKey.generate_key(2048, parameters={"kid": "test-1"})


def token(sub="alice", exp_in=300, iss="https://issuer.test", aud="kafscale", key=KEY) -> str:
    now = int(time.time())
    return jwt.encode({"alg": "RS256", "kid": "test-1"}, {"sub": sub, "iss": iss, "aud": aud, "iat": now, "exp": now + exp_in}, key)


def unsecured(sub="alice") -> str:
    import base64

    b = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{b({'alg': 'none'})}.{b({'sub': sub, 'exp': int(time.time()) + 300})}."


@pytest.fixture(scope="module")
def jwks(tmp_path_factory):
    path = tmp_path_factory.mktemp("oauth") / "jwks.json"
    path.write_text(json.dumps({"keys": [KEY.as_dict(private=False)]}))
    return str(path)


def test_client_message():
    assert parse_client_message(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01") == ("abc.def.ghi", {})
    assert parse_client_message(b"n,a=alice,\x01host=h\x01auth=Bearer t\x01\x01") == ("t", {"host": "h"})
    for bad in (b"", b"garbage", b"n,,\x01auth=Basic x\x01\x01", b"n,,\x01auth=Bearer t", b"\xff"):
        with pytest.raises(SaslError):
            parse_client_message(bad)


def test_validator(jwks):
    v = JwtValidator(JwtSettings(jwks, "https://issuer.test", "kafscale"))
    assert v.validate(token())[0] == "alice"
    for bad, why in ((token(exp_in=-3600), "expired"), (token(key=OTHER), "invalid token"), (token(iss="x"), "issuer"),
                     (token(aud="other"), "audience"), (unsecured(), "unsecured"), ("a.b", "JWS")):
        with pytest.raises(SaslError, match=why):
            v.validate(bad)
    assert JwtValidator(JwtSettings(jwks, allow_unsecured=True)).validate(unsecured("bob"))[0] == "bob"


@pytest.fixture(scope="module")
def oauth_broker(jwks):
    plain, sasl = free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}", "--sasl-mechanisms", "OAUTHBEARER,PLAIN",
        "--oauth-jwks", jwks, "--oauth-issuer", "https://issuer.test", "--oauth-audience", "kafscale",
        "--group-initial-rebalance-delay-ms", "0"]).start()
    yield b, sasl
    b.stop()


def _conf(sasl: int, make_token) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _cfg: (make_token(), time.time() + 300)}


def test_confluent_kafka_with_a_valid_token(oauth_broker):
    b, sasl = oauth_broker
    conf = _conf(sasl, token)
    p = Producer(conf)
    p.produce("oauth-topic", value=b"hello")
    assert p.flush(20) == 0
    c = Consumer({**conf, "group.id": "oauth-g", "auto.offset.reset": "earliest"})
    c.subscribe(["oauth-topic"])
    got = []
    try:
        wait_until(lambda: (m := c.poll(0.5)) is not None and m.error() is None and got.append(m.value()) is None, 30, "the record")
    finally:
        c.close()
    assert got == [b"hello"]
    assert "authenticated User:alice with SASL OAUTHBEARER" in b.log_text()


@pytest.mark.parametrize("make_token", [lambda: token(exp_in=-3600), lambda: token(key=OTHER), unsecured], ids=["expired", "other-key", "unsecured"])
def test_bad_tokens_fail_with_authentication_error(oauth_broker, make_token):
    _b, sasl = oauth_broker
    errors = []
    p = Producer({**_conf(sasl, make_token), "error_cb": errors.append})
    wait_until(lambda: p.poll(0.2) is not None and any(e.code() == KafkaError._AUTHENTICATION for e in errors), 15, "an authentication error")
    # librdkafka answers the error challenge with %x01 and reports the broker's final message
    assert any('{"status":"invalid_token"}' in e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION), [e.str() for e in errors]


def test_kafka_python_oauthbearer(oauth_broker):
    from kafka import KafkaProducer
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self):
            return token("kp-user")

    _b, sasl = oauth_broker
    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl}", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=Provider())
    p.send("oauth-kp", b"v").get(20)
    p.close()
    assert "authenticated User:kp-user with SASL OAUTHBEARER" in _b.log_text()


def test_aiokafka_oauthbearer(oauth_broker):
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        async def token(self):
            return token("ak-user")

    _b, sasl = oauth_broker

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl}", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                             sasl_oauth_token_provider=Provider())
        await p.start()
        try:
            await p.send_and_wait("oauth-ak", b"v")
        finally:
            await p.stop()

    asyncio.run(run())
    assert "authenticated User:ak-user with SASL OAUTHBEARER" in _b.log_text()


# -- RFC 7628's error challenge ---------------------------------------------------------------

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def _raw_exchange(sasl: int, first: bytes, second: bytes | None = b"\x01"):
    from tests.support import raw

    with raw.RawClient(f"127.0.0.1:{sasl}") as c:
        assert c.request(SASL_HANDSHAKE, 1, raw.req(SASL_HANDSHAKE, 1, mechanism="OAUTHBEARER")).error_code == 0
        r1 = c.request(SASL_AUTHENTICATE, 2, raw.req(SASL_AUTHENTICATE, 2, auth_bytes=first))
        r2 = c.request(SASL_AUTHENTICATE, 2, raw.req(SASL_AUTHENTICATE, 2, auth_bytes=second)) if second is not None and r1.error_code == 0 else None
        return r1, r2, c.wait_closed(5)


def test_bad_token_gets_the_json_error_challenge_then_fails(oauth_broker):
    """Kafka's OAuthBearerSaslServer: a refused token is answered with {"status":"invalid_token"}
    as a challenge (no error); the client's %x01 then gets SASL_AUTHENTICATION_FAILED with that
    JSON as the message, and the connection closes. The reason is only in the broker's log."""
    from kafscale.errors import ErrorCode

    b, sasl = oauth_broker
    before = b.log_text().count("SASL OAUTHBEARER authentication from")
    first, second, closed = _raw_exchange(sasl, f"n,,\x01auth=Bearer {token(exp_in=-3600)}\x01\x01".encode())
    assert (first.error_code, bytes(first.auth_bytes), first.session_lifetime.total_seconds()) == (ErrorCode.none, b"{\"status\":\"invalid_token\"}", 0)
    assert (second.error_code, second.error_message) == (ErrorCode.sasl_authentication_failed, '{"status":"invalid_token"}')
    assert closed
    wait_until(lambda: b.log_text().count("SASL OAUTHBEARER authentication from") == before + 1, 10, "one log line")
    assert "failed: Authentication failed: the token expired" in b.log_text()
    # something else than %x01 after the challenge ends the exchange the same way, with a line saying so
    _first, second, closed = _raw_exchange(sasl, f"n,,\x01auth=Bearer {token(key=OTHER)}\x01\x01".encode(), b"n,,\x01auth=Bearer again\x01\x01")
    assert second.error_code == ErrorCode.sasl_authentication_failed and closed
    wait_until(lambda: "expected %x01 after the error challenge" in b.log_text(), 10, "the line about the client's answer")
    # a malformed client message is no token to refuse: it fails at once, as Kafka's
    first, second, closed = _raw_exchange(sasl, b"garbage")
    assert first.error_code == ErrorCode.sasl_authentication_failed and second is None and closed
    # a valid token on a new connection is unaffected
    first, _second, _closed = _raw_exchange(sasl, f"n,,\x01auth=Bearer {token()}\x01\x01".encode(), None)
    assert (first.error_code, bytes(first.auth_bytes)) == (ErrorCode.none, b"")


def test_kafka_python_and_aiokafka_with_a_bad_token(oauth_broker, caplog):
    """kafka-python answers the challenge with %x01 and gets SaslAuthenticationFailedError
    with the JSON; aiokafka (0.12) takes the challenge for success and sends its next
    request, which closes the connection (as Kafka's broker does): a connection error."""
    import asyncio
    import logging

    from aiokafka import AIOKafkaProducer
    from aiokafka.abc import AbstractTokenProvider as AioProvider
    from aiokafka.errors import KafkaConnectionError
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Expired(AbstractTokenProvider):
        def token(self):
            return token(exp_in=-3600)

    b, sasl = oauth_broker
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KPError):
        KafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl}", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_provider=Expired(), bootstrap_timeout_ms=2000)
    assert any("SaslAuthenticationFailedError" in r.getMessage() and '{"status":"invalid_token"}' in r.getMessage() for r in caplog.records)

    class AioExpired(AioProvider):
        async def token(self):
            return token(exp_in=-3600)

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{sasl}", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                             sasl_oauth_token_provider=AioExpired())
        try:
            with pytest.raises(KafkaConnectionError):
                await p.start()
        finally:
            await p.stop()

    asyncio.run(run())
    wait_until(lambda: "before SASL authentication on listener SASL_PLAINTEXT" in b.log_text(), 10, "the broker closing aiokafka's connection")


# -- tokens from an OAuth token endpoint (librdkafka's sasl.oauthbearer.method=oidc) ---------


@pytest.fixture(scope="module")
def token_endpoint():
    """A client-credentials token endpoint: POST with HTTP basic auth (client id and secret)
    -> {"access_token": a JWT signed by KEY for sub=<client id>}; client "forged" gets one
    signed by another key."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    issued = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            client, _, secret = base64.b64decode(self.headers.get("Authorization", "Basic ").split(" ", 1)[1]).decode().partition(":")
            if secret != f"{client}-secret":
                self.send_response(401)
                self.end_headers()
                return
            issued.append(client)
            body = json.dumps({"access_token": token(sub=client, key=OTHER if client == "forged" else KEY),
                               "token_type": "bearer", "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token", issued
    server.shutdown()


def _kcat_unsecured(sasl: int, principal: str) -> list[str]:
    # Debian's kcat (librdkafka 2.0.2) is built without OIDC: librdkafka's own unsecured JWT
    return ["-b", f"127.0.0.1:{sasl}", "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=OAUTHBEARER",
            "-X", "enable.sasl.oauthbearer.unsecure.jwt=true", "-X", f"sasl.oauthbearer.config=principal={principal}"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make test installs it)")
def test_kcat_oauthbearer(oauth_broker, jwks):
    b, sasl = oauth_broker
    # the broker refuses unsecured tokens: kcat answers the error challenge and reports the broker's answer
    bad = subprocess.run(["kcat", "-L", *_kcat_unsecured(sasl, "kcat-user"), "-m", "5"], capture_output=True, timeout=30)
    assert bad.returncode != 0 and b'{"status":"invalid_token"}' in bad.stderr, bad.stderr[-500:]
    wait_until(lambda: "unsecured tokens (alg none) are not accepted" in b.log_text(), 10, "the refusal logged")
    # a broker that allows them (tests only): produce and consume
    plain, port = free_port(), free_port()
    dev = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{port}", "--sasl-mechanisms", "OAUTHBEARER",
        "--oauth-jwks", jwks, "--oauth-allow-unsecured", "true"]).start()
    try:
        assert kcat_roundtrip(_kcat_unsecured(port, "kcat-user"), "oauth-kcat") == [b"one", b"two"]
        assert "authenticated User:kcat-user with SASL OAUTHBEARER" in dev.log_text()
    finally:
        dev.stop()


def test_confluent_kafka_with_tokens_from_a_token_endpoint(oauth_broker, token_endpoint):
    b, sasl = oauth_broker
    url, issued = token_endpoint
    conf = {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "ck-svc", "sasl.oauthbearer.client.secret": "ck-svc-secret",
            "sasl.oauthbearer.token.endpoint.url": url}
    p = Producer(conf)
    p.produce("oauth-oidc", value=b"v")
    assert p.flush(20) == 0
    assert "ck-svc" in issued and "authenticated User:ck-svc with SASL OAUTHBEARER" in b.log_text()
    # a token the broker's keys did not sign: the error challenge, then librdkafka's authentication error
    errors = []
    p2 = Producer({**conf, "sasl.oauthbearer.client.id": "forged", "sasl.oauthbearer.client.secret": "forged-secret", "error_cb": errors.append})
    wait_until(lambda: p2.poll(0.2) is not None and any('{"status":"invalid_token"}' in e.str() for e in errors), 15, "the invalid_token error")
