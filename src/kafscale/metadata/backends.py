"""The KV backend for a metadata URL: the one place that picks one."""

from __future__ import annotations

from pathlib import Path

from kafscale.metadata.kv import KV
from kafscale.metadata.sqlite import SqliteKV
from kafscale.metadata.url import SQLITE, MetadataURL


def open_kv(url: MetadataURL | str | None, data_dir: str | Path, prefix: str = "/kafscale", timeout_s: float = 5.0) -> KV:
    """KV backend for a `--metadata` URL: None/`embedded` (SQLite in data dir), `sqlite:///file` or `etcd://...`
    (each call within `timeout_s`, failover and retries included)."""
    if not isinstance(url, MetadataURL):
        url = MetadataURL.parse(url)
    if url.is_etcd:
        # Imported only here: grpc costs a noticeable start-up time that embedded brokers skip.
        from kafscale.metadata.etcd import EtcdKV

        return EtcdKV.from_url(url, prefix=prefix, op_timeout=timeout_s)
    if url.scheme == SQLITE:
        return SqliteKV(url.path)
    return SqliteKV(Path(data_dir) / "metadata.sqlite")
