"""Requests that name topics by id: Metadata v12, Produce v13, Fetch v13+, DeleteTopics v6."""

from __future__ import annotations

import datetime
import time
import uuid

from kafscale.protocol import records
from tests.support.raw import RawClient, error_code, req

UNKNOWN_TOPIC_ID = 100


def _topic_id(c: RawClient, name: str) -> uuid.UUID:
    md = c.metadata([name], version=12)
    assert error_code(md.topics[0].error_code) == 0
    return md.topics[0].topic_id


def test_produce_fetch_metadata_and_delete_by_topic_id(broker, topic_name):
    with RawClient(broker.bootstrap) as c:
        tid = _topic_id(c, topic_name)
        assert isinstance(tid, uuid.UUID) and tid.int != 0
        # Metadata by id
        md = c.request(3, 12, req(3, 12, topics=(req(3, 12, "MetadataRequestTopic", name=None, topic_id=tid),), allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        assert (md.topics[0].name, error_code(md.topics[0].error_code)) == (topic_name, 0)
        # Produce v13 by id
        batch = records.build_batch([(b"k", b"by-id")], timestamp=int(time.time() * 1000))
        pp = req(0, 13, "PartitionProduceData", index=0, records=batch)
        body = req(0, 13, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(req(0, 13, "TopicProduceData", topic_id=tid, partition_data=(pp,)),))
        pr = c.request(0, 13, body).responses[0]
        assert pr.topic_id == tid and error_code(pr.partition_responses[0].error_code) == 0
        # Fetch v13 by id
        fp = req(1, 13, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
        fbody = req(1, 13, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                    topics=(req(1, 13, "FetchTopic", topic_id=tid, partitions=(fp,)),), forgotten_topics_data=(), rack_id="")
        fr = c.request(1, 13, fbody).responses[0]
        data = fr.partitions[0].records
        assert fr.topic_id == tid and [r.value for r in records.decode_records(data, 0)] == [b"by-id"]
        # an unknown id
        fbody2 = req(1, 13, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                     topics=(req(1, 13, "FetchTopic", topic_id=uuid.uuid4(), partitions=(fp,)),), forgotten_topics_data=(), rack_id="")
        assert error_code(c.request(1, 13, fbody2).responses[0].partitions[0].error_code) == UNKNOWN_TOPIC_ID
        # DeleteTopics v6 by id
        dr = c.request(20, 6, req(20, 6, topics=(req(20, 6, "DeleteTopicState", name=None, topic_id=tid),), timeout=datetime.timedelta(seconds=10)))
        assert (dr.responses[0].name, error_code(dr.responses[0].error_code)) == (topic_name, 0)
        md = c.metadata([topic_name], version=12, allow_auto=False)
        assert error_code(md.topics[0].error_code) == 3


async def test_topic_id_table_is_kept_and_read_again_on_a_miss_or_when_old(tmp_path, monkeypatch):
    """Requests by id do not list every topic per request: the broker keeps its id table,
    reads it again for an id it does not know (a topic created through another broker) and
    once it is older than its time to live (a topic deleted through another broker)."""
    from kafscale.metadata.store import TopicMeta
    from kafscale.storage import topic_cache as topic_cache_mod
    from tests.test_read_path import _manager

    mgr = _manager(tmp_path)
    md = mgr.metadata
    listings = []
    real_list = md.list_topics

    async def counted_list():
        listings.append(1)
        return await real_list()

    monkeypatch.setattr(md, "list_topics", counted_list)
    a = await md.create_topic(TopicMeta("a", 1))
    for _ in range(50):
        assert await mgr.topics.name_for_id(a.uuid) == "a"
    assert len(listings) == 1
    monkeypatch.setattr(topic_cache_mod, "TOPIC_IDS_MISS_REREAD_S", 0.0)
    b = await md.create_topic(TopicMeta("b", 1))  # as another broker would
    assert await mgr.topics.name_for_id(b.uuid) == "b" and len(listings) == 2
    assert await mgr.topics.name_for_id(uuid.uuid4()) is None and len(listings) == 3
    await md.delete_topic("a")  # as another broker would
    assert await mgr.topics.name_for_id(a.uuid) == "a" and len(listings) == 3  # a known id: kept until the TTL
    monkeypatch.setattr(topic_cache_mod, "TOPIC_IDS_TTL_S", 0.0)
    assert await mgr.topics.name_for_id(a.uuid) is None and len(listings) == 4
    await mgr.stop()
