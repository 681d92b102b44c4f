"""The Kafka listener: framing on a BufferedProtocol, requests dispatched concurrently,
responses written strictly in request order (Kafka's per-connection contract).

Each frame lands in its own bytearray, so the produce path can patch record batches in
place and keep them without another copy.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import TYPE_CHECKING

from kio.schema.index import api_key_map

from kafscale.broker.router import RequestContext
from kafscale.protocol import codec, error_response

if TYPE_CHECKING:
    from kafscale.broker.app import Broker
    from kafscale.broker.config import BrokerConfig

log = logging.getLogger("kafscale.server")

_LEN = struct.Struct(">i")
READ_BUFFER_BYTES = 256 * 1024
MAX_INFLIGHT_PER_CONNECTION = 256  # stop reading a connection beyond this many open requests
API_VERSIONS = 18
PRODUCE = 0
UNSUPPORTED_VERSION = 35


class CloseConnection(Exception):
    """Drop this one connection (malformed or unsupported input); others keep going."""


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, server: "KafkaServer"):
        self.server = server
        self.broker = server.broker
        self.max_frame = server.config.max_frame_bytes
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._start = 0
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being read straight into place
        self._frame_pos = 0
        self._pending: deque[asyncio.Task] = deque()
        self._paused = False
        self.produce_turn: asyncio.Future | None = None  # the last Produce's turn (ordering)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.closing = False

    # -- asyncio protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.connections.discard(self)
        for task in self._pending:
            task.cancel()
        self._pending.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_pos :]
        if self._end == len(self._buf):
            # compact: move the unconsumed tail to the front
            self._buf[: self._end - self._start] = self._buf[self._start : self._end]
            self._end -= self._start
            self._start = 0
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == len(self._frame):
                frame, self._frame = self._frame, None
                self._dispatch(frame)
            return
        self._end += nbytes
        buf = self._buf
        while self._end - self._start >= 4 and not self.closing:
            (length,) = _LEN.unpack_from(buf, self._start)
            if length < 0 or length > self.max_frame:
                self._close(f"frame of {length} bytes is over the limit of {self.max_frame} bytes" if length > 0 else f"invalid frame length {length}")
                return
            avail = self._end - self._start - 4
            if avail >= length:
                body_start = self._start + 4
                frame = buf[body_start : body_start + length]  # slicing a bytearray copies once
                self._start = body_start + length
                self._dispatch(frame)
                continue
            if 4 + length > len(buf) - self._start:
                # Too big for the read buffer: read the rest directly into its own bytearray.
                # (Doing so for every frame of 64 KiB and more measured worse: bytearray(n)
                # zero-fills, which costs about what the slice copy saves.)
                frame = bytearray(length)
                frame[:avail] = memoryview(buf)[self._start + 4 : self._end]
                self._start = self._end = 0
                self._frame, self._frame_pos = frame, avail
            break
        if self._start == self._end:
            self._start = self._end = 0

    def eof_received(self):
        return False

    # -- requests ------------------------------------------------------------------------

    def _close(self, reason: str) -> None:
        if not self.closing:
            log.warning("closing connection from %s: %s", self.peer, reason, extra={"peer": self.peer})
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def _dispatch(self, frame: bytearray) -> None:
        task = asyncio.get_running_loop().create_task(self.server.handle(self, frame))
        self._pending.append(task)
        task.add_done_callback(self._on_done)
        if len(self._pending) >= MAX_INFLIGHT_PER_CONNECTION and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def _on_done(self, _task: asyncio.Task) -> None:
        # Write finished responses in request order; stop at the first one still running.
        # Responses finished together (a group commit acknowledges many Produce requests at
        # once) go out in one writelines: one send syscall instead of one each.
        ready: list = []
        while self._pending and self._pending[0].done():
            task = self._pending.popleft()
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                if ready and not self.closing:
                    self.transport.writelines(ready)  # the answers before the failed one
                self._close(str(exc) if isinstance(exc, CloseConnection) else f"internal error: {exc!r}")
                if not isinstance(exc, CloseConnection):
                    log.error("request from %s failed", self.peer, exc_info=exc)
                return
            out = task.result()
            if out:
                ready.extend(out)
        if ready and not self.closing:
            self.transport.writelines(ready)
        if self._paused and len(self._pending) < MAX_INFLIGHT_PER_CONNECTION // 2 and not self.closing:
            self._paused = False
            self.transport.resume_reading()


class KafkaServer:
    def __init__(self, broker: "Broker", config: "BrokerConfig"):
        self.broker = broker
        self.config = config
        self.connections: set[KafkaConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self.address: tuple[str, int] = ("", 0)
        self.request_hooks: list = []  # called as hook(api_key, version, seconds, error) by ops/metrics

    async def start(self) -> None:
        host, port = self.config.split_hostport(self.config.listen)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: KafkaConnection(self), host, port, reuse_address=True, backlog=1024)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self, drain_s: float = 5.0) -> None:
        """Close client connections once their open requests are answered (produce
        requests waiting for the final flush get their acknowledgements)."""
        pending = [t for conn in self.connections for t in conn._pending]
        if pending:
            await asyncio.wait(pending, timeout=drain_s)
        for conn in list(self.connections):
            conn._close("broker shutting down")
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except TimeoutError:
                pass

    async def handle(self, conn: KafkaConnection, frame: bytearray) -> list | None:
        payload = memoryview(frame)
        started = time.perf_counter()
        try:
            api_key, version, correlation_id = codec.peek_api(payload)
        except codec.MalformedRequest as e:
            raise CloseConnection(str(e)) from None
        api = self.broker.router.get(api_key)
        if api_key == API_VERSIONS and api is not None and version > api.max_version:
            # Kafka answers a too-new ApiVersions with a v0 error response listing what it
            # supports, so the client can retry with a version both sides know.
            return [self._unsupported_api_versions(correlation_id)]
        if api is None or not api.min_version <= version <= api.max_version:
            raise CloseConnection(f"unsupported API key {api_key} version {version}")
        try:
            header = codec.decode_header(payload, codec.is_flexible(api_key, version))
            if api.decoder is not None:
                request = api.decoder(version, payload, header.body_offset)
            else:
                request = codec.decode_body(api_key, version, payload, header.body_offset)
        except Exception as e:  # noqa: BLE001 - any decode failure is malformed input
            # Apache Kafka parses the body in RequestChannel.Request's constructor; a failure
            # there closes the connection without an answer (SocketServer
            # processChannelException), for every API. So do we: one log line, no traceback.
            raise CloseConnection(f"malformed request (api {api_key} v{version}): {e}") from None
        ctx = RequestContext(self.broker, header, conn.peer)
        if api_key == PRODUCE:
            # Chained in frame order (nothing above awaits): see RequestContext.wait_turn.
            ctx.turn_before, ctx.turn = conn.produce_turn, asyncio.get_running_loop().create_future()
            conn.produce_turn = ctx.turn
        error = None
        try:
            response = await api.handler(ctx, request)
        except Exception as e:
            error = e
            response = self._error_response(ctx, conn, request, e)
        finally:
            ctx.end_turn()
            for hook in self.request_hooks:
                hook(api_key, version, time.perf_counter() - started, error)
        if response is None:
            return None
        encode_frame = getattr(response, "encode_frame", None)
        if encode_frame is not None:  # encoded by hand for the hot path (Fetch)
            return encode_frame(correlation_id)
        try:
            return codec.encode_response(api_key, version, correlation_id, response)
        except Exception as e:  # noqa: BLE001 - a handler's response kio cannot encode
            # It echoes a request value the response schema cannot hold (a null topic name
            # in Metadata v10-11, which Kafka refuses with INVALID_REQUEST): answer that.
            fallback = self._error_response(ctx, conn, request, e, error_response.INVALID_REQUEST)
            try:
                return codec.encode_response(api_key, version, correlation_id, fallback)
            except Exception as e2:  # noqa: BLE001
                raise CloseConnection(f"no encodable response to api {api_key} v{version}: {e!r}, {e2!r}") from None

    def _error_response(self, ctx: RequestContext, conn: KafkaConnection, request, exc: Exception, code: int | None = None):
        """What Kafka's KafkaApis.handleError does: answer the request with the error code
        the exception stands for (its own `error_code`, else UNKNOWN_SERVER_ERROR) in every
        topic / partition / group it named, instead of dropping the connection. A traceback
        is logged only for handler exceptions without a Kafka error code (bugs)."""
        header = ctx.header
        traceback = code is None and getattr(exc, "error_code", None) is None
        code = error_response.error_code_for(exc) if code is None else code
        log.error(
            "request failed: api=%s v%d client_id=%s peer=%s, answered with error %d: %r",
            api_key_map.get(header.api_key, header.api_key), header.api_version, header.client_id, conn.peer, code, exc,
            exc_info=exc if traceback else None,
            extra=ctx.log_fields(),
        )
        try:
            response = error_response.build(header.api_key, header.api_version, request, code)
        except Exception as e:  # noqa: BLE001 - the last resort must not fail the connection's others
            raise CloseConnection(f"internal error in api {header.api_key}: {exc!r}; no error response: {e!r}") from None
        if response is None:
            # Produce with acks=0 has no response: Kafka closes the connection so the
            # producer learns of the failure (KafkaApis.handleProduceRequest).
            raise CloseConnection(f"internal error in api {header.api_key} (acks=0): {exc!r}")
        return response

    def _unsupported_api_versions(self, correlation_id: int) -> bytes:
        body = bytearray(struct.pack(">hi", UNSUPPORTED_VERSION, len(self.broker.router.apis)))
        for api in sorted(self.broker.router.apis.values(), key=lambda a: a.key):
            body += struct.pack(">hhh", api.key, api.min_version, api.max_version)
        return codec.encode_raw_response(correlation_id, bytes(body))
