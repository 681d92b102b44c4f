"""The registry's driver: the state machine (state.py) kept equal to the `_schemas` log.

Storage. The log is the compacted topic `_schemas` (one partition) in KafScale itself,
read through the broker's own storage layer: the owned log when this broker owns the
partition, else the committed segments any broker can read from the object store (the
partition's state in the metadata store says how far they go). Every request first
catches up to the log's high watermark, so a broker answers with everything acknowledged
before the request came, without a consumer of its own.

Writes. Only the owner of `_schemas`-0 writes, as the group coordinator writes its
`__consumer_offsets` partition: other brokers forward write requests to it (rest.py;
each broker publishes its registry URL under /schema-registry/urls/ in the metadata
store). The owner decides a change under one lock after catching up, appends the records
and answers once they are durable, then applies them by reading them back. A previous
owner that has not noticed the hand-over cannot commit (the partition's leader epoch
fences it), so it never acknowledges a change. New global ids are taken from a
compare-guarded counter in the metadata store (/schema-registry/next-id), never below the
highest id in the log: two writers can never hand out one id, and an id freed by a hard
delete and compacted away is not reused.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Awaitable, Callable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata.kv import Txn
from kafscale.protocol.records import decode_records, iter_batches
from kafscale.registry import codec
from kafscale.registry.state import RegistryError, RegistryState
from kafscale.storage.failures import STORE_FAILURES, StorageError
from kafscale.storage.partition_log import read_committed

if TYPE_CHECKING:
    from kafscale.broker.router import BrokerServices

log = logging.getLogger("kafscale.registry")

SCHEMAS_TOPIC = "_schemas"  # Confluent's kafkastore.topic default
SCHEMAS_TOPIC_CONFIGS = {"cleanup.policy": "compact"}
PARTITION = 0
KV_PREFIX = "/schema-registry/"
NEXT_ID_KEY = KV_PREFIX + "next-id"
READ_CHUNK_BYTES = 1 << 20
ID_ALLOCATION_TRIES = 20


def url_key(broker_id: int) -> str:
    return f"{KV_PREFIX}urls/{broker_id}"


def store_error(e: BaseException) -> RegistryError:
    return RegistryError(500, 50001, f"Error in the backend data store: {e}")


class RegistryService:
    def __init__(self, broker: "BrokerServices", create_topic: Callable[[], Awaitable[object]]):
        self.broker = broker
        self._create_topic = create_topic  # the broker's topic creation, with `_schemas`' configs
        self._topic_known = False
        self.state = RegistryState()
        self.offset = 0  # next `_schemas` offset to apply
        self._segments: list | None = None  # the segment list last read (non-owner path); None: none yet
        self._catch_up_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()

    # -- start-up --------------------------------------------------------------------------

    async def start(self, url: str) -> None:
        """Create `_schemas` if missing and publish this broker's registry URL. A store
        that is down only delays both (the next catch-up creates the topic)."""
        try:
            await self.ensure_topic()
            await self.broker.metadata.kv.commit(Txn(puts=[(url_key(self.broker.config.broker_id), url.encode())]))
        except (RegistryError, *STORE_FAILURES) as e:
            log.warning("schema registry start-up: %s", e)

    async def ensure_topic(self) -> None:
        if self._topic_known:
            return
        try:
            if await self.broker.metadata.get_topic(SCHEMAS_TOPIC) is None:
                await self._create_topic()
                log.info("created topic %s for the schema registry", SCHEMAS_TOPIC)
        except KafkaError as e:
            if e.code != ErrorCode.topic_already_exists:  # another broker's create won the race
                raise RegistryError(500, 50001, f"cannot create {SCHEMAS_TOPIC}: {e}") from None
        except STORE_FAILURES as e:
            raise store_error(e) from None
        self._topic_known = True

    # -- reading the log -------------------------------------------------------------------

    def is_writer(self) -> bool:
        return self.broker.cluster.owns(SCHEMAS_TOPIC, PARTITION)

    async def writer_url(self) -> str | None:
        owner = self.broker.cluster.owner_of(SCHEMAS_TOPIC, PARTITION)
        if owner is None or owner < 0 or owner == self.broker.config.broker_id:
            return None
        kv = await self.broker.metadata.kv.get(url_key(owner))
        return kv.value.decode() if kv is not None else None

    async def catch_up(self) -> None:
        """Apply every `_schemas` record up to the high watermark. Raises RegistryError
        (50001) when the log cannot be read."""
        async with self._catch_up_lock:
            await self.ensure_topic()
            try:
                await self._catch_up()
            except (StorageError, *STORE_FAILURES) as e:
                raise store_error(e) from None

    async def _catch_up(self) -> None:
        logs = self.broker.logs
        if self.is_writer():
            self._segments = None
            lg = await logs.get_log(SCHEMAS_TOPIC, PARTITION)
            start, end = lg.log_start_offset, lg.high_watermark

            async def read(offset: int):
                return await lg.read(offset, READ_CHUNK_BYTES)
        else:
            md = self.broker.metadata
            st = await md.get_partition(SCHEMAS_TOPIC, PARTITION, with_segments=False)
            if st is None or (st.high_watermark <= self.offset and st.log_start_offset <= self.offset):
                return
            st = await md.get_partition(SCHEMAS_TOPIC, PARTITION)
            if self._segments is None:
                # Views cached while this broker owned the partition (or under an older
                # list) may stand for segments the owner merged or compacted since.
                logs.reader.drop(SCHEMAS_TOPIC, PARTITION)
            else:
                logs.reader.segments_changed(SCHEMAS_TOPIC, PARTITION, self._segments, st.segments)
            self._segments = list(st.segments)
            start, end = st.log_start_offset, st.high_watermark

            async def read(offset: int):
                return await read_committed(logs.reader, st, offset, READ_CHUNK_BYTES, True)
        if self.offset < start or self.offset > end:
            # Records were deleted below us (DeleteRecords) or the log is shorter than what
            # we applied (a new topic under the old name): start over from the log.
            log.info("schema registry: re-reading %s from offset %d (applied up to %d)", SCHEMAS_TOPIC, start, self.offset)
            self.state, self.offset = RegistryState(), start
        while self.offset < end:
            chunks = await read(self.offset)
            before = self.offset
            for chunk in chunks:
                self._apply_chunk(chunk)
            if self.offset == before:
                break  # nothing readable (a gap the reader passed over): next request retries

    def _apply_chunk(self, chunk) -> None:
        for pos, header in iter_batches(chunk):
            if header.last_offset < self.offset:
                continue
            if not header.is_control:
                for record in decode_records(chunk, pos, header):
                    if record.offset < self.offset:
                        continue
                    try:
                        self.state.apply(codec.decode(record.key, record.value))
                    except codec.BadRecord as e:
                        log.warning("skipping %s record at offset %d: %s", SCHEMAS_TOPIC, record.offset, e)
            self.offset = header.last_offset + 1

    async def read(self, query: Callable[[RegistryState], object]):
        """Answer `query` from a state caught up with the log."""
        await self.catch_up()
        return query(self.state)

    # -- writing ---------------------------------------------------------------------------

    async def write(self, decide: Callable[[RegistryState], Awaitable[tuple[list[codec.Record], object]]]):
        """Decide a change on the caught-up state, append its records, wait until they are
        durable and applied; return the answer. Only on the writer (rest.py forwards)."""
        async with self._write_lock:
            await self.catch_up()
            records, answer = await decide(self.state)
            if records:
                try:
                    waiter = await self.broker.logs.append_internal(SCHEMAS_TOPIC, PARTITION, [codec.encode(r) for r in records])
                    await waiter
                except (StorageError, *STORE_FAILURES) as e:
                    raise store_error(e) from None
                await self.catch_up()
            return answer

    async def allocate_id(self) -> int:
        """A global id no other writer can hand out (see the module docstring)."""
        kv = self.broker.metadata.kv
        try:
            for _ in range(ID_ALLOCATION_TRIES):
                current = await kv.get(NEXT_ID_KEY)
                stored = int(current.value) if current is not None else 1
                schema_id = max(stored, self.state.max_id + 1)
                version = current.version if current is not None else 0
                if await kv.commit(Txn(compares=[(NEXT_ID_KEY, version)], puts=[(NEXT_ID_KEY, str(schema_id + 1).encode())])):
                    return schema_id
        except STORE_FAILURES as e:
            raise store_error(e) from None
        raise RegistryError(500, 50001, "could not allocate a schema id: the id counter kept changing")

    async def register(self, subject: str, schema_type: str, text, refs: tuple, normalize: bool,
                       schema_id: int | None = None, version: int | None = None) -> dict:
        async def decide(state: RegistryState):
            plan = state.plan_register(subject, schema_type, text, refs, normalize, schema_id, version)
            if plan.existing is not None:
                return [], {"id": plan.existing.id}
            new_id = plan.id if plan.id is not None else await self.allocate_id()
            return state.register_records(plan, new_id), {"id": new_id}

        return await self.write(decide)

    async def change(self, decide_sync: Callable[[RegistryState], tuple[list[codec.Record], object]]):
        """A change decided without I/O (deletes, config, mode)."""

        async def decide(state: RegistryState):
            return decide_sync(state)

        return await self.write(decide)
