"""The steps one request frame goes through, in `KafkaServer.handle`'s order; each is a
function or method of its own, testable without a socket (tests/test_request_path.py).

1. `read_api`: API key, version and correlation id from the header.
2. `sasl_gate`: on a SASL listener, only ApiVersions, SaslHandshake and SaslAuthenticate
   before authentication, and only re-authentication once the session expired.
3. `check_version`: the key and version the router serves; an unsupported one closes the
   connection, except a too-new ApiVersions (`api_versions_error_frame`).
4. `decode`: header and body into a `Call`; a version older than kio's is converted to the
   kio request of the adapter's version (protocol/legacy.py).
5. authorization: `authz_checks.authorize` (the rules), `refusal_frame` (a request refused whole).
6. ordering: a request whose API keeps the connection's order (Produce) takes its turn
   (`RequestContext.wait_turn`), chained in frame order.
7. the handler, the denied topics merged back, the response hooks (`KafkaServer`).
8. quotas: `with_throttle` puts a quota's throttle into the response.
9. `encode_answer`: the response at the version on the wire, with the fallback answer when
   the response cannot be encoded.

Any step may raise `CloseConnection`: that one connection closes, with one log line.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import struct
from dataclasses import dataclass
from typing import Any, Callable

from kio.schema.index import api_key_map

from kafscale.broker import authz_checks
from kafscale.broker.router import Api
from kafscale.errors import ErrorCode
from kafscale.protocol import codec, legacy
from kafscale.protocol.api_keys import ApiKey
from kafscale.protocol.codec import RequestHeader
from kafscale.security.sasl import BEFORE_AUTHENTICATION


class CloseConnection(Exception):
    """Drop this one connection (malformed or unsupported input); others keep going.
    `level`: of the one log line saying why."""

    def __init__(self, message: str, level: int = logging.WARNING):
        super().__init__(message)
        self.level = level


def read_api(payload: memoryview) -> tuple[int, int, int]:
    """(api key, version, correlation id)."""
    try:
        return codec.peek_api(payload)
    except codec.MalformedRequest as e:
        raise CloseConnection(str(e)) from None


def sasl_gate(session, api_key: int, listener_name: str) -> None:
    """A SASL listener's connection (`session`): what it may send in its state."""
    if not session.authenticated and api_key not in BEFORE_AUTHENTICATION:
        raise CloseConnection(f"unexpected request {api_key_map.get(api_key, api_key)} (api {api_key}) before SASL authentication on listener {listener_name}")
    if session.expired() and api_key not in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
        raise CloseConnection(f"SASL session of {session.principal} expired (connections.max.reauth.ms) and was not re-authenticated")


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A key or version the broker does not serve (`api` None: an unknown key)."""

    api_key: int
    version: int
    api: Api | None

    @property
    def answer_with_versions(self) -> bool:
        """Kafka answers a too-new ApiVersions with a v0 error response listing what it
        supports, so the client can retry with a version both sides know; anything else
        closes the connection without an answer (the request cannot be parsed)."""
        return self.api_key == ApiKey.API_VERSIONS and self.api is not None and self.version > self.api.max_version

    def reason(self, suppressed: int = 0) -> str:
        name = api_key_map.get(self.api_key, "unknown API")
        more = f" ({suppressed} more such requests from this address since the last warning)" if suppressed else ""
        supported = f"; supported versions {self.api.min_version}-{self.api.max_version}" if self.api is not None else ""
        return f"unsupported request: API key {self.api_key} ({name}) version {self.version}{supported}{more}"


def check_version(api: Api | None, api_key: int, version: int) -> Unsupported | None:
    """None when `api` (the router's entry for `api_key`) serves `version`."""
    if api is not None and api.min_version <= version <= api.max_version:
        return None
    return Unsupported(api_key, version, api)


def api_versions_error_frame(apis, correlation_id: int) -> list:
    """ApiVersions v0 with UNSUPPORTED_VERSION and the `apis` served."""
    apis = sorted(apis, key=lambda a: a.key)
    body = bytearray(struct.pack(">hi", ErrorCode.unsupported_version, len(apis)))
    for api in apis:
        body += struct.pack(">hhh", api.key, api.min_version, api.max_version)
    return [codec.encode_raw_response(correlation_id, bytes(body))]


@dataclass(slots=True)
class Call:
    """One decoded request. `header.api_version` (`version`) is the version handlers,
    authorization and error answers see: kio's lowest for an older `wire_version`, which
    `adapter` converted (with `old_request`, the request as the old version had it)."""

    api: Api
    header: RequestHeader
    request: Any
    wire_version: int
    adapter: legacy.Adapter | None = None
    old_request: Any = None

    @property
    def version(self) -> int:
        return self.header.api_version

    def encode(self, correlation_id: int, response) -> list:
        """The response frame at the version on the wire."""
        if self.adapter is not None:
            return legacy.encode_response(self.adapter, self.wire_version, correlation_id, self.old_request, self.request, response)
        encode_frame = getattr(response, "encode_frame", None)
        if encode_frame is not None:  # encoded by hand for the hot path (Fetch)
            return encode_frame(correlation_id)
        return codec.encode_response(self.api.key, self.header.api_version, correlation_id, response)


def decode(api: Api, version: int, payload: memoryview) -> Call:
    """Header and body of a request `api` serves at `version` (check_version)."""
    adapter = api.legacy if api.legacy is not None and version < api.legacy.kio_version else None
    try:
        if adapter is not None:
            header = codec.decode_header(payload, False)  # no old version is flexible
            old_request, request = legacy.decode(adapter, version, payload, header.body_offset)
            header = header._replace(api_version=adapter.kio_version)
            return Call(api, header, request, version, adapter, old_request)
        header = codec.decode_header(payload, codec.is_flexible(api.key, version))
        if api.decoder is not None:
            request = api.decoder(version, payload, header.body_offset)
        else:
            request = codec.decode_body(api.key, version, payload, header.body_offset)
        return Call(api, header, request, version)
    except Exception as e:  # noqa: BLE001 - any decode failure is malformed input
        # Apache Kafka parses the body in RequestChannel.Request's constructor; a failure
        # there closes the connection without an answer (SocketServer
        # processChannelException), for every API. So do we: one log line, no traceback.
        raise CloseConnection(f"malformed request (api {api.key} v{version}): {e}") from None


def refusal_frame(call: Call, correlation_id: int, refusal: authz_checks.Refusal) -> list:
    """A request refused whole by authorization: its error everywhere it names."""
    response = authz_checks.refused(call.api.key, call.version, call.request, refusal[0])
    if response is None:  # Produce with acks=0 has no answer: Kafka closes
        raise CloseConnection(f"acks=0 produce refused: {refusal[1]}")
    return call.encode(correlation_id, response)


def with_throttle(response, throttle_ms: int):
    """`response` saying it was throttled `throttle_ms` (the larger of that and its own)."""
    if response is None:
        return None  # Produce acks=0: no answer, the mute alone slows the client (as Kafka)
    if hasattr(response, "throttle_time_ms"):
        response.throttle_time_ms = max(response.throttle_time_ms, throttle_ms)
        return response
    if dataclasses.is_dataclass(response) and any(f.name == "throttle_time" for f in dataclasses.fields(response)):
        current = response.throttle_time
        current_ms = current.total_seconds() * 1000 if hasattr(current, "total_seconds") else (current or 0)
        if throttle_ms > current_ms:
            value = datetime.timedelta(milliseconds=throttle_ms) if hasattr(current, "total_seconds") else throttle_ms
            return dataclasses.replace(response, throttle_time=value)
    return response


def fetched_bytes(response) -> int:
    """Record bytes a Fetch response carries (what the consumer byte-rate quota counts)."""
    if response is None:
        return 0
    return sum(len(p.records) for t in getattr(response, "responses", ()) for p in getattr(t, "partitions", ()) if hasattr(p, "records") and p.records is not None)


def encode_answer(call: Call, correlation_id: int, response, fallback: Callable[[Exception, int], Any]) -> list:
    """The response frame; when the response cannot be encoded, `fallback(exception, code)`
    answers instead: UNKNOWN_SERVER_ERROR for a value an old version cannot hold, and
    INVALID_REQUEST when a handler echoes a request value the response schema cannot hold
    (a null topic name in Metadata v10-11, which Kafka refuses so). When that cannot be
    encoded either, the connection closes."""
    if call.adapter is None and hasattr(response, "encode_frame"):
        return response.encode_frame(correlation_id)  # encoded by hand (Fetch): no fallback
    try:
        return call.encode(correlation_id, response)
    except Exception as e:  # noqa: BLE001
        code = ErrorCode.unknown_server_error if call.adapter is not None else ErrorCode.invalid_request
        answer = fallback(e, code)
        try:
            return call.encode(correlation_id, answer)
        except Exception as e2:  # noqa: BLE001
            raise CloseConnection(f"no encodable response to api {call.api.key} v{call.wire_version}: {e!r}, {e2!r}") from None
