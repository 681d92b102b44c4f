"""WriteTxnMarkers (27): a transaction coordinator on another broker asks the owner of
partitions to append the COMMIT/ABORT marker of a producer's transaction (docs/
transactions.md). Each partition is answered once its marker is durable, with the errors of
`LogManager.write_txn_markers`. Kafka serves this API on its broker listener, which is the
one clients use too, so it is advertised in ApiVersions as Kafka does."""

from __future__ import annotations

import asyncio

from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.txn import TxnMarker


async def write_txn_markers(ctx, req):
    logs = ctx.broker.logs
    markers = [
        TxnMarker(
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            coordinator_epoch=m.coordinator_epoch,
            commit=bool(m.transaction_result),
            partitions=[(t.name, p) for t in m.topics for p in t.partition_indexes],
        )
        for m in req.markers
    ]
    # The markers of different producers are independent: written at once, each answered
    # when durable (one marker's partitions share their flushes with other appends).
    results = await asyncio.gather(*(logs.write_txn_markers(m) for m in markers))
    cls = response(ApiKey.WRITE_TXN_MARKERS, ctx.version)
    m_cls, t_cls, p_cls = nested(cls, "WritableTxnMarkerResult"), nested(cls, "WritableTxnMarkerTopicResult"), nested(cls, "WritableTxnMarkerPartitionResult")
    out = []
    for m, result in zip(req.markers, results):
        topics = tuple(
            make(t_cls, name=t.name, partitions=tuple(make(p_cls, partition_index=p, error_code=result[(t.name, p)]) for p in t.partition_indexes))
            for t in m.topics
        )
        out.append(make(m_cls, producer_id=m.producer_id, topics=topics))
    return make(cls, markers=tuple(out))


def register(router):
    router.register(ApiKey.WRITE_TXN_MARKERS, write_txn_markers)
