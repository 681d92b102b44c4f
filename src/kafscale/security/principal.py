"""Principals: who a connection is, as Kafka names it (`User:alice`).

- No authentication: `User:ANONYMOUS`.
- TLS client certificate: the subject's distinguished name in RFC 2253/4514 form, most
  specific part first (`CN=alice,OU=eng,O=acme,C=DE`), as Java's X500Principal.getName()
  gives it, then Kafka's `ssl.principal.mapping.rules` (`--ssl-principal-mapping-rules`):
  a comma separated list of `DEFAULT` (the name unchanged) and
  `RULE:pattern/replacement/[LU]` (the first rule whose pattern matches the whole name
  wins; `$1` in the replacement is a group; L/U lower/upper-case the result).
- SASL: the authenticated user name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"
USER = "User"


class PrincipalMappingError(ValueError):
    """Mapping rules that cannot be parsed, or a name no rule applies to."""


def user(name: str) -> str:
    return f"{USER}:{name}"


@dataclass(frozen=True, slots=True)
class Rule:
    pattern: re.Pattern | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if not self.pattern.fullmatch(name):
            return None
        out = self.pattern.sub(self.replacement, name)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


def _java_replacement(text: str) -> str:
    # Java's $1 / ${name} become Python's \g<1> / \g<name>; a literal backslash stays one.
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(re.escape(text[i + 1]) if text[i + 1] != "\\" else "\\\\")
            i += 2
        elif c == "$" and i + 1 < len(text) and text[i + 1].isdigit():
            j = i + 1
            while j < len(text) and text[j].isdigit():
                j += 1
            out.append(f"\\g<{text[i + 1:j]}>")
            i = j
        elif c == "$" and text[i + 1 : i + 2] == "{":
            j = text.index("}", i)
            out.append(f"\\g<{text[i + 2:j]}>")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _until_slash(text: str, i: int) -> tuple[str, int]:
    """The part up to the next unescaped '/', and the index after that slash."""
    out = []
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i : i + 2] if text[i + 1] != "/" else "/")
            i += 2
            continue
        if c == "/":
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise PrincipalMappingError(f"unterminated rule in {text!r}")


def parse_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    i, n = 0, len(text or "")
    text = text or ""
    while i < n:
        if text[i] in " ,\t\n":
            i += 1
            continue
        if text.startswith("DEFAULT", i):
            rules.append(Rule(None))
            i += len("DEFAULT")
        elif text.startswith("RULE:", i):
            pattern, i = _until_slash(text, i + len("RULE:"))
            replacement, i = _until_slash(text, i)
            case = ""
            if i < n and text[i] in "LU":
                case, i = text[i], i + 1
            try:
                rules.append(Rule(re.compile(pattern), _java_replacement(replacement), case))
            except re.error as e:
                raise PrincipalMappingError(f"bad pattern {pattern!r} in principal mapping rule: {e}") from None
        else:
            raise PrincipalMappingError(f"principal mapping rules: expected DEFAULT or RULE: at {text[i:]!r}")
        while i < n and text[i] == " ":
            i += 1
        if i < n and text[i] != ",":
            raise PrincipalMappingError(f"principal mapping rules: expected ',' at {text[i:]!r}")
    return rules or [Rule(None)]


def map_name(distinguished_name: str, rules: list[Rule]) -> str:
    for rule in rules:
        out = rule.apply(distinguished_name)
        if out is not None:
            return out
    raise PrincipalMappingError(f"no principal mapping rule applies to {distinguished_name!r}")


def certificate_subject(der: bytes) -> str:
    """The subject of a DER certificate as an RFC 4514 string (most specific part first)."""
    from cryptography import x509

    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def from_certificate(der: bytes | None, rules: list[Rule]) -> str:
    """`User:<mapped subject>`, or User:ANONYMOUS without a client certificate."""
    if not der:
        return ANONYMOUS
    return user(map_name(certificate_subject(der), rules))
