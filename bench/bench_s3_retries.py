"""Time to give up on a dead S3 endpoint (connection refused): S3ObjectStore's retry loop
against botocore's standard and adaptive retry modes with the same attempt count (5).

    .venv/bin/python bench/bench_s3_retries.py

The figures are in kafscale/storage/s3.py's module docstring: why the loop stays.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from kafscale.storage.s3 import S3ObjectStore

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")


def dead_port() -> int:
    """A port nobody listens on: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def botocore_mode(mode, attempts=5):
    cfg = AioConfig(connect_timeout=2, read_timeout=5, retries={"mode": mode, "max_attempts": attempts})
    async with get_session().create_client("s3", endpoint_url=f"http://127.0.0.1:{dead_port()}", region_name="us-east-1", config=cfg) as c:
        t0 = time.monotonic()
        try:
            await c.head_bucket(Bucket="b")
        except Exception:
            pass
        return time.monotonic() - t0

async def loop():
    s = S3ObjectStore("b", endpoint_url=f"http://127.0.0.1:{dead_port()}")
    t0 = time.monotonic()
    try:
        await s.check()
    except Exception:
        pass
    await s.close()
    return time.monotonic() - t0

async def main():
    for name, fn in (("kafscale loop", loop), ("botocore standard", lambda: botocore_mode("standard")), ("botocore adaptive", lambda: botocore_mode("adaptive"))):
        ts = [await fn() for _ in range(3)]
        print(f"{name:18s} gives up after 5 attempts in " + ", ".join(f"{t:.2f}s" for t in ts))
if __name__ == "__main__":
    asyncio.run(main())
