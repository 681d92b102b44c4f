"""ElectLeaders (43), AlterPartitionReassignments (45), ListPartitionReassignments (46).

Partitions are owned, not replicated: each has one replica, its owner, chosen by the
cluster (balanced over the live brokers, moved within the lease TTL when a broker goes),
with the data in the object store. So:
- ElectLeaders: a partition with an owner has its leader: ELECTION_NOT_NEEDED, as Kafka
  answers when the preferred (or, for unclean, any) leader is in place; with no live owner,
  Kafka's PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE. Asked for all
  partitions (null), only those that are not ELECTION_NOT_NEEDED are listed, as Kafka.
- ListPartitionReassignments: nothing is ever being reassigned: an empty list.
- AlterPartitionReassignments: Kafka's error, not a silent no-op. A target equal to the
  current replica set is done at once (NONE, as in Kafka); any other target is
  INVALID_REPLICA_ASSIGNMENT with a message saying that KafScale places partitions itself;
  a cancellation (null replicas) is NO_REASSIGNMENT_IN_PROGRESS. Accepting a move and not
  doing it would make `kafka-reassign-partitions --verify` and Cruise Control wait forever.
"""

from __future__ import annotations

from kafscale.errors import ErrorCode
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.build import make, nested, response
from kafscale.storage.failures import StorageError

PREFERRED, UNCLEAN = 0, 1
_PLACED = (
    "KafScale places partitions on brokers itself (one owner per partition, moved automatically; "
    "the data lives in the object store), so replicas cannot be reassigned"
)


async def _partitions(broker, topic: str) -> int | None:
    meta = await broker.logs.topics.get(topic)
    return meta.partitions if meta is not None else None


def _election(cluster, topic: str, p: int, election_type: int) -> tuple[ErrorCode, str | None]:
    if cluster.owner_of(topic, p) >= 0:
        return ErrorCode.election_not_needed, None
    if election_type == PREFERRED:
        return ErrorCode.preferred_leader_not_available, f"no live owner for {topic}-{p} yet"
    return ErrorCode.eligible_leaders_not_available, f"no live owner for {topic}-{p} yet"


async def elect_leaders(ctx, req):
    cls = response(ApiKey.ELECT_LEADERS, ctx.version)
    topic_cls, part_cls = nested(cls, "ReplicaElectionResult"), nested(cls, "PartitionResult")
    broker, cluster = ctx.broker, ctx.broker.cluster
    election_type = getattr(req, "election_type", PREFERRED)  # v0: preferred only
    if election_type not in (PREFERRED, UNCLEAN):
        return make(cls, throttle_time=0, error_code=ErrorCode.invalid_request, replica_election_results=())
    results = []
    try:
        if req.topic_partitions is None:
            for meta in sorted(await broker.logs.topics.list_all(), key=lambda m: m.name):
                parts = []
                for p in range(meta.partitions):
                    code, msg = _election(cluster, meta.name, p, election_type)
                    if code != ErrorCode.election_not_needed:
                        parts.append(make(part_cls, partition_id=p, error_code=code, error_message=msg))
                results.append(make(topic_cls, topic=meta.name, partition_result=tuple(parts)))
        else:
            for t in req.topic_partitions:
                count = await _partitions(broker, t.topic)
                parts = []
                for p in t.partitions:
                    if count is None or not 0 <= p < count:
                        code, msg = ErrorCode.unknown_topic_or_partition, f"no partition {t.topic}-{p}"
                    else:
                        code, msg = _election(cluster, t.topic, p, election_type)
                    parts.append(make(part_cls, partition_id=p, error_code=code, error_message=msg))
                results.append(make(topic_cls, topic=t.topic, partition_result=tuple(parts)))
    except StorageError:
        return make(cls, throttle_time=0, error_code=ErrorCode.request_timed_out, replica_election_results=())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, replica_election_results=tuple(results))


async def alter_partition_reassignments(ctx, req):
    cls = response(ApiKey.ALTER_PARTITION_REASSIGNMENTS, ctx.version)
    topic_cls, part_cls = nested(cls, "ReassignableTopicResponse"), nested(cls, "ReassignablePartitionResponse")
    broker, cluster = ctx.broker, ctx.broker.cluster
    try:
        counts = {t.name: await _partitions(broker, t.name) for t in req.topics}
    except StorageError as e:
        return make(cls, throttle_time=0, error_code=ErrorCode.request_timed_out, error_message=str(e), responses=(), allow_replication_factor_change=getattr(req, "allow_replication_factor_change", True))
    out = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            count = counts[t.name]
            if count is None or not 0 <= p.partition_index < count:
                code, msg = ErrorCode.unknown_topic_or_partition, f"no partition {t.name}-{p.partition_index}"
            elif p.replicas is None:
                code, msg = ErrorCode.no_reassignment_in_progress, f"no reassignment of {t.name}-{p.partition_index} is in progress"
            else:
                owner = cluster.owner_of(t.name, p.partition_index)
                if owner >= 0 and tuple(p.replicas) == (owner,):
                    code, msg = ErrorCode.none, None  # already the replica set: nothing to move
                else:
                    code, msg = ErrorCode.invalid_replica_assignment, f"{_PLACED}; {t.name}-{p.partition_index} is on broker {owner}"
            parts.append(make(part_cls, partition_index=p.partition_index, error_code=code, error_message=msg))
        out.append(make(topic_cls, name=t.name, partitions=tuple(parts)))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, responses=tuple(out), allow_replication_factor_change=getattr(req, "allow_replication_factor_change", True))


async def list_partition_reassignments(ctx, req):
    cls = response(ApiKey.LIST_PARTITION_REASSIGNMENTS, ctx.version)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, topics=())


def register(router):
    router.register(ApiKey.ELECT_LEADERS, elect_leaders)
    router.register(ApiKey.ALTER_PARTITION_REASSIGNMENTS, alter_partition_reassignments)
    router.register(ApiKey.LIST_PARTITION_REASSIGNMENTS, list_partition_reassignments)
