"""A tiny Kafka client over a plain socket, for tests that need exact protocol control.

- `RawClient.request(api_key, version, body)` frames a kio request entity with request
  header v1 (or v2 for flexible versions), sends it and decodes the response (header v0,
  or v1 for flexible versions except ApiVersions, which always answers with header v0).
- `send_raw()` / `send_frame()` / `recv_frame()` / `wait_closed()` send arbitrary bytes
  and observe what the broker does with them.
- `req(api_key, version, "Nested", **fields)` builds kio entities by name.

The encoding is done here with `struct` and kio's serializers only; nothing comes from the
broker's own codec, so the tests check the wire format independently.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import sys
import time
from functools import lru_cache

from kio.index import load_payload_module
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

API_VERSIONS = 18


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset) while we waited for bytes."""


@lru_cache(maxsize=None)
def schema(api_key: int, version: int, kind: str) -> type:
    entity = EntityType.request if kind == "request" else EntityType.response
    module = load_payload_module(api_key, version, entity)
    name = "".join(part.title() for part in api_key_map[api_key].split("_"))
    return getattr(module, name + ("Request" if kind == "request" else "Response"))


def entity(api_key: int, version: int, name: str | None = None, kind: str = "request") -> type:
    """The top-level kio class, or a nested entity class of the same module by name."""
    cls = schema(api_key, version, kind)
    return cls if name is None else getattr(sys.modules[cls.__module__], name)


def _convert(f: dataclasses.Field, value):
    kind = f.metadata.get("kafka_type")
    if kind in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kind == "uuid" and value is None:
        return None
    return value


def req(api_key: int, version: int, entity_name: str | None = None, /, **fields):
    """Build a kio entity; fields the version does not have are dropped, plain ints become
    timedeltas where kio wants them, and a missing nullable uuid (topic_id) is None."""
    cls = entity(api_key, version, entity_name)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {k: _convert(known[k], v) for k, v in fields.items() if k in known}
    for fname, f in known.items():
        if fname not in kwargs and f.metadata.get("kafka_type") == "uuid" and f.default is dataclasses.MISSING:
            kwargs[fname] = None
    return cls(**kwargs)


def encode_string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def request_header(api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool) -> bytes:
    out = struct.pack(">hhi", api_key, version, correlation_id) + encode_string(client_id)
    if flexible:
        out += b"\x00"  # header v2: empty tagged fields
    return out


def encode_request(api_key: int, version: int, body, correlation_id: int, client_id: str | None = "raw-test") -> bytes:
    """The payload (without the length prefix) of a request."""
    cls = type(body)
    buf = io.BytesIO()
    buf.write(request_header(api_key, version, correlation_id, client_id, bool(cls.__flexible__)))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def produce_frame(topic: str, batches: dict[int, bytes], correlation_id: int, acks: int = -1) -> bytes:
    """A whole Produce v9 frame (length prefix included) of one topic: partition -> record set."""
    parts = tuple(req(0, 9, "PartitionProduceData", index=p, records=b) for p, b in batches.items())
    t = req(0, 9, "TopicProduceData", name=topic, partition_data=parts)
    body = req(0, 9, transactional_id=None, acks=acks, timeout=30_000, topic_data=(t,))
    return frame(encode_request(0, 9, body, correlation_id))


def _read_uvarint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def decode_response(api_key: int, version: int, payload: bytes):
    """(correlation id, kio response) from a response payload (without length prefix)."""
    cls = schema(api_key, version, "response")
    (corr,) = struct.unpack_from(">i", payload, 0)
    pos = 4
    if cls.__flexible__ and api_key != API_VERSIONS:
        n, pos = _read_uvarint(payload, pos)
        for _ in range(n):
            _tag, pos = _read_uvarint(payload, pos)
            size, pos = _read_uvarint(payload, pos)
            pos += size
    value, size = entity_reader(cls)(memoryview(payload).toreadonly(), pos)
    assert pos + size == len(payload), f"{len(payload) - pos - size} trailing bytes after {cls.__name__}"
    return corr, value


class RawClient:
    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str | None = "raw-test"):
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.client_id = client_id
        self._corr = 0

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- bytes ------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_raw_to_slow_reader(self, data: bytes) -> None:
        """send_raw to a broker that may stop reading this connection for longer than the
        socket's timeout (sendall's timeout bounds the whole send): waits on until all is
        sent, or the connection is closed."""
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view[: 1 << 20]) :]
            except TimeoutError:
                continue  # not read meanwhile: what the caller is waiting for

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(frame(payload))

    def _recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self.sock.recv(min(n - len(out), 1 << 20))
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ConnectionClosed(str(e)) from None
            if not chunk:
                raise ConnectionClosed(f"EOF after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def recv_frame(self) -> bytes:
        (n,) = struct.unpack(">i", self._recv_exact(4))
        return self._recv_exact(n)

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True if the broker closes the connection within `timeout` (any bytes it sends
        first are read and discarded)."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = self.sock.recv(65536)
                except socket.timeout:
                    continue
                except (ConnectionResetError, BrokenPipeError):
                    return True
                if not chunk:
                    return True
            return False
        finally:
            self.sock.settimeout(self.timeout)

    # -- requests ---------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        self._corr += 1
        return self._corr

    def send_request(self, api_key: int, version: int, body) -> int:
        corr = self.next_correlation_id()
        self.send_frame(encode_request(api_key, version, body, corr, self.client_id))
        return corr

    def request(self, api_key: int, version: int, body):
        corr = self.send_request(api_key, version, body)
        got, resp = decode_response(api_key, version, self.recv_frame())
        assert got == corr, f"correlation id {got} != {corr}"
        return resp

    # -- conveniences -------------------------------------------------------------------

    def metadata(self, topics: list[str] | None, version: int = 12, allow_auto: bool = True):
        ts = None if topics is None else tuple(req(3, version, "MetadataRequestTopic", name=t) for t in topics)
        return self.request(3, version, req(3, version, topics=ts, allow_auto_topic_creation=allow_auto,
                                           include_topic_authorized_operations=False,
                                           include_cluster_authorized_operations=False))

    def produce(self, topic: str, partition: int, records: bytes | None, acks: int = -1, version: int = 9, timeout_ms: int = 10000):
        """Produce a raw record set; returns the partition response (or None for acks=0)."""
        p = req(0, version, "PartitionProduceData", index=partition, records=records)
        t = req(0, version, "TopicProduceData", name=topic, partition_data=(p,))
        body = req(0, version, transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms), topic_data=(t,))
        if acks == 0:
            self.send_request(0, version, body)
            return None
        resp = self.request(0, version, body)
        return resp.responses[0].partition_responses[0]

    def list_offsets(self, topic: str, partition: int, timestamp: int, version: int = 7):
        p = req(2, version, "ListOffsetsPartition", partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)
        t = req(2, version, "ListOffsetsTopic", name=topic, partitions=(p,))
        resp = self.request(2, version, req(2, version, replica_id=-1, isolation_level=0, timeout=5000, topics=(t,)))
        return resp.topics[0].partitions[0]

    def fetch(self, topic: str, partition: int, offset: int, version: int = 12, max_bytes: int = 50 * 1024 * 1024, max_wait_ms: int = 100):
        """Fetch (by topic name, so version <= 12); returns the partition data."""
        fp = req(1, version, "FetchPartition", partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                 last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)
        ft = req(1, version, "FetchTopic", topic=topic, partitions=(fp,))
        body = req(1, version, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
                   max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1, topics=(ft,),
                   forgotten_topics_data=(), rack_id="")
        resp = self.request(1, version, body)
        return resp.responses[0].partitions[0]


def error_code(value) -> int:
    """kio gives ErrorCode enums; compare as plain ints."""
    return int(getattr(value, "value", value))
