"""The storage layer's one error type, and how store failures become retriable Kafka errors."""

from __future__ import annotations

import sqlite3

from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata.kv import MetadataUnavailable
from kafscale.metadata.store import ConflictError
from kafscale.storage.objectstore import ObjectStoreError


class StorageError(KafkaError):
    """A partition log refusing a request; KAFKA_STORAGE_ERROR unless told otherwise."""

    def __init__(self, message: str, error_code: ErrorCode = ErrorCode.kafka_storage_error):
        super().__init__(error_code, message)


# What the metadata and object stores raise when they fail or someone else changed the state
# first; store_failure() turns each into the StorageError a client retries on.
STORE_FAILURES = (MetadataUnavailable, ConflictError, ObjectStoreError, sqlite3.Error)


def store_failure(error: BaseException, what: str) -> StorageError:
    """The retriable Kafka error for a store failure while doing `what`: a concurrent change
    of the partition (its ownership moved) is NOT_LEADER_OR_FOLLOWER, so the client asks
    for the owner again; an unreachable or failing store is KAFKA_STORAGE_ERROR, which
    clients retry after refreshing their metadata."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, ConflictError):
        return StorageError(f"{what}: changed concurrently (ownership moved?): {error}", ErrorCode.not_leader_or_follower)
    if isinstance(error, ObjectStoreError):
        return StorageError(f"{what}: object store unavailable: {error}", ErrorCode.kafka_storage_error)
    return StorageError(f"{what}: metadata unavailable: {error}", ErrorCode.kafka_storage_error)
