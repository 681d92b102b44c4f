"""InitProducerId (22) for idempotent producers and DescribeProducers (61).

Producer ids come from the broker's allocator (metadata/producer_ids.py), unique across brokers.
Without a transactional id, every InitProducerId gets a fresh producer id with epoch 0,
as in Kafka: the producer id/epoch a client sends (KIP-360) are ignored, because they
only identify a transactional id's current producer. A transactional id goes to the
transaction coordinator (`transactions.py`); with --transactions false it is refused and
the transaction APIs are not advertised, so transactional clients fail at start with their
own clear error.
"""

from __future__ import annotations

import logging

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import STORE_FAILURES, StorageError

INIT_PRODUCER_ID_MAX_VERSION = 5
log = logging.getLogger("kafscale.producers")


async def init_producer_id(ctx, req):
    cls = response(ApiKey.INIT_PRODUCER_ID, ctx.version)
    if req.transactional_id is not None and getattr(ctx.broker, "transactions", None) is not None:
        from kafscale.broker.handlers.transactions import init_producer_id as transactional_init

        return await transactional_init(ctx, req)
    if req.transactional_id is not None:
        log.warning("client %s asked for transactional id %r: transactions are not supported", ctx.client_id, req.transactional_id, extra=ctx.log_fields())
        return make(cls, throttle_time=0, error_code=ErrorCode.transactional_id_authorization_failed, producer_id=-1, producer_epoch=-1)
    # An idempotent producer: always a new id, whatever producer_id/producer_epoch say.
    # Handing the sent id back (with a bumped epoch) would let two producers that both
    # send (0, 0) share one id, and the second one's batches would pass as duplicates.
    try:
        new_id = await ctx.broker.producer_ids.allocate()
    except STORE_FAILURES as e:  # unreachable, or still contended after the store's retries
        log.warning("InitProducerId from client %s: metadata store unavailable: %s", ctx.client_id, e, extra=ctx.log_fields())
        return make(cls, throttle_time=0, error_code=ErrorCode.coordinator_not_available, producer_id=-1, producer_epoch=-1)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)


async def describe_producers(ctx, req):
    cls = response(ApiKey.DESCRIBE_PRODUCERS, ctx.version)
    t_cls, p_cls, s_cls = nested(cls, "TopicResponse"), nested(cls, "PartitionResponse"), nested(cls, "ProducerState")
    topics = []
    for t in req.topics:
        parts = []
        for index in t.partition_indexes:
            try:
                lg = await ctx.broker.logs.get_log(t.name, index)
            except StorageError as e:
                parts.append(make(p_cls, partition_index=index, error_code=e.error_code, error_message=str(e), active_producers=()))
                continue
            states = tuple(
                make(
                    s_cls,
                    producer_id=e.producer_id,
                    producer_epoch=e.epoch,
                    last_sequence=e.last_seq,
                    last_timestamp=e.last_timestamp_ms,
                    coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=e.txn_first_offset,
                )
                for e in lg.producers.producers.values()
            )
            parts.append(make(p_cls, partition_index=index, error_code=ErrorCode.none, error_message=None, active_producers=states))
        topics.append(make(t_cls, name=t.name, partitions=tuple(parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))


def register(router):
    # Up to v5, as Kafka 4.0: v6 is KIP-939's two-phase commit (enable_2pc), which a Kafka
    # 4.0 broker does not know; a v6 request is refused like any unsupported version.
    router.register(ApiKey.INIT_PRODUCER_ID, init_producer_id, max_version=INIT_PRODUCER_ID_MAX_VERSION)
    router.register(ApiKey.DESCRIBE_PRODUCERS, describe_producers)
