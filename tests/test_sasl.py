"""SASL on real brokers (#17): confluent-kafka, kafka-python, aiokafka and kcat over
SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (users made with confluent-kafka's
AdminClient.alter_user_scram_credentials); wrong passwords fail with the client's
authentication error, are logged and counted; bad input on a SASL listener (garbage
tokens, SaslAuthenticate before SaslHandshake, requests before authentication, a 1 MiB
token) closes that connection with one log line; KIP-368 re-authentication."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion, UserScramCredentialUpsertion

from kafscale.errors import ErrorCode
from kafscale.security import certs
from tests.support import raw
from tests.support.broker import BrokerProcess, free_port
from tests.support.clients import aiokafka_roundtrip, confluent_roundtrip, kafka_python_roundtrip, kcat_roundtrip
from tests.support.wait import wait_until

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("sasl")
    paths = certs.write_self_signed(str(d))
    users = d / "users.txt"
    users.write_text("# PLAIN users\nalice:alice-secret\n")
    plain, sasl_plain, sasl_ssl, http = free_port(), free_port(), free_port(), free_port()
    b = BrokerProcess(
        port=plain,
        extra_args=[
            "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_plain},SASL_SSL://127.0.0.1:{sasl_ssl}",
            "--ssl-cert", paths["cert"], "--ssl-key", paths["key"],
            "--sasl-users-file", str(users), "--sasl-failed-authentication-delay-ms", "20",
            "--group-initial-rebalance-delay-ms", "0", "--http", f"127.0.0.1:{http}",
        ],
    ).start()  # fmt: skip
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    ups = [
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"bob-secret"),
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"carol-secret"),
    ]
    for fut in admin.alter_user_scram_credentials(ups).values():
        fut.result(10)
    yield dict(broker=b, plain=plain, sasl_plain=sasl_plain, sasl_ssl=sasl_ssl, http=http, paths=paths, admin=admin)
    b.stop()


def _conf(env, mechanism, user, password, ssl=True) -> dict:
    port = env["sasl_ssl"] if ssl else env["sasl_plain"]
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL" if ssl else "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if ssl:
        conf["ssl.ca.location"] = env["paths"]["ca"]
    return conf


def _metric(env, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{env['http']}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize("mechanism, user, password", [
    ("PLAIN", "alice", "alice-secret"),  # the users file
    ("PLAIN", "carol", "carol-secret"),  # a SCRAM user's password over PLAIN
    ("SCRAM-SHA-256", "bob", "bob-secret"),
    ("SCRAM-SHA-512", "carol", "carol-secret"),
])
def test_confluent_kafka_sasl_ssl(env, mechanism, user, password):
    topic = f"sasl-{mechanism.lower()}-{user}"
    assert confluent_roundtrip(_conf(env, mechanism, user, password), topic) == [f"{topic}-{i}".encode() for i in range(3)]


def test_confluent_kafka_sasl_plaintext_scram(env):
    assert len(confluent_roundtrip(_conf(env, "SCRAM-SHA-512", "carol", "carol-secret", ssl=False), "sasl-plaintext-scram", 2)) == 2


@pytest.mark.parametrize("mechanism, user, password", [("PLAIN", "alice", "alice-secret"), ("SCRAM-SHA-512", "carol", "carol-secret")])
def test_kafka_python_sasl_ssl(env, mechanism, user, password):
    common = dict(bootstrap_servers=f"127.0.0.1:{env['sasl_ssl']}", security_protocol="SASL_SSL", ssl_cafile=env["paths"]["ca"],
                  sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password)
    assert kafka_python_roundtrip(f"sasl-kp-{mechanism.lower()}", **common) == [b"kp-0", b"kp-1", b"kp-2"]


def test_aiokafka_sasl_ssl_scram_sha_256(env):
    from aiokafka.helpers import create_ssl_context

    common = dict(bootstrap_servers=f"127.0.0.1:{env['sasl_ssl']}", security_protocol="SASL_SSL",
                  ssl_context=create_ssl_context(cafile=env["paths"]["ca"]), sasl_mechanism="SCRAM-SHA-256",
                  sasl_plain_username="bob", sasl_plain_password="bob-secret")
    assert aiokafka_roundtrip("sasl-aiokafka", **common) == [b"ak-0", b"ak-1", b"ak-2"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make test installs it)")
@pytest.mark.parametrize("mechanism, user, password", [
    ("PLAIN", "alice", "alice-secret"),
    ("SCRAM-SHA-256", "bob", "bob-secret"),  # Debian's kcat (librdkafka 2.0.2) repeats its client nonce
    ("SCRAM-SHA-512", "carol", "carol-secret"),
])
def test_kcat_sasl_ssl(env, mechanism, user, password):
    topic = f"sasl-kcat-{mechanism.lower()}"
    args = ["-b", f"127.0.0.1:{env['sasl_ssl']}", "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={env['paths']['ca']}",
            "-X", f"sasl.mechanisms={mechanism}", "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"]
    assert kcat_roundtrip(args, topic) == [b"one", b"two"]


@pytest.mark.parametrize("mechanism, user", [("PLAIN", "alice"), ("SCRAM-SHA-256", "bob"), ("SCRAM-SHA-512", "carol"), ("SCRAM-SHA-512", "nobody")])
def test_wrong_password_fails_with_authentication_error(env, mechanism, user):
    b = env["broker"]
    failed_before = _metric(env, f'kafscale_sasl_authentications_total{{mechanism="{mechanism}",result="failed"}}')
    errors = []
    p = Producer({**_conf(env, mechanism, user, "wrong"), "error_cb": errors.append})
    try:
        wait_until(lambda: p.poll(0.2) is not None and any(e.code() == KafkaError._AUTHENTICATION for e in errors), 15, "an authentication error")
    finally:
        p.close()  # a refused client left retrying slows every later login from this address
    assert any("Authentication failed" in e.str() for e in errors), [e.str() for e in errors]
    assert f"SASL {mechanism} authentication from 127.0.0.1" in b.log_text()
    wait_until(lambda: _metric(env, f'kafscale_sasl_authentications_total{{mechanism="{mechanism}",result="failed"}}') > failed_before, 10, "the failure counted")


def test_kafka_python_wrong_password(env):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError

    failed = 'kafscale_sasl_authentications_total{mechanism="SCRAM-SHA-512",result="failed"}'
    failed_before = _metric(env, failed)
    # With api_version given the constructor does not bootstrap (retrying the refusal for
    # bootstrap_timeout_ms, 30 s: each retry one more refusal from this address, which
    # slows every later login from it); the send fails instead, and the client is closed.
    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{env['sasl_ssl']}", security_protocol="SASL_SSL", ssl_cafile=env["paths"]["ca"],
                      sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="carol", sasl_plain_password="nope",
                      api_version=(2, 8), max_block_ms=5000)
    try:
        with pytest.raises(KPError):
            p.send("x", b"v").get(10)
    finally:
        p.close(timeout=5)
    assert _metric(env, failed) > failed_before  # refused by the broker, not timed out unanswered


# -- bad input ----------------------------------------------------------------------------


def _handshake(c: raw.RawClient, mechanism: str, version: int = 1):
    return c.request(SASL_HANDSHAKE, version, raw.req(SASL_HANDSHAKE, version, mechanism=mechanism))


def _authenticate(c: raw.RawClient, token: bytes, version: int = 2):
    return c.request(SASL_AUTHENTICATE, version, raw.req(SASL_AUTHENTICATE, version, auth_bytes=token))


def _closes_with_one_line(env, action, needle: str) -> None:
    b = env["broker"]
    before = b.log_text().count(needle)
    with raw.RawClient(f"127.0.0.1:{env['sasl_plain']}") as c:
        action(c)
        assert c.wait_closed(5)
    wait_until(lambda: b.log_text().count(needle) == before + 1, 10, f"one log line with {needle!r}")
    # others unaffected
    with raw.RawClient(f"127.0.0.1:{env['sasl_plain']}") as c:
        assert _handshake(c, "PLAIN").error_code == ErrorCode.none
        assert _authenticate(c, b"\x00alice\x00alice-secret").error_code == ErrorCode.none
        assert c.metadata(None).brokers


def test_request_before_authentication_closes(env):
    _closes_with_one_line(env, lambda c: c.send_request(3, 12, raw.req(3, 12, topics=None, allow_auto_topic_creation=False,
                                                                    include_topic_authorized_operations=False)),
                          "before SASL authentication on listener SASL_PLAINTEXT")


def test_authenticate_before_handshake_closes(env):
    _closes_with_one_line(env, lambda c: c.send_request(SASL_AUTHENTICATE, 2, raw.req(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00a\x00b")),
                          "SaslAuthenticate received before SaslHandshake")


def test_garbage_scram_token_gets_an_error_and_a_closed_connection(env):
    def action(c):
        assert _handshake(c, "SCRAM-SHA-512").error_code == ErrorCode.none
        resp = _authenticate(c, b"\xff\x00garbage" * 10)
        assert resp.error_code == ErrorCode.sasl_authentication_failed and "Authentication failed" in resp.error_message
    _closes_with_one_line(env, action, "SASL SCRAM-SHA-512 authentication from")


def test_one_mib_token_closes(env):
    def action(c):
        assert _handshake(c, "PLAIN").error_code == ErrorCode.none
        try:
            c.send_frame(raw.encode_request(SASL_AUTHENTICATE, 2, raw.req(SASL_AUTHENTICATE, 2, auth_bytes=b"x" * (1 << 20)), 9))
        except OSError:
            pass
    _closes_with_one_line(env, action, "is over sasl.server.max.receive.size")


def test_unknown_mechanism_and_sasl_on_plaintext_listener(env):
    with raw.RawClient(f"127.0.0.1:{env['sasl_plain']}") as c:
        resp = _handshake(c, "GSSAPI")
        assert resp.error_code == ErrorCode.unsupported_sasl_mechanism and set(resp.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
    with raw.RawClient(env["broker"].bootstrap) as c:
        assert _handshake(c, "PLAIN").error_code == ErrorCode.illegal_sasl_state
        assert _authenticate(c, b"\x00a\x00b").error_code == ErrorCode.illegal_sasl_state
        assert c.metadata(None).brokers  # the plaintext connection goes on


def test_handshake_v0_then_raw_plain_token(env):
    with raw.RawClient(f"127.0.0.1:{env['sasl_plain']}") as c:
        assert _handshake(c, "PLAIN", version=0).error_code == ErrorCode.none
        c.send_frame(b"\x00alice\x00alice-secret")
        assert c.recv_frame() == b""  # the empty server token: authenticated
        assert c.metadata(None).brokers
    with raw.RawClient(f"127.0.0.1:{env['sasl_plain']}") as c:
        assert _handshake(c, "PLAIN", version=0).error_code == ErrorCode.none
        c.send_frame(b"\x00alice\x00wrong")
        assert c.wait_closed(5)


def test_scram_credentials_admin(env):
    admin = env["admin"]
    described = admin.describe_user_scram_credentials(["bob", "carol", "nobody"])
    bob = described["bob"].result(10)
    assert [(i.mechanism, i.iterations) for i in bob.scram_credential_infos] == [(ScramMechanism.SCRAM_SHA_256, 4096)]
    with pytest.raises(Exception, match="does not exist"):
        described["nobody"].result(10)
    up = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")])
    with pytest.raises(Exception, match="Iterations"):
        up["dave"].result(10)
    up = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"erin-pw")])
    up["erin"].result(10)
    assert len(confluent_roundtrip(_conf(env, "SCRAM-SHA-512", "erin", "erin-pw"), "sasl-erin", 1)) == 1
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512)])["erin"].result(10)
    errors = []
    p = Producer({**_conf(env, "SCRAM-SHA-512", "erin", "erin-pw"), "error_cb": errors.append})
    try:
        wait_until(lambda: p.poll(0.2) is not None and any(e.code() == KafkaError._AUTHENTICATION for e in errors), 15, "erin refused after deletion")
    finally:
        p.close()  # (as above: no refused client left retrying)


def test_users_add_cli(env, tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("frank-secret\n")
    subprocess.run([sys.executable, "-m", "kafscale", "users", "add", "frank", "--mechanism", "SCRAM-SHA-512", "--password-file", str(pw),
                    "--bootstrap", env["broker"].bootstrap], check=True, timeout=60, capture_output=True)
    assert len(confluent_roundtrip(_conf(env, "SCRAM-SHA-512", "frank", "frank-secret"), "sasl-frank", 1)) == 1


def test_failing_client_does_not_lock_out_its_host(tmp_path):
    """Kafka holds back the answer of a failed authentication, not the next attempt from the
    address: while a failing connection from 127.0.0.1 waits out its (doubled) delay, a
    correct authentication from the same host is answered at once."""
    users = tmp_path / "users.txt"
    users.write_text("alice:alice-secret\n")
    plain, sasl_plain = free_port(), free_port()
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_plain}",
        "--sasl-users-file", str(users), "--sasl-failed-authentication-delay-ms", "1500"]).start()
    bootstrap = f"127.0.0.1:{sasl_plain}"
    try:
        with raw.RawClient(bootstrap) as first:  # the address's first failure: answered after 1.5 s
            assert _handshake(first, "PLAIN").error_code == ErrorCode.none
            assert _authenticate(first, b"\x00alice\x00wrong").error_code == ErrorCode.sasl_authentication_failed
        with raw.RawClient(bootstrap, timeout=30) as failing, raw.RawClient(bootstrap) as good:
            assert _handshake(failing, "PLAIN").error_code == ErrorCode.none
            failing.send_request(SASL_AUTHENTICATE, 2, raw.req(SASL_AUTHENTICATE, 2, auth_bytes=b"\x00alice\x00wrong-again"))
            # the second failure's answer is held back 3 s; the correct client does not queue behind it
            assert _handshake(good, "PLAIN").error_code == ErrorCode.none
            assert _authenticate(good, b"\x00alice\x00alice-secret").error_code == ErrorCode.none
            assert good.metadata(None).brokers
            failing.sock.setblocking(False)
            try:
                pending = failing.sock.recv(1, socket.MSG_PEEK) == b""  # b"": closed without an answer
            except BlockingIOError:
                pending = True
            failing.sock.settimeout(failing.timeout)
            assert pending, "the failing connection was answered before the correct one finished"
            _corr, answer = raw.decode_response(SASL_AUTHENTICATE, 2, failing.recv_frame())
            assert answer.error_code == ErrorCode.sasl_authentication_failed
    finally:
        b.stop()


def test_reauthentication_kip368(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text("alice:alice-secret\n")
    plain, sasl = free_port(), free_port()
    # librdkafka re-authenticates at 90% of the session: 4 s leave it 400 ms on a busy
    # machine (1.5 s left 150 ms, and a loaded run saw the session expire first)
    lifetime_s = 4.0
    b = BrokerProcess(port=plain, extra_args=[
        "--listeners", f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}", "--sasl-users-file", str(users),
        "--connections-max-reauth-ms", str(int(lifetime_s * 1000))]).start()
    try:
        conf = {"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "alice-secret"}
        p = Producer(conf)
        sent = []

        def produce_one() -> bool:
            p.produce("reauth", value=str(len(sent)).encode())
            assert p.flush(10) == 0
            sent.append(1)
            return "(re-authentication)" in b.log_text()

        # librdkafka re-authenticates on its own before the session ends, and
        # producing goes on over the same connection.
        wait_until(produce_one, 20, "a re-authentication while producing", interval=0.3)
        assert "expired" not in b.log_text()
        # a raw client that does not re-authenticate is disconnected after the lifetime
        with raw.RawClient(f"127.0.0.1:{sasl}") as c:
            assert _handshake(c, "PLAIN").error_code == ErrorCode.none
            resp = _authenticate(c, b"\x00alice\x00alice-secret")
            assert resp.session_lifetime.total_seconds() == lifetime_s
            time.sleep(lifetime_s + 0.1)  # let the session end: the point of this check
            c.send_request(3, 12, raw.req(3, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
            assert c.wait_closed(5)
        wait_until(lambda: "expired (connections.max.reauth.ms)" in b.log_text(), 5, "the expiry logged")
    finally:
        b.stop()


def test_admin_cli_with_client_security_settings(env, tmp_path):
    cfg = tmp_path / "client.properties"
    cfg.write_text(f"# like kafka-topics --command-config\nsecurity.protocol=SASL_SSL\nssl.ca.location={env['paths']['ca']}\n"
                   "sasl.mechanism=SCRAM-SHA-512\nsasl.username=carol\n")
    base = [sys.executable, "-m", "kafscale", "topics", "create", "sasl-cli-topic", "--partitions", "2", "--bootstrap", f"127.0.0.1:{env['sasl_ssl']}",
            "--command-config", str(cfg)]
    # a generous --timeout: on a busy machine a SASL_SSL handshake plus the creation took >10 s once
    ok = subprocess.run([*base, "-X", "sasl.password=carol-secret", "--timeout", "60", "-v"], capture_output=True, text=True, timeout=90)
    assert ok.returncode == 0, ok.stderr[-4000:] + "\nbroker log:\n" + env["broker"].log_text()[-4000:]
    needle = "SASL SCRAM-SHA-512 authentication from 127.0.0.1"
    refused_before = env["broker"].log_text().count(needle)
    bad = subprocess.run([*base[:5], "sasl-cli-topic-2", *base[6:], "-X", "sasl.password=wrong", "--timeout", "5"], capture_output=True, text=True, timeout=60)
    # the CLI sees no answer (librdkafka reports the refusal only in its logs, -v shows it);
    # the broker logged this run's refusal
    assert bad.returncode != 0 and "sasl-cli-topic-2" in bad.stderr, bad.stderr
    wait_until(lambda: env["broker"].log_text().count(needle) > refused_before, 10, "the refusal logged")
    # a consumer-protocol group's member epochs come over the same SASL_SSL SCRAM settings
    # (the CLI's own request: librdkafka's describe has no epochs)
    c = Consumer({**_conf(env, "SCRAM-SHA-512", "carol", "carol-secret"), "group.id": "sasl-cli-g", "group.protocol": "consumer"})
    try:
        c.subscribe(["sasl-cli-topic"])
        wait_until(lambda: c.poll(0.2) is None and len(c.assignment()) == 2, 60, "the consumer assigned both partitions")
        described = subprocess.run([*base[:3], "groups", "describe", "sasl-cli-g", "--json", *base[8:], "-X", "sasl.password=carol-secret",
                                    "--timeout", "60"], capture_output=True, text=True, timeout=90)
        assert described.returncode == 0, described.stderr
        doc = json.loads(described.stdout)
        assert doc["group_epoch"] >= 1 and [m["member_epoch"] for m in doc["members"]] == [doc["assignment_epoch"]], doc
    finally:
        c.close()
