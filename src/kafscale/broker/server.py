"""The Kafka listener: framing on a BufferedProtocol, requests dispatched concurrently,
responses written strictly in request order (Kafka's per-connection contract).

Each frame lands in its own bytearray, so the produce path can patch record batches in
place and keep them without another copy. A large frame is read straight into its bytearray
(the socket writes its bytes once, where the handler reads them), one the server's
FramePool lends and takes back when the frame is done with.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

from kio.schema.index import api_key_map

from kafscale.broker import authz_checks, memory, request_path
from kafscale.broker.request_path import CloseConnection
from kafscale.broker.router import RequestContext
from kafscale.errors import KafkaError
from kafscale.protocol import error_response
from kafscale.protocol.api_keys import ApiKey
from kafscale.security.principal import ANONYMOUS, from_certificate, parse_rules
from kafscale.security.sasl import IllegalSaslState
from kafscale.security.tls import ReloadingContext

if TYPE_CHECKING:
    from kafscale.broker.router import BrokerServices
    from kafscale.broker.config import BrokerConfig
    from kafscale.security.listeners import Listener

log = logging.getLogger("kafscale.server")

_LEN = struct.Struct(">i")
READ_BUFFER_BYTES = 256 * 1024
# A frame of at least this many bytes that has not fully arrived with its length is read
# straight into its own buffer, not through the read buffer and a copy.
DIRECT_READ_MIN_BYTES = 64 * 1024
# A frame larger than this starts with this much memory and doubles as its bytes arrive
# (the declared length is only a promise); up to it, frames get buffers of the FramePool.
LARGE_FRAME_FIRST_BYTES = 1024 * 1024
READ_BUFFER_RELEASE_S = 2.0  # a connection quiet this long gives its read buffer back
MALLOC_TRIM_INTERVAL_S = 1.0  # how often freed heap memory is returned to the OS (memory.py)
# Least request memory whatever --cache-bytes: a segment (4 MiB) being uploaded and the next
# one filling, for each of a few partitions written at full speed.
REQUEST_MEMORY_FLOOR = 32 * 1024 * 1024
# The share of --cache-bytes requests may not take: kept for the segments readers load. When
# requests held all of it, a tailing consumer's loads were evicted as they landed, loaded
# again by the next fetch, and 40-60 MiB of GET bodies were in flight outside the budget
# (S3, 16 KiB records, saturated producers: docs/performance.md "Memory on S3"). With a
# quarter kept (3/4 for requests) a 64 MiB cache still peaked 12-16 MiB over its target:
# the newest views, the loads in flight and aiohttp's received chunks outgrew the quarter,
# and the loads repeated. Half: 22-30 MiB less at that peak, and the tailing consumer's
# data stays cached (broker CPU per GiB 13-18 s -> 5-6 s, fewer PUTs per GiB, 2026-11-28).
READ_SHARE_DIVISOR = 2
# Stop reading a connection beyond this many open requests. Produce requests wait for a
# flush (0.5-1 s on S3), and a producer of many partitions sends small ones: at 256 a
# connection carried at most 256 requests a flush cycle (0.77 of 1 MB/s over 1,024
# partitions of 1 KiB records), at 1,024 about 1,150 records (10 MB/s over 256 partitions:
# p50/p99 4.6/10.6 s, 2.3/5.3 s at 4,096). Their bytes are bounded by the request memory
# (PAUSE_MEMORY).
MAX_INFLIGHT_PER_CONNECTION = 4096
# Why a connection does not read (any of them pauses it).
PAUSE_INFLIGHT, PAUSE_MEMORY, PAUSE_WRITING, PAUSE_AUTH, PAUSE_THROTTLE, PAUSE_SERIAL, PAUSE_FAILED = 1, 2, 4, 8, 16, 32, 64
PAUSE_FRAMES = PAUSE_AUTH | PAUSE_THROTTLE | PAUSE_SERIAL | PAUSE_FAILED  # reasons that stop even buffered frames
# After a failed authentication is answered, the connection closes this much later: a client
# that reads the answer and the end of the connection in one go (kafka-python 3) would
# otherwise drop the answer and report a lost connection instead of the failure.
SASL_FAILURE_CLOSE_DELAY_S = 0.1


class LogLimiter:
    """At most one log line per key and interval: the first is logged at WARNING with the
    count of those suppressed since the last one, the others at DEBUG. A client that sends
    an unsupported request, is disconnected and reconnects (kafka-go does, ~30 times a
    second) must not write thousands of warnings a minute. Pure: the caller gives the time."""

    def __init__(self, interval_s: float = 60.0, max_keys: int = 4096):
        self.interval_s, self.max_keys = interval_s, max_keys
        self._last: dict = {}  # key -> (time of the last warning, suppressed since)

    def decide(self, key, now: float) -> tuple[int, int]:
        """(log level, count of suppressed lines to mention)."""
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return logging.DEBUG, 0
        if last is None and len(self._last) >= self.max_keys:
            self._last.clear()  # bounded memory under a flood of distinct keys
        self._last[key] = (now, 0)
        return logging.WARNING, last[1] if last is not None else 0


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, server: "KafkaServer", listener: "Listener | None" = None):
        self.server = server
        self.listener = listener  # the listener this connection came in on
        self.broker = server.broker
        self.max_frame = server.config.max_frame_bytes
        # The read buffer is an anonymous mmap made on the first read: pages never written
        # cost no memory, and dropping it when the connection idles gives the pages back to
        # the OS at once (a bytearray would leave the malloc heap fragmented).
        self._buf: mmap.mmap | None = None
        self._start = 0
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being read straight into place
        self._frame_pos = 0
        self._frame_len = 0  # its declared length; the bytearray grows towards it
        self._head_reserved = -1  # bytes reserved for the frame being read (-1: none yet)
        self.reserved = 0  # request memory this connection holds (server-wide budget)
        self._pending: deque[asyncio.Task] = deque()
        self._reservations: dict[asyncio.Task, int] = {}  # request memory of each request being handled
        self._loop: asyncio.AbstractEventLoop | None = None  # set when connected (get_running_loop costs a getpid() a call)
        self._pause_reasons = 0
        self._reading_paused = False
        self.produce_turn: asyncio.Future | None = None  # the last Produce's turn (ordering)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.address = ""
        self.admitted = False
        self.closing = False
        self.principal = ANONYMOUS  # who the client is (TLS certificate, SASL)
        # SASL state on a SASL listener (None elsewhere): until it is authenticated, only
        # ApiVersions, SaslHandshake and SaslAuthenticate are served, one at a time.
        self.sasl = server.broker.auth.new_session() if listener is not None and listener.sasl else None
        self.last_active = time.monotonic()

    # -- asyncio protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.address = peer[0] if peer else "?"
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:  # a TLS listener, handshake done: who is the client?
            try:
                rules = self.server.listener_principal_rules.get(self.listener.name, self.server.principal_rules) if self.listener else self.server.principal_rules
                self.principal = from_certificate(ssl_object.getpeercert(binary_form=True), rules)
            except Exception as e:  # noqa: BLE001 - a certificate no mapping rule applies to
                self.closing = True
                log.warning("refusing TLS connection from %s: %s", self.peer, e, extra={"peer": self.peer})
                transport.close()
                return
        refusal = self.server.admit(self)
        if refusal is not None:
            self.closing = True
            log.warning("refusing connection from %s: %s", self.peer, refusal, extra={"peer": self.peer})
            transport.close()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.forget(self)
        for hook in self.server.close_hooks:
            hook(self.peer)
        if self._head_reserved > 0:
            self.server.release_request_memory(self, self._head_reserved)
        self._head_reserved = -1
        self._frame = self._buf = None
        for task in self._pending:
            task.cancel()  # each gives its request memory back when done
        self._pending.clear()

    def pause_writing(self) -> None:
        # The client does not read its responses: read no more requests from it either, so
        # the responses waiting in the transport stay bounded by the open requests.
        self._pause(PAUSE_WRITING)

    def resume_writing(self) -> None:
        self._unpause(PAUSE_WRITING)

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        if frame is not None:
            if self._frame_pos == len(frame):
                # Grow as the bytes arrive (doubling, up to the declared length): a client
                # that declares a huge frame and sends little gets little memory. Growing
                # happens here, not in buffer_updated, where the event loop still holds a
                # view of the buffer (a bytearray with views cannot be resized).
                memory.resize_bytearray(frame, min(self._frame_len, 2 * len(frame)))
            return memoryview(frame)[self._frame_pos :]
        buf = self._buf
        if buf is None:
            buf = self._buf = mmap.mmap(-1, READ_BUFFER_BYTES)
        elif self._end == READ_BUFFER_BYTES:
            # compact: move the unconsumed tail to the front
            buf.move(0, self._start, self._end - self._start)
            self._end -= self._start
            self._start = 0
        return memoryview(buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        if self._frame is not None:
            self._frame_pos += nbytes
            if self._frame_pos == self._frame_len:
                frame, self._frame = self._frame, None
                self._dispatch(frame)
            return
        self._end += nbytes
        self._read_frames()

    def _read_frames(self) -> None:
        """Dispatch the complete frames in the read buffer; move a frame too large for it
        into its own buffer. Each frame first reserves its size from the server's request
        memory budget; a frame that does not fit waits there, with reading paused."""
        buf = self._buf
        while self._end - self._start >= 4 and not self.closing and not self._pause_reasons & PAUSE_FRAMES:
            (length,) = _LEN.unpack_from(buf, self._start)
            sasl = self.sasl
            if sasl is not None and not sasl.authenticated and length > self.server.config.sasl_server_max_receive_size:
                # Kafka's sasl.server.max.receive.size: an unauthenticated client gets no
                # more memory than a SASL token needs.
                self._close(f"request of {length} bytes before SASL authentication is over sasl.server.max.receive.size ({self.server.config.sasl_server_max_receive_size})")
                return
            if length < 0 or length > self.max_frame:
                if buf[self._start] == 0x16 and buf[self._start + 1] == 0x03 and (self.listener is None or not self.listener.tls):
                    # 0x16 0x03: a TLS record (ClientHello), not a Kafka frame length
                    self._close(f"a TLS handshake on plaintext listener {self.listener.name if self.listener else ''}: the client must not use SSL here")
                    return
                self._close(f"frame of {length} bytes is over the limit of {self.max_frame} bytes" if length > 0 else f"invalid frame length {length}")
                return
            if self._head_reserved < 0:
                if not self.server.reserve_request_memory(self, length):
                    self._pause(PAUSE_MEMORY)  # the server calls memory_available()
                    return
                self._head_reserved = length
            body_start = self._start + 4
            avail = self._end - body_start
            if avail >= length:
                if length < DIRECT_READ_MIN_BYTES:
                    frame = bytearray(memoryview(buf)[body_start : body_start + length])  # one copy
                else:
                    frame = self.server.frames.take(length)
                    memoryview(frame)[:] = memoryview(buf)[body_start : body_start + length]  # (frame[:] = ... copies twice)
                self._start = body_start + length
                self._dispatch(frame)
                continue
            if length >= DIRECT_READ_MIN_BYTES or 4 + length > READ_BUFFER_BYTES - self._start:
                # Read the rest straight into the frame's own bytearray (not filled: the
                # socket writes every byte after `avail`). One larger than
                # LARGE_FRAME_FIRST_BYTES grows in steps as its bytes arrive (get_buffer).
                frame = self.server.frames.take(length) if length <= LARGE_FRAME_FIRST_BYTES else memory.uninitialized_bytearray(LARGE_FRAME_FIRST_BYTES)
                memoryview(frame)[:avail] = memoryview(buf)[body_start : self._end]
                self._start = self._end = 0
                self._frame, self._frame_pos, self._frame_len = frame, avail, length
            break
        if self._start == self._end:
            self._start = self._end = 0

    def memory_available(self) -> None:
        """Request memory was given back: retry the frame that waited for it."""
        self._resume_frames(PAUSE_MEMORY)

    def _resume_frames(self, reason: int) -> None:
        """`reason` to pause is over: read the frames waiting in the buffer, then the socket."""
        if self.closing or not self._pause_reasons & reason:
            return
        self._pause_reasons &= ~reason
        self._read_frames()
        self._update_reading()

    def mute(self, throttle_ms: int) -> None:
        """Read no further request for `throttle_ms` (a quota's throttle, KIP-219): requests
        already read go on; the next ones wait in the socket. A client under a quota is
        served one request at a time, as Kafka serves every connection, so one that ignores
        throttle_time_ms and keeps its socket full gets one request per throttle period,
        not a socket buffer's worth."""
        if self.closing or throttle_ms <= 0:
            return
        self._pause(PAUSE_THROTTLE)
        asyncio.get_running_loop().call_later(throttle_ms / 1000, self._resume_frames, PAUSE_THROTTLE)

    def _under_quota(self, frame: bytearray) -> bool:
        """Whether a client quota applies to this request's client (user, client id)."""
        quotas = self.broker.quotas
        if not quotas.active or len(frame) < 10:
            return False
        n = int.from_bytes(frame[8:10], "big", signed=True)  # request header: client id
        client_id = bytes(frame[10 : 10 + n]).decode("utf-8", "replace") if n >= 0 else None
        return quotas.applies(principal_user(self.principal), client_id)

    def release_idle_buffer(self) -> None:
        """Give the read buffer back while the connection is quiet (made again on the
        next read)."""
        if self._buf is not None and self._start == self._end:
            self._buf = None
            self._start = self._end = 0

    def eof_received(self):
        return False

    def _pause(self, reason: int) -> None:
        self._pause_reasons |= reason
        self._update_reading()

    def _unpause(self, reason: int) -> None:
        if self._pause_reasons & reason:
            self._pause_reasons &= ~reason
            self._update_reading()

    def _update_reading(self) -> None:
        paused = bool(self._pause_reasons)
        if paused != self._reading_paused and not self.closing and self.transport is not None:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # -- requests ------------------------------------------------------------------------

    def _close(self, reason: str, level: int = logging.WARNING) -> None:
        if not self.closing:
            log.log(level, "closing connection from %s: %s", self.peer, reason, extra={"peer": self.peer})
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def close_idle(self, idle_s: float) -> None:
        self._close(f"idle for {idle_s:.0f} s (connections.max.idle.ms)", logging.INFO)

    def _dispatch(self, frame: bytearray) -> None:
        # The frame's reservation now belongs to its request: given back when it is done
        # (_on_done, the one callback a request needs).
        reserved, self._head_reserved = self._head_reserved, -1
        task = self._loop.create_task(self.server.handle(self, frame))
        self._pending.append(task)
        if reserved > 0:
            self._reservations[task] = reserved
        task.add_done_callback(self._on_done)
        if self.broker.quotas.active and self._under_quota(frame):
            self._pause(PAUSE_SERIAL)  # the next frame waits for this one's answer
            task.add_done_callback(lambda _task: self._resume_frames(PAUSE_SERIAL))
        sasl = self.sasl
        if sasl is not None and (sasl.in_exchange or (len(frame) >= 2 and int.from_bytes(frame[:2], "big") in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE))):
            # A SASL exchange goes one request at a time: each step sees the state the
            # previous one left (and a pipelining client gets no parallel guesses).
            self._pause(PAUSE_AUTH)
            task.add_done_callback(lambda _task: self._resume_frames(PAUSE_AUTH))
        if len(self._pending) >= MAX_INFLIGHT_PER_CONNECTION:
            self._pause(PAUSE_INFLIGHT)

    def _on_done(self, task: asyncio.Task) -> None:
        reserved = self._reservations.pop(task, 0)
        if reserved:
            self.server.release_request_memory(self, reserved)
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
                if isinstance(exc, CloseConnection):
                    self._close(str(exc), exc.level)
                else:
                    self._close(f"internal error: {exc!r}")
                if not isinstance(exc, CloseConnection):
                    log.error("request from %s failed", self.peer, exc_info=exc)
                return
            out = task.result()
            if out:
                ready.extend(out)
        if ready and not self.closing:
            self.last_active = time.monotonic()
            self.transport.writelines(ready)
        if self.sasl is not None and self.sasl.failed and not self._pending and not self._pause_reasons & PAUSE_FAILED:
            # Kafka closes the connection once the failure is answered (logged already).
            self._pause(PAUSE_FAILED)
            asyncio.get_running_loop().call_later(SASL_FAILURE_CLOSE_DELAY_S, self._close, "SASL authentication failed", logging.DEBUG)
            return
        if self._pause_reasons & PAUSE_INFLIGHT and len(self._pending) < MAX_INFLIGHT_PER_CONNECTION // 2:
            self._unpause(PAUSE_INFLIGHT)


def principal_user(principal: str | None) -> str | None:
    """The user name quotas know a principal by ("User:alice" -> "alice")."""
    if not principal:
        return None
    return principal.split(":", 1)[1] if ":" in principal else principal


def _ssl_protocol_class(loop):
    """The event loop's own TLS protocol: uvloop's (Cython) under uvloop, else asyncio's."""
    try:
        import uvloop
        from uvloop.loop import SSLProtocol

        if isinstance(loop, uvloop.Loop):
            return SSLProtocol
    except ImportError:
        pass
    from asyncio.sslproto import SSLProtocol

    return SSLProtocol


class TlsAcceptor(asyncio.BufferedProtocol):
    """The socket's protocol on a TLS listener: the loop's TLS protocol wrapped around the
    Kafka connection (what `create_server(ssl=...)` builds), made here so that a failed
    handshake (a plaintext client, an untrusted client certificate, a timeout) is seen:
    one log line and a count, where asyncio and uvloop would drop it silently. Everything
    the transport calls is passed on to the TLS protocol."""

    def __init__(self, server: "KafkaServer", listener: "Listener"):
        loop = asyncio.get_running_loop()
        self.server = server
        self.listener = listener
        self.peer = "?"
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        self.tls = _ssl_protocol_class(loop)(
            loop, KafkaConnection(server, listener), server.tls_contexts[listener.name].base, waiter, server_side=True,
            ssl_handshake_timeout=server.config.ssl_handshake_timeout_ms / 1000,
        )
        self.get_buffer = self.tls.get_buffer
        self.buffer_updated = self.tls.buffer_updated
        self.eof_received = self.tls.eof_received
        self.pause_writing = self.tls.pause_writing
        self.resume_writing = self.tls.resume_writing

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.tls.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.tls.connection_lost(exc)

    def _handshake_done(self, waiter: asyncio.Future) -> None:
        exc = None if waiter.cancelled() else waiter.exception()
        if exc is None:
            return
        self.server.tls_handshake_failures += 1
        log.warning("TLS handshake with %s on listener %s failed: %s", self.peer, self.listener.name, str(exc) or type(exc).__name__, extra={"peer": self.peer})


class KafkaServer:
    def __init__(self, broker: "BrokerServices", config: "BrokerConfig"):
        self.broker = broker
        self.config = config
        self.connections: set[KafkaConnection] = set()
        self.connections_per_address: dict[str, int] = {}
        self.request_memory = 0  # bytes reserved by requests being read or handled
        # Requests share the segment cache's budget (it gives way to them: storage/cache.py),
        # so they also stay within --cache-bytes less the readers' share, or
        # REQUEST_MEMORY_FLOOR for a smaller cache: with a 64 MiB cache, saturated S3
        # producers still kept 211 MiB of requests waiting.
        limit = config.max_request_memory
        share = config.cache_bytes - config.cache_bytes // READ_SHARE_DIVISOR
        self.request_memory_limit = min(limit, max(share, REQUEST_MEMORY_FLOOR)) if limit > 0 else 0
        self._memory_waiters: deque[KafkaConnection] = deque()
        self.frames = memory.FramePool(LARGE_FRAME_FIRST_BYTES)  # buffers of large frames
        self.request_memory_grew: Callable[[], None] | None = None  # the segment cache giving way (broker/app.py)
        self._memory_wake_scheduled = False
        self._servers: list[asyncio.AbstractServer] = []
        self._housekeeper: asyncio.Task | None = None
        self.address: tuple[str, int] = ("", 0)  # the first listener's bound address
        self.addresses: dict[str, tuple[str, int]] = {}  # listener name -> bound address
        self.request_hooks: list = []  # called as hook(api_key, version, seconds, error) by ops/metrics
        self.unsupported_log = LogLimiter()  # unsupported API keys and versions: see handle()
        # api_key -> [hook(request, response)], called after that API's handler answered
        # (response None: Produce with acks=0); ops/metrics counts bytes in and out with them.
        self.response_hooks: dict[int, list] = {}
        self.tls_handshake_failures = 0
        # hook(peer) for each connection closing: state tied to a connection (share sessions) goes with it
        self.close_hooks: list = []
        self.tls_contexts: dict[str, ReloadingContext] = {}  # TLS listener name -> its context (listeners with equal settings share one)
        self.principal_rules = parse_rules(config.ssl_principal_mapping_rules)
        self.listener_principal_rules = {name: parse_rules(rules) for name, rules in config.listener_principal_rules().items()}
        self._tls_reloader: asyncio.Task | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listeners = getattr(self.broker, "listeners", None) or self.config.resolved_listeners()[0]
        if any(listener.tls for listener in listeners):
            shared: dict = {}
            for name, settings in self.config.listener_tls_settings(listeners).items():
                if settings not in shared:
                    shared[settings] = ReloadingContext(settings)
                self.tls_contexts[name] = shared[settings]
            if self.config.ssl_reload_interval_ms > 0:
                self._tls_reloader = loop.create_task(self._reload_tls(), name="tls-reload")
        try:
            for listener in listeners:
                factory = TlsAcceptor if listener.tls else KafkaConnection
                server = await loop.create_server(
                    lambda listener=listener, factory=factory: factory(self, listener),
                    listener.host or None, listener.port, reuse_address=True, backlog=1024,
                )
                self._servers.append(server)
                sock = server.sockets[0].getsockname()
                self.addresses[listener.name] = (sock[0], sock[1])
                log.info("listening on %s (%s) at %s:%d", listener.name, listener.protocol, sock[0], sock[1])
        except BaseException:
            for server in self._servers:
                server.close()
            raise
        self.address = self.addresses[listeners[0].name]
        memory.limit_arenas()
        memory.map_large_blocks()
        self._housekeeper = loop.create_task(self._housekeeping(), name="connection-housekeeping")

    def is_serving(self) -> bool:
        """True while the Kafka listener accepts connections (readiness checks read it)."""
        return bool(self._servers) and all(s.is_serving() for s in self._servers)

    async def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def close(self, drain_s: float = 5.0) -> None:
        """Close client connections once their open requests are answered (produce
        requests waiting for the final flush get their acknowledgements)."""
        pending = [t for conn in self.connections for t in conn._pending]
        if pending:
            await asyncio.wait(pending, timeout=drain_s)
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        if self._tls_reloader is not None:
            self._tls_reloader.cancel()
        for conn in list(self.connections):
            conn._close("broker shutting down")
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), 2)
            except TimeoutError:
                pass

    # -- connection accounting -------------------------------------------------------------

    def admit(self, conn: KafkaConnection) -> str | None:
        """Count a new connection in, or say why it is refused (over a connection limit)."""
        cfg = self.config
        if cfg.max_connections > 0 and len(self.connections) >= cfg.max_connections:
            return f"{len(self.connections)} connections open, the limit is {cfg.max_connections} (--max-connections)"
        from_address = self.connections_per_address.get(conn.address, 0)
        if cfg.max_connections_per_ip > 0 and from_address >= cfg.max_connections_per_ip:
            return f"{from_address} connections open from {conn.address}, the limit is {cfg.max_connections_per_ip} (--max-connections-per-ip)"
        self.connections.add(conn)
        self.connections_per_address[conn.address] = from_address + 1
        conn.admitted = True
        return None

    def forget(self, conn: KafkaConnection) -> None:
        if not conn.admitted:
            return
        conn.admitted = False
        self.connections.discard(conn)
        left = self.connections_per_address.get(conn.address, 1) - 1
        if left > 0:
            self.connections_per_address[conn.address] = left
        else:
            self.connections_per_address.pop(conn.address, None)

    def reserve_request_memory(self, conn: KafkaConnection, nbytes: int) -> bool:
        """Reserve a frame's declared size before reading or handling it. False (and the
        connection is queued) when it does not fit the budget; one frame alone always fits,
        so a frame larger than the budget is not stuck forever."""
        limit = self.request_memory_limit
        if limit > 0 and self.request_memory > 0 and self.request_memory + nbytes > limit:
            self._memory_waiters.append(conn)
            return False
        self.request_memory += nbytes
        conn.reserved += nbytes
        if self.request_memory_grew is not None:
            self.request_memory_grew()
        return True

    def release_request_memory(self, conn: KafkaConnection, nbytes: int) -> None:
        self.request_memory -= nbytes
        conn.reserved -= nbytes
        if self._memory_waiters and not self._memory_wake_scheduled:
            self._memory_wake_scheduled = True
            asyncio.get_running_loop().call_soon(self._wake_memory_waiters)

    def _wake_memory_waiters(self) -> None:
        # In arrival order; each retries its frame and queues itself again if it still does
        # not fit. Stop at the first that stays queued (the budget is spent).
        self._memory_wake_scheduled = False
        for _ in range(len(self._memory_waiters)):
            conn = self._memory_waiters.popleft()
            conn.memory_available()
            if self._memory_waiters and self._memory_waiters[-1] is conn:
                break

    async def _reload_tls(self) -> None:
        while True:
            await asyncio.sleep(self.config.ssl_reload_interval_ms / 1000)
            try:
                for tls in set(self.tls_contexts.values()):
                    tls.check()
            except Exception:  # noqa: BLE001 - keep checking; the old context stays in use
                log.exception("checking the TLS files failed")

    async def _housekeeping(self) -> None:
        """Close connections idle past connections.max.idle.ms, take the read buffers
        of quiet ones back, and return freed heap memory to the OS."""
        idle_s = self.config.connections_max_idle_ms / 1000
        period = min(1.0, max(0.05, idle_s / 4)) if idle_s > 0 else 1.0
        last_trim = time.monotonic()
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if now - last_trim >= MALLOC_TRIM_INTERVAL_S:
                last_trim = now
                self.frames.release_idle()
                # Every second: RSS under a steady load then stays 20-30 MiB above
                # --cache-bytes plus the interpreter (every 5 s left 60-100 MiB more); no
                # measurable cost in produce throughput. It takes 1-40 ms (median 1.3), so
                # in a worker thread (ctypes lets go of the GIL), not on the event loop.
                took = await asyncio.to_thread(memory.trim)
                log.debug("malloc_trim took %.1f ms", took * 1000)
            for conn in list(self.connections):
                quiet = now - conn.last_active
                if 0 < idle_s < quiet and not conn._pending:
                    conn.close_idle(quiet)
                elif quiet > READ_BUFFER_RELEASE_S:
                    conn.release_idle_buffer()

    async def handle(self, conn: KafkaConnection, frame: bytearray) -> list | None:
        """One request frame through the steps of `request_path`, in order; the response
        frames, or None for no answer (Produce acks=0)."""
        started = time.perf_counter()
        session = conn.sasl
        if session is not None and session.raw_tokens:
            return await self._raw_sasl_token(conn, bytes(frame))
        payload = memoryview(frame)
        api_key, version, correlation_id = request_path.read_api(payload)
        if session is not None:
            request_path.sasl_gate(session, api_key, conn.listener.name)
        api = self.broker.router.get(api_key)
        unsupported = request_path.check_version(api, api_key, version)
        if unsupported is not None:
            return self._refuse_version(conn, unsupported, correlation_id)
        call = request_path.decode(api, version, payload)
        ctx = RequestContext(
            self.broker, call.header, conn.peer, listener=conn.listener.name if conn.listener is not None else None,
            principal=session.principal if session is not None else conn.principal, session=session,
            wire_version=version if call.adapter is not None else None,
        )
        if api.in_order:
            # Chained in frame order (nothing above awaits): see RequestContext.wait_turn.
            ctx.turn_before, ctx.turn = conn.produce_turn, asyncio.get_running_loop().create_future()
            conn.produce_turn = ctx.turn
        error = None
        try:
            denied_topics = None
            if self.broker.authorizer.enabled:
                call.request, denied_topics, refusal = await authz_checks.authorize(ctx, api_key, call.request)
                if refusal is not None:
                    # Every resource the request named gets the error (the denial is logged
                    # and counted by the authorizer, at most once a second per resource).
                    return request_path.refusal_frame(call, correlation_id, refusal)
            response = await self._serve(ctx, call, denied_topics)
        except CloseConnection:
            raise
        except IllegalSaslState as e:
            # Kafka closes the connection (IllegalSaslStateException), answering nothing.
            error = e
            raise CloseConnection(f"SASL: {e}") from None
        except Exception as e:
            error = e
            response = self._error_response(ctx, conn, call.request, e)
        finally:
            ctx.end_turn()
            for hook in self.request_hooks:
                hook(api_key, version, time.perf_counter() - started, error)
        quotas = self.broker.quotas
        if quotas.active:
            response = self._apply_quotas(quotas, ctx, conn, api_key, len(frame), response, time.perf_counter() - started)
        if response is None:
            return None
        return request_path.encode_answer(call, correlation_id, response, lambda e, code: self._error_response(ctx, conn, call.request, e, code))

    def _refuse_version(self, conn: KafkaConnection, unsupported: request_path.Unsupported, correlation_id: int) -> list:
        if unsupported.answer_with_versions:
            return request_path.api_versions_error_frame(self.broker.router.apis.values(), correlation_id)
        # One log line per connection, and per client address, key and version at most one
        # warning a minute (LogLimiter).
        key = (conn.peer.rpartition(":")[0], unsupported.api_key, unsupported.version)
        level, suppressed = self.unsupported_log.decide(key, time.monotonic())
        raise CloseConnection(unsupported.reason(suppressed), level)

    async def _serve(self, ctx: RequestContext, call: request_path.Call, denied_topics) -> object:
        """The handler's response, with the topics authorization denied merged back in;
        the API's response hooks see it."""
        response = await call.api.handler(ctx, call.request)
        if denied_topics is not None and response is not None:
            response = authz_checks.merge_denied(call.api.key, call.version, response, denied_topics)
        observers = self.response_hooks.get(call.api.key)
        if observers:
            for hook in observers:
                hook(call.request, response)
        return response

    @staticmethod
    def _apply_quotas(quotas, ctx: RequestContext, conn: KafkaConnection, api_key: int, request_bytes: int, response, handling_s: float):
        """Record the request against the client's quotas; when it must wait, the response
        says how long (throttle_time_ms) and the connection stays muted that long."""
        response_bytes = request_path.fetched_bytes(response) if api_key == ApiKey.FETCH else 0
        throttle = quotas.throttle_ms(api_key, principal_user(ctx.principal), ctx.header.client_id, request_bytes, response_bytes, handling_s * 1000)
        if throttle <= 0:
            return response
        conn.mute(throttle)
        return request_path.with_throttle(response, throttle)

    def _error_response(self, ctx: RequestContext, conn: KafkaConnection, request, exc: Exception, code: int | None = None):
        """What Kafka's KafkaApis.handleError does: answer the request with the error code
        the exception stands for (a KafkaError's code, else UNKNOWN_SERVER_ERROR) in every
        topic / partition / group it named, instead of dropping the connection. A traceback
        is logged only for handler exceptions without a Kafka error code (bugs)."""
        header = ctx.header
        traceback = code is None and not isinstance(exc, KafkaError)
        code = error_response.error_code_for(exc) if code is None else code
        # a request the handler refused as a whole is the client's doing: a warning
        log.log(
            logging.WARNING if isinstance(exc, error_response.RequestError) else logging.ERROR,
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

    async def _raw_sasl_token(self, conn: KafkaConnection, token: bytes) -> list | None:
        """After SaslHandshake v0 the client sends bare tokens and expects bare answers;
        a failure closes the connection (there is no error field)."""
        session = conn.sasl
        reply, failure = await self.broker.auth.step(session, token, conn.peer, conn.address)
        if failure is not None:
            return None  # session.failed: closed once answered (the failure is logged)
        return [_LEN.pack(len(reply)) + reply]
