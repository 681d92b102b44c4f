"""Checks run over every version of an API the broker serves, failures reported together
with the broker's recent errors."""

from __future__ import annotations


def api_range(api_key: int) -> tuple[int, int]:
    """The versions of `api_key` the broker serves and kio encodes (old versions: test_old_versions.py)."""
    from kafscale.broker.router import build_router
    from kafscale.protocol.codec import kio_versions

    a = build_router().apis[api_key]
    return max(a.min_version, kio_versions(api_key)[0]), a.max_version


def broker_log_errors(b, lines: int = 6) -> str:
    """The last distinct ERROR / connection-closing lines of a broker's log."""
    seen, out = set(), []
    for line in reversed(b.log_text().splitlines()):
        if ("ERROR" in line or "closing connection" in line or line.startswith("TypeError")) and line[24:] not in seen:
            seen.add(line[24:])
            out.append(line)
            if len(out) == lines:
                break
    return "\n".join(reversed(out))


def each_version(versions, check, b=None, what: str = "") -> None:
    """Run check(v) for every version; report every failing version at once (with the
    broker's recent errors, when a broker is given)."""
    failures = {}
    for v in versions:
        try:
            check(v)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failures[v] = repr(e)[:200]
    log = f"\nbroker log:\n{broker_log_errors(b)}" if failures and b is not None else ""
    assert not failures, f"{what}failing versions: {failures}{log}"
