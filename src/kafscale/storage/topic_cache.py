"""This broker's cache of topic metadata, and its table of topic ids (requests that name
topics by id: Fetch v13+, Produce v13+, Metadata v12, DeleteTopics v6)."""

from __future__ import annotations

import asyncio
import logging
import time

from kafscale.metadata.store import MetadataStore, TopicMeta
from kafscale.storage.failures import STORE_FAILURES, store_failure

log = logging.getLogger("kafscale.storage")

# How long a broker trusts its table of topic ids (another broker may delete a topic), and
# how soon after reading it a miss may read it again (a topic created elsewhere meanwhile).
TOPIC_IDS_TTL_S = 2.0
TOPIC_IDS_MISS_REREAD_S = 0.1


class TopicCache:
    """Topics by name as last read from the metadata store, and topic names by id."""

    def __init__(self, metadata: MetadataStore):
        self.metadata = metadata
        self._topics: dict[str, TopicMeta] = {}
        self._topic_ids: dict = {}  # uuid -> topic name
        self._topic_ids_at = float("-inf")
        self._topic_ids_lock = asyncio.Lock()

    async def get(self, name: str, refresh: bool = False) -> TopicMeta | None:
        meta = None if refresh else self._topics.get(name)
        if meta is None:
            try:
                meta = await self.metadata.get_topic(name)
            except STORE_FAILURES as e:
                raise store_failure(e, f"reading topic {name}") from e
            if meta is None:
                self._topics.pop(name, None)
                return None
            self._topics[name] = meta
        return meta

    async def list_all(self) -> list[TopicMeta]:
        """Every topic (Metadata for all topics). While the metadata store cannot be read,
        the topics this broker knows, as a Kafka broker answers from its metadata cache;
        StorageError if it knows none."""
        try:
            metas = await self.metadata.list_topics()
        except STORE_FAILURES as e:
            if not self._topics:
                raise store_failure(e, "listing topics") from e
            log.warning("listing topics: metadata unavailable, answering with the %d topics known here: %s", len(self._topics), e)
            return list(self._topics.values())
        self._topics = {m.name: m for m in metas}
        return metas

    async def name_for_id(self, topic_id) -> str | None:
        """Name of the topic with this id (Fetch v13+, Produce v13+, ... name topics by id).

        The id table is kept for TOPIC_IDS_TTL_S and read again on a miss, so a request by
        id costs no listing of every topic in the metadata store (milliseconds per request
        with hundreds of topics, an etcd range on etcd)."""
        stale = time.monotonic() - self._topic_ids_at
        if stale > TOPIC_IDS_TTL_S or (topic_id not in self._topic_ids and stale > TOPIC_IDS_MISS_REREAD_S):
            async with self._topic_ids_lock:  # concurrent misses: one read
                if time.monotonic() - self._topic_ids_at > TOPIC_IDS_MISS_REREAD_S:
                    read_at = time.monotonic()
                    try:
                        self._topic_ids = {m.uuid: m.name for m in await self.metadata.list_topics()}
                        self._topic_ids_at = read_at
                    except STORE_FAILURES as e:
                        # A known id keeps its name (topic ids never change); an unknown one
                        # cannot be told from a new topic: a retriable error, not "unknown".
                        if topic_id not in self._topic_ids:
                            raise store_failure(e, "looking up a topic id") from e
        return self._topic_ids.get(topic_id)

    def cached_name_for_id(self, topic_id) -> str | None:
        """Name of the topic with this id if this broker has already seen it, with no I/O
        (metrics name Fetch v13+ topics, which arrive by id, with it)."""
        name = self._topic_ids.get(topic_id)
        if name is None:
            name = next((m.name for m in list(self._topics.values()) if m.uuid == topic_id), None)
        return name

    def known(self, name: str) -> TopicMeta | None:
        """The topic as last read here, with no I/O (None: not known here)."""
        return self._topics.get(name)

    def cached(self, name: str) -> TopicMeta | None:
        """The topic as last read here, with no I/O."""
        return self._topics.get(name)

    def put(self, meta: TopicMeta) -> None:
        """A topic created or changed (its configs, its partitions) through this broker."""
        self._topics[meta.name] = meta
        self._topic_ids[meta.uuid] = meta.name

    def forget(self, name: str) -> None:
        """A topic deleted (here, or by another broker)."""
        self._topics.pop(name, None)
        self._topic_ids = {i: n for i, n in self._topic_ids.items() if n != name}
