"""`kafscale mcp`: the console's view of the cluster as MCP tools for agents (the official
`mcp` SDK; stdio or streamable HTTP).

Read-only tools always; the tools that change the cluster only with --allow-writes, and over
HTTP only behind a bearer token (every request then carries `Authorization: Bearer TOKEN`).
Every answer is bounded: lists are paged (at most MAX_LIST a call), records sampled (at most
MAX_SAMPLE, each key/value cut at MAX_BYTES).
"""

from __future__ import annotations

import base64
import hmac
import logging
from typing import Any

import anyio

from kafscale.console.cluster import Cluster, ClusterError
from kafscale.console.metrics import LATENCIES, QUANTILES, MetricsReader, buckets, quantile, total

log = logging.getLogger("kafscale.mcp")

MAX_LIST = 500
MAX_SAMPLE = 100
MAX_BYTES = 4096

READ_TOOLS = ("cluster_status", "list_topics", "describe_topic", "sample_records", "list_groups", "describe_group", "broker_metrics")
WRITE_TOOLS = ("create_topic", "delete_topic", "produce_record", "reset_group_offsets", "delete_group")


def _field(b: bytes | None) -> str | dict | None:
    if b is None:
        return None
    cut = b[:MAX_BYTES]
    try:
        text = cut.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(cut).decode(), "truncated": len(b) > MAX_BYTES}
    return text + ("…" if len(b) > MAX_BYTES else "")


class Tools:
    """The tools, as plain async methods over a Cluster and the brokers' metrics."""

    def __init__(self, cluster: Cluster, metrics: MetricsReader):
        self.cluster = cluster
        self.metrics = metrics

    async def _call(self, fn, *args):
        from mcp.server.mcpserver.exceptions import ToolError

        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except ClusterError as e:
            raise ToolError(str(e)) from None  # an error result with this text, not a crash

    async def cluster_status(self) -> dict:
        """Cluster id, controller, brokers (id, address, partitions led), topic and partition
        counts, and partitions without an owner."""
        ov = await self._call(self.cluster.overview)
        ov["offline"] = ov["offline"][:MAX_LIST]
        return ov

    async def list_topics(self, query: str = "", offset: int = 0, limit: int = 100) -> dict:
        """Topic names containing `query`, sorted, with partition counts; `offset`/`limit` page
        through them (limit at most 500)."""
        limit = max(1, min(limit, MAX_LIST))
        data = await self._call(self.cluster.topics_page, query, 0, 10**9)
        return {"total": data["total"], "offset": offset, "topics": data["rows"][offset:offset + limit]}

    async def describe_topic(self, topic: str) -> dict:
        """Partitions (owner, log start, end offset, records) and configs of a topic."""
        return await self._call(self.cluster.topic, topic)

    async def sample_records(self, topic: str, partition: int, count: int = 10) -> dict:
        """The last `count` records (at most 100) of one partition, newest first; keys and
        values as UTF-8 text (base64 if not text), each cut at 4 KiB."""
        res = await self._call(self.cluster.browse, topic, partition, "latest", "", max(1, min(count, MAX_SAMPLE)), "")
        return {"topic": topic, "partition": partition, "records": [
            {"offset": r.offset, "timestamp": r.timestamp, "key": _field(r.key), "value": _field(r.value),
             "headers": {k: _field(v) for k, v in r.headers}} for r in res["records"]]}

    async def list_groups(self, query: str = "", offset: int = 0, limit: int = 100) -> dict:
        """Consumer groups whose id contains `query`, with state and type, paged (limit at most 500)."""
        limit = max(1, min(limit, MAX_LIST))
        data = await self._call(self.cluster.groups_page, query, 0, 10**9)
        return {"total": data["total"], "offset": offset, "groups": data["rows"][offset:offset + limit]}

    async def describe_group(self, group: str) -> dict:
        """State, members and, per partition, committed offset, end offset and lag of a group."""
        g = await self._call(self.cluster.group, group)
        g["partitions"] = g["partitions"][:MAX_LIST]
        return g

    async def broker_metrics(self) -> dict:
        """Per broker, from its /metrics: up, ready, partitions owned, connections, unflushed
        records, requests, produce/fetch bytes, flushes (count, failures, mean latency),
        object-store requests, cache hits/misses, metadata snapshot age, and object-store and
        metadata-store call latency (p50/p99 in ms since the broker started)."""
        try:
            brokers = await anyio.to_thread.run_sync(self.cluster.overview)
        except ClusterError:
            brokers = {"brokers": []}  # no Kafka answer: the named --metrics endpoints still do
        try:
            stats = await self.metrics.scrape(brokers["brokers"])
        finally:
            await self.metrics.close()
        out = []
        for url, st in sorted(stats.items()):
            row: dict[str, Any] = {"url": url, "broker_id": st.broker_id, "up": bool(st.up), "ready": bool(st.ready)}
            if not st.up:
                row["error"] = st.error
            else:
                s = st.last
                fc, fs = total(s, "kafscale_flush_duration_seconds_count"), total(s, "kafscale_flush_duration_seconds_sum")
                row.update({
                    "partitions_owned": total(s, "kafscale_partitions_owned"), "connections": total(s, "kafscale_connections"),
                    "unflushed_records": total(s, "kafscale_unflushed_records"), "requests": total(s, "kafscale_requests_total"),
                    "produce_bytes": total(s, "kafscale_produce_bytes_total"), "fetch_bytes": total(s, "kafscale_topic_bytes_out_total"),
                    "flushes": fc, "flush_failures": total(s, "kafscale_flush_failures_total"),
                    "flush_mean_ms": round(fs / fc * 1000, 2) if fc else None,
                    "object_store_requests": total(s, "kafscale_object_store_requests_total"),
                    "cache_hits": total(s, "kafscale_cache_hits_total"), "cache_misses": total(s, "kafscale_cache_misses_total"),
                    "metadata_snapshot_age_seconds": total(s, "kafscale_metadata_snapshot_age_seconds"),
                    "latency_ms": _latencies(s),
                })
            out.append(row)
        return {"brokers": out}

    # -- writes (--allow-writes) -----------------------------------------------------------

    async def create_topic(self, topic: str, partitions: int = 1, replication_factor: int = -1, configs: dict[str, str] | None = None) -> dict:
        """Create a topic."""
        log.info("mcp: create topic %s partitions=%d", topic, partitions)
        await self._call(self.cluster.create_topic, topic, partitions, replication_factor, configs or {})
        return {"created": topic}

    async def delete_topic(self, topic: str) -> dict:
        """Delete a topic and its records."""
        log.info("mcp: delete topic %s", topic)
        await self._call(self.cluster.delete_topic, topic)
        return {"deleted": topic}

    async def produce_record(self, topic: str, value: str, key: str | None = None, partition: int | None = None,
                             headers: dict[str, str] | None = None) -> dict:
        """Produce one record (UTF-8 key and value); answers its partition and offset."""
        log.info("mcp: produce to %s", topic)
        p, off = await self._call(self.cluster.produce, topic, partition, key.encode() if key is not None else None, value.encode(),
                                  [(k, v.encode()) for k, v in (headers or {}).items()])
        return {"topic": topic, "partition": p, "offset": off}

    async def reset_group_offsets(self, group: str, topic: str, to: str, value: str = "", dry_run: bool = True) -> dict:
        """Move an empty group's committed offsets on a topic to earliest, latest, offset
        (`value` = N) or timestamp (`value` = ISO 8601 or epoch ms). A dry run (the default)
        only answers the plan."""
        plan = await self._call(self.cluster.reset_plan, group, topic, to, value)
        if not dry_run:
            log.info("mcp: reset offsets of %s on %s to %s %s", group, topic, to, value)
            await self._call(self.cluster.reset, group, plan)
        return {"group": group, "executed": not dry_run, "partitions": plan}

    async def delete_group(self, group: str) -> dict:
        """Delete an empty group and its committed offsets."""
        log.info("mcp: delete group %s", group)
        await self._call(self.cluster.delete_group, group)
        return {"deleted": group}


def _latencies(samples: dict) -> dict:
    """{store_put: {p50, p99}, ...} in ms over everything a broker counted (None: no call yet)."""
    out = {}
    for key, (name, ops) in LATENCIES.items():
        cumulative = buckets(samples, name, ops) or {}
        out[key] = {}
        for label, q in QUANTILES:
            seconds = quantile(q, cumulative)
            out[key][label] = round(seconds * 1000, 3) if seconds is not None else None
    return out


def make_server(cluster: Cluster, metrics: MetricsReader, allow_writes: bool):
    from mcp.server.mcpserver import MCPServer
    from mcp_types import ToolAnnotations

    tools = Tools(cluster, metrics)
    server = MCPServer("kafscale", instructions="A KafScale (Kafka-compatible) cluster: topics, records, consumer groups, broker metrics."
                       + ("" if allow_writes else " Read-only: started without --allow-writes."))
    for name in READ_TOOLS:
        server.add_tool(getattr(tools, name), name=name, annotations=ToolAnnotations(readOnlyHint=True))
    if allow_writes:
        for name in WRITE_TOOLS:
            server.add_tool(getattr(tools, name), name=name, annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=name.startswith("delete")))
    return server


class BearerToken:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer TOKEN`."""

    def __init__(self, app, token: str):
        self.app = app
        self.want = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.want):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b'Bearer realm="kafscale mcp"')]})
                await send({"type": "http.response.body", "body": b"a bearer token is required\n"})
                return
        await self.app(scope, receive, send)
