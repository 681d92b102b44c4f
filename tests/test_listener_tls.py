"""Per-listener TLS settings (#17), Kafka's listener.name.<name>.ssl.*: `--listener-ssl
NAME:key=value,...`. The parsing and inheritance from --ssl-* without a broker; then one
broker with an internal mTLS listener (its own certificate, an encrypted key whose password
comes from KAFSCALE_LISTENER_INTERNAL_SSL_KEY_PASSWORD, its own CA, client-auth required)
and a public TLS listener (the --ssl-* certificate of another CA, no client certificates):
confluent-kafka, kafka-python, aiokafka and kcat on each; each listener refuses what the
other accepts; a certificate replaced on one listener is served there without restart,
the other keeps its own."""

from __future__ import annotations

import asyncio
import os
import shutil
import urllib.request

import pytest
from confluent_kafka import KafkaError, Producer

from kafscale.broker.config import BrokerConfig
from kafscale.security import certs
from kafscale.security.tls import TlsConfigError, TlsSettings, listener_settings, parse_listener_ssl, password_env
from tests.support.broker import BrokerProcess, free_port
from tests.support.clients import confluent_roundtrip, kcat_roundtrip
from tests.support.wait import wait_until
from tests.test_tls_stores import handshake, write_encrypted_key

KEY_PW = "internal-key-pw"


def test_parse_listener_ssl_both_spellings_and_repeats():
    got = parse_listener_ssl("internal:cert=/a.pem,key=/a.key;INTERNAL:ssl.client.auth=required,ssl.truststore.location=/ca.p12; EXTERNAL:cipher-suites=ECDHE-RSA-AES128-GCM-SHA256")
    assert got == {"INTERNAL": {"cert": "/a.pem", "key": "/a.key", "client-auth": "required", "truststore-location": "/ca.p12"},
                   "EXTERNAL": {"cipher-suites": "ECDHE-RSA-AES128-GCM-SHA256"}}
    # the principal mapping rules, a comma-separated list themselves, come last
    got = parse_listener_ssl("INTERNAL:client-auth=required,principal-mapping-rules=RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT")
    assert got == {"INTERNAL": {"client-auth": "required", "principal-mapping-rules": "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT"}}
    for bad in ("INTERNAL", "INTERNAL:", "INTERNAL:colour=blue", ":cert=x", "INTERNAL:cert", "INTERNAL:DEFAULT"):
        with pytest.raises(TlsConfigError):
            parse_listener_ssl(bad)


def test_listener_settings_inherit_by_group():
    base = TlsSettings("/g.pem", "/g.key", "/gca.pem", "requested", "HIGH", key_password="gpw")
    # identity set: none of the global identity (not its key, not its password); trust and the rest inherited
    s = listener_settings(base, {"keystore-location": "/l.p12"}, "INTERNAL", {password_env("INTERNAL", "keystore-password"): "lpw"})
    assert (s.cert, s.key, s.key_password, s.keystore, s.keystore_password) == ("", "", "", "/l.p12", "lpw")
    assert (s.ca, s.client_auth, s.ciphers) == ("/gca.pem", "requested", "HIGH")
    # trust and client auth set, identity inherited
    s = listener_settings(base, {"truststore-location": "/t.p12", "client-auth": "REQUIRED"}, "X", {})
    assert (s.cert, s.key, s.key_password, s.ca, s.truststore, s.client_auth) == ("/g.pem", "/g.key", "gpw", "", "/t.p12", "required")
    # a password alone goes with the inherited files
    s = listener_settings(base, {}, "X", {password_env("X", "key-password"): "other"})
    assert (s.cert, s.key_password) == ("/g.pem", "other")
    assert password_env("internal-1", "truststore-password") == "KAFSCALE_LISTENER_INTERNAL_1_SSL_TRUSTSTORE_PASSWORD"
    assert "other" not in repr(s)


def test_listener_ssl_must_name_a_tls_listener(tmp_path):
    paths = certs.write_self_signed(str(tmp_path))
    cfg = BrokerConfig(listeners="PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:2", ssl_cert=paths["cert"], ssl_key=paths["key"],
                       listener_ssl="PLAINTEXT:client-auth=required")
    with pytest.raises(ValueError, match="PLAINTEXT, which is not a TLS listener"):
        cfg.check_security()
    cfg = BrokerConfig(listeners="SSL://127.0.0.1:2", ssl_cert=paths["cert"], ssl_key=paths["key"], listener_ssl="SSL:client-auth=required")
    with pytest.raises(ValueError, match="--listener-ssl SSL:client-auth required needs --listener-ssl SSL:ca"):
        cfg.check_security()


# -- one broker, two TLS listeners ------------------------------------------------------------


@pytest.fixture(scope="module")
def two_listeners(tmp_path_factory):
    d = tmp_path_factory.mktemp("listener-tls")
    public = certs.write_self_signed(str(d / "public"))  # the public listener's CA and certificate
    internal_ca = certs.make_ca("internal CA")
    p = {k: str(d / n) for k, n in (("int_ca", "internal-ca.pem"), ("int_cert", "internal.pem"), ("int_key", "internal.key"),
                                   ("svc_cert", "svc.pem"), ("svc_key", "svc.key"))}
    internal_ca.write(p["int_ca"])
    server = certs.issue(internal_ca, "localhost", hosts=("localhost", "127.0.0.1"))
    server.write(p["int_cert"])
    write_encrypted_key(server, p["int_key"], KEY_PW)
    certs.issue(internal_ca, "svc", client=True).write(p["svc_cert"], p["svc_key"])
    p.update(pub_ca=public["ca"], pub_cert=public["cert"], pub_key=public["key"], _int_ca=internal_ca, dir=str(d))
    plain, internal, external, http = free_port(), free_port(), free_port(), free_port()
    p["http"] = http
    b = BrokerProcess(port=plain, extra_args=["--http", f"127.0.0.1:{http}",
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}",
        "--listener-security-protocol-map", "INTERNAL:SSL,EXTERNAL:SSL",
        "--ssl-cert", p["pub_cert"], "--ssl-key", p["pub_key"], "--ssl-client-auth", "none",
        "--listener-ssl", f"INTERNAL:cert={p['int_cert']},key={p['int_key']}",
        "--listener-ssl", f"INTERNAL:ssl.truststore.location={p['int_ca']},ssl.client.auth=required",
        "--ssl-reload-interval-ms", "200", "--group-initial-rebalance-delay-ms", "0",
    ], env={password_env("INTERNAL", "key-password"): KEY_PW}).start()  # fmt: skip
    yield b, internal, external, p
    b.stop()


def _internal(port: int, p: dict, client: bool = True) -> dict:
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL", "ssl.ca.location": p["int_ca"]}
    if client:
        conf.update({"ssl.certificate.location": p["svc_cert"], "ssl.key.location": p["svc_key"]})
    return conf


def _external(port: int, p: dict) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL", "ssl.ca.location": p["pub_ca"]}


def _fails(conf: dict) -> bool:
    errors = []
    prod = Producer({**conf, "error_cb": errors.append})
    bad = (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION, KafkaError._ALL_BROKERS_DOWN)
    wait_until(lambda: prod.poll(0.2) is not None and any(e.code() in bad for e in errors), 15, "the client's TLS error")
    return True


def test_each_listener_its_own_certificate_ca_and_client_auth(two_listeners):
    b, internal, external, p = two_listeners
    assert confluent_roundtrip(_internal(internal, p), "lt-internal") == [b"lt-internal-0", b"lt-internal-1", b"lt-internal-2"]
    assert confluent_roundtrip(_external(external, p), "lt-external") == [b"lt-external-0", b"lt-external-1", b"lt-external-2"]
    # the internal listener wants a client certificate of its CA; the public one has another certificate
    assert not handshake(internal, p["int_ca"])
    assert handshake(internal, p["int_ca"], (p["svc_cert"], p["svc_key"]))
    assert not handshake(external, p["int_ca"])
    assert handshake(external, p["pub_ca"])
    assert _fails(_internal(internal, p, client=False))
    assert _fails({**_external(external, p), "ssl.ca.location": p["int_ca"]})
    wait_until(lambda: "TLS handshake with" in b.log_text() and "listener INTERNAL failed" in b.log_text(), 10, "the refused handshake logged")
    assert KEY_PW not in b.log_text()


def test_kafka_python_internal_aiokafka_external(two_listeners):
    from aiokafka import AIOKafkaConsumer
    from aiokafka.helpers import create_ssl_context
    from kafka import KafkaProducer

    _b, internal, external, p = two_listeners
    kp = KafkaProducer(bootstrap_servers=f"127.0.0.1:{internal}", security_protocol="SSL", ssl_cafile=p["int_ca"],
                       ssl_certfile=p["svc_cert"], ssl_keyfile=p["svc_key"])
    for i in range(2):
        kp.send("lt-cross", f"kp-{i}".encode()).get(20)
    kp.close()

    async def read_external() -> list[bytes]:
        c = AIOKafkaConsumer("lt-cross", bootstrap_servers=f"127.0.0.1:{external}", security_protocol="SSL",
                             ssl_context=create_ssl_context(cafile=p["pub_ca"]), auto_offset_reset="earliest")
        await c.start()
        try:
            out: list[bytes] = []
            while len(out) < 2:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 20)
                out += [m.value for msgs in batch.values() for m in msgs]
            return out
        finally:
            await c.stop()

    assert asyncio.run(read_external()) == [b"kp-0", b"kp-1"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make test installs it)")
def test_kcat_on_both(two_listeners):
    _b, internal, external, p = two_listeners
    mtls = ["-b", f"127.0.0.1:{internal}", "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={p['int_ca']}",
            "-X", f"ssl.certificate.location={p['svc_cert']}", "-X", f"ssl.key.location={p['svc_key']}"]
    public = ["-b", f"127.0.0.1:{external}", "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={p['pub_ca']}"]
    assert kcat_roundtrip(mtls, "lt-kcat", public) == [b"one", b"two"]


def test_one_listeners_certificate_reloads_alone(two_listeners):
    b, internal, external, p = two_listeners
    client = (p["svc_cert"], p["svc_key"])
    saved = {k: open(p[k], "rb").read() for k in ("int_cert", "int_key")}
    rotated_ca = os.path.join(p["dir"], "rotated-ca.pem")
    ca2 = certs.make_ca("rotated server CA")
    ca2.write(rotated_ca)
    try:
        server = certs.issue(ca2, "localhost", hosts=("localhost", "127.0.0.1"))
        write_encrypted_key(server, p["int_key"] + ".new", KEY_PW)
        os.replace(p["int_key"] + ".new", p["int_key"])
        server.write(p["int_cert"])
        wait_until(lambda: handshake(internal, rotated_ca, client), 10, "the internal listener's new certificate")
        assert not handshake(internal, p["int_ca"], client)
        assert handshake(external, p["pub_ca"])  # the public listener keeps its own
        assert not handshake(external, rotated_ca)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{p['http']}/metrics", timeout=5).read().decode()
        reloads = [ln for ln in metrics.splitlines() if ln.startswith("kafscale_tls_reloads_total ")]
        assert reloads and float(reloads[0].split()[1]) >= 1, reloads
    finally:
        for k, data in saved.items():
            with open(p[k] + ".tmp", "wb") as f:
                f.write(data)
            os.replace(p[k] + ".tmp", p[k])
        wait_until(lambda: handshake(internal, p["int_ca"], client), 10, "the internal certificate back")


def test_describe_configs_shows_listener_settings_as_kafka_names_them(two_listeners):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    b, _internal, _external, p = two_listeners
    res = ConfigResource(ResourceType.BROKER, "0")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # must outlive the future
    got = admin.describe_configs([res])[res].result(15)
    assert got["listener.name.internal.ssl.client.auth"].value == "required"
    assert got["listener.name.internal.ssl.truststore.location"].value == p["int_ca"]
    key_pw = got["listener.name.internal.ssl.key.password"]  # from KAFSCALE_LISTENER_INTERNAL_SSL_KEY_PASSWORD
    assert key_pw.is_sensitive and key_pw.value is None
    assert not any(n.startswith("listener.name.external.") for n in got)  # EXTERNAL takes the --ssl-* settings
    assert got["ssl.client.auth"].value == "none"


def test_principal_mapping_rules_per_listener(tmp_path):
    """Two mTLS listeners with the same certificates: on MAPPED the rule makes CN=svc the
    principal User:svc, whom an ACL lets write; on PLAIN_DN (the --ssl-* DEFAULT rule) the
    same client is User:CN=svc and is refused."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType

    paths = certs.write_self_signed(str(tmp_path), clients=("svc",))
    plain, mapped, dn = free_port(), free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},MAPPED://127.0.0.1:{mapped},PLAIN_DN://127.0.0.1:{dn}",
        "--listener-security-protocol-map", "MAPPED:SSL,PLAIN_DN:SSL",
        "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--ssl-ca", paths["ca"], "--ssl-client-auth", "required",
        "--listener-ssl", "MAPPED:principal-mapping-rules=RULE:^CN=([a-z]+)$/$1/L,DEFAULT",
        "--authorizer", "acls", "--super-users", "User:ANONYMOUS"]).start()  # fmt: skip
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        binding = AclBinding(ResourceType.TOPIC, "lt-mapped", ResourcePatternType.LITERAL, "User:svc", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
        list(admin.create_acls([binding]).values())[0].result(10)
        admin.create_topics([NewTopic("lt-mapped", 1)])["lt-mapped"].result(10)

        def produce(port: int):
            out = []
            p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL", "ssl.ca.location": paths["ca"],
                          "ssl.certificate.location": paths["svc_cert"], "ssl.key.location": paths["svc_key"], "message.timeout.ms": 10000})
            p.produce("lt-mapped", value=b"x", on_delivery=lambda err, msg: out.append(err))
            p.flush(15)
            return out[0] if out else "no delivery report"

        assert produce(mapped) is None
        assert produce(dn).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        wait_until(lambda: "denied: User:CN=svc from 127.0.0.1" in b.log_text(), 5, "the denial of User:CN=svc")
    finally:
        b.stop()
