"""Client quota decisions without I/O; `quota_manager.py` drives them.

What Kafka's ClientQuotaManager decides, kept here as pure functions and one state object
over an injected clock (milliseconds):

- which quota applies to a (user, client-id) pair: the most specific of Kafka's eight
  entity levels (`quota_entity`), so a user-level quota is shared by all of the user's
  client ids and a <default> entity gives each user (or client id) its own;
- the observed rate: Kafka's `Rate` over `samples` windows of `window_ms` (11 x 1 s by
  default), the elapsed time counted as at least `samples - 1` full windows so a burst on a
  fresh sensor is not measured over a few milliseconds;
- the throttle time once the rate is above the bound: `(rate - bound) / bound * window`,
  rounded, as Kafka's QuotaUtils.throttleTime, capped at the whole measured window.

The driver (`quota_manager.QuotaManager`, called by the server per request) records the
bytes of each Produce / Fetch and the handling time for request_percentage; the server
answers with throttle_time_ms and mutes the connection that long, as Kafka does (KIP-219).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafscale.metadata.quotas import CLIENT_ID, USER

Entity = tuple[tuple[str, str | None], ...]


def _levels(user: str | None, client_id: str | None) -> list[Entity]:
    """Kafka's lookup order, most specific first (DefaultQuotaCallback)."""
    u, c = (USER, user), (CLIENT_ID, client_id)
    du, dc = (USER, None), (CLIENT_ID, None)
    return [
        (c, u), (dc, u), (u,),
        (c, du), (dc, du), (du,),
        (c,), (dc,),
    ]


def quota_entity(quotas: dict[Entity, dict[str, float]], key: str, user: str | None, client_id: str | None) -> tuple[Entity, float] | None:
    """(entity whose quota applies, bound) for `key` (producer_byte_rate, ...), or None when
    no quota applies. Entities are sorted (type, name) pairs, name None for <default>; a
    client with no user (no SASL) is user None only through the client-id levels."""
    for entity in _levels(user, client_id):
        if user is None and any(k == USER for k, _ in entity):
            continue
        values = quotas.get(tuple(sorted(entity)))
        if values is not None and key in values:
            return tuple(sorted(entity)), values[key]
    return None


@dataclass
class Rate:
    """Kafka's windowed Rate: a value per second over the last `samples` windows."""

    window_ms: int = 1000
    samples: int = 11
    _windows: list[tuple[int, float]] = field(default_factory=list)  # (window start ms, total)

    def record(self, value: float, now_ms: int) -> None:
        start = now_ms - now_ms % self.window_ms
        if self._windows and self._windows[-1][0] == start:
            s, total = self._windows[-1]
            self._windows[-1] = (s, total + value)
        else:
            self._windows.append((start, value))
        self._purge(now_ms)

    def _purge(self, now_ms: int) -> None:
        oldest = now_ms - self.samples * self.window_ms
        self._windows = [w for w in self._windows if w[0] > oldest]

    def window_size_ms(self, now_ms: int) -> int:
        """Elapsed time the rate is measured over, at least samples - 1 full windows."""
        self._purge(now_ms)
        first = self._windows[0][0] if self._windows else now_ms
        elapsed = now_ms - first
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def per_second(self, now_ms: int) -> float:
        window = self.window_size_ms(now_ms)  # drops expired windows first
        return sum(t for _, t in self._windows) * 1000.0 / window


def throttle_ms(rate: Rate, bound: float, now_ms: int) -> int:
    """How long the client must wait for its rate to come back to `bound` (0 if it is
    within), as Kafka's QuotaUtils.throttleTime, capped at the measured window."""
    observed = rate.per_second(now_ms)
    if observed <= bound:
        return 0
    window = rate.window_size_ms(now_ms)
    return min(round((observed - bound) / bound * window), rate.samples * rate.window_ms)
