"""A group's writes to the metadata store, batched and off the group's lock.

Apache Kafka's group coordinator applies a request to the group in memory, appends the
records of the change to `__consumer_offsets` and answers once they are committed, without
holding anything while it waits; the next request sees the new state at once, and many
changes go out in one batch. The same here: a request changes the group under its lock
(CPU only), queues what must be stored (`offsets`, or `doc()`: the group document is due),
releases the lock and waits for its `ticket`. One flush at a time per group writes
everything queued since the last one (the offsets, and the group document as it is when
the flush starts) in one store transaction, so the store sees a group's changes in order
and a burst of commits and heartbeats costs one write instead of one each. A request is
answered only once what it changed is stored: nothing acknowledged is lost to a failover.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata.store import CommittedOffset

# flush(offsets, doc_due) -> None: store the offsets and, when `doc_due`, the group's document
Flush = Callable[[dict[tuple[str, int], CommittedOffset], bool], Awaitable[None]]


class GroupWriter:
    def __init__(self, flush: Flush):
        self._flush = flush
        self._offsets: dict[tuple[str, int], CommittedOffset] = {}
        self._doc_due = False
        self._queued = 0  # ticket of the latest queued change
        self._stored = 0  # every ticket up to this one is settled
        self._flushing = 0  # the ticket the running flush stores up to (0: none running)
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    def offsets(self, offsets: dict[tuple[str, int], CommittedOffset]) -> asyncio.Future:
        """Queue committed offsets (a later commit of a partition replaces an earlier one);
        a future of their write, failing as it failed."""
        self._offsets.update(offsets)
        return self._waiter(self._queue())

    def doc(self) -> int:
        """The group document changed: store it with the next flush. The ticket to `wait`
        for (the flush logs a failure to store it; the group works on from memory)."""
        self._doc_due = True
        return self._queue()

    def pending(self) -> int | None:
        """The ticket of the latest change not stored yet (None: all stored)."""
        return self._queued if self._queued > self._stored else None

    async def wait(self, ticket: int | None) -> None:
        """Until the change of `ticket` is stored (NOT_COORDINATOR if it never will be; a
        failure to store the document was logged by the flush, and the group works on from
        memory, as it always did)."""
        if ticket is not None and ticket > self._stored:
            try:
                await self._waiter(ticket)
            except KafkaError:
                raise
            except Exception:  # noqa: BLE001 - see above
                pass

    async def drain(self) -> None:
        """Until everything queued is stored or settled."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def abandon(self) -> None:
        """This broker no longer coordinates the group: what is queued is not written and
        its waiters get NOT_COORDINATOR (a flush under way completes)."""
        self._offsets.clear()
        self._doc_due = False
        error = KafkaError(ErrorCode.not_coordinator, "the group moved to another coordinator")
        self._settle(self._queued, error, after=self._flushing or self._stored)
        if self._task is None:
            self._stored = self._queued

    def _waiter(self, ticket: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((ticket, fut))
        return fut

    def _queue(self) -> int:
        self._queued += 1
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return self._queued

    async def _run(self) -> None:
        try:
            while self._queued > self._stored:
                self._flushing = upto = self._queued
                offsets, self._offsets = self._offsets, {}
                doc_due, self._doc_due = self._doc_due, False
                error = None
                if offsets or doc_due:
                    try:
                        await self._flush(offsets, doc_due)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - the offsets' committers get it
                        error = e
                        self._doc_due = self._doc_due or doc_due  # the document goes with the next flush
                self._settle(upto, error)
                self._stored = upto
        finally:
            self._task, self._flushing = None, 0
            if self._queued > self._stored:  # cancelled: the coordinator stops
                self._settle(self._queued, KafkaError(ErrorCode.not_coordinator, "the coordinator is stopping"))
                self._stored = self._queued

    def _settle(self, upto: int, error: BaseException | None, after: int = 0) -> None:
        """Answer the waiters of tickets in (after, upto]."""
        keep = []
        for ticket, fut in self._waiters:
            if not after < ticket <= upto:
                keep.append((ticket, fut))
            elif not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
        self._waiters = keep
