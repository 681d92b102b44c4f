"""Kafka-style listeners: `NAME://HOST:PORT,...`, advertised listeners and the map from
listener name to security protocol (Kafka's `listeners`, `advertised.listeners`,
`listener.security.protocol.map`). Pure parsing, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Kafka's default map: each standard name stands for the protocol of the same name.
DEFAULT_PROTOCOL_MAP = {p: p for p in PROTOCOLS}


class ListenerError(ValueError):
    """A listener setting that cannot be used (the broker refuses to start)."""


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # upper case, as Kafka normalises listener names
    host: str  # "" means every interface
    port: int
    protocol: str = "PLAINTEXT"

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str) -> dict[str, str]:
    """`NAME:PROTOCOL,...` on top of Kafka's default map (the standard names map to themselves)."""
    out = dict(DEFAULT_PROTOCOL_MAP)
    for item in _items(text):
        name, sep, proto = item.partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not name or not proto:
            raise ListenerError(f"listener security protocol map entry {item!r} is not NAME:PROTOCOL")
        if proto not in PROTOCOLS:
            raise ListenerError(f"unknown security protocol {proto!r} for listener {name} (one of {', '.join(PROTOCOLS)})")
        out[name] = proto
    return out


def parse_listeners(text: str, protocol_map: dict[str, str] | None = None, *, what: str = "listeners") -> list[Listener]:
    """`NAME://HOST:PORT,...` (HOST may be empty or `[v6]`); each name once, mapped to a protocol."""
    protocol_map = DEFAULT_PROTOCOL_MAP if protocol_map is None else protocol_map
    out: list[Listener] = []
    for item in _items(text):
        name, sep, rest = item.partition("://")
        name = name.strip().upper()
        if not sep or not name:
            raise ListenerError(f"{what} entry {item!r} is not NAME://HOST:PORT")
        if rest.startswith("["):
            host, close, tail = rest[1:].partition("]")
            if not close or not tail.startswith(":"):
                raise ListenerError(f"{what} entry {item!r}: bad [IPv6]:PORT")
            port_text = tail[1:]
        else:
            host, colon, port_text = rest.rpartition(":")
            if not colon:
                raise ListenerError(f"{what} entry {item!r} has no port")
        try:
            port = int(port_text)
        except ValueError:
            raise ListenerError(f"{what} entry {item!r}: port {port_text!r} is not a number") from None
        if not 0 <= port <= 65535:
            raise ListenerError(f"{what} entry {item!r}: port {port} out of range")
        if name not in protocol_map:
            raise ListenerError(f"listener {name} has no security protocol: add {name}:PROTOCOL to --listener-security-protocol-map")
        if any(l.name == name for l in out):
            raise ListenerError(f"{what}: listener name {name} appears twice")
        out.append(Listener(name, host, port, protocol_map[name]))
    return out


def resolve(listeners: str, advertised: str, protocol_map: str, listen: str, advertise: str) -> tuple[list[Listener], list[Listener]]:
    """The listeners to bind and those to advertise.

    Without `listeners`, `--listen`/`--advertise` make one PLAINTEXT listener. Without
    `advertised`, each listener is advertised as bound (as Kafka does). An advertised
    listener must name a bound one; a bound one without an advertised entry is advertised
    as bound."""
    pmap = parse_protocol_map(protocol_map)
    if not listeners.strip():
        listeners = f"PLAINTEXT://{listen}"
        if not advertised.strip():
            advertised = f"PLAINTEXT://{advertise or listen}"
    bound = parse_listeners(listeners, pmap)
    if not bound:
        raise ListenerError("no listener configured")
    names = {l.name for l in bound}
    adv = parse_listeners(advertised, pmap, what="advertised listeners") if advertised.strip() else []
    for a in adv:
        if a.name not in names:
            raise ListenerError(f"advertised listener {a.name} is not among the listeners ({', '.join(sorted(names))})")
    given = {a.name for a in adv}
    adv += [l for l in bound if l.name not in given]
    order = [l.name for l in bound]
    adv.sort(key=lambda a: order.index(a.name))
    return bound, adv


def _items(text: str) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]
