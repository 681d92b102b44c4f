"""The console's view of a cluster through the Kafka protocol, as any client sees it:
confluent-kafka's AdminClient, one Consumer (message browser) and one Producer, with the
client settings of the admin CLI (kafscale/client.py).

Every method blocks (librdkafka answers on its own threads); the web layer calls them with
`asyncio.to_thread`. Everything a page shows is bounded: topic and group lists are paged
from one Metadata/ListGroups answer, offsets are asked for the partitions shown only, and
the browser reads at most `MAX_RECORDS` records per partition.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace

from kafscale.client import CliError, await_result, client_conf, list_offsets, parse_time

log = logging.getLogger("kafscale.console")

MAX_RECORDS = 200  # per page of the message browser
FILTER_SCAN = 2000  # records a key/value filter may look through for one page
MAX_LIST_ROWS = 1000  # transactions and quotas shown on one page
QUOTA_DEFAULT = "<default>"  # how a quota entity's default name is written (as kafka-configs.sh shows it)
METADATA_TTL_S = 10.0  # pages shown within this reuse one Metadata answer (the sampler refreshes it every interval)


class ClusterError(Exception):
    """A broker answered with an error, or none answered: shown to the user as is."""


@dataclass
class Record:
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def _state(state) -> str:
    name = getattr(state, "name", str(state))
    return "".join(p.title() for p in name.split("_"))


def _err(e: Exception, what: str) -> ClusterError:
    return ClusterError(str(e) if isinstance(e, CliError) else f"{what}: {e}")


class Cluster:
    """One cluster, reached through `bootstrap` with the admin CLI's client settings."""

    def __init__(self, bootstrap: str, settings: dict[str, str] | None = None, timeout: float = 5.0):
        self.bootstrap = bootstrap
        self.timeout = timeout
        # The shape kafscale/client.py's helpers read (bootstrap, settings, timeout).
        self.args = SimpleNamespace(bootstrap=bootstrap, timeout=timeout, verbose=False, command_config=None,
                                    client_setting=[f"{k}={v}" for k, v in (settings or {}).items()])
        self._admin = None
        self._kp_admin = None
        self._producer = None
        self._consumer = None
        self._consumer_lock = threading.Lock()
        self._make_lock = threading.Lock()
        self._md = None
        self._md_at = 0.0
        self._md_lock = threading.Lock()

    def conf(self, **extra) -> dict:
        return client_conf(self.args, **{"client.id": "kafscale-console", **extra})

    @property
    def admin(self):
        # One client, made once: a second one made by a racing thread would be dropped,
        # and a dropped AdminClient never answers the futures it handed out.
        with self._make_lock:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient(self.conf())
            return self._admin

    def _wait(self, future, what: str):
        try:
            return await_result(future, self.args, what)
        except CliError as e:
            raise ClusterError(str(e)) from None

    # Client quotas and transactions: confluent-kafka's AdminClient has no API for them,
    # kafka-python's has (with the same connection settings, translated).
    KAFKA_PYTHON_SETTINGS = {"security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism", "sasl.mechanisms": "sasl_mechanism",
                             "sasl.username": "sasl_plain_username", "sasl.password": "sasl_plain_password", "ssl.ca.location": "ssl_cafile",
                             "ssl.certificate.location": "ssl_certfile", "ssl.key.location": "ssl_keyfile", "ssl.key.password": "ssl_password"}

    def _kafka_python(self):
        with self._make_lock:
            return self._make_kafka_python()

    def _make_kafka_python(self):
        if self._kp_admin is None:
            from kafka.admin import KafkaAdminClient

            conf = self.conf()
            kwargs = {self.KAFKA_PYTHON_SETTINGS[k]: v for k, v in conf.items() if k in self.KAFKA_PYTHON_SETTINGS}
            if "security_protocol" in kwargs:
                kwargs["security_protocol"] = kwargs["security_protocol"].upper()
            try:
                self._kp_admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="kafscale-console",
                                                  request_timeout_ms=int(self.timeout * 1000), **kwargs)
            except Exception as e:  # noqa: BLE001 - NoBrokersAvailable and the like
                raise _err(e, "connecting (kafka-python)") from None
        return self._kp_admin

    def transactions(self) -> list[dict]:
        """Open and recent transactions on every broker, described by their coordinators."""
        admin = self._kafka_python()
        try:
            listed = [t for per_broker in admin.list_transactions().values() for t in per_broker]
            described = admin.describe_transactions([t.transactional_id for t in listed]) if listed else {}
        except Exception as e:  # noqa: BLE001 - a broker's error code, as kafka-python raises it
            raise _err(e, "listing transactions") from None
        rows = []
        for t in sorted(listed, key=lambda t: t.transactional_id)[:MAX_LIST_ROWS]:
            d = described.get(t.transactional_id)
            rows.append({"id": t.transactional_id, "producer_id": t.producer_id, "state": getattr(t.state, "value", str(t.state)),
                         "epoch": getattr(d, "producer_epoch", None), "timeout_ms": getattr(d, "transaction_timeout_ms", None),
                         "started": getattr(d, "transaction_start_time_ms", None), "coordinator": getattr(d, "coordinator_id", None),
                         "partitions": sorted(f"{tp.topic}-{tp.partition}" for tp in (getattr(d, "topic_partitions", None) or ()))})
        return rows

    def partition_sizes(self, topic: str, partitions: list[int]) -> dict[int, int]:
        """Bytes each partition occupies in the store (DescribeLogDirs, summed over brokers:
        on KafScale the owner reports its committed segments); {} when not answered."""
        try:
            answers = self._kafka_python().describe_log_dirs({topic: partitions})
        except Exception as e:  # noqa: BLE001 - an older Kafka or an ACL: the page goes on without sizes
            log.info("no partition sizes for %s: %s", topic, e)
            return {}
        sizes: dict[int, int] = {}
        for broker in answers:
            for d in broker.get("log_dirs", ()):
                for t in d.get("topics", ()):
                    if t.get("name") == topic:
                        for p in t.get("partitions", ()):
                            sizes[p["partition_index"]] = sizes.get(p["partition_index"], 0) + p["partition_size"]
        return sizes

    def _send(self, request, what: str):
        """One request through kafka-python's connection manager (the APIs its admin client
        has no call for), to any broker: each answers for the whole cluster."""
        admin = self._kafka_python()

        async def send():
            return await admin._manager.send(request)

        try:
            return admin._manager.run(send)
        except Exception as e:  # noqa: BLE001
            raise _err(e, what) from None

    def quotas(self) -> list[dict]:
        """Every client quota (DescribeClientQuotas matching all entities)."""
        from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest

        res = self._send(DescribeClientQuotasRequest(components=[], strict=False), "describing client quotas")
        if res.error_code:
            raise ClusterError(f"describing client quotas: error {res.error_code} {res.error_message or ''}")
        rows = []
        for entry in res.entries[:MAX_LIST_ROWS]:
            parts = {e.entity_type: e.entity_name for e in entry.entity}
            rows.append({"entity": ", ".join(f"{t}={QUOTA_DEFAULT if n is None else n}" for t, n in parts.items()), "parts": parts,
                         "values": {v.key: v.value for v in entry.values}})
        return sorted(rows, key=lambda r: r["entity"])

    def set_quota(self, entity: dict[str, str | None], key: str, value: float | None) -> None:
        """Set one quota of an entity ({user: name, client-id: name, ip: address}; a None name
        is the entity type's default), or remove it (value None): AlterClientQuotas."""
        from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as Alter

        e = Alter.EntryData
        op = e.OpData(key=key, value=0.0 if value is None else float(value), remove=value is None)
        req = Alter(entries=[e(entity=[e.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()], ops=[op])], validate_only=False)
        res = self._send(req, "altering client quotas")
        for entry in res.entries:
            if entry.error_code:
                raise ClusterError(f"altering client quotas: error {entry.error_code} {entry.error_message or ''}".strip())

    def open_transactions(self, topic: str) -> list[dict]:
        """The producers with an open transaction on each partition of `topic`, as their
        owners see them (DescribeProducers): what a hanging transaction looks like."""
        from kafka.structs import TopicPartition

        parts = sorted(self._topic(topic).partitions)
        try:
            states = self._kafka_python().describe_producers([TopicPartition(topic, p) for p in parts])
        except Exception as e:  # noqa: BLE001 - a broker's error code, as kafka-python raises it
            raise _err(e, f"describing the producers of {topic!r}") from None
        rows = []
        for tp, state in sorted(states.items(), key=lambda kv: kv[0].partition):
            for pr in state.active_producers:
                if pr.current_transaction_start_offset >= 0:
                    rows.append({"topic": tp.topic, "partition": tp.partition, "producer_id": pr.producer_id, "epoch": pr.producer_epoch,
                                 "coordinator_epoch": pr.coordinator_epoch, "start_offset": pr.current_transaction_start_offset,
                                 "last_timestamp": pr.last_timestamp})
        return rows

    def abort_transaction(self, topic: str, partition: int, producer_id: int, start_offset: int) -> None:
        """Abort the open transaction of `producer_id` on one partition that began at
        `start_offset`, as kafka-transactions.sh abort --start-offset does: the producer's
        epoch and coordinator epoch from DescribeProducers, then an ABORT marker through
        WriteTxnMarkers to the partition's owner. Refused when the partition no longer has
        that transaction open (it ended, or a newer one began)."""
        from kafka.admin import AbortTransactionSpec
        from kafka.structs import TopicPartition

        open_now = [r for r in self.open_transactions(topic) if r["partition"] == partition and r["producer_id"] == producer_id]
        if not open_now or open_now[0]["start_offset"] != start_offset:
            raise ClusterError(f"{topic}-{partition} has no open transaction of producer {producer_id} from offset {start_offset} (any more)")
        r = open_now[0]
        spec = AbortTransactionSpec(TopicPartition(topic, partition), producer_id, r["epoch"], r["coordinator_epoch"])
        try:
            self._kafka_python().abort_transaction(spec)
        except Exception as e:  # noqa: BLE001 - a broker's error code, as kafka-python raises it
            raise _err(e, f"aborting the transaction of producer {producer_id} on {topic}-{partition}") from None

    def close(self) -> None:
        if self._kp_admin is not None:
            self._kp_admin.close()
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(self.timeout)

    # -- metadata ------------------------------------------------------------------------

    def metadata(self, fresh: bool = False):
        with self._md_lock:
            if fresh or self._md is None or time.monotonic() - self._md_at > METADATA_TTL_S:
                try:
                    # All topics, never one by name: a named request may auto-create it.
                    self._md = self.admin.list_topics(timeout=self.timeout)
                except Exception as e:  # noqa: BLE001 - KafkaException: no broker answered
                    self._md = None  # pages say so too, rather than show the last answer
                    raise _err(e, "fetching metadata") from None
                self._md_at = time.monotonic()
            return self._md

    def forget_metadata(self) -> None:
        with self._md_lock:
            self._md = None

    def overview(self, fresh: bool = True) -> dict:
        md = self.metadata(fresh)
        leaders: dict[int, int] = {}
        offline = []
        partitions = 0
        for t in md.topics.values():
            for p in t.partitions.values():
                partitions += 1
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
                if p.leader < 0:
                    offline.append(f"{t.topic}-{p.id}")
        brokers = [{"id": b.id, "host": b.host, "port": b.port, "address": f"{b.host}:{b.port}", "partitions": leaders.get(b.id, 0),
                    "controller": b.id == md.controller_id} for b in sorted(md.brokers.values(), key=lambda b: b.id)]
        return {"cluster_id": md.cluster_id, "controller": md.controller_id, "brokers": brokers,
                "topics": len(md.topics), "partitions": partitions, "offline": sorted(offline)}

    def _topic(self, name: str):
        t = self.metadata().topics.get(name)
        if t is None or (t.error is not None and t.error.code() != 0):
            t = self.metadata(fresh=True).topics.get(name)
        if t is None or (t.error is not None and t.error.code() != 0):
            raise ClusterError(f"topic {name!r} does not exist")
        return t

    # -- topics --------------------------------------------------------------------------

    def topic_names(self, fresh: bool = False) -> list[str]:
        return sorted(self.metadata(fresh).topics)

    def topics_page(self, query: str, page: int, per_page: int) -> dict:
        md = self.metadata()
        names = [n for n in sorted(md.topics) if query.lower() in n.lower()]
        total = len(names)
        rows = []
        for n in names[page * per_page:(page + 1) * per_page]:
            t = md.topics[n]
            rows.append({"name": n, "partitions": len(t.partitions), "internal": n.startswith("__"),
                         "replicas": max((len(p.replicas) for p in t.partitions.values()), default=0)})
        return {"rows": rows, "total": total}

    def offsets(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """partition -> (log start, end offset)."""
        from confluent_kafka.admin import OffsetSpec

        try:
            lo = list_offsets(self.admin, self.args, topic, partitions, OffsetSpec.earliest())
            hi = list_offsets(self.admin, self.args, topic, partitions, OffsetSpec.latest())
        except CliError as e:
            raise ClusterError(str(e)) from None
        return {p: (lo[p][0], hi[p][0]) for p in partitions}

    def topic(self, name: str) -> dict:
        from confluent_kafka.admin import ConfigResource, ResourceType

        t = self._topic(name)
        md = self.metadata()
        ps = sorted(t.partitions)
        offs = self.offsets(name, ps)
        sizes = self.partition_sizes(name, ps)
        parts = []
        for p in ps:
            meta = t.partitions[p]
            owner = md.brokers.get(meta.leader)
            start, end = offs[p]
            parts.append({"partition": p, "leader": meta.leader, "owner": f"{owner.host}:{owner.port}" if owner else "offline",
                          "start": start, "end": end, "records": max(end - start, 0), "size": sizes.get(p)})
        res = ConfigResource(ResourceType.TOPIC, name)
        entries = self._wait(self.admin.describe_configs([res], request_timeout=self.timeout)[res], f"describing configs of {name!r}")
        configs = [{"name": e.name, "value": "(sensitive)" if e.is_sensitive else e.value, "default": e.is_default,
                    "read_only": e.is_read_only, "source": getattr(e.source, "name", str(e.source))} for e in sorted(entries.values(), key=lambda e: e.name)]
        return {"name": name, "partitions": parts, "configs": configs, "internal": name.startswith("__"), "offsets": offs}

    def create_topic(self, name: str, partitions: int, replication: int, configs: dict[str, str]) -> None:
        from confluent_kafka.admin import NewTopic

        fut = self.admin.create_topics([NewTopic(name, partitions, replication, config=configs)], request_timeout=self.timeout)[name]
        self._wait(fut, f"creating topic {name!r}")
        self.forget_metadata()

    def delete_topic(self, name: str) -> None:
        self._wait(self.admin.delete_topics([name], request_timeout=self.timeout)[name], f"deleting topic {name!r}")
        self.forget_metadata()

    def set_config(self, topic: str, key: str, value: str | None) -> None:
        """Set one topic config (None: back to its default), leaving the others alone."""
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
        self._wait(self.admin.incremental_alter_configs([res], request_timeout=self.timeout)[res], f"setting {key} of {topic!r}")

    # -- records -------------------------------------------------------------------------

    def _reader(self):
        if self._consumer is None:
            from confluent_kafka import Consumer

            # Partitions are assigned directly: no group is joined and nothing committed
            # (librdkafka still wants a group.id).
            self._consumer = Consumer(self.conf(**{"group.id": f"kafscale-console-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                                                   "enable.partition.eof": False, "fetch.wait.max.ms": 50}))
        return self._consumer

    def browse(self, topic: str, partition: int | None, start: str, value: str, limit: int, grep: str = "",
               offsets: dict[int, tuple[int, int]] | None = None) -> dict:
        """Records of one partition (or all): `start` is latest (the newest `limit`, newest
        first), earliest, offset or timestamp (then oldest first from there). With `grep`
        only records whose key or value contain it, looking through at most FILTER_SCAN."""
        from confluent_kafka.admin import OffsetSpec

        limit = max(1, min(limit, MAX_RECORDS))
        t = self._topic(topic)
        parts = sorted(t.partitions) if partition is None else [partition]
        if partition is not None and partition not in t.partitions:
            raise ClusterError(f"topic {topic!r} has no partition {partition}")
        offs = {p: offsets[p] for p in parts} if offsets and all(p in offsets for p in parts) else self.offsets(topic, parts)
        span = FILTER_SCAN if grep else limit
        windows: dict[int, tuple[int, int]] = {}
        if start == "latest":
            for p in parts:
                lo, hi = offs[p]
                windows[p] = (max(lo, hi - span), hi)
        else:
            if start == "earliest":
                firsts = {p: offs[p][0] for p in parts}
            elif start == "offset":
                try:
                    n = int(value)
                except ValueError:
                    raise ClusterError(f"offset must be a number, not {value!r}") from None
                firsts = {p: min(max(n, offs[p][0]), offs[p][1]) for p in parts}
            elif start == "timestamp":
                try:
                    at = list_offsets(self.admin, self.args, topic, parts, OffsetSpec.for_timestamp(parse_time(value)))
                except CliError as e:
                    raise ClusterError(str(e)) from None
                firsts = {p: at[p][0] if at[p][0] >= 0 else offs[p][1] for p in parts}
            else:
                raise ClusterError(f"unknown start {start!r} (latest, earliest, offset, timestamp)")
            windows = {p: (firsts[p], min(firsts[p] + span, offs[p][1])) for p in parts}
        records = self._read(topic, {p: w for p, w in windows.items() if w[1] > w[0]})
        if grep:
            needle = grep.encode()
            records = [r for r in records if needle in (r.key or b"") or needle in (r.value or b"")]
        if start == "latest":
            records.sort(key=lambda r: (r.timestamp or 0, r.offset), reverse=True)
        else:
            records.sort(key=lambda r: (r.timestamp or 0, r.partition, r.offset))
        return {"records": records[:limit], "offsets": offs, "partitions": parts}

    def _read(self, topic: str, windows: dict[int, tuple[int, int]]) -> list[Record]:
        """The records in [first, end) of each partition: done when the consumer's position
        reaches each end (it steps over transaction markers and compacted-away offsets)."""
        from confluent_kafka import TopicPartition

        if not windows:
            return []
        out: list[Record] = []
        with self._consumer_lock:
            c = self._reader()
            c.assign([TopicPartition(topic, p, first) for p, (first, _end) in windows.items()])
            pending = dict(windows)
            deadline = time.monotonic() + self.timeout
            try:
                while pending and time.monotonic() < deadline:
                    # Short waits: consume() returns early only once it has num_messages.
                    for msg in c.consume(num_messages=500, timeout=0.01):
                        if msg.error() is not None or msg.topic() != topic:
                            continue
                        p, off = msg.partition(), msg.offset()
                        w = windows.get(p)
                        if w is None or not w[0] <= off < w[1]:
                            continue
                        ts_type, ts = msg.timestamp()
                        out.append(Record(p, off, ts if ts_type else None, msg.key(), msg.value(), list(msg.headers() or ())))
                    for tp in c.position([TopicPartition(topic, p) for p in pending]):
                        if tp.offset >= pending[tp.partition][1]:
                            del pending[tp.partition]
            finally:
                c.unassign()
        return out

    def produce(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> tuple[int, int]:
        """(partition, offset) of the record once the broker acknowledged it."""
        from confluent_kafka import Producer

        self._topic(topic)  # never auto-create by producing to a misspelled name
        with self._make_lock:
            if self._producer is None:
                self._producer = Producer(self.conf(**{"acks": "all", "linger.ms": 0, "message.timeout.ms": int(self.timeout * 1000)}))
        done: dict = {}

        def delivered(err, msg):
            done["err"], done["msg"] = err, msg

        kwargs = {"partition": partition} if partition is not None else {}
        self._producer.produce(topic, value=value, key=key, headers=headers or None, on_delivery=delivered, **kwargs)
        self._producer.flush(self.timeout + 1)
        if "err" not in done:
            raise ClusterError(f"producing to {topic!r}: no acknowledgement within {self.timeout:g}s")
        if done["err"] is not None:
            raise ClusterError(f"producing to {topic!r}: {done['err'].str()}")
        return done["msg"].partition(), done["msg"].offset()

    # -- groups --------------------------------------------------------------------------

    def groups_page(self, query: str, page: int, per_page: int) -> dict:
        res = self._wait(self.admin.list_consumer_groups(request_timeout=self.timeout), "listing groups")
        groups = sorted((g for g in res.valid if query.lower() in g.group_id.lower()), key=lambda g: g.group_id)
        rows = [{"name": g.group_id, "state": _state(g.state), "type": "simple" if g.is_simple_consumer_group else "consumer"}
                for g in groups[page * per_page:(page + 1) * per_page]]
        return {"rows": rows, "total": len(groups), "errors": [str(e) for e in res.errors]}

    def committed(self, group: str, partitions=None) -> dict[tuple[str, int], int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        req = ConsumerGroupTopicPartitions(group, partitions) if partitions else ConsumerGroupTopicPartitions(group)
        res = self._wait(self.admin.list_consumer_group_offsets([req], request_timeout=self.timeout)[group], f"fetching offsets of group {group!r}")
        return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0 and tp.error is None}

    def group(self, name: str) -> dict:
        desc = self._wait(self.admin.describe_consumer_groups([name], request_timeout=self.timeout)[name], f"describing group {name!r}")
        committed = self.committed(name)
        state = _state(desc.state)
        if state in ("Dead", "Unknown") and not desc.members and not committed:
            raise ClusterError(f"group {name!r} does not exist")
        owner = {}
        members = []
        for m in desc.members:
            tps = list(getattr(m.assignment, "topic_partitions", None) or ())
            for tp in tps:
                owner[(tp.topic, tp.partition)] = m
            members.append({"member": m.member_id, "client": m.client_id, "host": m.host, "instance": m.group_instance_id,
                            "assignment": [f"{tp.topic}-{tp.partition}" for tp in tps]})
        keys = sorted(set(committed) | set(owner))
        ends: dict[tuple[str, int], int] = {}
        for topic in sorted({t for t, _ in keys}):
            for p, (_lo, hi) in self.offsets(topic, sorted(p for t, p in keys if t == topic)).items():
                ends[(topic, p)] = hi
        rows = []
        for key in keys:
            off, end, m = committed.get(key), ends.get(key), owner.get(key)
            rows.append({"topic": key[0], "partition": key[1], "committed": off, "end": end,
                         "lag": max(end - off, 0) if off is not None and end is not None else None,
                         "member": m.member_id if m else None, "client": m.client_id if m else None})
        return {"name": name, "state": state, "type": desc.type.name.title() if getattr(desc, "type", None) is not None else "Classic",
                "assignor": desc.partition_assignor, "coordinator": getattr(desc.coordinator, "id", None), "members": members,
                "partitions": rows, "lag": sum(r["lag"] or 0 for r in rows)}

    def reset_plan(self, group: str, topic: str, to: str, value: str) -> list[dict]:
        """New committed offsets for each partition of `topic`: earliest, latest, offset N
        (clamped into the partition's range, as Kafka does) or timestamp."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        parts = sorted(self._topic(topic).partitions)
        offs = self.offsets(topic, parts)
        if to == "timestamp":
            try:
                at = list_offsets(self.admin, self.args, topic, parts, OffsetSpec.for_timestamp(parse_time(value)))
            except CliError as e:
                raise ClusterError(str(e)) from None
        elif to == "offset":
            try:
                n = int(value)
            except ValueError:
                raise ClusterError(f"offset must be a number, not {value!r}") from None
        elif to not in ("earliest", "latest"):
            raise ClusterError(f"unknown reset target {to!r}")
        current = self.committed(group, [TopicPartition(topic, p) for p in parts])
        plan = []
        for p in parts:
            lo, hi = offs[p]
            new = lo if to == "earliest" else hi if to == "latest" else min(max(n, lo), hi) if to == "offset" else (at[p][0] if at[p][0] >= 0 else hi)
            plan.append({"topic": topic, "partition": p, "current": current.get((topic, p)), "new": new})
        return plan

    def reset(self, group: str, plan: list[dict]) -> None:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        desc = self._wait(self.admin.describe_consumer_groups([group], request_timeout=self.timeout)[group], f"describing group {group!r}")
        if desc.members:
            # Kafka only moves offsets of a group nobody consumes in: members would overwrite them.
            raise ClusterError(f"group {group!r} has {len(desc.members)} active members: stop its consumers before resetting offsets")
        req = ConsumerGroupTopicPartitions(group, [TopicPartition(r["topic"], r["partition"], r["new"]) for r in plan])
        res = self._wait(self.admin.alter_consumer_group_offsets([req], request_timeout=self.timeout)[group], f"resetting offsets of {group!r}")
        failed = [tp for tp in res.topic_partitions if tp.error is not None]
        if failed:
            raise ClusterError(f"resetting {failed[0].topic}-{failed[0].partition}: {failed[0].error.str()}")

    def delete_group(self, group: str) -> None:
        self._wait(self.admin.delete_consumer_groups([group], request_timeout=self.timeout)[group], f"deleting group {group!r}")

    # -- security ------------------------------------------------------------------------

    def acls(self) -> list[dict]:
        from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)
        bindings = self._wait(self.admin.describe_acls(flt, request_timeout=self.timeout), "listing ACLs")
        return sorted(({"resource_type": b.restype.name, "name": b.name, "pattern": b.resource_pattern_type.name, "principal": b.principal,
                        "host": b.host, "operation": b.operation.name, "permission": b.permission_type.name} for b in bindings),
                      key=lambda a: (a["resource_type"], a["name"], a["principal"], a["operation"]))

    def _acl(self, a: dict, binding: bool):
        from confluent_kafka.admin import AclBinding, AclBindingFilter

        cls = AclBinding if binding else AclBindingFilter
        try:
            return cls(a["resource_type"].upper(), a["name"], a["pattern"].upper(), a["principal"], a["host"] or "*", a["operation"].upper(), a["permission"].upper())
        except (KeyError, ValueError, TypeError) as e:
            raise ClusterError(f"not a valid ACL: {e}") from None

    def create_acl(self, a: dict) -> None:
        b = self._acl(a, True)
        self._wait(self.admin.create_acls([b], request_timeout=self.timeout)[b], "creating an ACL")

    def delete_acl(self, a: dict) -> None:
        f = self._acl(a, False)
        self._wait(self.admin.delete_acls([f], request_timeout=self.timeout)[f], "deleting ACLs")

    def users(self) -> list[dict]:
        res = self._wait(self.admin.describe_user_scram_credentials(request_timeout=self.timeout), "listing SCRAM users")
        return [{"user": u, "mechanisms": [f"{c.mechanism.name.replace('_', '-')} ({c.iterations} iterations)" for c in d.scram_credential_infos]}
                for u, d in sorted(res.items())]

    def set_user(self, user: str, mechanism: str, password: str, iterations: int = 8192) -> None:
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        mech = ScramMechanism.SCRAM_SHA_256 if mechanism.upper() == "SCRAM-SHA-256" else ScramMechanism.SCRAM_SHA_512
        up = UserScramCredentialUpsertion(user, ScramCredentialInfo(mech, iterations), password.encode())
        self._wait(self.admin.alter_user_scram_credentials([up], request_timeout=self.timeout)[user], f"setting credentials of {user!r}")

    def delete_user(self, user: str, mechanism: str) -> None:
        from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

        mech = ScramMechanism.SCRAM_SHA_256 if mechanism.upper() == "SCRAM-SHA-256" else ScramMechanism.SCRAM_SHA_512
        self._wait(self.admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, mech)], request_timeout=self.timeout)[user],
                   f"deleting credentials of {user!r}")
