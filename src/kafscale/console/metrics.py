"""The brokers' ops endpoints (/metrics, /readyz; kafscale/ops/http.py) as the console reads
them: one scrape of every broker every few seconds, a bounded history of rates computed
from the counters, and each broker's readiness.

Where the ops endpoints are: the Kafka protocol does not say, so either the operator names
them (`--metrics URL,URL`; each answer says which broker it is by kafscale_broker_info) or
the console derives one per broker from its advertised Kafka address: the same host, the
Kafka port plus `--metrics-port-offset` (1 by default: KafScale's defaults are 9092 for
Kafka and 9093 for /metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("kafscale.console")

HISTORY = 120  # samples kept per broker (10 minutes at the default 5 s interval)
SCRAPE_TIMEOUT_S = 2.0


def parse(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Sample name (with its _total/_sum/_count suffix) -> [(labels, value)]."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(samples: dict, name: str, **match) -> float | None:
    rows = samples.get(name)
    if rows is None:
        return None
    return sum(v for labels, v in rows if all(labels.get(k) == want for k, want in match.items()))


# Counters whose per-second rate the charts show: chart key -> (sample name, label match).
RATES = {
    "produce_bytes": ("kafscale_produce_bytes_total", {}),
    "fetch_bytes": ("kafscale_topic_bytes_out_total", {}),
    "produce_requests": ("kafscale_requests_total", {"api": "Produce"}),
    "fetch_requests": ("kafscale_requests_total", {"api": "Fetch"}),
    "requests": ("kafscale_requests_total", {}),
    "store_requests": ("kafscale_object_store_requests_total", {}),
    "flush_failures": ("kafscale_flush_failures_total", {}),
    "store_failures": ("kafscale_object_store_request_failures_total", {}),
}


# Latency histograms whose p50/p99 over each interval the charts show: chart key ->
# (histogram name, the `op` labels merged). Buckets are added up over brokers before the
# quantile is taken (quantiles of brokers cannot be averaged).
LATENCIES = {
    "store_put": ("kafscale_object_store_request_duration_seconds", ("put",)),
    "store_get": ("kafscale_object_store_request_duration_seconds", ("get",)),
    "store_list": ("kafscale_object_store_request_duration_seconds", ("list",)),
    "store_delete": ("kafscale_object_store_request_duration_seconds", ("delete",)),
    "meta_read": ("kafscale_metadata_request_duration_seconds", ("get", "range")),
    "meta_commit": ("kafscale_metadata_request_duration_seconds", ("commit",)),
}
QUANTILES = (("p50", 0.5), ("p99", 0.99))


def buckets(samples: dict, name: str, ops: tuple[str, ...]) -> dict[float, float] | None:
    """Cumulative counts by upper bound (le) of a histogram's series with those ops."""
    rows = samples.get(name + "_bucket")
    if rows is None:
        return None
    out: dict[float, float] = {}
    for labels, v in rows:
        if labels.get("op") in ops:
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + v
    return out


def quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """The q-quantile of a histogram as Prometheus' histogram_quantile estimates it:
    linear within the bucket holding the rank; the highest finite bound past it."""
    bounds = sorted(cumulative)
    count = cumulative.get(float("inf"), 0.0)
    if not bounds or count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for le in bounds:
        here = cumulative[le]
        if here >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / (here - below) if here > below else 1.0)
        lower, below = le, here
    return lower


@dataclass
class BrokerStats:
    url: str
    broker_id: int | None = None
    up: bool | None = None  # None: never scraped
    ready: bool | None = None
    error: str = ""
    scraped_at: float = 0.0
    last: dict = field(default_factory=dict)
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (time, {chart key: value})

    def gauge(self, name: str) -> float | None:
        return total(self.last, name)

    def recent_count(self, key: str, window_s: float) -> float:
        """How many of what a rate key counts (failed flushes, ...) happened within the last
        `window_s` seconds of history: a problem stays shown that long, not one scrape."""
        since = self.history[-1][0] - window_s if self.history else 0.0
        return sum(counts.get("n:" + key) or 0.0 for t, counts in self.history if t > since)


def _derive(prev: tuple[float, dict], now: tuple[float, dict]) -> dict[str, float | None]:
    (t0, a), (t1, b) = prev, now
    dt = max(t1 - t0, 1e-3)
    out: dict[str, float | None] = {}
    for key, (name, match) in RATES.items():
        x, y = total(a, name, **match), total(b, name, **match)
        out[key] = max(y - x, 0) / dt if x is not None and y is not None else None
        out["n:" + key] = max(y - x, 0) if x is not None and y is not None else None  # the count itself, for recent_count
    # Mean flush latency and cache hit rate over the interval, from sums and counts.
    fs, fc = total(b, "kafscale_flush_duration_seconds_sum"), total(b, "kafscale_flush_duration_seconds_count")
    fs0, fc0 = total(a, "kafscale_flush_duration_seconds_sum"), total(a, "kafscale_flush_duration_seconds_count")
    out["flush_ms"] = (fs - fs0) / (fc - fc0) * 1000 if None not in (fs, fc, fs0, fc0) and fc > fc0 else None
    h, m = total(b, "kafscale_cache_hits_total"), total(b, "kafscale_cache_misses_total")
    h0, m0 = total(a, "kafscale_cache_hits_total"), total(a, "kafscale_cache_misses_total")
    looked = (h - h0) + (m - m0) if None not in (h, m, h0, m0) else 0
    out["cache_hit"] = (h - h0) / looked * 100 if looked > 0 else None
    # Bucket increments over the interval, per latency chart key (None: nothing observed).
    for key, (name, ops) in LATENCIES.items():
        x, y = buckets(a, name, ops), buckets(b, name, ops)
        if x is not None and y is not None:
            inc = {le: max(n - x.get(le, 0.0), 0.0) for le, n in y.items()}
            out["lat:" + key] = inc if inc.get(float("inf"), 0.0) > 0 else None
    return out


class MetricsReader:
    """Scrapes the ops endpoints; `urls_for(brokers)` says which."""

    def __init__(self, urls: list[str] | None = None, port_offset: int | None = 1, interval: float = 5.0, basic_auth: str = ""):
        self.fixed = [u.rstrip("/") for u in urls or []]
        self.port_offset = port_offset
        self.interval = interval
        self.basic_auth = basic_auth
        self.stats: dict[str, BrokerStats] = {}
        self._session = None
        self._raw: dict[str, tuple[float, dict]] = {}

    def urls_for(self, brokers: list[dict]) -> list[str]:
        if self.fixed:
            return self.fixed
        if self.port_offset is None:
            return []
        return [f"http://{b['host']}:{b['port'] + self.port_offset}" for b in brokers]

    async def _get(self, url: str) -> tuple[int, str]:
        import aiohttp

        if self._session is None:
            auth = aiohttp.BasicAuth(*self.basic_auth.split(":", 1)) if self.basic_auth else None
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S), auth=auth)
        async with self._session.get(url) as r:
            return r.status, await r.text()

    async def scrape_one(self, url: str) -> BrokerStats:
        st = self.stats.setdefault(url, BrokerStats(url))
        now = time.time()
        try:
            status, text = await self._get(url + "/metrics")
            if status != 200:
                raise RuntimeError(f"/metrics answered HTTP {status}")
            samples = parse(text)
            ready_status, _ = await self._get(url + "/readyz")
        except Exception as e:  # noqa: BLE001 - a broker that does not answer is down
            if st.up is not False:
                log.warning("broker ops endpoint %s is down: %s", url, e)
            st.up, st.ready, st.error = False, False, str(e) or type(e).__name__
            st.history.append((now, {}))
            return st
        if st.up is False:
            log.info("broker ops endpoint %s answers again", url)
        info = samples.get("kafscale_broker_info") or []
        st.broker_id = int(info[0][0]["broker_id"]) if info and info[0][0].get("broker_id", "").lstrip("-").isdigit() else st.broker_id
        st.up, st.ready, st.error, st.scraped_at, st.last = True, ready_status == 200, "", now, samples
        prev = self._raw.get(url)
        self._raw[url] = (now, samples)
        st.history.append((now, _derive(prev, (now, samples)) if prev else {}))
        return st

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape(self, brokers: list[dict]) -> dict[str, BrokerStats]:
        urls = self.urls_for(brokers)
        await asyncio.gather(*(self.scrape_one(u) for u in urls))
        for gone in set(self.stats) - set(urls):
            del self.stats[gone]
        return self.stats

    def by_broker(self, brokers: list[dict]) -> dict[int, BrokerStats]:
        """Broker id -> stats: by kafscale_broker_info, else by the derived URL."""
        out = {}
        derived = dict(zip(self.urls_for(brokers), brokers)) if not self.fixed else {}
        for url, st in self.stats.items():
            if st.broker_id is not None:
                out[st.broker_id] = st
            elif url in derived:
                out[derived[url]["id"]] = st
        return out

    def per_partition(self, name: str, topic: str, **match: str) -> dict[int, float]:
        """partition -> value of a per-partition gauge (kafscale_partition_segments, ...) for
        `topic` (and the other labels of `match`: group=...), from the last scrape of every
        broker: each reports the partitions it owns."""
        out: dict[int, float] = {}
        for st in self.stats.values():
            if not st.up:
                continue
            for labels, v in st.last.get(name, ()):
                if labels.get("topic") == topic and labels.get("partition", "").isdigit() and \
                        all(labels.get(k) == want for k, want in match.items()):
                    out[int(labels["partition"])] = v
        return out

    def series(self) -> dict:
        """Chart data: aligned timestamps and, per chart key, the cluster total per time
        (mean flush latency and cache hit rate averaged; latency quantiles in ms from the
        brokers' buckets added up)."""
        times: list[float] = []
        summed = (*RATES, "flush_ms", "cache_hit")
        values: dict[str, list] = {k: [] for k in summed}
        values.update({f"{k}_{name}": [] for k in LATENCIES for name, _q in QUANTILES})
        hist = [list(st.history) for st in self.stats.values() if st.history]
        if not hist:
            return {"t": [], **values}
        n = min(len(h) for h in hist)
        for i in range(-n, 0):
            times.append(round(hist[0][i][0]))
            for k in summed:
                xs = [h[i][1].get(k) for h in hist if h[i][1].get(k) is not None]
                if not xs:
                    values[k].append(None)
                elif k in ("flush_ms", "cache_hit"):
                    values[k].append(round(sum(xs) / len(xs), 2))
                else:
                    values[k].append(round(sum(xs), 2))
            for k in LATENCIES:
                merged: dict[float, float] = {}
                for h in hist:
                    for le, c in (h[i][1].get("lat:" + k) or {}).items():
                        merged[le] = merged.get(le, 0.0) + c
                for name, q in QUANTILES:
                    seconds = quantile(q, merged)
                    values[f"{k}_{name}"].append(round(seconds * 1000, 3) if seconds is not None else None)
        return {"t": times, **values}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
