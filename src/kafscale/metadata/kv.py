"""The transactional key-value contract under the MetadataStore.

Backends implement five calls with etcd's semantics (a key's `version` is 0 when absent
and grows by one on each write); the typed MetadataStore above builds every change as one
`txn` (with compare conditions where it writes back what it read), so embedded (SQLite,
sqlite.py) and etcd (etcd.py) behave alike; `backends.open_kv` picks one for a metadata URL.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from typing import Callable


class MetadataUnavailable(IOError):
    """The metadata backend cannot be reached; callers answer a retriable Kafka error."""


class BeforeCommitFailed(Exception):
    """The blocking step of `KV.commit_after` raised (`error`): nothing was committed."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    version: int


@dataclass(slots=True)
class Txn:
    """Applied atomically if every compare holds: key's current version == expected."""

    compares: list[tuple[str, int]] = field(default_factory=list)
    puts: list[tuple[str, bytes]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    delete_prefixes: list[str] = field(default_factory=list)
    # Puts tied to a lease (etcd): deleted when the lease ends. Backends without leases
    # (embedded: one broker, nothing to fence) store them as plain puts.
    leased_puts: list[tuple[str, bytes]] = field(default_factory=list)
    lease: int = 0


class KV(abc.ABC):
    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def range(self, prefix: str) -> list[KeyValue]:
        """Every key starting with prefix, sorted by key."""

    @abc.abstractmethod
    async def commit(self, txn: Txn) -> bool:
        """Apply txn atomically; False (and nothing applied) if a compare failed."""

    async def commit_after(self, before: Callable[[], None], txn: Txn) -> bool:
        """commit(txn) once `before` has returned: a blocking step (writing and fsyncing the
        objects the txn names) that must be durable before the txn is. Raises
        BeforeCommitFailed, with nothing committed, when `before` raised. A backend with a
        commit thread of its own runs `before` beside it, with no loop hop between the step and
        the commit (sqlite.py)."""
        try:
            await asyncio.to_thread(before)
        except Exception as e:  # noqa: BLE001 - the step's failure, told apart from the commit's
            raise BeforeCommitFailed(e) from e
        return await self.commit(txn)

    async def get_many(self, keys: list[str]) -> list[KeyValue | None]:
        """Each key's record (None when absent), in the order asked. Not one consistent read:
        each key is read as of some moment during the call. Backends batch it."""
        return [await self.get(k) for k in keys]

    async def read_all(self) -> tuple[int, list[KeyValue]]:
        """(revision, every key of this store sorted by key) in ONE consistent read: what a
        metadata snapshot holds. The revision is the backend's (etcd's store revision; 0 on
        SQLite, which has none) and only labels the snapshot."""
        return 0, await self.range("")

    async def close(self) -> None:
        pass

    async def check(self) -> None:
        """Raise MetadataUnavailable when the backend is unreachable."""
        await self.get("/__health__")
