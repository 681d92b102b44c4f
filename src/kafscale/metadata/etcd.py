"""EtcdKV: the KV contract on an etcd v3 cluster (the production metadata backend).

We talk gRPC through the protobuf stubs shipped with `aetcd` (`aetcd.rpc`), not through
`aetcd.Client`: the client has one global timeout, no endpoint failover, no paging and
no nested transactions, and all of those matter here. The stubs are plain grpc.aio.

Semantics match SqliteKV (sqlite.py): a key's version is 0 when absent and grows by one per
write; `commit` is ONE etcd transaction guarded by version compares. Two etcd rules
shape how a Txn is translated:

* a transaction may not put a key twice, nor put a key that one of its deletes covers
  ("duplicate key given in txn request"), so puts are de-duplicated (last wins) and
  deletes / prefix deletes are cut around the put keys. Unlike SQLite's delete-then-put,
  a key that is both deleted and put keeps counting its version up instead of restarting
  at 1.
* a transaction may hold at most `--max-txn-ops` (128 by default) compares or ops, and
  nesting does not help (nested levels share that budget). A refused transaction without
  compares (offset commits, group docs) is applied in chunks of `max_txn_ops`; a refused
  guarded one raises MetadataUnavailable asking for a larger --max-txn-ops, since it
  cannot be split without losing atomicity.

Unreachable etcd surfaces as MetadataUnavailable within `op_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import grpc
from aetcd import rpc

from kafscale.metadata.kv import KV, KeyValue, MetadataUnavailable, Txn
from kafscale.metadata.url import MetadataURL

_PAGE = 1000  # keys per Range page: keeps every response far below gRPC size limits
_MAX_MSG = 64 * 1024 * 1024

# Short reconnect backoff so a restarted etcd is usable again within about a second
# (gRPC's default backoff grows to two minutes).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", _MAX_MSG),
    ("grpc.max_send_message_length", _MAX_MSG),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 0),
]


def _range_end(prefix: bytes) -> bytes:
    """Smallest key greater than every key starting with prefix (etcd's prefix range end)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\0"  # empty / all-0xff prefix: to the end of the keyspace


class _TooManyOps(MetadataUnavailable):
    """etcd refused a transaction for exceeding its --max-txn-ops."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by `watch_prefix`; key is relative to the KV prefix."""

    type: str  # "put" or "delete"
    key: str
    value: bytes
    version: int  # 0 for deletes
    revision: int


class EtcdKV(KV):
    def __init__(
        self,
        endpoints: list[str],
        prefix: str = "/kafscale",
        *,
        op_timeout: float = 5.0,
        rpc_timeout: float = 2.0,
        max_txn_ops: int = 128,
    ):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.prefix = prefix.rstrip("/")
        self._pfx = self.prefix.encode()
        self.op_timeout = op_timeout  # whole call, failover and retries included
        self.rpc_timeout = rpc_timeout  # one attempt
        self.max_txn_ops = max_txn_ops
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current = 0  # index of the endpoint that answered last

    @classmethod
    def from_url(cls, url: MetadataURL | str, prefix: str = "/kafscale", **kwargs) -> "EtcdKV":
        """`etcd://host:port[,host:port...]` (a trailing path is ignored)."""
        parsed = MetadataURL.parse(url) if isinstance(url, str) else url
        if not parsed.is_etcd:
            raise ValueError(f"not an etcd URL: {str(url)!r}")
        return cls(list(parsed.endpoints), prefix=prefix, **kwargs)

    # -- plumbing -----------------------------------------------------------------------

    def _k(self, key: str) -> bytes:
        return self._pfx + key.encode()

    def _unk(self, key: bytes) -> str:
        return key[len(self._pfx) :].decode()

    def _prefix_bytes(self, prefix: str) -> bytes:
        # An empty prefix means "every key of this store", not every key sharing the
        # store prefix's characters (/kafscale vs /kafscale2).
        return self._k(prefix or "/")

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Channels are bound to the loop that made them; a new loop (tests) starts fresh.
            self._channels = {}
            self._loop = loop
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = grpc.aio.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
            self._channels[endpoint] = ch
        return ch

    @staticmethod
    def _retriable(err: grpc.aio.AioRpcError, idempotent: bool) -> bool:
        code = err.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return idempotent  # a write may have been applied: its outcome is unknown
        if code != grpc.StatusCode.UNAVAILABLE:
            return False
        if idempotent:
            return True
        # Writes are retried only when they surely were not applied: the connection
        # failed (gRPC's own message) or the member had no leader to propose to.
        # "etcdserver: request timed out" / "leader changed" may have been applied.
        details = err.details() or ""
        return not details.startswith("etcdserver:") or "no leader" in details

    async def _call(self, what: str, fn, *, idempotent: bool = True):
        """Run `fn(channel, timeout)` against the endpoints, failing over, within op_timeout."""
        deadline = time.monotonic() + self.op_timeout
        n = len(self.endpoints)
        attempt = 0
        last: Exception | None = None
        while True:
            idx = (self._current + attempt) % n
            remaining = deadline - time.monotonic()
            if remaining <= 0.05:
                break
            try:
                result = await fn(self._channel(self.endpoints[idx]), min(self.rpc_timeout, remaining))
                self._current = idx
                return result
            except grpc.aio.AioRpcError as e:
                last = e
                if not self._retriable(e, idempotent):
                    # Also refusals (too many ops, request too large): callers only know
                    # MetadataUnavailable, and a retriable answer beats a crashed handler.
                    raise MetadataUnavailable(f"etcd {what} failed: {e.code().name}: {e.details()}") from e
            attempt += 1
            if attempt % n == 0:
                # Every endpoint failed once: back off a little (leader election, restart).
                pause = min(1.0, 0.1 * 2 ** (attempt // n - 1)) * (0.5 + random.random() / 2)
                await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic() - 0.05)))
        detail = f"{last.code().name}: {last.details()}" if isinstance(last, grpc.aio.AioRpcError) else "timed out"
        raise MetadataUnavailable(f"etcd {what}: unreachable at {','.join(self.endpoints)} ({detail})") from last

    # -- KV contract -----------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        kv = await self._get_one(key)
        return None if kv is None else KeyValue(key, bytes(kv.value), kv.version)

    async def _get_one(self, key: str):
        """etcd's record of `key` (value, version, lease), or None."""
        req = rpc.RangeRequest(key=self._k(key))

        async def go(ch, timeout):
            return await rpc.KVStub(ch).Range(req, timeout=timeout)

        resp = await self._call(f"get {key}", go)
        return resp.kvs[0] if resp.kvs else None

    async def get_many(self, keys: list[str]) -> list[KeyValue | None]:
        # One transaction of up to --max-txn-ops single-key ranges per round trip.
        out: list[KeyValue | None] = []
        m = max(1, self.max_txn_ops)
        for i in range(0, len(keys), m):
            chunk = keys[i : i + m]
            req = rpc.TxnRequest(success=[rpc.RequestOp(request_range=rpc.RangeRequest(key=self._k(k))) for k in chunk])

            async def go(ch, timeout, req=req):
                return await rpc.KVStub(ch).Txn(req, timeout=timeout)

            resp = await self._call(f"get {len(chunk)} keys", go)  # reads only: safe to retry
            for k, r in zip(chunk, resp.responses):
                kvs = r.response_range.kvs
                out.append(KeyValue(k, bytes(kvs[0].value), kvs[0].version) if kvs else None)
        return out

    async def range(self, prefix: str) -> list[KeyValue]:
        return (await self._range_at_revision(prefix))[1]

    async def read_all(self) -> tuple[int, list[KeyValue]]:
        return await self._range_at_revision("")

    async def _range_at_revision(self, prefix: str) -> tuple[int, list[KeyValue]]:
        """(revision, keys under prefix): every page is read at the first page's revision,
        so the whole range is one consistent view of the store."""
        start = self._prefix_bytes(prefix)
        end = _range_end(start)
        out: list[KeyValue] = []
        revision = 0  # pinned after the first page, so all pages read one snapshot
        while True:
            req = rpc.RangeRequest(key=start, range_end=end, limit=_PAGE, revision=revision)

            async def go(ch, timeout, req=req):
                return await rpc.KVStub(ch).Range(req, timeout=timeout)

            resp = await self._call(f"range {prefix}", go)
            revision = revision or resp.header.revision
            out.extend(KeyValue(self._unk(kv.key), bytes(kv.value), kv.version) for kv in resp.kvs)
            if not resp.more or not resp.kvs:
                return revision, out
            start = bytes(resp.kvs[-1].key) + b"\0"

    async def commit(self, txn: Txn) -> bool:
        return await self._commit(txn)

    async def check(self) -> None:
        await self.get("/__health__")

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            try:
                await ch.close()
            except Exception:
                pass

    # -- transactions ----------------------------------------------------------------------

    def _ops(self, txn: Txn) -> list:
        puts: dict[bytes, bytes] = {}
        for key, value in txn.puts:
            puts[self._k(key)] = bytes(value)  # etcd rejects a key put twice: last wins
        put_keys = sorted(puts)

        ranges: list[tuple[bytes, bytes]] = []  # [start, end); end b"" = single key
        for p in txn.delete_prefixes:
            s = self._prefix_bytes(p)
            ranges.append((s, _range_end(s)))
        for key in txn.deletes:
            ranges.append((self._k(key), b""))

        ops = []
        for s, e in ranges:
            if not e:
                if s not in puts:
                    ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=s)))
                continue
            # Cut the range around the keys this txn puts (etcd rejects the overlap).
            cur = s
            for k in put_keys:
                if s <= k < e:
                    if cur < k:
                        ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=cur, range_end=k)))
                    cur = k + b"\0"
            if cur < e:
                ops.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=cur, range_end=e)))
        for k in put_keys:
            ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=k, value=puts[k])))
        for key, value in txn.leased_puts:
            ops.append(rpc.RequestOp(request_put=rpc.PutRequest(key=self._k(key), value=bytes(value), lease=txn.lease)))
        return ops

    def _compares(self, txn: Txn) -> list:
        return [
            rpc.Compare(key=self._k(key), target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=int(v))
            for key, v in txn.compares
        ]

    async def _txn(self, req: rpc.TxnRequest) -> bool:
        async def go(ch, timeout):
            return await rpc.KVStub(ch).Txn(req, timeout=timeout)

        try:
            resp = await self._call("txn", go, idempotent=False)
        except MetadataUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, grpc.aio.AioRpcError) and "too many operations" in (cause.details() or ""):
                raise _TooManyOps(str(e)) from cause
            raise
        return resp.succeeded

    async def _commit(self, txn: Txn) -> bool:
        compares, ops = self._compares(txn), self._ops(txn)
        try:
            return await self._txn(rpc.TxnRequest(compare=compares, success=ops))
        except _TooManyOps as e:
            if compares:
                raise MetadataUnavailable(
                    f"etcd refused a guarded transaction of {len(compares)} compares and {len(ops)} ops: "
                    f"start etcd with a larger --max-txn-ops (default 128)"
                ) from e.__cause__
        # Unguarded writes (offsets, group docs) past the server's limit: apply in chunks.
        # Not atomic as a whole, but each key's write is, which is all these callers need.
        m = max(1, self.max_txn_ops)
        for i in range(0, len(ops), m):
            await self._txn(rpc.TxnRequest(success=ops[i : i + m]))
        return True

    # -- leases and watches (used by the etcd cluster layer) -------------------------------

    async def grant_lease(self, ttl_seconds: int) -> int:
        async def go(ch, timeout):
            return await rpc.LeaseStub(ch).LeaseGrant(rpc.LeaseGrantRequest(TTL=int(ttl_seconds)), timeout=timeout)

        # Not idempotent strictly (a retry may orphan a lease), but an orphan just expires.
        resp = await self._call("lease grant", go)
        if resp.error:
            raise MetadataUnavailable(f"etcd lease grant: {resp.error}")
        return resp.ID

    async def keepalive(self, lease_id: int) -> bool:
        """Refresh the lease once; False when it no longer exists (expired or revoked)."""

        async def go(ch, timeout):
            call = rpc.LeaseStub(ch).LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=timeout)
            try:
                async for reply in call:
                    return reply
                return None
            finally:
                call.cancel()

        reply = await self._call("lease keepalive", go)
        return reply is not None and reply.TTL > 0

    async def key_lease(self, key: str) -> tuple[int, int] | None:
        """(lease id, the lease's granted TTL in seconds) of the lease `key` is attached to;
        None when the key is absent; (0, 0) when it has no lease; (id, 0) when the lease is
        already gone (the key's deletion is on its way)."""
        kv = await self._get_one(key)
        if kv is None:
            return None
        lease_id = kv.lease
        if not lease_id:
            return 0, 0

        async def ttl(ch, timeout):
            return await rpc.LeaseStub(ch).LeaseTimeToLive(rpc.LeaseTimeToLiveRequest(ID=lease_id), timeout=timeout)

        info = await self._call("lease time-to-live", ttl)
        return lease_id, (info.grantedTTL if info.TTL > 0 else 0)

    async def revoke_lease(self, lease_id: int) -> None:
        async def go(ch, timeout):
            try:
                await rpc.LeaseStub(ch).LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease_id), timeout=timeout)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:  # already gone: fine
                    raise

        await self._call("lease revoke", go)

    async def watch_prefix(self, prefix: str, start_revision: int = 0, on_created: Callable[[], None] | None = None) -> AsyncIterator[WatchEvent]:
        """Changes under prefix as they happen; raises MetadataUnavailable when the stream
        breaks (etcd down, revision compacted) so the caller re-reads and watches again.
        `on_created()` runs once etcd has set the watch up: every change after that moment
        is delivered, so a read made after it misses nothing."""
        start = self._prefix_bytes(prefix)
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(key=start, range_end=_range_end(start), start_revision=start_revision)
        )
        idx = self._current
        call = rpc.WatchStub(self._channel(self.endpoints[idx])).Watch()
        try:
            try:
                await asyncio.wait_for(call.write(create), self.op_timeout)
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise MetadataUnavailable(f"etcd watch {prefix}: stream closed")
                    if resp.canceled:
                        reason = resp.cancel_reason or f"compacted at {resp.compact_revision}"
                        raise MetadataUnavailable(f"etcd watch {prefix} canceled: {reason}")
                    if resp.created and on_created is not None:
                        on_created()
                    rev = resp.header.revision
                    for ev in resp.events:
                        if ev.type == ev.DELETE:
                            yield WatchEvent("delete", self._unk(ev.kv.key), b"", 0, ev.kv.mod_revision or rev)
                        else:
                            yield WatchEvent("put", self._unk(ev.kv.key), bytes(ev.kv.value), ev.kv.version, ev.kv.mod_revision)
            except grpc.aio.AioRpcError as e:
                # The caller watches again; let that try the next endpoint.
                self._current = (idx + 1) % len(self.endpoints)
                raise MetadataUnavailable(f"etcd watch {prefix}: {e.code().name}: {e.details()}") from e
            except asyncio.TimeoutError as e:
                raise MetadataUnavailable(f"etcd watch {prefix}: timed out") from e
        finally:
            call.cancel()


class BlockingLeaseKeeper:
    """Lease refreshes over plain, blocking gRPC channels of its own, for a thread of its own.

    The broker's asyncio loop can be busy for seconds on a loaded machine; refreshing the
    lease from that loop would let one late refresh stop a healthy broker from writing. A
    blocking call in a separate thread needs only a few milliseconds of CPU and the GIL, which
    a busy loop hands over every few milliseconds. Used by one thread only."""

    def __init__(self, endpoints: list[str]):
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self._channels: dict[str, grpc.Channel] = {}
        self._current = 0

    def _channel(self, endpoint: str) -> grpc.Channel:
        ch = self._channels.get(endpoint)
        if ch is None:
            ch = grpc.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
            self._channels[endpoint] = ch
        return ch

    def keepalive(self, lease_id: int, timeout: float) -> bool:
        """Refresh the lease once, trying each endpoint within `timeout` seconds in all.

        True: refreshed (etcd renews from when the request arrives, so the lease lives at
        least its TTL past the moment this call began). False: the lease no longer exists;
        etcd never renews an expired lease, however late the request. Raises
        MetadataUnavailable when no endpoint answered."""
        deadline = time.monotonic() + timeout
        n = len(self.endpoints)
        last: Exception | None = None
        for attempt in range(n):
            remaining = deadline - time.monotonic()
            if remaining <= 0.01:
                break
            idx = (self._current + attempt) % n
            stub = rpc.LeaseStub(self._channel(self.endpoints[idx]))
            call = stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=remaining)
            try:
                reply = next(call, None)
            except grpc.RpcError as e:
                last = e
                continue
            finally:
                call.cancel()
            self._current = idx
            return reply is not None and reply.TTL > 0
        detail = f"{last.code().name}: {last.details()}" if isinstance(last, grpc.RpcError) else "timed out"
        raise MetadataUnavailable(f"etcd lease keepalive: unreachable at {','.join(self.endpoints)} ({detail})") from last

    def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            ch.close()
