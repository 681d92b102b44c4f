"""Metadata a broker reads again at an interval (ACLs, client quotas), so that what another
broker changed applies here within that interval."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from kafscale.metadata.kv import MetadataUnavailable


async def reload_every(interval_s: float, reload: Callable[[], Awaitable[None]], what: str, log: logging.Logger) -> None:
    """`reload()` every `interval_s` seconds until cancelled. A failed reload keeps what the
    last one read: the store being down is logged at debug, anything else with its trace."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await reload()
        except MetadataUnavailable as e:
            log.debug("%s refresh: %s", what, e)
        except Exception:  # noqa: BLE001 - keep the last state, try again
            log.exception("%s refresh failed", what)
