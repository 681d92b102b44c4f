"""S3ObjectStore: segments in an S3 bucket (or any S3-compatible store: MinIO, moto, ...).

Configuration comes from the URL (`s3://bucket/prefix`) and the environment:

    KAFSCALE_S3_ENDPOINT       custom endpoint URL (default: AWS)
    KAFSCALE_S3_REGION         region (else AWS_REGION, AWS_DEFAULT_REGION, us-east-1)
    KAFSCALE_S3_PATH_STYLE     path-style addressing (default: true with a custom endpoint)
    KAFSCALE_S3_MAX_ATTEMPTS   attempts per request for retriable failures (default 5)
    KAFSCALE_S3_CREATE_BUCKET  create the bucket on first use when true
    KAFSCALE_S3_CHECKSUM       how the store checks each PUT body: crc32c (default: an
                               x-amz-checksum-crc32c header, unsigned payload) or sha256 (the
                               body's SHA-256 signed into the request, for stores that refuse
                               x-amz-checksum-* headers, such as Backblaze B2)
    KAFSCALE_S3_CONDITIONAL_WRITES  how a segment is created (default true, see below)

Segment keys are fixed by the spec (`segment-{base_offset}.kfs`), so an old owner whose
upload is still in flight (S3 retries can outlast the lease margin) and the new owner write
the same key. A segment is therefore created with `If-None-Match: *` (AWS S3 since 2024,
MinIO, Ceph, R2, moto): of two writers exactly one succeeds, the other gets 412 and fails
its produces with NOT_LEADER_OR_FOLLOWER; acknowledged bytes can never be replaced. Stores
without conditional writes take KAFSCALE_S3_CONDITIONAL_WRITES=false: a HEAD before each
PUT attempt (a key that exists is lost) and a read-back after it (other bytes: lost). That
fallback only narrows the window to one PUT attempt overlapping the other writer's upload
and commit; it does not close it, which only the conditional create does. What slips
through is detected, not served: a reader refuses a segment object whose header (created
time, offsets) is not the one the metadata committed, with KAFKA_STORAGE_ERROR.

The merger replaces a run's first segment with the merged one under the same key, with
`If-Match: <ETag>` of the object it merged from (AWS S3 since late 2024, MinIO, moto): an
old owner's late merge finds the new owner's merged object there, gets 412 and is dropped
before its metadata swap. The fallback compares the ETag from a HEAD before each PUT
attempt and checks with a HEAD after it that its own PUT is still the object there (else
the swap is not committed); a PUT overlapping another writer's replace can still slip
through that window, and is then refused by readers as above, never served.

Credentials come from the standard AWS chain (env vars, config files, instance role).

Botocore's own retries are off: we retry throttling, 5xx and connection errors ourselves
with capped exponential backoff and jitter, within a total time budget, so a caller gets
ObjectStoreError after a few seconds and answers the client with a retriable Kafka error.

Why not botocore's standard/adaptive retry modes plus a deadline (tried for issue #14):
- their backoff is random() * 2**(attempt - 1) s up to 20 s, not configurable: against a
  dead endpoint, 5 attempts took 7.9-24 s (standard) and 9.2-23 s (adaptive) where this
  loop's 0.1 s base, 1 s cap takes 1.3-1.4 s (bench/bench_s3_retries.py). Under a 5 s
  deadline that is 2-3 attempts in 5 s instead of 5 in 1.4 s: produces wait longer for a
  retriable error during an outage, and recover later after it;
- the fallback without conditional writes must HEAD before every PUT attempt (a late
  retry has to find the new owner's object and stop), which a retry inside botocore
  skips;
- one attempt must be bounded as a whole (aiohttp waiting for "100 Continue" from a
  stalled server is outside botocore's read timeout), then retried, not abandoned with
  the whole budget spent;
- 409 ConditionalRequestConflict (a concurrent conditional write) is not retriable there.
The conditional create/replace answers (412 after a retried PUT whose first attempt
landed) are handled after the loop either way: see create and replace.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import time

import aiohttp
import botocore.exceptions as bce
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from kafscale.protocol.records import crc32c
from kafscale.storage.objectstore import ObjectChangedError, ObjectExistsError, ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.storage.url import StorageURL

_RETRY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
    "ConditionalRequestConflict",  # 409: a concurrent conditional write; the retry settles it
}
_RETRY_STATUS = {429, 500, 502, 503, 504}
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION_FAILED = {"PreconditionFailed", "412"}
_DELETE_BATCH = 1000  # DeleteObjects limit
_CHECKSUMS = ("crc32c", "sha256")

# Transport failures worth another attempt (connection refused/reset, timeouts).
_TRANSPORT_ERRORS = (
    bce.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    bce.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _error_code(e: bce.ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {}) or {}
    status = (e.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode", 0) or 0
    return str(err.get("Code", "")), int(status)


PUT_CHUNK_BYTES = 256 * 1024  # what one write to the connection takes from a part


class PartsBody:
    """A PUT body sent from its parts where they lie (a segment's header, its batch buffers,
    its footer), without joining them into one more copy of the object.

    A bytes body cost two: the join, then botocore's BytesIO, which copies a shared buffer
    as soon as aiohttp asks for its size (getbuffer). For a 4 MiB segment that was 8 MiB
    more per upload in flight (docs/performance.md "Memory on S3"). botocore takes this as
    a file-like body (read/seek/tell, its length from len()); aiohttp sends it as an async
    iterable, slices of the parts written as they are; SHA-256 payload signing reads it
    with read(), then seeks back."""

    def __init__(self, parts: list):
        self.parts = [memoryview(p).cast("B") for p in parts]
        self.size = sum(len(p) for p in self.parts)
        self._pos = 0

    def __len__(self) -> int:
        return self.size

    def crc32c(self) -> int:
        value = 0
        for part in self.parts:
            value = crc32c(part, value)
        return value

    def equals(self, data) -> bool:
        """Whether `data` holds exactly this body's bytes."""
        data = memoryview(data).cast("B")
        if len(data) != self.size:
            return False
        pos = 0
        for part in self.parts:
            if data[pos : pos + len(part)] != part:
                return False
            pos += len(part)
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self.size)[whence]
        self._pos = min(max(0, base + offset), self.size)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        out, start, pos = [], self._pos, 0
        for part in self.parts:
            lo, hi = max(start - pos, 0), min(end - pos, len(part))
            if lo < hi:
                out.append(part[lo:hi])
            pos += len(part)
            if pos >= end:
                break
        self._pos = end
        return b"".join(out)

    async def __aiter__(self):
        # Parts smaller than a chunk (a segment's header and footer, the batches of small
        # records, which are sent as they were produced) go out joined a chunk at a time:
        # one write each was thousands of writes for a segment of 100-byte records.
        small: list = []
        held = 0
        for part in self.parts:
            if len(part) >= PUT_CHUNK_BYTES:
                if small:
                    yield b"".join(small)
                    small, held = [], 0
                for start in range(0, len(part), PUT_CHUNK_BYTES):
                    yield part[start : start + PUT_CHUNK_BYTES]
                continue
            small.append(part)
            held += len(part)
            if held >= PUT_CHUNK_BYTES:
                yield b"".join(small)
                small, held = [], 0
        if small:
            yield b"".join(small)


READ_INTO_BYTES = 1 << 20  # bodies from this size on are read into one buffer of their length


async def _read_body(resp) -> bytes | bytearray:
    """A GetObject answer's body. A large one (a segment) is read into one buffer of its
    length as it arrives: reading it whole kept every chunk aiohttp received until the end,
    then joined them, twice the object at that moment (bytearray, not bytes: the callers
    take any bytes-like)."""
    size = resp.get("ContentLength")
    async with resp["Body"] as body:
        if size is None or size < READ_INTO_BYTES:
            return await body.read()
        buf = bytearray(size)
        view = memoryview(buf)
        pos = 0
        while pos < size:
            n = await body.readinto(view[pos:])  # (at the end of the body: checks its length)
            if n == 0:
                break
            pos += n
        view.release()
        if pos != size:
            raise bce.IncompleteReadError(actual_bytes=pos, expected_bytes=size)
        return buf

class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        max_attempts: int = 5,
        retry_budget: float = 5.0,
        base_backoff: float = 0.1,
        max_backoff: float = 1.0,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        create_bucket: bool = False,
        checksum: str = "crc32c",
        conditional_writes: bool = True,
    ):
        if not bucket:
            raise ValueError("S3 bucket name is empty")
        if checksum not in _CHECKSUMS:
            raise ValueError(f"S3 checksum {checksum!r} is not one of {', '.join(_CHECKSUMS)}")
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = prefix + "/" if prefix else ""
        self.endpoint_url = endpoint_url or None
        self.region = region or "us-east-1"
        self.path_style = bool(self.endpoint_url) if path_style is None else path_style
        self.max_attempts = max(1, max_attempts)
        self.retry_budget = retry_budget  # seconds, all attempts and pauses together
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.attempt_timeout = connect_timeout + read_timeout
        self._create_bucket_on_start = create_bucket
        self.checksum = checksum
        self.conditional_writes = conditional_writes  # False: the fallback of the module doc
        self.delete_batch = _DELETE_BATCH
        self.list_page_size: int | None = None  # None: the server's default (1000)
        self._client = None
        self._client_cm = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: StorageURL | str, **kwargs) -> "S3ObjectStore":
        parsed = StorageURL.parse(url) if isinstance(url, str) else url
        if not parsed.is_s3:
            raise ValueError(f"not an S3 URL: {str(url)!r}")
        env = os.environ
        path_style = env.get("KAFSCALE_S3_PATH_STYLE")
        opts = dict(
            endpoint_url=env.get("KAFSCALE_S3_ENDPOINT") or None,
            region=env.get("KAFSCALE_S3_REGION") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            path_style=None if path_style in (None, "") else _truthy(path_style),
            create_bucket=_truthy(env.get("KAFSCALE_S3_CREATE_BUCKET")),
        )
        if env.get("KAFSCALE_S3_CHECKSUM"):
            opts["checksum"] = env["KAFSCALE_S3_CHECKSUM"].strip().lower()
        if env.get("KAFSCALE_S3_CONDITIONAL_WRITES"):
            opts["conditional_writes"] = _truthy(env["KAFSCALE_S3_CONDITIONAL_WRITES"])
        if env.get("KAFSCALE_S3_MAX_ATTEMPTS"):
            opts["max_attempts"] = int(env["KAFSCALE_S3_MAX_ATTEMPTS"])
        opts.update(kwargs)
        return cls(parsed.bucket, parsed.prefix, **opts)

    def __repr__(self) -> str:
        where = self.endpoint_url or "aws"
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix} at {where})"

    # -- client ---------------------------------------------------------------------------

    async def _get_client(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # aiohttp sessions belong to the loop that made them; a new loop starts fresh.
            self._client = self._client_cm = None
            self._lock = asyncio.Lock()
            self._loop = loop
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                config = AioConfig(
                    connect_timeout=self.connect_timeout,
                    read_timeout=self.read_timeout,
                    retries={"total_max_attempts": 1},
                    # crc32c: no SHA-256 of every body on the event loop (botocore signs
                    # payloads over plain HTTP, and over HTTPS unless a checksum header is
                    # set); each PUT carries a CRC32C of its body instead (see put), which
                    # the store checks, computed by the C library in a fraction of the time.
                    s3={"addressing_style": "path" if self.path_style else "auto", "payload_signing_enabled": self.checksum == "sha256"},
                    # Plain payloads: S3-compatible stores don't all accept the
                    # aws-chunked trailing checksums newer botocore sends by default.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    max_pool_connections=64,
                )
                cm = get_session().create_client(
                    "s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config
                )
                client = await cm.__aenter__()
                self._client_cm, self._client = cm, client
        return self._client

    async def close(self) -> None:
        cm, self._client_cm, self._client = self._client_cm, None, None
        if cm is not None and self._loop is asyncio.get_running_loop():
            try:
                await cm.__aexit__(None, None, None)
            except Exception:
                pass

    async def _call(self, what: str, fn):
        """Run `fn(client)` with bounded retries for throttling, 5xx and transport errors."""
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                client = await self._get_client()
                if self._create_bucket_on_start:
                    await self._create_bucket(client)
                    self._create_bucket_on_start = False
                # One attempt is bounded as a whole: botocore's read timeout does not
                # cover aiohttp waiting for "100 Continue" on a PUT to a stalled server.
                return await asyncio.wait_for(fn(client), self.attempt_timeout)
            except TimeoutError as e:
                err = e
                detail = f"no answer within {self.attempt_timeout:.0f}s"
            except bce.ClientError as e:
                code, status = _error_code(e)
                if not (code in _RETRY_CODES or status in _RETRY_STATUS):
                    raise
                err: Exception = e
                detail = f"{code or status}"
            except _TRANSPORT_ERRORS as e:
                err = e
                detail = f"{type(e).__name__}: {e}"
            except bce.BotoCoreError as e:  # no credentials, bad parameters: retrying won't help
                raise ObjectStoreError(f"s3 {what}: {e}") from e
            pause = min(self.max_backoff, self.base_backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            elapsed = time.monotonic() - start
            if attempt >= self.max_attempts or elapsed + pause > self.retry_budget:
                raise ObjectStoreError(
                    f"s3 {what} on bucket {self.bucket!r} failed after {attempt} attempts "
                    f"in {elapsed:.1f}s: {detail}"
                ) from err
            await asyncio.sleep(pause)

    def _key(self, key: str) -> str:
        return self.prefix + key

    # -- ObjectStore ------------------------------------------------------------------------

    def _body(self, parts: list) -> tuple["PartsBody", dict]:
        """The PUT body and its checksum argument."""
        body = PartsBody(parts)
        extra = {}
        if self.checksum == "crc32c":
            extra["ChecksumCRC32C"] = base64.b64encode(body.crc32c().to_bytes(4, "big")).decode("ascii")
        return body, extra

    async def put(self, key: str, parts: list) -> None:
        body, extra = self._body(parts)

        async def go(client):
            body.seek(0)
            await client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, **extra)

        try:
            await self._call(f"put {key}", go)
        except bce.ClientError as e:
            raise ObjectStoreError(f"s3 put {key}: {e}") from e

    async def create(self, key: str, parts: list) -> None:
        body, extra = self._body(parts)
        if self.conditional_writes:
            extra["IfNoneMatch"] = "*"

        async def go(client):
            if not self.conditional_writes:
                # Fallback: checked before every attempt, so a retry late after the
                # lease margin still finds the new owner's object and stops.
                try:
                    await client.head_object(Bucket=self.bucket, Key=self._key(key))
                    return False
                except bce.ClientError as e:
                    code, status = _error_code(e)
                    if not (code in _NOT_FOUND or status == 404):
                        raise
            body.seek(0)
            await client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, **extra)
            return True

        try:
            created = await self._call(f"create {key}", go)
        except bce.ClientError as e:
            code, status = _error_code(e)
            if not (code in _PRECONDITION_FAILED or status == 412):
                raise ObjectStoreError(f"s3 create {key}: {e}") from e
            created = False
        if created and self.conditional_writes:
            return
        # The key was there (or, in the fallback, may have been overwritten since): it is
        # ours only if it holds exactly our bytes, as after a retry whose first PUT landed.
        await self._holds_ours(key, body, ObjectStoreError(f"s3 create {key}: the object vanished while being created"),
                               ObjectExistsError(f"s3 create {key}: the key holds another writer's object"))

    async def _holds_ours(self, key: str, body: "PartsBody", gone: ObjectStoreError, other: ObjectStoreError) -> None:
        """Raises `gone` when `key` holds nothing, `other` when it holds other bytes than `body`."""
        try:
            stored = await self.get(key)
        except ObjectNotFound:
            raise gone from None
        if not body.equals(stored):
            raise other

    async def get_with_version(self, key: str) -> tuple[bytes, str]:
        async def go(client):
            resp = await client.get_object(Bucket=self.bucket, Key=self._key(key))
            return await _read_body(resp), resp["ETag"]

        return await self._read(key, f"get {key}", go, past_end=None)

    async def replace(self, key: str, parts: list, expected: str) -> None:
        body, extra = self._body(parts)
        if self.conditional_writes:
            extra["IfMatch"] = expected

        async def go(client):
            if not self.conditional_writes:
                # Fallback: compared before every attempt, so a retry late after the new
                # owner's replace finds its object and stops.
                head = await client.head_object(Bucket=self.bucket, Key=self._key(key))
                if head["ETag"] != expected:
                    return None
            body.seek(0)
            resp = await client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, **extra)
            return resp["ETag"]

        try:
            etag = await self._call(f"replace {key}", go)
        except bce.ClientError as e:
            code, status = _error_code(e)
            # 412: another version is there; 404: none is (If-Match on a missing key).
            if not (code in _PRECONDITION_FAILED or status == 412 or code in _NOT_FOUND or status == 404):
                raise ObjectStoreError(f"s3 replace {key}: {e}") from e
            etag = None
        if etag is not None:
            if self.conditional_writes:
                return
            # Fallback: our PUT must still be the object there, or another writer's PUT
            # overlapped ours and which one stands is unknown: the caller must not commit.
            try:
                head = await self._call(f"head {key}", lambda client: client.head_object(Bucket=self.bucket, Key=self._key(key)))
                if head["ETag"] == etag:
                    return
            except bce.ClientError:
                pass
            raise ObjectChangedError(f"s3 replace {key}: another writer's PUT overlapped ours")
        # Refused: success only if the key already holds our bytes (a retry whose first
        # PUT landed and whose answer was lost).
        await self._holds_ours(key, body, ObjectChangedError(f"s3 replace {key}: the object is gone"),
                               ObjectChangedError(f"s3 replace {key}: the key holds another version than expected"))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        kwargs = {"Bucket": self.bucket, "Key": self._key(key)}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"

        async def go(client):
            return await _read_body(await client.get_object(**kwargs))

        # A range that starts past the end reads like past EOF.
        return await self._read(key, f"get {key}", go, past_end=b"")

    async def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        async def go(client):
            # A suffix range: S3 answers the last bytes and, in Content-Range, the size.
            resp = await client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes=-{nbytes}")
            async with resp["Body"] as body:
                data = await body.read()
            total = resp.get("ContentRange", "").rpartition("/")[2]
            return data, int(total) if total.isdigit() else len(data)

        # An empty object has no suffix to give.
        return await self._read(key, f"get tail of {key}", go, past_end=(b"", 0))

    async def _read(self, key: str, what: str, go, past_end):
        """Run a GetObject call: a missing key is ObjectNotFound, an unsatisfiable range
        (416) answers `past_end`, any other failure is an ObjectStoreError."""
        try:
            return await self._call(what, go)
        except bce.ClientError as e:
            code, status = _error_code(e)
            if code in _NOT_FOUND or status == 404:
                raise ObjectNotFound(key) from None
            if code == "InvalidRange" or status == 416:
                return past_end
            raise ObjectStoreError(f"s3 get {key}: {e}") from e

    async def copy(self, source: str, target: str) -> None:
        """CopyObject: the bytes never leave the store (up to 5 GiB, far above any segment)."""
        async def go(client):
            await client.copy_object(Bucket=self.bucket, Key=self._key(target), CopySource={"Bucket": self.bucket, "Key": self._key(source)})

        try:
            await self._call(f"copy {source} to {target}", go)
        except bce.ClientError as e:
            code, status = _error_code(e)
            if code in _NOT_FOUND or status == 404:
                raise ObjectNotFound(source) from None
            raise ObjectStoreError(f"s3 copy {source} to {target}: {e}") from e

    async def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), self.delete_batch):
            batch = [{"Key": self._key(k)} for k in keys[i : i + self.delete_batch]]

            async def go(client, batch=batch):
                return await client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

            try:
                resp = await self._call("delete", go)
            except bce.ClientError as e:
                raise ObjectStoreError(f"s3 delete: {e}") from e
            errors = [x for x in resp.get("Errors", []) if x.get("Code") not in _NOT_FOUND]
            if errors:
                first = errors[0]
                raise ObjectStoreError(
                    f"s3 delete: {len(errors)} objects failed, e.g. {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message', '')}".rstrip()
                )

    async def list(self, prefix: str) -> list[str]:
        return sorted(await self._list(prefix))

    async def list_sizes(self, prefix: str) -> dict[str, int]:
        return await self._list(prefix)

    async def _list(self, prefix: str) -> dict[str, int]:
        """{key: size} under prefix: ListObjectsV2 pages carry each object's size. Each
        page is one bounded, retried request: a namespace of many pages (a restore lists
        all of it) is not held to one request's time limit."""
        full = self._key(prefix)
        cut = len(self.prefix)
        found: dict[str, int] = {}
        token = None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            if self.list_page_size:
                kwargs["MaxKeys"] = self.list_page_size

            async def go(client, kwargs=kwargs):
                return await client.list_objects_v2(**kwargs)

            try:
                resp = await self._call(f"list {prefix}", go)
            except bce.ClientError as e:
                raise ObjectStoreError(f"s3 list {prefix}: {e}") from e
            found.update((obj["Key"][cut:], int(obj.get("Size", 0))) for obj in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                return found
            token = resp.get("NextContinuationToken")

    async def check(self) -> None:
        async def go(client):
            await client.head_bucket(Bucket=self.bucket)

        try:
            await self._call("check", go)
        except bce.ClientError as e:
            code, status = _error_code(e)
            raise ObjectStoreError(f"s3 bucket {self.bucket!r} not usable: {code or status}") from e

    # -- setup ------------------------------------------------------------------------------

    async def _create_bucket(self, client) -> None:
        kwargs = {"Bucket": self.bucket}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            await client.create_bucket(**kwargs)
        except bce.ClientError as e:
            if _error_code(e)[0] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    async def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests, KAFSCALE_S3_CREATE_BUCKET)."""
        try:
            await self._call("create bucket", self._create_bucket)
        except bce.ClientError as e:
            raise ObjectStoreError(f"s3 create bucket {self.bucket!r}: {e}") from e
