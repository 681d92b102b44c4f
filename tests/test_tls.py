"""TLS listeners (#17): certificates made in the test with `cryptography`; confluent-kafka,
kafka-python, aiokafka and kcat produce and consume over SSL and mTLS; untrusted
certificates fail with the client's error; a plaintext client on the TLS port and a TLS
client on the plaintext port are one log line each; certificates reload without restart."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess

import pytest
from confluent_kafka import KafkaError, Producer

from kafscale.security import certs
from kafscale.security.principal import PrincipalMappingError, certificate_subject, from_certificate, map_name, parse_rules
from kafscale.security.tls import ReloadingContext, TlsConfigError, TlsSettings
from tests.support.broker import BrokerProcess, free_port
from tests.support.clients import aiokafka_roundtrip, confluent_roundtrip, kafka_python_roundtrip, kcat_roundtrip
from tests.support.wait import wait_until

# -- pure parts ---------------------------------------------------------------------------


def test_default_principal_is_the_subject_most_specific_first():
    ca = certs.make_ca()
    c = certs.issue(ca, "alice", client=True, org="acme")
    der = c.cert.public_bytes(certs.serialization.Encoding.DER)
    assert certificate_subject(der) == "CN=alice,O=acme"
    assert from_certificate(der, parse_rules("DEFAULT")) == "User:CN=alice,O=acme"
    assert from_certificate(None, parse_rules("DEFAULT")) == "User:ANONYMOUS"


def test_mapping_rules_like_kafka():
    rules = parse_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=([a-z]+)@example\\.com,O=(.*)$/$2:$1/U,DEFAULT")
    assert map_name("CN=Kafka-Service,OU=ServiceUsers,O=acme", rules) == "kafka-service"
    assert map_name("CN=bob@example.com,O=acme", rules) == "ACME:BOB"
    assert map_name("CN=carol,O=acme", rules) == "CN=carol,O=acme"  # DEFAULT
    with pytest.raises(PrincipalMappingError, match="no principal mapping rule"):
        map_name("CN=x", parse_rules("RULE:^CN=y$/y/"))
    with pytest.raises(PrincipalMappingError):
        parse_rules("RULE:unterminated")
    with pytest.raises(PrincipalMappingError):
        parse_rules("SOMETHING")


def test_tls_settings_refused_before_start(tmp_path):
    with pytest.raises(TlsConfigError, match="--ssl-cert and --ssl-key"):
        TlsSettings("", "").check()
    paths = certs.write_self_signed(str(tmp_path))
    with pytest.raises(TlsConfigError, match="needs --ssl-ca"):
        TlsSettings(paths["cert"], paths["key"], client_auth="required").check()
    with pytest.raises(TlsConfigError, match="one of"):
        TlsSettings(paths["cert"], paths["key"], client_auth="maybe").check()


def test_reloading_context_picks_up_changed_files(tmp_path):
    paths = certs.write_self_signed(str(tmp_path))
    r = ReloadingContext(TlsSettings(paths["cert"], paths["key"]))
    assert not r.check() and r.current is r.base
    certs.write_self_signed(str(tmp_path))  # new CA, new server certificate, same paths
    assert r.check() and r.current is not r.base and r.reloads == 1
    with open(paths["key"], "w") as f:
        f.write("not a key")
    assert not r.check() and r.reload_failures == 1  # the previous context stays


# -- a real broker ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_env(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tls"))
    paths = certs.write_self_signed(d, clients=("alice",))
    other = certs.write_self_signed(os.path.join(d, "other"), clients=("mallory",))  # an untrusted CA
    plain, tls = free_port(), free_port()
    b = BrokerProcess(
        port=plain,
        extra_args=[
            "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
            "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--ssl-ca", paths["ca"],
            "--ssl-client-auth", "requested", "--ssl-reload-interval-ms", "200",
            "--group-initial-rebalance-delay-ms", "0",
        ],
    ).start()  # fmt: skip
    yield b, tls, paths, other
    b.stop()


def _ssl_conf(tls: int, paths: dict, client: str | None = None) -> dict:
    conf = {"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL", "ssl.ca.location": paths["ca"]}
    if client:
        conf.update({"ssl.certificate.location": paths[f"{client}_cert"], "ssl.key.location": paths[f"{client}_key"]})
    return conf


def test_confluent_kafka_over_ssl_and_mtls(tls_env):
    _b, tls, paths, _other = tls_env
    assert confluent_roundtrip(_ssl_conf(tls, paths), "tls-confluent") == [b"tls-confluent-0", b"tls-confluent-1", b"tls-confluent-2"]
    assert len(confluent_roundtrip(_ssl_conf(tls, paths, "alice"), "tls-confluent-mtls")) == 3


def test_kafka_python_over_ssl(tls_env):
    _b, tls, paths, _other = tls_env
    common = dict(bootstrap_servers=f"127.0.0.1:{tls}", security_protocol="SSL", ssl_cafile=paths["ca"],
                  ssl_certfile=paths["alice_cert"], ssl_keyfile=paths["alice_key"])
    assert kafka_python_roundtrip("tls-kafka-python", **common) == [b"kp-0", b"kp-1", b"kp-2"]


def test_aiokafka_over_ssl(tls_env):
    from aiokafka.helpers import create_ssl_context

    _b, tls, paths, _other = tls_env
    common = dict(bootstrap_servers=f"127.0.0.1:{tls}", security_protocol="SSL", ssl_context=create_ssl_context(cafile=paths["ca"]))
    assert aiokafka_roundtrip("tls-aiokafka", **common) == [b"ak-0", b"ak-1", b"ak-2"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make test installs it)")
def test_kcat_over_ssl(tls_env):
    _b, tls, paths, _other = tls_env
    args = ["-b", f"127.0.0.1:{tls}", "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={paths['ca']}",
            "-X", f"ssl.certificate.location={paths['alice_cert']}", "-X", f"ssl.key.location={paths['alice_key']}"]
    assert kcat_roundtrip(args, "tls-kcat") == [b"one", b"two"]


def test_untrusted_certificates_fail_with_the_clients_error(tls_env):
    b, tls, paths, other = tls_env
    # the client does not trust the broker's CA
    errors = []
    p = Producer({**_ssl_conf(tls, other), "error_cb": errors.append})
    p.poll(0)
    wait_until(lambda: p.poll(0.2) is not None and any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN) for e in errors), 15, "an SSL error")
    # the broker does not trust the client's certificate (signed by another CA)
    before = b.log_text().count("TLS handshake with")
    errors2 = []
    conf = {**_ssl_conf(tls, paths), "ssl.certificate.location": other["mallory_cert"], "ssl.key.location": other["mallory_key"], "error_cb": errors2.append}
    p2 = Producer(conf)
    failed = (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION, KafkaError._ALL_BROKERS_DOWN)
    wait_until(lambda: p2.poll(0.2) is not None and any(e.code() in failed for e in errors2), 15, "the client to see the broker refuse it")
    wait_until(lambda: b.log_text().count("TLS handshake with") > before, 10, "the broker to log the failed handshake")
    del p  # stop its retries
    wait_until(lambda: any("certificate" in ln.lower() for ln in b.log_text().splitlines() if "TLS handshake with" in ln), 10,
               "a failed handshake logged with the certificate problem")
    # others unaffected
    assert len(confluent_roundtrip(_ssl_conf(tls, paths), "tls-after-untrusted", 1)) == 1


def test_plaintext_client_on_tls_port_and_tls_client_on_plaintext_port(tls_env):
    b, tls, paths, _other = tls_env
    before = b.log_text().count("TLS handshake with")
    with socket.create_connection(("127.0.0.1", tls), timeout=5) as s:
        s.sendall(b"\x00\x00\x00\x17\x00\x12\x00\x00\x00\x00\x00\x01\x00\x07kafscale\x00")  # ApiVersions v0 in clear
        s.settimeout(5)
        assert s.recv(100) == b""  # closed, nothing answered
    wait_until(lambda: b.log_text().count("TLS handshake with") == before + 1, 10, "one log line for the plaintext client")
    ctx = ssl.create_default_context(cafile=paths["ca"])
    with socket.create_connection(("127.0.0.1", b.port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            ctx.wrap_socket(raw, server_hostname="localhost")
    wait_until(lambda: "a TLS handshake on plaintext listener PLAINTEXT" in b.log_text(), 10, "the plaintext listener's log line")
    assert b.log_text().count("a TLS handshake on plaintext listener") == 1
    assert len(confluent_roundtrip({"bootstrap.servers": b.bootstrap}, "tls-plain-still-fine", 1)) == 1


def test_certificates_reload_without_restart(tls_env, tmp_path):
    b, tls, paths, _other = tls_env
    ctx_old = ssl.create_default_context(cafile=paths["ca"])

    def handshake(ctx) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", tls), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="localhost"):
                return True
        except (ssl.SSLError, OSError):
            return False

    assert handshake(ctx_old)
    saved = {k: open(paths[k], "rb").read() for k in ("cert", "key", "ca")}
    try:
        new_ca = certs.make_ca("rotated CA")
        server = certs.issue(new_ca, "localhost", hosts=("localhost", "127.0.0.1"))
        new_ca_path = str(tmp_path / "new-ca.pem")
        new_ca.write(new_ca_path)
        server.write(paths["cert"], paths["key"])
        ctx_new = ssl.create_default_context(cafile=new_ca_path)
        wait_until(lambda: handshake(ctx_new), 10, "the broker to serve the rotated certificate")
        assert not handshake(ctx_old)
        assert "TLS certificate, key and CA reloaded" in b.log_text()
    finally:
        for k, data in saved.items():
            with open(paths[k] + ".tmp", "wb") as f:
                f.write(data)
            os.replace(paths[k] + ".tmp", paths[k])
        wait_until(lambda: handshake(ctx_old), 10, "the original certificate back")


def test_kafscale_certs_generate(tmp_path):
    import sys

    out = subprocess.run([sys.executable, "-m", "kafscale", "certs", "generate", str(tmp_path / "c"), "--client", "bob"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert "--ssl-cert" in out.stdout
    for name in ("ca.pem", "server.pem", "server.key", "bob.pem", "bob.key"):
        assert (tmp_path / "c" / name).exists()
    ssl.create_default_context(cafile=str(tmp_path / "c" / "ca.pem"))


def test_mtls_principal_is_used_by_acls(tmp_path):
    """The client certificate's subject, mapped by a RULE, is the principal the ACLs see:
    alice (CN=alice) may write, bob (CN=bob, same CA) may not."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType, ResourceType

    paths = certs.write_self_signed(str(tmp_path), clients=("alice", "bob"))
    plain, tls = free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--ssl-ca", paths["ca"], "--ssl-client-auth", "required",
        "--ssl-principal-mapping-rules", "RULE:^CN=([a-z]+)$/$1/L,DEFAULT",
        "--authorizer", "acls", "--super-users", "User:ANONYMOUS"]).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        binding = AclBinding(ResourceType.TOPIC, "mtls-orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
        list(admin.create_acls([binding]).values())[0].result(10)
        from confluent_kafka.admin import NewTopic

        admin.create_topics([NewTopic("mtls-orders", 1)])["mtls-orders"].result(10)  # alice may write, not create

        def produce(client: str):
            out = []
            p = Producer({**_ssl_conf(tls, paths, client), "message.timeout.ms": 10000})
            p.produce("mtls-orders", value=client.encode(), on_delivery=lambda err, msg: out.append(err))
            p.flush(15)
            return out[0] if out else "no delivery report"

        assert produce("alice") is None
        assert produce("bob").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        wait_until(lambda: "denied: User:bob from 127.0.0.1 may not DESCRIBE TOPIC mtls-orders" in b.log_text(), 5, "the denial of User:bob")
    finally:
        b.stop()


def test_ops_endpoint_over_tls_with_basic_auth(tmp_path):
    import base64
    import urllib.error
    import urllib.request

    paths = certs.write_self_signed(str(tmp_path))
    http = free_port()
    b = BrokerProcess(extra_args=["--http", f"127.0.0.1:{http}", "--http-tls", "true", "--ssl-cert", paths["cert"], "--ssl-key", paths["key"]],
                      env={"KAFSCALE_HTTP_BASIC_AUTH": "scraper:s3cret"}).start()
    try:
        ctx = ssl.create_default_context(cafile=paths["ca"])

        def get(path: str, auth: str | None = None):
            req = urllib.request.Request(f"https://localhost:{http}{path}")
            if auth:
                req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        wait_until(lambda: get("/healthz")[0] == 200, 10, "the ops endpoint over TLS")  # probes stay open
        assert get("/metrics")[0] == 401
        assert get("/metrics", "scraper:wrong")[0] == 401
        status, body = get("/metrics", "scraper:s3cret")
        assert status == 200 and b"kafscale_connections" in body
    finally:
        b.stop()
