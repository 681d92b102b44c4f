"""Who may use the console: a users file of scrypt password hashes, sessions kept in the
console's memory (a random id in an HttpOnly, SameSite=Strict cookie, Secure over HTTPS),
and a CSRF token per session that every mutating request must carry.

Users file: one `NAME:scrypt$N$r$p$SALT$HASH` line per user (base64 salt and hash; '#'
comments). `kafscale console --auth FILE --add-user NAME` writes such a line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
SESSION_TTL_S = 12 * 3600
COOKIE = "kafscale_console"
ANONYMOUS = "anonymous"  # the user of a console started without --auth


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def check_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        want = base64.b64decode(digest)
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(want))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, want)


def load_users(path: str) -> dict[str, str]:
    users = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, stored = line.partition(":")
            if not sep or not name or not stored.startswith("scrypt$"):
                raise ValueError(f"{path}:{lineno}: not NAME:scrypt$... (write users with --add-user)")
            users[name] = stored
    return users


def add_user(path: str, name: str, password: str) -> None:
    """Add or replace `name` in the users file (created if missing)."""
    if not name or ":" in name or not name.isprintable():
        raise ValueError(f"not a usable user name: {name!r}")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f.read().splitlines() if ln.partition(":")[0] != name]
    except FileNotFoundError:
        lines = []
    lines.append(f"{name}:{hash_password(password)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


@dataclass
class Session:
    user: str | None  # None: not logged in yet (still has a CSRF token for the login form)
    csrf: str
    expires: float


class Sessions:
    def __init__(self, users: dict[str, str] | None):
        self.users = users  # None: no login (local use)
        self._by_id: dict[str, Session] = {}

    @property
    def required(self) -> bool:
        return self.users is not None

    def get(self, sid: str | None) -> Session | None:
        s = self._by_id.get(sid or "")
        if s is not None and s.expires < time.time():
            del self._by_id[sid]
            return None
        return s

    def new(self, user: str | None) -> tuple[str, Session]:
        now = time.time()
        for sid in [k for k, s in self._by_id.items() if s.expires < now]:
            del self._by_id[sid]
        sid = secrets.token_urlsafe(32)
        s = Session(user if self.required else ANONYMOUS, secrets.token_urlsafe(32), now + SESSION_TTL_S)
        self._by_id[sid] = s
        return sid, s

    def login(self, name: str, password: str) -> bool:
        stored = (self.users or {}).get(name)
        # Hash even for an unknown name: the answer takes as long either way.
        ok = check_password(password, stored or hash_password("x"))
        return ok and stored is not None

    def drop(self, sid: str | None) -> None:
        self._by_id.pop(sid or "", None)


def csrf_ok(session: Session | None, token: str | None) -> bool:
    return session is not None and bool(token) and hmac.compare_digest(session.csrf, token)
