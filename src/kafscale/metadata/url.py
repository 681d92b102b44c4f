"""MetadataURL: the `--metadata` URL, parsed once where the config is read.

`embedded` (or nothing) is SQLite in the data directory, `sqlite:///path` a given SQLite
file (the pipeline reading a broker's embedded store), `etcd://host:port[,host:port]` an
etcd cluster (a trailing path is ignored; a host without a port gets 2379).
"""

from __future__ import annotations

from dataclasses import dataclass

EMBEDDED, SQLITE, ETCD = "embedded", "sqlite", "etcd"


@dataclass(frozen=True, slots=True)
class MetadataURL:
    scheme: str  # EMBEDDED, SQLITE or ETCD
    path: str = ""  # SQLITE: the file
    endpoints: tuple[str, ...] = ()  # ETCD: host:port each
    text: str = EMBEDDED  # as given

    @classmethod
    def parse(cls, text: str | None) -> "MetadataURL":
        """Raises ValueError for anything else."""
        if text and text.startswith("etcd://"):
            return cls(ETCD, endpoints=_etcd_endpoints(text[len("etcd://") :]), text=text)
        if text and text.startswith("sqlite://"):
            return cls(SQLITE, path=text[len("sqlite://") :], text=text)
        if text not in (None, "", EMBEDDED):
            raise ValueError(f"unsupported metadata URL {text!r} (use embedded or etcd://host:port)")
        return cls(EMBEDDED, text=text or EMBEDDED)

    @property
    def is_etcd(self) -> bool:
        return self.scheme == ETCD

    def __str__(self) -> str:
        return self.text


def _etcd_endpoints(rest: str) -> tuple[str, ...]:
    endpoints = []
    for hp in rest.split("/", 1)[0].split(","):
        hp = hp.strip()
        if not hp:
            continue
        if ":" not in hp.rsplit("]", 1)[-1]:
            hp += ":2379"
        endpoints.append(hp)
    return tuple(endpoints)
