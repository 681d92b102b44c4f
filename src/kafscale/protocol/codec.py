"""Sans-I/O Kafka request/response codec over kio's generated schemas.

Frames are `int32 length | payload`. A request payload is a header (v1, or v2 with tagged
fields for flexible versions) followed by the body; responses carry header v0 (or v1 for
flexible versions, except ApiVersions which always answers with header v0).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from kio.index import load_payload_module
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from kafscale.protocol import validate, varint
from kafscale.protocol.api_keys import ApiKey

_I16I16I32 = struct.Struct(">hhi")
_I32 = struct.Struct(">i")


class MalformedRequest(ValueError):
    pass


class RequestHeader(NamedTuple):  # a NamedTuple: one per request, 3x cheaper to build than a frozen dataclass (#33)
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the body starts in the frame payload


@lru_cache(maxsize=None)
def schema(api_key: int, version: int, kind: str) -> type:
    """The kio request/response class for an API key and version."""
    entity = EntityType.request if kind == "request" else EntityType.response
    module = load_payload_module(api_key, version, entity)
    name = "".join(part.title() for part in api_key_map[api_key].split("_"))
    return getattr(module, name + ("Request" if kind == "request" else "Response"))


def kio_versions(api_key: int) -> tuple[int, int]:
    """The version range kio provides for an API key."""
    from kio.schema.index import schema_name_map

    versions = sorted(schema_name_map[api_key_map[api_key]])
    return versions[0], versions[-1]


@lru_cache(maxsize=None)
def _reader(cls: type):
    return entity_reader(cls)


@lru_cache(maxsize=None)
def _writer(cls: type):
    return entity_writer(cls)


def decode_header(payload: memoryview, flexible: bool | None) -> RequestHeader:
    """Parse the request header. `flexible` None: decide from the api key/version."""
    if len(payload) < 10:
        raise MalformedRequest(f"request header needs at least 10 bytes, got {len(payload)}")
    api_key, api_version, correlation_id = _I16I16I32.unpack_from(payload, 0)
    (n,) = struct.unpack_from(">h", payload, 8)
    pos = 10
    client_id = None
    if n >= 0:
        if pos + n > len(payload):
            raise MalformedRequest("client id runs past the end of the frame")
        client_id = bytes(payload[pos : pos + n]).decode("utf-8", "replace")
        pos += n
    if flexible:
        try:
            pos = varint.skip_tagged_fields(payload, pos)
        except varint.VarintError as e:
            raise MalformedRequest(f"{e} in request header") from None
        if pos > len(payload):
            raise MalformedRequest("tagged fields run past the end of the frame")
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def peek_api(payload: memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) without decoding anything else."""
    if len(payload) < 8:
        raise MalformedRequest(f"frame of {len(payload)} bytes is too short for a request header")
    return _I16I16I32.unpack_from(payload, 0)


def is_flexible(api_key: int, version: int) -> bool:
    return bool(schema(api_key, version, "request").__flexible__)


def decode_body(api_key: int, version: int, payload: memoryview, offset: int) -> Any:
    cls = schema(api_key, version, "request")
    payload = memoryview(payload).toreadonly()  # kio's readers (the validator's varints too) take read-only buffers
    try:
        # Bounds first: kio's native decoder aborts the process on a huge array count.
        validate.check(cls, payload, offset)
    except validate.InvalidRequestBody as e:
        raise MalformedRequest(f"{cls.__name__} v{version}: {e}") from None
    try:
        value, size = _reader(cls)(payload, offset)
    except Exception as e:  # kio raises various errors on short/garbled input
        raise MalformedRequest(f"cannot decode {cls.__name__} v{version}: {e}") from e
    if offset + size > len(payload):
        raise MalformedRequest(f"{cls.__name__} v{version}: body runs past the end of the frame")
    # Trailing bytes are ignored, as Apache Kafka does (librdkafka 2.16 sends a few extra
    # bytes in some Metadata requests).
    return value


def encode_response(api_key: int, version: int, correlation_id: int, response: Any) -> list[bytes]:
    """Frame a response: returns buffers to write as they are (length prefix first)."""
    flexible_header = api_key != ApiKey.API_VERSIONS and bool(response.__flexible__)
    header = _I32.pack(correlation_id) + (b"\0" if flexible_header else b"")  # flexible: no tagged fields in it
    return [_frame(header, response)]


def _frame(header: bytes, entity: Any) -> bytes:
    """Length prefix, `header`, then `entity` as kio writes it."""
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    buf.write(header)
    _writer(type(entity))(buf, entity)
    out = buf.getbuffer()
    _I32.pack_into(out, 0, len(out) - 4)
    del out
    return buf.getvalue()


def encode_entity(entity: Any) -> bytes:
    """One entity (a response's nested entry, say) as kio writes it inside a message."""
    buf = io.BytesIO()
    _writer(type(entity))(buf, entity)
    return buf.getvalue()


def encode_raw_response(correlation_id: int, body: bytes, flexible_header: bool = False) -> bytes:
    header = _I32.pack(correlation_id) + (b"\0" if flexible_header else b"")
    return _I32.pack(len(header) + len(body)) + header + body


class EncodedResponse:
    """A response encoded once, framed again for each request it answers: for an answer
    that stays the same while the broker runs (ApiVersions, which every client asks on
    every connection). The request path sends `encode_frame(correlation_id)`; the bytes
    are those `encode_response` makes of `response`."""

    __slots__ = ("response", "_body", "_flexible_header")

    def __init__(self, api_key: int, version: int, response: Any):
        self.response = response
        self._flexible_header = api_key != ApiKey.API_VERSIONS and bool(response.__flexible__)
        frame = encode_response(api_key, version, 0, response)[0]
        self._body = frame[8 + self._flexible_header :]  # after length, correlation id, tagged fields

    def encode_frame(self, correlation_id: int) -> list[bytes]:
        return [encode_raw_response(correlation_id, self._body, self._flexible_header)]


def encode_request(api_key: int, version: int, correlation_id: int, client_id: str | None, body: Any) -> bytes:
    """Frame a request (header v1, or v2 for flexible versions), as a broker sends one to
    another broker (the transaction coordinator's WriteTxnMarkers)."""
    header = _I16I16I32.pack(api_key, version, correlation_id)
    if client_id is None:
        header += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        header += struct.pack(">h", len(raw)) + raw
    if type(body).__flexible__:
        header += b"\0"  # no tagged fields in the request header
    return _frame(header, body)


def decode_response(api_key: int, version: int, payload: bytes) -> tuple[int, Any]:
    """(correlation id, response entity) of a response frame's payload (no length prefix)."""
    cls = schema(api_key, version, "response")
    (correlation_id,) = _I32.unpack_from(payload, 0)
    pos = 4
    if api_key != ApiKey.API_VERSIONS and cls.__flexible__:
        pos = varint.skip_tagged_fields(memoryview(payload).toreadonly(), pos)
    value, _size = _reader(cls)(memoryview(payload).toreadonly(), pos)
    return correlation_id, value
