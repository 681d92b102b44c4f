"""SASL/OAUTHBEARER (#17): tokens signed by a test key, validated against a JWKS file
(issuer, audience, expiry, the principal claim); confluent-kafka produces and consumes
with a valid token, fails with its authentication error with an expired one, one signed
by another key, or an unsecured one; the client message parser and validator without I/O."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from joserfc import jwt
from joserfc.jwk import RSAKey

from kafscale.security.oauth import JwtSettings, JwtValidator, parse_client_message
from kafscale.security.sasl import SaslError
from tests.support.broker import BrokerProcess, free_port
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
