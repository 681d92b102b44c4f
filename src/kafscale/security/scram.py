"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), without I/O: the server side, and
the client side a broker uses towards other brokers (`ScramClient`).

Credentials are what Kafka stores: salt, StoredKey = H(HMAC(SaltedPassword, "Client
Key")), ServerKey = HMAC(SaltedPassword, "Server Key") and the iteration count; the
password itself is never kept. hashlib (PBKDF2 = Hi) and hmac cover all of it.

`ScramServer` is one exchange: `client_first(msg)` returns the user name to look up,
`server_first(credential)` the challenge, `client_final(msg)` the server's final message
(or raises ScramError). No channel binding (`n,,` / `y,,` only), as Kafka.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# The ids AlterUserScramCredentials / DescribeUserScramCredentials use on the wire.
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}
MIN_ITERATIONS = 4096  # Kafka's bounds for stored credentials
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 8192


class ScramError(Exception):
    """The exchange failed: malformed message or wrong proof (message safe to send)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_doc(self) -> dict:
        b = lambda x: base64.b64encode(x).decode()  # noqa: E731
        return {"salt": b(self.salt), "stored_key": b(self.stored_key), "server_key": b(self.server_key), "iterations": self.iterations}

    @classmethod
    def from_doc(cls, doc: dict) -> "ScramCredential":
        d = base64.b64decode
        return cls(d(doc["salt"]), d(doc["stored_key"]), d(doc["server_key"]), int(doc["iterations"]))


def _h(alg: str, data: bytes) -> bytes:
    return hashlib.new(alg, data).digest()


def _hmac(alg: str, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, alg).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode("utf-8"), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    alg = MECHANISMS[mechanism]
    client_key = _hmac(alg, salted, b"Client Key")
    return ScramCredential(salt, _h(alg, client_key), _hmac(alg, salted, b"Server Key"), iterations)


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> ScramCredential:
    salt = os.urandom(32) if salt is None else salt
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


def check_password(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one the credential was made from (PLAIN against SCRAM users)."""
    again = credential_from_salted(mechanism, salted_password(mechanism, password, credential.salt, credential.iterations), credential.salt, credential.iterations)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


def _attributes(msg: str) -> list[tuple[str, str]]:
    out = []
    for part in msg.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def _saslname(value: str) -> str:
    # RFC 5802: "," and "=" in names are sent as =2C and =3D; any other "=" is an error.
    out, i = [], 0
    while i < len(value):
        if value[i] == "=":
            code = value[i : i + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise ScramError("malformed user name")
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


class ScramServer:
    def __init__(self, mechanism: str, nonce: str | None = None):
        if mechanism not in MECHANISMS:
            raise ScramError(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.alg = MECHANISMS[mechanism]
        # Letters and digits only, as Kafka's: older librdkafka (kcat's 2.0) mis-parses a
        # nonce with '=' or '/' in it.
        self._server_nonce = nonce or secrets.token_hex(16)
        self.user: str | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None
        self.done = False

    def client_first(self, data: bytes) -> str:
        """Parse the client's first message; returns the user name to look up."""
        try:
            msg = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("SCRAM message is not UTF-8") from None
        parts = msg.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed SCRAM client-first message")
        cb, authzid, bare = parts
        if cb not in ("n", "y"):
            raise ScramError("channel binding is not supported" if cb.startswith("p=") else "malformed gs2 header")
        if authzid and not authzid.startswith("a="):
            raise ScramError("malformed authorization id")
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise ScramError("SCRAM client-first message needs n= and r=")
        user, nonce = _saslname(attrs[0][1]), attrs[1][1]
        if not user or not nonce:
            raise ScramError("empty user name or nonce")
        if authzid and _saslname(authzid[2:]) != user:
            raise ScramError("authorization id differs from the user name")
        # Further attributes are extensions (Kafka's tokenauth=true for delegation tokens,
        # which we do not have): ignored.
        self.user = user
        self._gs2_header = f"{cb},{authzid},"
        self._client_first_bare = bare
        self._nonce = nonce + self._server_nonce
        return user

    def server_first(self, credential: ScramCredential) -> bytes:
        self._credential = credential
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def client_final(self, data: bytes) -> bytes:
        """Check the client's proof; returns the server-final message (v=signature)."""
        if self._credential is None:
            raise ScramError("SCRAM client-final message before client-first")
        try:
            msg = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("SCRAM message is not UTF-8") from None
        without_proof, sep, proof_text = msg.rpartition(",p=")
        if not sep:
            raise ScramError("SCRAM client-final message has no proof")
        attrs = dict(_attributes(without_proof))
        try:
            channel = base64.b64decode(attrs.get("c", ""), validate=True).decode()
            proof = base64.b64decode(proof_text, validate=True)
        except Exception:  # noqa: BLE001 - any decoding failure is a malformed message
            raise ScramError("malformed SCRAM client-final message") from None
        if channel != self._gs2_header:
            raise ScramError("channel binding does not match")
        # RFC 5802: r is exactly the server-first nonce. librdkafka before 2.6.1 (Debian's
        # kcat 1.7.1 has 2.0.2) sends its client nonce once more in front of it; Kafka 3.8.1
        # to 3.9 accept that (Kafka 4 refuses those clients). Only that exact form is taken
        # besides the RFC's, so the server nonce must still be echoed whole.
        client_nonce = self._nonce[: len(self._nonce) - len(self._server_nonce)]
        if attrs.get("r") not in (self._nonce, client_nonce + self._nonce):
            raise ScramError("nonce does not match")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._credential
        signature = _hmac(self.alg, cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(_h(self.alg, client_key), cred.stored_key):
            raise ScramError("invalid credentials")
        self.done = True
        return ("v=" + base64.b64encode(_hmac(self.alg, cred.server_key, auth_message)).decode()).encode()


def _escape_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """The client side of one exchange (the broker's own, to other brokers): `first()` is the
    client-first message, `final(server_first)` the client-final one, `verify(server_final)`
    checks the server's signature (a server that does not know the password fails it)."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None):
        if mechanism not in MECHANISMS:
            raise ScramError(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.alg = MECHANISMS[mechanism]
        self.password = password
        self._nonce = nonce or secrets.token_hex(16)
        self._bare = f"n={_escape_saslname(user)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8")
        attrs = dict(_attributes(text))
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("the server nonce does not extend ours")
        if salt is None or not iterations.isdigit() or int(iterations) < MIN_ITERATIONS:
            raise ScramError("malformed SCRAM server-first message")
        salted = salted_password(self.mechanism, self.password, base64.b64decode(salt), int(iterations))
        client_key = _hmac(self.alg, salted, b"Client Key")
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(self.alg, _h(self.alg, client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = _hmac(self.alg, _hmac(self.alg, salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = dict(_attributes(server_final.decode("utf-8")))
        if "e" in attrs:
            raise ScramError(f"the server refused: {attrs['e']}")
        if not hmac.compare_digest(base64.b64decode(attrs.get("v", "")), self._server_signature):
            raise ScramError("the server's signature does not match")
