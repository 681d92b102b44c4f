"""Prometheus metrics of one broker.

Each broker gets its own CollectorRegistry, so several brokers in one process (tests,
benchmarks) never clash. Almost everything is read from live broker state at scrape time
by `_LiveCollector`; only what has no live source is counted as it happens:

* request counts and latencies, via `KafkaServer.request_hooks`;
* per-topic bytes in/out and per-partition error codes, via the response hooks for Produce
  and Fetch, which see the request and the response without the handler modules knowing;
* flush times and sizes, via the flush hooks;
* consumer lag and group states, sampled by a background task (they need awaits, a scrape
  is synchronous).

The broker is seen through the read model of read_model.py (`BrokerReadModel`), never
imported.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kafscale.errors import ErrorCode
from kafscale.protocol import legacy_records, records
from kafscale.ops.read_model import BrokerReadModel
from kafscale.protocol.api_keys import ApiKey

log = logging.getLogger("kafscale.ops")

# Request latency buckets: a produce waits for an object-store upload (ms on a local disk,
# tens to hundreds of ms on S3); a fetch long-polls up to max.wait.ms (500 ms by default).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _LoopValue:
    """A bucket's count or the sum of a LoopHistogram: a plain number, read by Histogram's
    own exposition (get, get_exemplar), as its lock-guarded values are."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> None:
        return None


class LoopHistogram(Histogram):
    """A prometheus_client Histogram observed from the event loop only: its bucket found by
    bisection and plain numbers added to, not a lock taken per bucket and per sum (an
    observe was ~1.3 us of the loop's time, four a flush, one a request; #33). Exposed by
    Histogram's own code, the same samples; no exemplars, no multiprocess mode."""

    def _metric_init(self) -> None:
        self._created = time.time()
        self._sum = _LoopValue()
        self._buckets = [_LoopValue() for _ in self._upper_bounds]

    def observe(self, amount: float, exemplar=None) -> None:
        self._sum.value += amount
        if amount == amount:  # a NaN lands in no bucket (as in Histogram.observe)
            self._buckets[bisect.bisect_left(self._upper_bounds, amount)].value += 1


class _LoopCount(_LoopValue):
    """A LoopCounter's value (Counter's exposition reads get())."""

    __slots__ = ()

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class LoopCounter(Counter):
    """A prometheus_client Counter incremented from the event loop only: a plain number
    added to, not a lock taken per increment (three increments a Produce request, two a
    Fetch; #33). Exposed by Counter's own code, the same samples; no exemplars."""

    def _metric_init(self) -> None:
        self._value = _LoopCount()
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar=None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value.value += amount


def api_name(api_key: int) -> str:
    """Kafka's name of an API key (Produce, Fetch, ...), or the number if unknown."""
    try:
        from kio.schema.index import api_key_map

        return "".join(part.title() for part in api_key_map[api_key].split("_"))
    except (ImportError, KeyError):
        return str(api_key)


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class BrokerMetrics:
    """The registry of one broker plus the event-driven metrics feeding it."""

    def __init__(self, broker: BrokerReadModel):
        self.broker = broker
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = LoopCounter("kafscale_requests", "Kafka requests handled, by API and version", ["api", "version"], registry=r)
        self.request_errors = LoopCounter(
            "kafscale_request_errors", "Requests whose handler failed (the connection is closed), by API and version", ["api", "version"], registry=r
        )
        self.latency = LoopHistogram(
            "kafscale_request_duration_seconds", "Time from a request's arrival to its response being ready, by API", ["api"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.sasl_authentications = Counter(
            "kafscale_sasl_authentications", "SASL authentications, by mechanism and result (succeeded, failed)", ["mechanism", "result"], registry=r
        )
        self.bytes_in = LoopCounter("kafscale_topic_bytes_in", "Record-batch bytes appended by Produce, by topic", ["topic"], registry=r)
        self.bytes_out = LoopCounter("kafscale_topic_bytes_out", "Record-batch bytes returned by Fetch, by topic", ["topic"], registry=r)
        self.batches_in = LoopCounter("kafscale_produce_batches", "Record batches appended by Produce, by topic", ["topic"], registry=r)
        self.partition_errors = LoopCounter(
            "kafscale_partition_errors", "Per-partition error codes in Produce/Fetch responses, by API and error", ["api", "error"], registry=r
        )
        self.flush_seconds = LoopHistogram(
            "kafscale_flush_duration_seconds", "Time to upload a segment and commit it to the metadata store", buckets=LATENCY_BUCKETS, registry=r
        )
        self.flush_bytes = LoopHistogram(
            "kafscale_flush_size_bytes", "Size of each uploaded segment (small ones mean many PUTs per byte)",
            buckets=(1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864), registry=r,
        )
        self.store_seconds = LoopHistogram(
            "kafscale_object_store_request_duration_seconds", "Time an object-store call took as its caller waited (retries included), by operation",
            ["op"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.store_failures = Counter("kafscale_object_store_request_failures", "Object-store calls that failed (after retries), by operation", ["op"], registry=r)
        self.metadata_seconds = LoopHistogram(
            "kafscale_metadata_request_duration_seconds", "Time a metadata-store call (SQLite or etcd) took as its caller waited, by operation",
            ["op"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.metadata_failures = Counter("kafscale_metadata_request_failures", "Metadata-store calls that failed, by operation", ["op"], registry=r)
        ProcessCollector(namespace="kafscale", registry=r)
        # Filled by the sampler (OpsHandle); read by the collector.
        self.health: dict[str, Any] = {"ready": None, "metadata": None, "object_store": None, "listener": None, "checked_at": 0.0}
        self.lag: dict[tuple[str, str, int], tuple[int, int]] = {}  # (group, topic, partition) -> (committed, lag)
        self.lag_sampled_at = 0.0
        self.topic_names: dict[Any, str] = {}  # topic id -> name, for Fetch v13+ (ids only)
        # Label children cached per key: resolving labels costs more than the increment.
        self._req_children: dict[tuple[int, int], tuple] = {}
        self._store_children: dict[str, tuple] = {}
        self._metadata_children: dict[str, tuple] = {}
        self._topic_children: dict[tuple[str, str], Any] = {}
        self._error_children: dict[tuple[str, int], Any] = {}
        self._response_hooks: dict[int, Any] = {}  # api key -> the hook install_taps registered
        r.register(_LiveCollector(broker, self))

    # -- request hook (hot path: dictionary lookups and increments only) ------------------

    def on_request(self, api_key: int, version: int, seconds: float, error: BaseException | None) -> None:
        children = self._req_children.get((api_key, version))
        if children is None:
            name = api_name(api_key)
            children = (self.requests.labels(name, str(version)), self.request_errors.labels(name, str(version)), self.latency.labels(name))
            self._req_children[(api_key, version)] = children
        children[0].inc()
        children[2].observe(seconds)
        if error is not None:
            children[1].inc()

    def _topic_counter(self, family: str, topic: str):
        child = self._topic_children.get((family, topic))
        if child is None:
            child = getattr(self, family).labels(topic)
            self._topic_children[(family, topic)] = child
        return child

    def _partition_error(self, api: str, code: int):
        child = self._error_children.get((api, code))
        if child is None:
            child = self._error_children[(api, code)] = self.partition_errors.labels(api, error_name(code))
        return child

    def forget_topics(self, live: set[str]) -> None:
        """Drop per-topic series of deleted topics (called by the sampler)."""
        for family, topic in [k for k in self._topic_children if k[1] not in live]:
            del self._topic_children[(family, topic)]
            try:
                getattr(self, family).remove(topic)
            except KeyError:
                pass

    # -- produce / fetch taps -------------------------------------------------------------

    def account_produce(self, req, resp) -> None:
        # The response lists topics and partitions in request order (produce.py builds it
        # that way); with acks=0 there is no response and every partition counts.
        resp_topics = resp.responses if resp is not None else None
        for i, td in enumerate(req.topic_data):
            rt = resp_topics[i] if resp_topics is not None and i < len(resp_topics) else None
            name = getattr(rt, "name", None) or getattr(td, "name", None) or self._name_of(getattr(td, "topic_id", None))
            if name is None:
                continue
            nbytes = nbatches = 0
            answers = rt.partition_responses if rt is not None else ()
            for j, pd in enumerate(td.partition_data):
                answer = answers[j] if j < len(answers) else None
                if answer is not None and answer.error_code:
                    self._partition_error("Produce", answer.error_code).inc()
                    continue
                data = pd.records
                if not data:
                    continue
                nbytes += len(data)
                # the handler's count of the batches it appended (produce_response.py), else
                # the record set walked again (acks=0, answers of old versions)
                nbatches += getattr(answer, "batches", 0) or records.count_batches(data)
            if nbytes:
                self._topic_counter("bytes_in", name).inc(nbytes)
                self._topic_counter("batches_in", name).inc(nbatches)

    def account_fetch(self, req, resp) -> None:
        if resp is None:
            return
        for rt in resp.responses:
            name = getattr(rt, "topic", None) or self._name_of(getattr(rt, "topic_id", None))
            nbytes = 0
            for p in rt.partitions:
                if p.error_code:
                    self._partition_error("Fetch", p.error_code).inc()
                if p.records:
                    nbytes += len(p.records)
            if nbytes and name is not None:
                self._topic_counter("bytes_out", name).inc(nbytes)

    def _name_of(self, topic_id) -> str | None:
        if topic_id is None:
            return None
        name = self.topic_names.get(topic_id)
        if name is None:
            # Fetch by id already loaded the topic into the broker's topic cache.
            name = self.broker.topic_name_for_id(topic_id)
            if name is not None:
                self.topic_names[topic_id] = name
        return name

    def on_flush(self, nbytes: int, seconds: float, puts: int) -> None:
        self.flush_seconds.observe(seconds)
        self.flush_bytes.observe(nbytes)

    def on_store_request(self, op: str, seconds: float, failed: bool) -> None:
        _observe(self._store_children, self.store_seconds, self.store_failures, op, seconds, failed)

    def on_metadata_request(self, op: str, seconds: float, failed: bool) -> None:
        _observe(self._metadata_children, self.metadata_seconds, self.metadata_failures, op, seconds, failed)

    def on_authentication(self, mechanism: str, succeeded: bool) -> None:
        self.sasl_authentications.labels(mechanism, "succeeded" if succeeded else "failed").inc()

    def install_taps(self) -> None:
        """Register on the broker's request, Produce and Fetch response, flush and
        authentication hooks; `remove_taps` unregisters."""
        self.remove_taps()
        points = self.broker.hooks
        points.request_hooks.append(self.on_request)
        self._response_hooks = {ApiKey.PRODUCE: _never_raising(self.account_produce), ApiKey.FETCH: _never_raising(self.account_fetch)}
        for key, hook in self._response_hooks.items():
            points.response_hooks.setdefault(key, []).append(hook)
        points.flush_hooks.append(self.on_flush)
        points.authentication_hooks.append(self.on_authentication)
        points.store_hooks.append(self.on_store_request)
        points.metadata_hooks.append(self.on_metadata_request)

    def remove_taps(self) -> None:
        points = self.broker.hooks
        if self.on_request in points.request_hooks:
            points.request_hooks.remove(self.on_request)
        hooks = points.response_hooks
        for key, hook in self._response_hooks.items():
            observers = hooks.get(key, [])
            if hook in observers:
                observers.remove(hook)
            if not observers:
                hooks.pop(key, None)  # an API with no observers costs the request path nothing
        self._response_hooks = {}
        if self.on_flush in points.flush_hooks:
            points.flush_hooks.remove(self.on_flush)
        if self.on_authentication in points.authentication_hooks:
            points.authentication_hooks.remove(self.on_authentication)
        if self.on_store_request in points.store_hooks:
            points.store_hooks.remove(self.on_store_request)
        if self.on_metadata_request in points.metadata_hooks:
            points.metadata_hooks.remove(self.on_metadata_request)


def _observe(children: dict, seconds_family, failures_family, op: str, seconds: float, failed: bool) -> None:
    pair = children.get(op)
    if pair is None:
        pair = children[op] = (seconds_family.labels(op), failures_family.labels(op))
    pair[0].observe(seconds)
    if failed:
        pair[1].inc()


def _never_raising(account):
    def hook(req, resp):
        try:
            account(req, resp)
        except Exception:  # noqa: BLE001 - metrics must never fail a request
            log.debug("metrics tap failed", exc_info=True)

    return hook


class _LiveCollector(Collector):
    """Reads broker state at scrape time: no work at all on the request path."""

    def __init__(self, broker: BrokerReadModel, metrics: BrokerMetrics):
        self.broker = broker
        self.metrics = metrics

    def describe(self):
        return []  # dynamic series: no registration-time name clash checks

    def collect(self):
        m = self.metrics
        settings = self.broker.settings
        st = self.broker.scrape()

        info = GaugeMetricFamily("kafscale_broker_info", "Static facts about this broker (value 1)", labels=["broker_id", "storage", "metadata"])
        info.add_metric([str(settings.broker_id), settings.storage_kind, settings.metadata_kind], 1)
        yield info

        counted, compaction = st.storage, st.compaction
        yield CounterMetricFamily("kafscale_produce_bytes", "Record-batch bytes appended to partition write buffers", value=counted.produce_bytes)
        yield CounterMetricFamily("kafscale_produce_records", "Records appended to partition write buffers", value=counted.produce_records)
        yield CounterMetricFamily("kafscale_flushes", "Segments uploaded and committed (one per group-commit flush)", value=counted.flushes)
        yield CounterMetricFamily("kafscale_flush_failures", "Flushes that failed (upload or metadata commit); their batches were rejected", value=counted.flush_failures)
        yield CounterMetricFamily("kafscale_segment_bytes", "Bytes of segments uploaded to the object store", value=counted.segment_bytes)
        yield CounterMetricFamily("kafscale_compaction_rounds", "Times the compactor looked at every owned compacted partition (every --compaction-interval-ms)", value=compaction.rounds)
        yield CounterMetricFamily("kafscale_compaction_runs", "Log compaction passes completed over compacted partitions", value=compaction.runs)
        yield CounterMetricFamily("kafscale_compaction_bytes_read", "Segment bytes read by log compaction (key map and cleaning)", value=compaction.bytes_read)
        yield CounterMetricFamily("kafscale_compaction_bytes_written", "Segment bytes written by log compaction", value=compaction.bytes_written)
        yield CounterMetricFamily("kafscale_compaction_segments_written", "Segments written by log compaction", value=compaction.segments_written)
        yield CounterMetricFamily("kafscale_compaction_records_removed", "Records removed by log compaction (superseded, aborted, keyless, tombstones past their delete horizon, markers)", value=compaction.records_removed)
        yield CounterMetricFamily("kafscale_compaction_recompressions", "Compressed batches log compaction decompressed and compressed again (not in kafscale_decompressions_total)", value=compaction.recompressions)
        yield GaugeMetricFamily("kafscale_compaction_key_map_peak_entries", "Most keys one compaction pass held in its key map (budget: --compaction-key-map-bytes)", value=compaction.key_map_peak_entries)
        yield _by_label(CounterMetricFamily, "kafscale_object_store_requests", "Object-store requests issued by the log manager, by operation", "op", (("put", counted.puts), ("get", counted.gets)))
        yield CounterMetricFamily("kafscale_decompressions", "Compressed record batches decompressed by this broker process (0 from produce and fetch, which store and serve batches as the client compressed them, except produce to topics with message.timestamp.*.max.ms set, whose record timestamps are checked; ListOffsets by timestamp decompresses the batch holding the answer)", value=records.decompressions)
        yield CounterMetricFamily("kafscale_schema_check_decompressions", "Compressed record batches produce decompressed to check the schema ids of records sent to topics with confluent.key/value.schema.validation (0 unless compressed batches go to such topics)", value=records.schema_check_decompressions)
        yield CounterMetricFamily("kafscale_key_check_decompressions", "Compressed record batches produce decompressed to check that every record sent to a compacted topic has a key (Kafka's rule; 0 unless compressed batches go to topics with cleanup.policy compact)", value=records.key_check_decompressions)
        yield _by_label(CounterMetricFamily, "kafscale_record_conversions", "Record sets re-encoded between message formats by this broker process: 'up' a Produce v0-v2 message set (magic 0/1) into a v2 batch on append, 'down' a stored v2 batch into a message set for a Fetch v0-v3 (the only re-encoding the broker does)",
                        "direction", (("up", legacy_records.up_conversions), ("down", legacy_records.down_conversions)))

        cache = st.cache
        yield CounterMetricFamily("kafscale_cache_hits", "Segment cache lookups that found the segment", value=cache.hits)
        yield CounterMetricFamily("kafscale_cache_misses", "Segment cache lookups that had to read the object store", value=cache.misses)
        yield GaugeMetricFamily("kafscale_cache_bytes", "Bytes of segments held in the cache", value=cache.bytes)
        yield GaugeMetricFamily("kafscale_cache_max_bytes", "Cache budget (--cache-bytes)", value=cache.max_bytes)

        yield GaugeMetricFamily("kafscale_connections", "Open Kafka client connections", value=st.connections)
        yield GaugeMetricFamily("kafscale_request_memory_bytes", "Bytes of requests being read or handled (budget: --max-request-memory)", value=st.request_memory)
        if st.authorization_denials is not None:
            yield _by_label(CounterMetricFamily, "kafscale_authorization_denials", "Requests refused by the ACL authorizer, by operation", "operation", sorted(st.authorization_denials.items()))
        if st.tls is not None:
            yield CounterMetricFamily("kafscale_tls_handshake_failures", "TLS handshakes that failed (plaintext clients, untrusted certificates, timeouts)", value=st.tls.handshake_failures)
            yield CounterMetricFamily("kafscale_tls_reloads", "Times changed TLS files were loaded without restart", value=st.tls.reloads)
            yield CounterMetricFamily("kafscale_tls_reload_failures", "Times changed TLS files could not be loaded (the previous certificate stayed)", value=st.tls.reload_failures)

        if st.cluster_brokers is not None:
            yield GaugeMetricFamily("kafscale_cluster_brokers", "Live brokers this broker sees (itself included)", value=st.cluster_brokers)
        if st.lease_alive is not None:
            yield GaugeMetricFamily("kafscale_cluster_lease_alive", "1 while the etcd lease is fresh enough to write (etcd clusters only)", value=1 if st.lease_alive else 0)

        yield GaugeMetricFamily("kafscale_partitions_owned", "Partition logs this broker owns and has loaded", value=len(st.partitions))
        yield from _row_gauges(["topic", "partition"], st.partitions, lambda p: [p.topic, str(p.partition)], (
            ("kafscale_partition_high_watermark", "High watermark (next offset to be made durable) of an owned partition", "high_watermark"),
            ("kafscale_partition_log_start_offset", "First offset still kept of an owned partition", "log_start_offset"),
            ("kafscale_partition_segments", "Committed segments of an owned partition (the metadata store's segment list)", "segments"),
            ("kafscale_partition_size_bytes", "Bytes of an owned partition's committed segments in the object store", "segment_bytes"),
        ))
        yield GaugeMetricFamily("kafscale_unflushed_records", "Records appended but not yet durable, over all owned partitions", value=sum(p.unflushed_records for p in st.partitions))

        if st.share is not None:
            yield from _share_families(st.share)

        if st.metadata_snapshot_age_s is not None:
            yield GaugeMetricFamily("kafscale_metadata_snapshot_age_seconds", "Age of the newest metadata snapshot in the backup location (docs/operations.md: alert when it exceeds a few snapshot intervals)", value=st.metadata_snapshot_age_s)

        h = m.health
        for key, name, doc in (
            ("ready", "kafscale_ready", "1 when /readyz answers 200 (last check)"),
            ("metadata", "kafscale_metadata_store_up", "1 when the metadata store answered the last health check"),
            ("object_store", "kafscale_object_store_up", "1 when the object store answered the last health check"),
            ("listener", "kafscale_listener_up", "1 when the Kafka listener accepts connections"),
        ):
            if h.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=1 if h[key] else 0)
        if h.get("checked_at"):
            yield GaugeMetricFamily("kafscale_health_checked_timestamp_seconds", "Unix time of the last health check", value=h["checked_at"])

        states = st.group_states
        by_state: dict[str, int] = {}
        for s in states.values():
            by_state[s] = by_state.get(s, 0) + 1
        for s in ("Empty", "Stable", "PreparingRebalance", "CompletingRebalance", "Dead"):
            by_state.setdefault(s, 0)
        yield _by_label(GaugeMetricFamily, "kafscale_consumer_groups", "Consumer groups coordinated here, by state", "state", sorted(by_state.items()))

        lag = GaugeMetricFamily("kafscale_consumer_lag", "High watermark minus committed offset (sampled)", labels=["group", "topic", "partition"])
        committed = GaugeMetricFamily("kafscale_consumer_committed_offset", "Committed offset (sampled)", labels=["group", "topic", "partition"])
        total: dict[str, int] = {}
        for (group, topic, partition), (off, n) in m.lag.items():
            lag.add_metric([group, topic, str(partition)], n)
            committed.add_metric([group, topic, str(partition)], off)
            total[group] = total.get(group, 0) + n
        yield lag
        yield committed
        yield _by_label(GaugeMetricFamily, "kafscale_consumer_group_lag", "Sum of a group's lag over its partitions (sampled)", "group", sorted(total.items()))
        if m.lag_sampled_at:
            yield GaugeMetricFamily("kafscale_consumer_lag_sampled_timestamp_seconds", "Unix time of the last lag sample", value=m.lag_sampled_at)



def _by_label(family, name: str, doc: str, label: str, values: Iterable[tuple[str, float]]):
    """A metric family (CounterMetricFamily or GaugeMetricFamily) of one series per
    (label value, value), in the order given."""
    out = family(name, doc, labels=[label])
    for label_value, value in values:
        out.add_metric([label_value], value)
    return out


def _share_families(share):
    """Share groups (KIP-932): what the share partitions served here did, in records, and
    each one's window now."""
    c = share.counts
    yield CounterMetricFamily("kafscale_share_records_acquired", "Records acquired by share consumers (each acquisition is one delivery)", value=c.acquired)
    yield CounterMetricFamily("kafscale_share_records_redelivered", "Records acquired again (a delivery after the first: released, lock timed out, or left by a member)", value=c.redelivered)
    yield _by_label(CounterMetricFamily, "kafscale_share_acknowledgements", "Records acknowledged by share consumers, by acknowledge type (accept, release, reject, gap, renew)", "type", sorted(c.acknowledged.items()))
    yield CounterMetricFamily("kafscale_share_lock_timeouts", "Acquired records whose acquisition lock ran out before an acknowledgement", value=c.lock_timeouts)
    yield _by_label(CounterMetricFamily, "kafscale_share_records_released", "Acquired records given back at once, by why: the member's share session closed (or its connection), or the member left its group", "cause", sorted(c.released.items()))
    yield _by_label(CounterMetricFamily, "kafscale_share_records_archived", "Records archived, never to be delivered again, by why: rejected, delivery_limit (released or timed out at group.share.delivery.count.limit), gap", "reason", sorted(c.archived.items()))
    yield CounterMetricFamily("kafscale_share_state_writes", "Share-partition state documents written to the metadata store (one per acknowledging request and partition)", value=share.state_writes)
    yield GaugeMetricFamily("kafscale_share_sessions", "Open share sessions (one per share consumer and broker it fetches from)", value=share.sessions)
    yield from _row_gauges(["group", "topic", "partition"], share.partitions, lambda p: [p.group, p.topic, str(p.partition)], (
        ("kafscale_share_partition_in_flight_records", "Records from a share partition's start offset to the end of what was acquired (available, acquired, acknowledged or archived ahead of the start)", "in_flight"),
        ("kafscale_share_partition_acquired_records", "Records of a share partition held by consumers now (under an acquisition lock)", "acquired"),
        ("kafscale_share_partition_start_offset", "A share partition's start offset (SPSO): every record below it is done with", "start_offset"),
    ))


def _row_gauges(label_names: list[str], rows, key_of, specs) -> list[GaugeMetricFamily]:
    """One gauge family per (name, help, attribute) of `specs`, a sample per row."""
    families = [(GaugeMetricFamily(name, doc, labels=label_names), attr) for name, doc, attr in specs]
    for row in rows:
        key = key_of(row)
        for family, attr in families:
            family.add_metric(key, getattr(row, attr))
    return [family for family, _ in families]
