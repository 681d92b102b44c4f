"""TLS for the Kafka listeners with Python's `ssl`: a server context from PEM files or PKCS#12 stores
(TLS 1.2 or newer, optional client authentication), reloaded when the files change.

Reloading: asyncio binds a listening socket to one SSLContext. The context given to it
(`base`) carries an `sni_callback`, which OpenSSL calls for every ClientHello (with or
without a server name); it moves the connection onto the newest context, so a certificate,
key or CA file replaced on disk is used by the next handshake, without a restart. A
reload that fails (a key that does not match its certificate, a half-written file) keeps
the previous context and is logged; the next check tries again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl
from dataclasses import dataclass, field

log = logging.getLogger("kafscale.tls")

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """TLS settings that cannot work (the broker refuses to start)."""


STORE_TYPES = ("PKCS12", "PEM")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Where a TLS listener's identity and trust come from.

    Identity: `cert` + `key` (PEM files, the key encrypted or not: `key_password`), or a
    `keystore` (Kafka's ssl.keystore.*): PKCS#12 with `keystore_password`, or one PEM file
    with the key and the certificate chain. Trust (the CAs of client certificates): `ca`
    (PEM) and/or a `truststore` (PEM, or PKCS#12 with `truststore_password`). Passwords
    are left out of repr(), so a settings object in a log line shows none."""

    cert: str = ""
    key: str = ""
    ca: str = ""
    client_auth: str = "none"
    ciphers: str = ""  # OpenSSL cipher list for TLS 1.2 ("" keeps Python's secure default)
    key_password: str = field(default="", repr=False)
    keystore: str = ""
    keystore_password: str = field(default="", repr=False)
    keystore_type: str = ""  # PKCS12 or PEM; "" is read from the file (PEM if it is text)
    truststore: str = ""
    truststore_password: str = field(default="", repr=False)
    truststore_type: str = ""
    flag: str = field(default="--ssl", compare=False)  # how messages name the settings: --ssl or --listener-ssl NAME:

    def _name(self, key: str) -> str:
        return f"{self.flag}-{key}" if self.flag == "--ssl" else f"{self.flag}{key}"

    def check(self) -> None:
        if self.keystore and (self.cert or self.key):
            raise TlsConfigError(f"give either {self._name('keystore-location')} or {self._name('cert')}/{self._name('key')}, not both")
        if not self.keystore and (not self.cert or not self.key):
            raise TlsConfigError(f"a TLS listener needs {self._name('cert')} and {self._name('key')} (or {self._name('keystore-location')})")
        if self.client_auth not in CLIENT_AUTH:
            raise TlsConfigError(f"{self._name('client-auth')} must be one of {', '.join(CLIENT_AUTH)}, not {self.client_auth!r}")
        if self.client_auth != "none" and not self.ca and not self.truststore:
            raise TlsConfigError(
                f"{self._name('client-auth')} {self.client_auth} needs {self._name('ca')} or {self._name('truststore-location')} (the CA that signs client certificates)"
            )
        for what, t in (("keystore-type", self.keystore_type), ("truststore-type", self.truststore_type)):
            if t and t.upper() not in STORE_TYPES:
                hint = " (convert a JKS store: keytool -importkeystore -srckeystore F.jks -destkeystore F.p12 -deststoretype PKCS12)" if t.upper() == "JKS" else ""
                raise TlsConfigError(f"{self._name(what)} must be PKCS12 or PEM, not {t!r}{hint}")
        for what, path in (("cert", self.cert), ("key", self.key), ("ca", self.ca), ("keystore-location", self.keystore), ("truststore-location", self.truststore)):
            if path and not os.path.isfile(path):
                raise TlsConfigError(f"{self._name(what)} {path}: no such file")
        try:
            server_context(self)
        except TlsConfigError:
            raise
        except (OSError, ssl.SSLError, ValueError, TypeError) as e:
            raise TlsConfigError(f"the TLS settings cannot be loaded: {e}") from None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert, self.key, self.ca, self.keystore, self.truststore) if p)


def store_type(path: str, declared: str) -> str:
    """PKCS12 or PEM: as declared, else from the file (a PEM file is text starting "-----BEGIN")."""
    if declared:
        return declared.upper()
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return "PEM" if head.startswith(b"-----BEGIN") else "PKCS12"


def _read_pkcs12(path: str, password: str, what: str):
    from cryptography.hazmat.primitives.serialization import pkcs12

    with open(path, "rb") as f:
        data = f.read()
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError:
        raise TlsConfigError(f"{what} {path}: not a PKCS#12 store, or the password does not open it") from None


def _pem_key_error(path: str, password: str, what: str) -> TlsConfigError | None:
    """A readable reason when a PEM private key does not load (OpenSSL only says 'PEM lib')."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        with open(path, "rb") as f:
            data = f.read()
        load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        if password:
            return TlsConfigError(f"{what} {path}: the key is not encrypted, but a key password was given")
        return TlsConfigError(f"{what} {path}: the key is encrypted: give its password (--ssl-key-password or $KAFSCALE_SSL_KEY_PASSWORD)")
    except ValueError:
        if password:
            return TlsConfigError(f"{what} {path}: the key password does not decrypt the key")
        return TlsConfigError(f"{what} {path}: no PEM private key in it")
    except OSError:
        return None
    return None


def _load_pem_identity(ctx: ssl.SSLContext, cert: str, key: str | None, password: str, what: str) -> None:
    def no_password():
        raise TlsConfigError(f"{what} {key or cert}: the key is encrypted: give its password (--ssl-key-password or $KAFSCALE_SSL_KEY_PASSWORD)")

    # Never let OpenSSL prompt on the terminal for a missing password: the callback refuses.
    try:
        ctx.load_cert_chain(cert, key, password=password or no_password)
    except ssl.SSLError as e:
        better = _pem_key_error(key or cert, password, what)
        if better is not None:
            raise better from None
        raise TlsConfigError(f"{what}: {e}") from None


def _load_pkcs12_identity(ctx: ssl.SSLContext, path: str, password: str) -> None:
    """The key and certificate chain of a PKCS#12 keystore, handed to OpenSSL through an
    in-memory file (memfd) with the key encrypted under a one-time random password, so the
    key never reaches a disk in clear."""
    import secrets

    from cryptography.hazmat.primitives import serialization

    store = _read_pkcs12(path, password, "--ssl-keystore-location")
    if store.key is None or store.cert is None:
        raise TlsConfigError(f"--ssl-keystore-location {path}: no private key with a certificate in the store")
    once = secrets.token_urlsafe(32)
    pem = store.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(once.encode())
    ) + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [store.cert.certificate, *(x.certificate for x in store.additional_certs)])
    with _memory_file(pem) as name:
        ctx.load_cert_chain(name, password=once)


class _memory_file:
    """A file name OpenSSL can open whose bytes live only in memory (Linux memfd), or a
    private temporary file elsewhere; gone when the block ends."""

    def __init__(self, data: bytes):
        self.data = data
        self.fd = -1
        self.path = ""

    def __enter__(self) -> str:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("kafscale-tls", os.MFD_CLOEXEC)
            os.write(self.fd, self.data)
            return f"/proc/self/fd/{self.fd}"
        import tempfile

        self.fd, self.path = tempfile.mkstemp(prefix="kafscale-tls-")
        os.write(self.fd, self.data)
        return self.path

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
        if self.path:
            os.unlink(self.path)


def load_identity(ctx: ssl.SSLContext, settings: TlsSettings) -> None:
    """The certificate chain and private key of `settings` into `ctx`."""
    if settings.keystore:
        if store_type(settings.keystore, settings.keystore_type) == "PKCS12":
            _load_pkcs12_identity(ctx, settings.keystore, settings.keystore_password or settings.key_password)
        else:  # Kafka's PEM keystore: one file with the key and the certificate chain
            _load_pem_identity(ctx, settings.keystore, None, settings.key_password, "--ssl-keystore-location")
    else:
        _load_pem_identity(ctx, settings.cert, settings.key, settings.key_password, "--ssl-key")


def load_trust(ctx: ssl.SSLContext, settings: TlsSettings) -> bool:
    """The CA certificates of `settings` into `ctx`; False when there are none."""
    if settings.ca:
        ctx.load_verify_locations(cafile=settings.ca)
    if settings.truststore:
        if store_type(settings.truststore, settings.truststore_type) == "PEM":
            ctx.load_verify_locations(cafile=settings.truststore)
        else:
            from cryptography.hazmat.primitives import serialization

            store = _read_pkcs12(settings.truststore, settings.truststore_password, "--ssl-truststore-location")
            found = ([store.cert] if store.cert is not None else []) + list(store.additional_certs)
            if not found:
                raise TlsConfigError(f"--ssl-truststore-location {settings.truststore}: no certificates in the store")
            ctx.load_verify_locations(cadata="".join(c.certificate.public_bytes(serialization.Encoding.PEM).decode() for c in found))
    return bool(settings.ca or settings.truststore)


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server-side context: TLS 1.2+, the certificate chain and key, and the CA for
    client certificates when client authentication is on. Raises ssl.SSLError / OSError /
    ValueError (TlsConfigError)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if settings.ciphers:
        ctx.set_ciphers(settings.ciphers)
    load_identity(ctx, settings)
    load_trust(ctx, settings)
    ctx.verify_mode = CLIENT_AUTH[settings.client_auth]
    return ctx


def _signature(paths: tuple[str, ...]) -> tuple:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((p, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((p, None))
    return tuple(out)


class ReloadingContext:
    """The context for a TLS listener, swapped for a new one when its files change."""

    def __init__(self, settings: TlsSettings):
        settings.check()
        self.settings = settings
        self.base = server_context(settings)
        self.current = self.base
        self._seen = _signature(settings.files)
        self.reloads = 0
        self.reload_failures = 0
        self.base.sni_callback = self._select

    def _select(self, ssl_object, _server_name, _ctx) -> None:
        current = self.current
        if current is not self.base:
            ssl_object.context = current
        return None

    def check(self) -> bool:
        """Reload if a file changed since the last look; True when a new context is in use."""
        seen = _signature(self.settings.files)
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            ctx = server_context(self.settings)
        except (OSError, ssl.SSLError, ValueError) as e:
            self.reload_failures += 1
            log.error("TLS files changed but cannot be loaded, keeping the previous certificate: %s", e)
            return False
        # The swap target must itself carry no callback: the base's callback picks it.
        self.current = ctx
        self.reloads += 1
        log.info("TLS certificate, key and CA reloaded from %s", ", ".join(self.settings.files))
        return True


# -- per-listener settings (Kafka's listener.name.<name>.ssl.*) ------------------------------

# --listener-ssl keys -> TlsSettings fields, in three groups: a listener that sets any key of
# a group takes none of that group from the --ssl-* settings (a listener's certificate never
# pairs with the global key); the groups it does not touch are inherited.
_IDENTITY = {"cert": "cert", "key": "key", "key-password": "key_password", "keystore-location": "keystore",
             "keystore-password": "keystore_password", "keystore-type": "keystore_type"}
_TRUST = {"ca": "ca", "truststore-location": "truststore", "truststore-password": "truststore_password", "truststore-type": "truststore_type"}
_OTHER = {"client-auth": "client_auth", "cipher-suites": "ciphers"}
LISTENER_KEYS = {**_IDENTITY, **_TRUST, **_OTHER}
_PASSWORDS = ("key-password", "keystore-password", "truststore-password")
# Not a TLS context setting: how this listener's client certificates become principals
# (Kafka's listener.name.<name>.ssl.principal.mapping.rules); written last in an entry,
# since its value is a comma-separated list.
PRINCIPAL_RULES = "principal-mapping-rules"


def password_env(listener: str, key: str) -> str:
    """The variable a listener's password may come from: KAFSCALE_LISTENER_<NAME>_SSL_KEY_PASSWORD, ..."""
    name = "".join(c if c.isalnum() else "_" for c in listener.upper())
    return f"KAFSCALE_LISTENER_{name}_SSL_{key.upper().replace('-', '_')}"


def parse_listener_ssl(text: str) -> dict[str, dict[str, str]]:
    """`NAME:key=value,key=value;NAME2:...` -> {NAME: {key: value}}. Keys are LISTENER_KEYS,
    also in Kafka's spelling (`ssl.client.auth`, `ssl.keystore.location`). A listener named
    twice has its entries merged (the flag may be repeated)."""
    out: dict[str, dict[str, str]] = {}
    for entry in (e.strip() for e in (text or "").replace("\n", ";").split(";")):
        if not entry:
            continue
        name, sep, rest = entry.partition(":")
        name = name.strip().upper()
        if not sep or not name or not rest.strip():
            raise TlsConfigError(f"--listener-ssl entry {entry!r} is not NAME:key=value,...")
        settings = out.setdefault(name, {})
        last = None
        for item in (i.strip() for i in rest.split(",")):
            if not item:
                continue
            key, eq, value = item.partition("=")
            key = key.strip().lower().removeprefix("ssl.").replace(".", "-")
            key = {"cipher-suite": "cipher-suites", "keystore": "keystore-location", "truststore": "truststore-location"}.get(key, key)
            if eq and (key in LISTENER_KEYS or key == PRINCIPAL_RULES):
                settings[key] = value.strip()
                last = key
            elif last == PRINCIPAL_RULES:  # the rules are a comma-separated list themselves
                settings[last] += "," + item
            else:
                raise TlsConfigError(f"--listener-ssl {name}: {item.partition('=')[0]!r} is not one of {', '.join([*LISTENER_KEYS, PRINCIPAL_RULES])}")
    return out


def listener_settings(base: TlsSettings, overrides: dict[str, str], listener: str, environ: dict[str, str]) -> TlsSettings:
    """The TLS settings of one listener: its --listener-ssl keys (passwords also from
    password_env()), the groups it does not set taken from `base` (the --ssl-* settings)."""
    given = {k: v for k, v in overrides.items() if k != PRINCIPAL_RULES}
    for key in _PASSWORDS:
        if key not in given and environ.get(password_env(listener, key)):
            given[key] = environ[password_env(listener, key)]
    changes: dict[str, str] = {}
    for group in (_IDENTITY, _TRUST, _OTHER):
        if group is _OTHER:
            changes.update({group[k]: v for k, v in given.items() if k in group})
        elif any(k in given for k in group if k not in _PASSWORDS):
            changes.update({field_name: given.get(k, "") for k, field_name in group.items()})
        else:  # only a password of the group given: it goes with the inherited files
            changes.update({group[k]: given[k] for k in _PASSWORDS if k in given and k in group})
    if "client_auth" in changes:
        changes["client_auth"] = changes["client_auth"].lower()
    return dataclasses.replace(base, flag=f"--listener-ssl {listener}:", **changes)
