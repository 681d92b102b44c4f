"""Self-signed certificates for trying TLS out and for tests: a CA, and server or client
certificates it signs (RSA 2048, SHA-256), written as PEM. Uses `cryptography`.

Not a PKI: production certificates come from the operator's CA."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    cert: x509.Certificate
    key: rsa.RSAPrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())

    def write(self, cert_path: str, key_path: str | None = None) -> None:
        _write(cert_path, self.cert_pem(), 0o644)
        if key_path:
            _write(key_path, self.key_pem(), 0o600)


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # a reloading broker never sees half a file


def _name(cn: str, org: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        parts.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def make_ca(cn: str = "KafScale test CA", days: int = 365) -> Issued:
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    name = _name(cn)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return Issued(cert, key)


def issue(ca: Issued, cn: str, *, hosts: tuple[str, ...] = (), client: bool = False, org: str | None = None, days: int = 365) -> Issued:
    """A certificate signed by `ca`: for a server (`hosts`: DNS names and IP addresses in
    its subjectAltName) or a client (`client=True`)."""
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(ca.cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )  # fmt: skip
    if hosts:
        alt: list[x509.GeneralName] = []
        for h in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                alt.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def write_self_signed(directory: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), clients: tuple[str, ...] = ()) -> dict[str, str]:
    """ca.pem (+ ca.key), server.pem + server.key for `hosts`, and <name>.pem + <name>.key
    per client name; returns the paths by name."""
    os.makedirs(directory, exist_ok=True)
    ca = make_ca()
    paths = {"ca": os.path.join(directory, "ca.pem"), "ca_key": os.path.join(directory, "ca.key")}
    ca.write(paths["ca"], paths["ca_key"])
    server = issue(ca, hosts[0] if hosts else "localhost", hosts=hosts)
    paths["cert"], paths["key"] = os.path.join(directory, "server.pem"), os.path.join(directory, "server.key")
    server.write(paths["cert"], paths["key"])
    for name in clients:
        c = issue(ca, name, client=True)
        paths[f"{name}_cert"], paths[f"{name}_key"] = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
        c.write(paths[f"{name}_cert"], paths[f"{name}_key"])
    return paths
