"""One way for tests to wait: poll a condition until it holds, never a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
import time


def wait_until(cond, timeout: float, what: str, interval: float = 0.1):
    """Poll `cond()` until it returns something truthy and return that value; a raised
    exception counts as "not yet" (a broker may be between states). AssertionError naming
    `what` (and the last exception) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:  # noqa: BLE001
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc!r})" if last_exc else ""))


async def wait_until_async(cond, timeout: float, what: str, interval: float = 0.05):
    """`wait_until` for a test running in an event loop: sleeps with asyncio.sleep so the
    loop (and a broker running on it) keeps working; `cond()` may return an awaitable."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except Exception as e:  # noqa: BLE001
            last_exc = e
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc!r})" if last_exc else ""))
