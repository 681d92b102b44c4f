"""Writing DataFrames back into KafScale through a broker (confluent-kafka producer).

    df.write.format("kafscale").option("bootstrap", "host:9092").option("topic", "out").save()

Columns follow Spark's Kafka sink: `value` (binary or string, required), and optionally `key`
(binary or string), `headers` (array<struct<key: string, value: binary>>), `topic` (used
when no `topic` option is given) and `partition` (int). Options starting with `kafka.` are
passed to librdkafka (e.g. `kafka.linger.ms`), the client security settings too, as with
Spark's Kafka sink: `kafka.security.protocol`, `kafka.ssl.ca.location`, `kafka.sasl.mechanism`,
`kafka.sasl.username`, `kafka.sasl.password`, ... (docs/security.md). A failed authentication
fails the task at once with the client's message. Delivery is at least once: a retried
Spark task produces its rows again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

try:  # Arrow writers (Spark 4.1+) hand over column batches instead of Row objects
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
except ImportError:
    DataSourceArrowWriter, DataSourceStreamArrowWriter = DataSourceWriter, DataSourceStreamWriter  # type: ignore[misc]

FLUSH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SinkConfig:
    bootstrap: str
    topic: str | None
    producer_config: tuple[tuple[str, str], ...]


def parse_sink_options(options, schema: StructType) -> SinkConfig:
    bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
    if not bootstrap:
        raise ValueError("option bootstrap (host:port of a KafScale broker) is required for writing")
    names = {f.name: f.dataType for f in schema.fields}
    if "value" not in names:
        raise ValueError("writing to kafscale needs a value column (binary or string)")
    for col, allowed in (("key", (BinaryType, StringType)), ("value", (BinaryType, StringType)), ("topic", (StringType,)), ("partition", (IntegerType,))):
        if col in names and not isinstance(names[col], allowed):
            raise ValueError(f"column {col} must be {' or '.join(a.__name__ for a in allowed)}, not {names[col].simpleString()}")
    if "headers" in names:
        h = names["headers"]
        if not (isinstance(h, ArrayType) and isinstance(h.elementType, StructType) and [f.name for f in h.elementType.fields] == ["key", "value"]):
            raise ValueError("column headers must be array<struct<key: string, value: binary>>")
    topic = options.get("topic")
    if not topic and "topic" not in names:
        raise ValueError("give option topic or a topic column")
    extra = tuple(sorted((k[len("kafka.") :], str(v)) for k, v in options.items() if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"))
    return SinkConfig(bootstrap, topic or None, extra)


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


def _headers(v: Any) -> list[tuple[str, bytes | None]] | None:
    if not v:
        return None
    out = []
    for h in v:
        if isinstance(h, dict):
            k, val = h.get("key"), h.get("value")
        else:  # Row or tuple
            k, val = h[0], h[1]
        out.append((k or "", _as_bytes(val)))
    return out


def _messages(items: Iterable[Any]) -> Iterator[dict]:
    """Rows or Arrow record batches -> dicts with the columns present."""
    for item in items:
        if hasattr(item, "to_pylist"):  # pyarrow.RecordBatch
            yield from item.to_pylist()
        else:
            yield item.asDict(recursive=False) if hasattr(item, "asDict") else dict(item)


class _Producer:
    """confluent-kafka producer that turns async delivery failures into an exception."""

    def __init__(self, cfg: SinkConfig, producer_factory=None):
        if producer_factory is None:
            from confluent_kafka import Producer as producer_factory  # type: ignore[no-redef]
        conf = {"bootstrap.servers": cfg.bootstrap, "linger.ms": 5, **dict(cfg.producer_config)}
        self.cfg = cfg
        conf.setdefault("error_cb", self._client_error)
        self.producer = producer_factory(conf)
        self.errors: list[str] = []
        self.fatal: str | None = None  # authentication refused, or a fatal client error
        self.sent = 0

    def _client_error(self, err) -> None:
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._AUTHENTICATION or err.fatal():
            self.fatal = self.fatal or err.str()

    def _check(self) -> None:
        if self.fatal:
            raise RuntimeError(f"kafscale sink: cannot write through {self.cfg.bootstrap}: {self.fatal}")

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def send(self, row: dict) -> None:
        topic = self.cfg.topic or row.get("topic")
        if not topic:
            raise ValueError("row without topic (and no topic option)")
        kwargs: dict[str, Any] = {"value": _as_bytes(row.get("value")), "key": _as_bytes(row.get("key")), "on_delivery": self._delivered}
        headers = _headers(row.get("headers"))
        if headers:
            kwargs["headers"] = headers
        if row.get("partition") is not None:
            kwargs["partition"] = int(row["partition"])
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self.producer.poll(0.1)
                self._check()
        self.sent += 1
        self.producer.poll(0)
        self._check()

    def finish(self) -> int:
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while True:  # flushed in steps, so that a refused authentication ends it at once
            left = self.producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
            self._check()
            if not left or time.monotonic() >= deadline:
                break
        if left:
            self.errors.append(f"{left} messages still undelivered after {FLUSH_TIMEOUT_S}s")
        if self.errors:
            raise RuntimeError(f"kafscale sink: {len(self.errors)} delivery failure(s) via {self.cfg.bootstrap}; first: {self.errors[0]}")
        return self.sent


@dataclass
class ProducedMessage(WriterCommitMessage):
    rows: int


def produce_all(cfg: SinkConfig, items: Iterable[Any], producer_factory=None) -> ProducedMessage:
    producer = _Producer(cfg, producer_factory)
    for row in _messages(items):
        producer.send(row)
    return ProducedMessage(producer.finish())


class KafScaleWriter(DataSourceArrowWriter):
    def __init__(self, cfg: SinkConfig):
        self.cfg = cfg

    def write(self, iterator) -> ProducedMessage:
        return produce_all(self.cfg, iterator)

    def commit(self, messages) -> None:
        pass  # each task flushed its own producer: rows are in the topic already

    def abort(self, messages) -> None:
        pass  # produced rows cannot be taken back (Kafka sink semantics: at least once)


class KafScaleStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, cfg: SinkConfig):
        self.cfg = cfg

    def write(self, iterator) -> ProducedMessage:
        return produce_all(self.cfg, iterator)

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass
