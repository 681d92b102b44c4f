"""TLS from encrypted private keys and key/trust stores (#17): Kafka's ssl.key.password,
ssl.keystore.* (PKCS#12 or PEM) and ssl.truststore.* (PEM or PKCS#12). The loading without
a broker (keytool-made Java stores too); then brokers whose identity is an encrypted PEM key
or a PKCS#12 keystore with a PKCS#12 truststore, passwords from KAFSCALE_* variables:
confluent-kafka, kafka-python, aiokafka and kcat over mTLS; the passwords appear nowhere
(process list, log, DescribeConfigs: sensitive, value null); a replaced keystore is served
without restart; a wrong password is refused at start with one line."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from kafscale.security import certs
from kafscale.security.tls import ReloadingContext, TlsConfigError, TlsSettings, server_context
from tests.support.broker import REPO, BrokerProcess, free_port
from tests.support.clients import confluent_roundtrip, kcat_roundtrip
from tests.support.wait import wait_until

KEY_PW, STORE_PW, TRUST_PW = "k3y-pass-word", "st0re-pass-word", "tru5t-pass-word"


def write_encrypted_key(issued: certs.Issued, path: str, password: str) -> None:
    pem = issued.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.BestAvailableEncryption(password.encode()))
    with open(path, "wb") as f:
        f.write(pem)


def write_keystore(issued: certs.Issued, ca: certs.Issued, path: str, password: str) -> None:
    data = pkcs12.serialize_key_and_certificates(b"server", issued.key, issued.cert, [ca.cert],
                                                 serialization.BestAvailableEncryption(password.encode()))
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def write_truststore(ca: certs.Issued, path: str, password: str) -> None:
    data = pkcs12.serialize_key_and_certificates(b"ca", None, None, [ca.cert], serialization.BestAvailableEncryption(password.encode()))
    with open(path, "wb") as f:
        f.write(data)


def handshake(port: int, ca_path: str, client: tuple[str, str] | None = None) -> bool:
    ctx = ssl.create_default_context(cafile=ca_path)
    if client:
        ctx.load_cert_chain(*client)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"\x00\x00\x00\x12\x00\x12\x00\x00\x00\x00\x00\x01\x00\x08kafscale")  # ApiVersions v0
            return len(s.recv(4)) == 4  # TLS 1.3 reports a refused client certificate only here
    except (ssl.SSLError, OSError):
        return False


# -- loading, no broker -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("stores")
    ca = certs.make_ca()
    server = certs.issue(ca, "localhost", hosts=("localhost", "127.0.0.1"))
    alice = certs.issue(ca, "alice", client=True)
    p = {k: str(d / n) for k, n in (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"), ("enc_key", "server-enc.key"),
                                   ("p12", "server.p12"), ("trust", "trust.p12"), ("alice_cert", "alice.pem"), ("alice_key", "alice.key"),
                                   ("pem_store", "server-store.pem"))}
    ca.write(p["ca"])
    server.write(p["cert"], p["key"])
    alice.write(p["alice_cert"], p["alice_key"])
    write_encrypted_key(server, p["enc_key"], KEY_PW)
    write_keystore(server, ca, p["p12"], STORE_PW)
    write_truststore(ca, p["trust"], TRUST_PW)
    with open(p["pem_store"], "wb") as f:  # Kafka's PEM keystore: the (encrypted) key and the chain in one file
        f.write(open(p["enc_key"], "rb").read() + server.cert_pem())
    p["_ca"], p["_server"] = ca, server
    return p


def test_encrypted_pem_key_needs_its_password(pki):
    server_context(TlsSettings(pki["cert"], pki["enc_key"], key_password=KEY_PW))
    with pytest.raises(TlsConfigError, match="the key is encrypted: give its password"):
        TlsSettings(pki["cert"], pki["enc_key"]).check()  # refused, never a prompt on the terminal
    with pytest.raises(TlsConfigError, match="does not decrypt the key"):
        TlsSettings(pki["cert"], pki["enc_key"], key_password="wrong").check()


def test_keystores_and_truststores(pki):
    TlsSettings(keystore=pki["p12"], keystore_password=STORE_PW, truststore=pki["trust"], truststore_password=TRUST_PW, client_auth="required").check()
    TlsSettings(keystore=pki["p12"], keystore_password=STORE_PW, keystore_type="pkcs12").check()
    TlsSettings(keystore=pki["pem_store"], key_password=KEY_PW, truststore=pki["ca"], client_auth="required").check()  # PEM, from the content
    with pytest.raises(TlsConfigError, match="password does not open it"):
        TlsSettings(keystore=pki["p12"], keystore_password="wrong").check()
    with pytest.raises(TlsConfigError, match="password does not open it"):
        TlsSettings(pki["cert"], pki["key"], truststore=pki["trust"], truststore_password="wrong").check()
    with pytest.raises(TlsConfigError, match="PKCS12 or PEM.*keytool -importkeystore"):
        TlsSettings(keystore=pki["p12"], keystore_type="JKS").check()
    with pytest.raises(TlsConfigError, match="not both"):
        TlsSettings(pki["cert"], pki["key"], keystore=pki["p12"]).check()
    with pytest.raises(TlsConfigError, match="no private key"):
        TlsSettings(keystore=pki["trust"], keystore_password=TRUST_PW).check()
    with pytest.raises(TlsConfigError, match="needs --ssl-ca or --ssl-truststore-location"):
        TlsSettings(keystore=pki["p12"], keystore_password=STORE_PW, client_auth="required").check()
    # passwords never in a settings object's text (log lines, tracebacks)
    text = repr(TlsSettings(pki["cert"], pki["enc_key"], key_password=KEY_PW, keystore_password=STORE_PW, truststore_password=TRUST_PW))
    assert KEY_PW not in text and STORE_PW not in text and TRUST_PW not in text


def test_keystore_reload(pki, tmp_path):
    path = str(tmp_path / "ks.p12")
    shutil.copy(pki["p12"], path)
    r = ReloadingContext(TlsSettings(keystore=path, keystore_password=STORE_PW))
    assert not r.check()
    ca2 = certs.make_ca("second CA")
    write_keystore(certs.issue(ca2, "localhost", hosts=("localhost",)), ca2, path, STORE_PW)
    assert r.check() and r.reloads == 1
    write_keystore(certs.issue(ca2, "localhost", hosts=("localhost",)), ca2, path, "another password")
    assert not r.check() and r.reload_failures == 1  # the previous context stays


def _serve_once(ctx: ssl.SSLContext) -> tuple[int, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def run():
        conn, _ = sock.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as s:
                s.recv(100)
                s.sendall(b"ok!!")
        except (ssl.SSLError, OSError):
            pass
        finally:
            sock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return sock.getsockname()[1], t


@pytest.mark.skipif(shutil.which("keytool") is None, reason="keytool (a JDK) not installed")
def test_java_keytool_stores(pki, tmp_path):
    """The stores a Kafka operator has: keytool's PKCS#12 keystore (its own key pair) and a
    truststore made with keytool -importcert."""
    ks, ts, exported = str(tmp_path / "kafka.server.keystore.p12"), str(tmp_path / "kafka.server.truststore.p12"), str(tmp_path / "server.pem")
    run = lambda *a: subprocess.run(["keytool", *a], check=True, capture_output=True, timeout=120)  # noqa: E731
    run("-genkeypair", "-keystore", ks, "-storetype", "PKCS12", "-storepass", STORE_PW, "-alias", "localhost", "-keyalg", "RSA",
        "-keysize", "2048", "-validity", "30", "-dname", "CN=localhost", "-ext", "SAN=dns:localhost,ip:127.0.0.1")
    run("-exportcert", "-rfc", "-keystore", ks, "-storepass", STORE_PW, "-alias", "localhost", "-file", exported)
    run("-importcert", "-noprompt", "-keystore", ts, "-storetype", "PKCS12", "-storepass", TRUST_PW, "-alias", "caroot", "-file", pki["ca"])
    ctx = server_context(TlsSettings(keystore=ks, keystore_password=STORE_PW, truststore=ts, truststore_password=TRUST_PW, client_auth="required"))
    port, t = _serve_once(ctx)
    assert handshake(port, exported, (pki["alice_cert"], pki["alice_key"]))  # alice's CA is in the keytool truststore
    t.join(10)


# -- brokers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def p12_broker(pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("p12-broker")
    keystore = str(d / "server.p12")
    shutil.copy(pki["p12"], keystore)
    plain, tls = free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
        "--ssl-keystore-location", keystore, "--ssl-keystore-type", "PKCS12",
        "--ssl-truststore-location", pki["trust"], "--ssl-truststore-type", "PKCS12",
        "--ssl-client-auth", "required", "--ssl-reload-interval-ms", "200", "--group-initial-rebalance-delay-ms", "0",
    ], env={"KAFSCALE_SSL_KEYSTORE_PASSWORD": STORE_PW, "KAFSCALE_SSL_TRUSTSTORE_PASSWORD": TRUST_PW}).start()  # fmt: skip
    yield b, tls, keystore
    b.stop()


def _conf(tls: int, pki: dict) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL", "ssl.ca.location": pki["ca"],
            "ssl.certificate.location": pki["alice_cert"], "ssl.key.location": pki["alice_key"]}


def test_confluent_kafka_mtls_with_pkcs12_stores(p12_broker, pki):
    b, tls, _ = p12_broker
    assert confluent_roundtrip(_conf(tls, pki), "p12-confluent") == [b"p12-confluent-0", b"p12-confluent-1", b"p12-confluent-2"]
    assert not handshake(tls, pki["ca"])  # client-auth required: no certificate, no session
    wait_until(lambda: "TLS handshake with" in b.log_text(), 10, "the refused handshake logged")


def test_kafka_python_and_aiokafka_with_pkcs12_stores(p12_broker, pki):
    from aiokafka import AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    from kafka import KafkaConsumer, KafkaProducer

    _b, tls, _ = p12_broker
    common = dict(bootstrap_servers=f"127.0.0.1:{tls}", security_protocol="SSL", ssl_cafile=pki["ca"],
                  ssl_certfile=pki["alice_cert"], ssl_keyfile=pki["alice_key"])
    p = KafkaProducer(**common)
    p.send("p12-clients", b"kafka-python").get(20)
    p.close()

    async def aio():
        ctx = create_ssl_context(cafile=pki["ca"], certfile=pki["alice_cert"], keyfile=pki["alice_key"])
        ap = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{tls}", security_protocol="SSL", ssl_context=ctx)
        await ap.start()
        try:
            await ap.send_and_wait("p12-clients", b"aiokafka")
        finally:
            await ap.stop()

    asyncio.run(aio())
    c = KafkaConsumer("p12-clients", auto_offset_reset="earliest", consumer_timeout_ms=15000, **common)
    got = [m.value for _, m in zip(range(2), c)]
    c.close()
    assert got == [b"kafka-python", b"aiokafka"]


def test_passwords_nowhere_and_sensitive_in_describe_configs(p12_broker):
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

    b, _tls, keystore = p12_broker
    with open(f"/proc/{b.proc.pid}/cmdline", "rb") as f:
        cmdline = f.read()
    assert b"--ssl-keystore-location" in cmdline and STORE_PW.encode() not in cmdline and TRUST_PW.encode() not in cmdline
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ResourceType.BROKER, "0")
    got = admin.describe_configs([res])[res].result(15)
    assert got["ssl.keystore.location"].value == keystore and not got["ssl.keystore.location"].is_sensitive
    assert got["ssl.keystore.type"].value == "PKCS12"
    for name in ("ssl.keystore.password", "ssl.truststore.password", "ssl.key.password"):
        assert got[name].is_sensitive and got[name].value is None, name
    assert got["ssl.keystore.password"].source == ConfigSource.STATIC_BROKER_CONFIG.value  # given (by a variable), not shown
    assert STORE_PW not in b.log_text() and TRUST_PW not in b.log_text()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make test installs it)")
def test_kcat_and_keystore_reload(p12_broker, pki):
    b, tls, keystore = p12_broker
    args = ["-b", f"127.0.0.1:{tls}", "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki['ca']}",
            "-X", f"ssl.certificate.location={pki['alice_cert']}", "-X", f"ssl.key.location={pki['alice_key']}"]
    assert kcat_roundtrip(args, "p12-kcat") == [b"one", b"two"]
    # a new keystore (a certificate from another CA, same password) is served from the next handshake on
    alice = (pki["alice_cert"], pki["alice_key"])
    saved = open(keystore, "rb").read()
    ca2 = certs.make_ca("rotated CA")
    ca2_path = os.path.join(os.path.dirname(keystore), "ca2.pem")
    ca2.write(ca2_path)
    try:
        write_keystore(certs.issue(ca2, "localhost", hosts=("localhost", "127.0.0.1")), ca2, keystore, STORE_PW)
        wait_until(lambda: handshake(tls, ca2_path, alice), 10, "the rotated keystore served")
        assert not handshake(tls, pki["ca"], alice)
    finally:
        with open(keystore + ".tmp", "wb") as f:
            f.write(saved)
        os.replace(keystore + ".tmp", keystore)
        wait_until(lambda: handshake(tls, pki["ca"], alice), 10, "the original keystore back")


def test_encrypted_pem_key_broker_and_wrong_password_refused(pki):
    plain, tls = free_port(), free_port()
    args = ["--listeners", f"PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}", "--ssl-cert", pki["cert"], "--ssl-key", pki["enc_key"]]
    b = BrokerProcess(port=plain, extra_args=args, env={"KAFSCALE_SSL_KEY_PASSWORD": KEY_PW}).start()
    try:
        assert len(confluent_roundtrip({"bootstrap.servers": f"127.0.0.1:{tls}", "security.protocol": "SSL", "ssl.ca.location": pki["ca"]},
                                       "enc-key", 1)) == 1
    finally:
        b.stop()
    env = {**os.environ, "KAFSCALE_SSL_KEY_PASSWORD": "not-the-password"}
    out = subprocess.run([sys.executable, "-m", "kafscale", "broker", "--data-dir", str(pki["ca"]) + ".d", "--http", "", *args],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 2
    text = out.stderr + out.stdout
    assert "refusing to start" in text and "the key password does not decrypt the key" in text
    assert "not-the-password" not in text
