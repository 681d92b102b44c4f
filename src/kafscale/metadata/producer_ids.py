"""Producer ids for idempotent (and later transactional) producers, unique across brokers.

Ids come in blocks reserved in the metadata store, so a broker hands out a thousand ids per
store round trip and two brokers never hand out the same one.
"""

from __future__ import annotations

import asyncio

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    """Hands out ids from a reserved block; reserves the next block when it runs out."""

    def __init__(self, metadata, block_size: int = BLOCK_SIZE):
        self.metadata = metadata
        self.block_size = block_size
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def allocate(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                self._next = await self.metadata.allocate_producer_ids(self.block_size)
                self._end = self._next + self.block_size
            pid = self._next
            self._next += 1
            return pid
