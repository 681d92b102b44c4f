"""Topic administration shared by Metadata (auto-creation), CreateTopics, DeleteTopics,
CreatePartitions and the config APIs. Errors carry the Kafka error code to answer."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Awaitable

from kafscale.errors import ErrorCode, KafkaError
from kafscale.metadata import topic_config
from kafscale.metadata.internal_topics import OFFSETS_TOPIC, is_internal, offsets_topic_configs
from kafscale.metadata.store import TopicExistsError, TopicMeta, UnknownTopicError
from kafscale.storage import topic_marker
from kafscale.storage.failures import STORE_FAILURES, StorageError

if TYPE_CHECKING:
    from kafscale.broker.router import BrokerServices

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 10_000
log = logging.getLogger("kafscale.admin")


class TopicError(KafkaError):
    """A topic administration request refused with `code`."""


# A store failing under an admin change: REQUEST_TIMED_OUT, as Kafka answers when its
# controller does not respond; clients retry (and a retried create finds the topic).
_STORE_DOWN = (*STORE_FAILURES, StorageError)


def _unavailable(error: Exception) -> TopicError:
    return TopicError(ErrorCode.request_timed_out, f"metadata store unavailable: {error}")


def check_name(name: str | None) -> None:
    if not name:
        raise TopicError(ErrorCode.invalid_topic_exception, "topic name is empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name cannot be {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name is longer than {MAX_NAME_LENGTH} characters")
    if not _LEGAL.match(name):
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'")


async def create(broker: "BrokerServices", name: str, partitions: int, configs: dict[str, str], *, replication_factor: int = -1, validate_only: bool = False) -> TopicMeta:
    check_name(name)
    if partitions == -1:
        partitions = broker.config.default_partitions
    if partitions <= 0 or partitions > MAX_PARTITIONS:
        raise TopicError(ErrorCode.invalid_partitions, f"number of partitions must be between 1 and {MAX_PARTITIONS}")
    if replication_factor not in (-1, 1, 2, 3):
        # Durability comes from the object store; any usual factor is accepted and ignored.
        raise TopicError(ErrorCode.invalid_replication_factor, "replication factor must be -1 or 1-3")
    try:
        configs = topic_config.normalize(configs, broker.config.kafka_static_configs())
    except topic_config.InvalidConfigError as e:
        raise TopicError(ErrorCode.invalid_config, str(e)) from None
    meta = TopicMeta(name=name, partitions=partitions, configs={k: v for k, v in configs.items() if v is not None})
    try:
        if await broker.metadata.get_topic(name) is not None:
            raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        await _clear_prefix(broker, name, dry_run=validate_only)
        if validate_only:
            return meta
        await broker.metadata.create_topic(meta)
    except TopicExistsError:
        raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists") from None
    except _STORE_DOWN as e:
        raise _unavailable(e) from None
    await _mark_created(broker, meta)
    broker.logs.topic_changed(meta)
    return meta


async def _clear_prefix(broker: "BrokerServices", name: str, dry_run: bool) -> None:
    """No new topic adopts objects of an earlier topic of its name (Kafka's topic ids exist
    for this): an interrupted deletion's leftovers go, anything else refuses the create.
    TopicExistsError when the objects are those of the topic another broker just created
    (its marker came after our look at the metadata store)."""
    try:
        await topic_marker.clear_for_create(broker.store, broker.config.namespace, name, dry_run=dry_run)
    except topic_marker.ForeignObjectsError as e:
        if await broker.metadata.get_topic(name) is not None:
            raise TopicExistsError(name) from None
        log.error("refusing to create topic %s: %s", name, e)
        raise TopicError(ErrorCode.policy_violation, str(e)) from None


async def _mark_created(broker: "BrokerServices", meta: TopicMeta) -> None:
    """The new topic's marker, before the create is answered. Without it the create is
    undone (as far as the store lets) and answered as a store failure: the client retries."""
    try:
        await topic_marker.write_marker(broker.store, broker.config.namespace, topic_marker.TopicMarker.of(meta))
    except _STORE_DOWN as e:
        log.warning("topic %s: writing its marker failed, undoing the create: %s", meta.name, e)
        try:
            await broker.metadata.delete_topic(meta.name, topic_id=meta.topic_id)
        except (UnknownTopicError, *_STORE_DOWN) as undo:
            log.warning("topic %s: undoing the create failed (its marker comes at the next broker start): %s", meta.name, undo)
        raise _unavailable(e) from None


async def _mark_changed(broker: "BrokerServices", meta: TopicMeta) -> None:
    """The marker follows a change of partitions or configs; the change stands if this
    fails (the marker is a copy; brokers bring stale ones up to date at start)."""
    try:
        await topic_marker.write_marker(broker.store, broker.config.namespace, topic_marker.TopicMarker.of(meta))
    except _STORE_DOWN as e:
        log.warning("topic %s changed, but rewriting its marker failed: %s", meta.name, e)


async def sync_markers(broker: "BrokerServices") -> None:
    """At broker start: markers for topics created before markers existed (or whose marker
    write failed), stale ones rewritten. A store that is down only delays it to the next start."""
    try:
        counts = await topic_marker.sync_markers(
            broker.store, broker.config.namespace, await broker.metadata.list_topics(), broker.metadata.get_topic
        )
    except _STORE_DOWN as e:
        log.warning("could not check the topic markers: %s", e)
        return
    if counts["written"] or counts["updated"]:
        log.info("topic markers: %d written, %d brought up to date", counts["written"], counts["updated"])


async def ensure_internal_topics(broker: "BrokerServices") -> TopicMeta | None:
    """Create `__consumer_offsets` if it does not exist yet, with Kafka's configs for it
    (--offsets-topic-num-partitions, compacted, --offsets-topic-segment-bytes). Brokers
    starting together race on one guarded create: one wins, the others find it. A store
    that is down only delays it (a later Metadata request for it, or the next start,
    creates it); groups work meanwhile, without their records in the topic."""
    try:
        meta = await broker.metadata.get_topic(OFFSETS_TOPIC)
        if meta is None:
            configs = offsets_topic_configs(broker.config.offsets_topic_segment_bytes)
            meta = TopicMeta(name=OFFSETS_TOPIC, partitions=broker.config.offsets_topic_num_partitions, configs=configs)
            try:
                await _clear_prefix(broker, OFFSETS_TOPIC, dry_run=False)
                await broker.metadata.create_topic(meta)
                log.info("created internal topic %s with %d partitions", OFFSETS_TOPIC, meta.partitions)
                await _changed(broker, meta)
            except TopicExistsError:
                meta = await broker.metadata.get_topic(OFFSETS_TOPIC)
    except _STORE_DOWN as e:
        log.warning("could not create %s: %s", OFFSETS_TOPIC, e)
        return None
    except TopicError:
        return None  # objects of an earlier __consumer_offsets are in the way (logged)
    if meta is not None:
        broker.cluster.offsets_topic_seen(meta.partitions)
    return meta


def check_not_internal(name: str, what: str) -> None:
    """Refuse an administrative change of an internal topic (INVALID_TOPIC_EXCEPTION, the
    code Kafka gives appends and DeleteRecords on internal topics)."""
    if is_internal(name):
        raise TopicError(ErrorCode.invalid_topic_exception, f"Cannot {what} internal topic {name}")


async def delete(broker: "BrokerServices", name: str) -> TopicMeta:
    check_not_internal(name, "delete")
    try:
        meta = await broker.metadata.get_topic(name)
        if meta is None:
            raise UnknownTopicError(name)
        # Marked deleted first: a deletion cut short is known as one, and the next create
        # of the name removes what it left.
        await topic_marker.mark_deleted(broker.store, broker.config.namespace, meta)
    except UnknownTopicError:
        raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist") from None
    except _STORE_DOWN as e:
        raise _unavailable(e) from None
    try:
        meta = await broker.metadata.delete_topic(name, topic_id=meta.topic_id)
    except (UnknownTopicError, *_STORE_DOWN) as e:
        await _mark_changed(broker, meta)  # not deleted after all
        if isinstance(e, UnknownTopicError):
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist") from None
        raise _unavailable(e) from None
    try:
        await broker.logs.drop_topic(name, meta.topic_id)
    except _STORE_DOWN as e:
        # The topic is gone (the metadata says so); only its objects are left behind, under
        # a marker saying it was deleted.
        log.warning("topic %s deleted, but deleting its objects failed: %s", name, e)
    return meta


async def add_partitions(broker: "BrokerServices", name: str, count: int, validate_only: bool) -> TopicMeta:
    return await _store_up(_add_partitions(broker, name, count, validate_only))


async def _add_partitions(broker: "BrokerServices", name: str, count: int, validate_only: bool) -> TopicMeta:
    check_not_internal(name, "add partitions to")
    meta = await _existing(broker, name)
    if count <= meta.partitions:
        raise TopicError(ErrorCode.invalid_partitions, f"topic {name!r} has {meta.partitions} partitions; the new count must be larger, not {count}")
    if count > MAX_PARTITIONS:
        raise TopicError(ErrorCode.invalid_partitions, f"at most {MAX_PARTITIONS} partitions")
    if validate_only:
        return meta
    return await _changed(broker, await broker.metadata.add_partitions(name, count))


async def alter_configs(broker: "BrokerServices", name: str, change, validate_only: bool) -> TopicMeta:
    """`change(old_configs) -> new_configs`; validated before anything is stored."""
    return await _store_up(_alter_configs(broker, name, change, validate_only))


async def _alter_configs(broker: "BrokerServices", name: str, change, validate_only: bool) -> TopicMeta:
    meta = await _existing(broker, name)
    try:
        new = {k: v for k, v in topic_config.normalize(change(dict(meta.configs)), broker.config.kafka_static_configs()).items() if v is not None}
    except topic_config.InvalidConfigError as e:
        raise TopicError(ErrorCode.invalid_config, str(e)) from None
    if validate_only:
        return meta
    return await _changed(broker, await broker.metadata.set_topic_configs(name, new))


async def _store_up(change: Awaitable[TopicMeta]) -> TopicMeta:
    """An admin change, a store failure under it answered as unavailable."""
    try:
        return await change
    except _STORE_DOWN as e:
        raise _unavailable(e) from None


async def _existing(broker: "BrokerServices", name: str) -> TopicMeta:
    meta = await broker.logs.topics.get(name, refresh=True)
    if meta is None:
        raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
    return meta


async def _changed(broker: "BrokerServices", meta: TopicMeta) -> TopicMeta:
    """A topic whose partitions or configs changed: its marker follows, the logs learn it."""
    await _mark_changed(broker, meta)
    broker.logs.topic_changed(meta)
    return meta


class TopicIdResolver:
    """The one topic-id resolver, one per request: names for requests that name topics by
    id (Produce v13+, Fetch v13+, DeleteTopics v6+, Metadata v10+, the offset APIs v10+)
    from the log manager's id table (LogManager.topic_name), and topics by name or id from
    the metadata store, each read once per request."""

    def __init__(self, broker: "BrokerServices"):
        self.broker = broker
        self._by_name: dict[str, TopicMeta | None] = {}

    async def name(self, name: str | None, topic_id) -> str | None:
        """`name` when the request gave one, else the name of the topic with `topic_id`."""
        if name is not None or topic_id is None:
            return name
        return await self.broker.logs.topics.name_for_id(topic_id)

    async def name_or_error(self, name: str | None, topic_id) -> tuple[str | None, StorageError | None]:
        """As `name`, for requests that answer per partition: (None, the error) when the
        metadata store cannot say which topic the id names."""
        try:
            return await self.name(name, topic_id), None
        except StorageError as e:
            return None, e

    async def by_name(self, name: str) -> TopicMeta | None:
        if name not in self._by_name:
            self._by_name[name] = await self.broker.metadata.get_topic(name)
        return self._by_name[name]

    async def by_id(self, topic_id) -> TopicMeta | None:
        """The topic with `topic_id`; None when there is none (or the name now belongs to
        a topic created again, with a new id)."""
        name = await self.name(None, topic_id)
        meta = await self.by_name(name) if name is not None else None
        return meta if meta is not None and meta.uuid == topic_id else None

    async def id_of(self, name: str):
        meta = await self.by_name(name)
        return meta.uuid if meta is not None else None
