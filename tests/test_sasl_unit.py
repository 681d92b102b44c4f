"""SASL and SCRAM without I/O (#17): RFC 7677's SCRAM-SHA-256 example, bad proofs and
malformed messages, PLAIN tokens, the session state machine and the failure limiter."""

from __future__ import annotations

import base64

import pytest

from kafscale.metadata import keys
from kafscale.security import scram
from kafscale.security.sasl import FailureLimiter, IllegalSaslState, SaslError, SaslSession, parse_mechanisms, parse_plain


def test_rfc7677_example():
    # RFC 7677 section 3: user "user", password "pencil".
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = scram.make_credential("SCRAM-SHA-256", "pencil", 4096, salt)
    srv = scram.ScramServer("SCRAM-SHA-256", nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert srv.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == "user"
    assert srv.server_first(cred) == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = srv.client_final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert scram.check_password("SCRAM-SHA-256", cred, "pencil") and not scram.check_password("SCRAM-SHA-256", cred, "pencil2")


def _client_exchange(mechanism: str, user: str, password: str, cred: scram.ScramCredential, tamper=None, final_nonce=None) -> bytes:
    """A client written from RFC 5802, against ScramServer."""
    import hashlib
    import hmac

    alg = scram.MECHANISMS[mechanism]
    srv = scram.ScramServer(mechanism)
    bare = f"n={user},r=clientnonce"
    srv.client_first(f"n,,{bare}".encode())
    server_first = srv.server_first(cred).decode()
    attrs = dict(p.split("=", 1) for p in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(alg, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", alg).digest()
    without_proof = f"c=biws,r={final_nonce(attrs['r']) if final_nonce else attrs['r']}"
    auth = f"{bare},{server_first},{without_proof}".encode()
    sig = hmac.new(hashlib.new(alg, client_key).digest(), auth, alg).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()
    msg = f"{without_proof},p={proof}"
    return srv.client_final((tamper(msg) if tamper else msg).encode())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_and_wrong_password(mechanism):
    cred = scram.make_credential(mechanism, "s3cret", 4096)
    assert _client_exchange(mechanism, "bob", "s3cret", cred).startswith(b"v=")
    with pytest.raises(scram.ScramError, match="invalid credentials"):
        _client_exchange(mechanism, "bob", "wrong", cred)
    with pytest.raises(scram.ScramError, match="nonce"):
        _client_exchange(mechanism, "bob", "s3cret", cred, tamper=lambda m: m.replace("r=clientnonce", "r=othernonce"))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_takes_old_librdkafkas_repeated_client_nonce_and_nothing_looser(mechanism):
    # librdkafka < 2.6.1 puts its client nonce once more in front of the server-first nonce
    # (Kafka 3.8.1-3.9 accept it); any other deviation from that nonce is refused.
    cred = scram.make_credential(mechanism, "s3cret", 4096)
    assert _client_exchange(mechanism, "bob", "s3cret", cred, final_nonce=lambda r: "clientnonce" + r).startswith(b"v=")
    for bad in (lambda r: "clientnonce", lambda r: "x" + r, lambda r: "clientnonceclientnonce" + r, lambda r: r + "x", lambda r: r[:-1]):
        with pytest.raises(scram.ScramError, match="nonce"):
            _client_exchange(mechanism, "bob", "s3cret", cred, final_nonce=bad)


@pytest.mark.parametrize(
    "message", [b"", b"garbage", b"\xff\xfe", b"p=tls-unique,,n=a,r=b", b"n,,r=x,n=y", b"n,,n=a=2Xb,r=x", b"n,a=other,n=me,r=x"]
)
def test_malformed_client_first_is_refused(message):
    with pytest.raises(scram.ScramError):
        scram.ScramServer("SCRAM-SHA-512").client_first(message)


def test_saslname_escapes():
    assert scram.ScramServer("SCRAM-SHA-256").client_first(b"n,,n=a=2Cb=3Dc,r=x") == "a,b=c"


def test_client_final_garbage():
    srv = scram.ScramServer("SCRAM-SHA-256")
    srv.client_first(b"n,,n=u,r=x")
    srv.server_first(scram.make_credential("SCRAM-SHA-256", "p", 4096))
    for bad in (b"junk", b"c=biws,r=x,p=!!!", b"c=eHl6,r=x,p=AAAA"):
        with pytest.raises(scram.ScramError):
            srv.client_final(bad)


def test_credential_doc_round_trip():
    cred = scram.make_credential("SCRAM-SHA-512", "pw", 4096)
    assert scram.ScramCredential.from_doc(cred.to_doc()) == cred
    assert keys.scram_credential_of(keys.scram_credential("a/b c", "SCRAM-SHA-512")) == ("a/b c", "SCRAM-SHA-512")


def test_plain_tokens():
    assert parse_plain(b"\x00alice\x00pw") == ("", "alice", "pw")
    assert parse_plain(b"alice\x00alice\x00pw") == ("alice", "alice", "pw")
    for bad in (b"alice", b"\x00\x00pw", b"\x00alice\x00", b"bob\x00alice\x00pw", b"\x00a\x00b\x00c", b"\x00\xff\x00x"):
        with pytest.raises(SaslError):
            parse_plain(bad)


def test_session_states():
    s = SaslSession(("PLAIN", "SCRAM-SHA-256"))
    with pytest.raises(IllegalSaslState, match="before SaslHandshake"):
        s.expect_authenticate()
    assert not s.handshake("GSSAPI", 1)
    assert s.handshake("PLAIN", 1) and not s.raw_tokens
    s.expect_authenticate()
    with pytest.raises(IllegalSaslState, match="twice"):
        s.handshake("PLAIN", 1)
    s.succeeded("User:alice", 1000, now=10.0)
    assert s.authenticated and not s.expired(now=10.5) and s.expired(now=11.0)
    with pytest.raises(IllegalSaslState, match="unexpected"):
        s.expect_authenticate()
    with pytest.raises(IllegalSaslState, match="same mechanism"):
        s.handshake("SCRAM-SHA-256", 1)
    assert s.handshake("PLAIN", 1) and s.reauthenticating and not s.expired(now=20.0)
    with pytest.raises(SaslError, match="Cannot change principals"):
        s.succeeded("User:mallory", 1000, now=20.0)
    s.succeeded("User:alice", 0, now=20.0)
    assert s.expires_at is None
    v0 = SaslSession(("PLAIN",))
    assert v0.handshake("PLAIN", 0) and v0.raw_tokens


def test_mechanisms_flag():
    assert parse_mechanisms("plain, SCRAM-SHA-512") == ("PLAIN", "SCRAM-SHA-512")
    with pytest.raises(ValueError, match="unsupported"):
        parse_mechanisms("PLAIN,GSSAPI")


def test_failure_limiter_slows_repeated_failures_per_address():
    lim = FailureLimiter(base_s=0.1, max_s=1.0, forget_s=60)
    assert lim.slot("a", 0.0) == 0.0
    for _ in range(6):
        lim.failed("a", 0.0)
    waits = [lim.slot("a", 0.0) for _ in range(3)]
    assert waits[0] == pytest.approx(1.0) and waits[1] == pytest.approx(2.0) and waits[2] == pytest.approx(3.0)  # one at a time
    assert lim.slot("b", 0.0) == 0.0  # other addresses unaffected
    lim.succeeded("a")
    assert lim.slot("a", 0.0) == 0.0
    lim.failed("c", 0.0)
    assert lim.slot("c", 100.0) == 0.0  # forgotten after a quiet period
