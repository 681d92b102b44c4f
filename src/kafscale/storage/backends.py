"""The object-store backend for a storage URL: the one place that picks one."""

from __future__ import annotations

from kafscale.storage.local_store import LocalObjectStore
from kafscale.storage.objectstore import ObjectStore
from kafscale.storage.url import StorageURL


def open_store(url: StorageURL | str) -> ObjectStore:
    """Object store for a storage URL: `file:///path` (or a plain path) or `s3://bucket/prefix`."""
    if isinstance(url, str):
        url = StorageURL.parse(url)
    if url.is_s3:
        # Imported only here: aiobotocore costs a noticeable start-up time, which brokers,
        # tools and Spark tasks on a local directory skip.
        from kafscale.storage.s3 import S3ObjectStore

        return S3ObjectStore.from_url(url)
    return LocalObjectStore(url.location)
