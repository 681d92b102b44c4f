"""`kafscale mcp` through the official SDK's client against a real broker: over stdio the
read-only tools are listed and each one answers what the broker holds; over streamable HTTP
with --allow-writes the write tools need the bearer token and their effects are checked
with confluent-kafka."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import requests

from tests.support.broker import REPO, free_port, wait_port
from tests.support.console import GROUP, TOPIC, admin, committed, seeded_broker
from tests.support.wait import wait_until

pytest.importorskip("mcp")

READ = {"cluster_status", "list_topics", "describe_topic", "sample_records", "list_groups", "describe_group", "broker_metrics"}
WRITE = {"create_topic", "delete_topic", "produce_record", "reset_group_offsets", "delete_group"}


@pytest.fixture(scope="module")
def cluster():
    b = seeded_broker()
    yield b
    b.stop()


def _result(res) -> dict:
    assert not res.is_error, res.content
    if res.structured_content is not None:
        return res.structured_content.get("result", res.structured_content)
    return json.loads(res.content[0].text)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])}


async def _read_tools(cluster) -> dict:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "kafscale", "mcp", "--bootstrap", cluster.bootstrap, "--metrics", cluster.http,
                                                                 "--timeout", "5"], env=_env(), cwd=str(REPO))
    async with Client(params) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        out = {"names": names}
        out["cluster_status"] = _result(await client.call_tool("cluster_status", {}))
        out["list_topics"] = _result(await client.call_tool("list_topics", {"query": "ord", "limit": 10}))
        out["describe_topic"] = _result(await client.call_tool("describe_topic", {"topic": TOPIC}))
        out["sample_records"] = _result(await client.call_tool("sample_records", {"topic": TOPIC, "partition": 1, "count": 5}))
        out["list_groups"] = _result(await client.call_tool("list_groups", {}))
        out["describe_group"] = _result(await client.call_tool("describe_group", {"group": GROUP}))
        out["broker_metrics"] = _result(await client.call_tool("broker_metrics", {}))
        out["unknown_topic"] = await client.call_tool("describe_topic", {"topic": "no-such-topic"})
        out["write_refused"] = await client.call_tool("create_topic", {"topic": "never"})
        return out


def test_read_only_tools_over_stdio(cluster):
    out = asyncio.run(asyncio.wait_for(_read_tools(cluster), 120))
    assert out["names"] == READ
    status = out["cluster_status"]
    assert [b["address"] for b in status["brokers"]] == [cluster.bootstrap] and status["topics"] >= 1
    assert [t["name"] for t in out["list_topics"]["topics"]] == [TOPIC] and out["list_topics"]["total"] == 1
    assert [(p["partition"], p["start"], p["end"]) for p in out["describe_topic"]["partitions"]] == [(0, 0, 100), (1, 0, 100), (2, 0, 100)]
    records = out["sample_records"]["records"]
    assert [r["offset"] for r in records] == [99, 98, 97, 96, 95]
    assert records[0]["key"] == "k298" and records[0]["value"] == '{"order": 298}'
    assert GROUP in [g["name"] for g in out["list_groups"]["groups"]]
    p0 = next(p for p in out["describe_group"]["partitions"] if p["topic"] == TOPIC and p["partition"] == 0)
    assert (p0["committed"], p0["end"], p0["lag"]) == (37, 100, 63)
    [b] = out["broker_metrics"]["brokers"]
    assert b["up"] and b["ready"] and b["broker_id"] == 0 and b["produce_bytes"] > 0
    put, commit = b["latency_ms"]["store_put"], b["latency_ms"]["meta_commit"]  # the seeding's flushes
    assert 0 < put["p50"] <= put["p99"] and 0 < commit["p50"] <= commit["p99"], b["latency_ms"]
    assert out["unknown_topic"].is_error and "does not exist" in out["unknown_topic"].content[0].text
    assert out["write_refused"].is_error  # no such tool without --allow-writes


def _read_back(bootstrap: str, topic: str, partition: int) -> tuple:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "mcp-test-reader", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        m = wait_until(lambda: next((m for m in c.consume(10, 0.5) if m.error() is None), None), 20, "the produced record")
        return m.offset(), m.key(), m.value()
    finally:
        c.close()


async def _write_tools(url: str, token: str, bootstrap: str, name: str) -> dict:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        out = {"names": {t.name for t in (await client.list_tools()).tools}}
        out["create"] = _result(await client.call_tool("create_topic", {"topic": name, "partitions": 2}))
        out["produce"] = _result(await client.call_tool("produce_record", {"topic": name, "key": "k", "value": "v1", "partition": 1}))
        out["record"] = _read_back(bootstrap, name, 1)
        out["dry_run"] = _result(await client.call_tool("reset_group_offsets", {"group": GROUP, "topic": TOPIC, "to": "offset", "value": "20"}))
        out["committed_after_dry_run"] = committed(bootstrap, GROUP, TOPIC, [0])
        out["reset"] = _result(await client.call_tool("reset_group_offsets", {"group": GROUP, "topic": TOPIC, "to": "latest", "dry_run": False}))
        out["committed_after_reset"] = committed(bootstrap, GROUP, TOPIC, [0, 1, 2])
        out["delete_topic"] = _result(await client.call_tool("delete_topic", {"topic": name}))
        out["delete_group"] = _result(await client.call_tool("delete_group", {"group": GROUP}))
        return out


def test_write_tools_over_http_need_the_token(cluster, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("tok-" + os.urandom(8).hex())
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kafscale", "mcp", "--transport", "http", "--listen", f"127.0.0.1:{port}", "--allow-writes",
                             "--token-file", str(token_file), "--bootstrap", cluster.bootstrap, "--metrics-port-offset", "-1"],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_port(port, timeout=30, proc=proc)
        url = f"http://127.0.0.1:{port}/mcp"
        assert requests.post(url, json={}, timeout=10).status_code == 401
        assert requests.post(url, json={}, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        name = f"mcp-made-{port}"
        out = asyncio.run(asyncio.wait_for(_write_tools(url, token_file.read_text(), cluster.bootstrap, name), 120))
    finally:
        proc.terminate()
        proc.wait(20)
    assert out["names"] == READ | WRITE
    assert out["produce"] == {"topic": name, "partition": 1, "offset": 0}
    assert out["record"] == (0, b"k", b"v1")
    assert [p["new"] for p in out["dry_run"]["partitions"]] == [20, 20, 20] and not out["dry_run"]["executed"]
    assert out["committed_after_dry_run"] == {0: 37}
    assert out["reset"]["executed"] and out["committed_after_reset"] == {0: 100, 1: 100, 2: 100}
    assert out["delete_topic"] == {"deleted": name} and out["delete_group"] == {"deleted": GROUP}
    wait_until(lambda: name not in admin(cluster.bootstrap).list_topics(timeout=10).topics, 15, "the topic to be deleted")
    groups = admin(cluster.bootstrap).list_consumer_groups().result(10)
    assert GROUP not in [g.group_id for g in groups.valid]


def test_writes_over_http_without_a_token_refuse_to_start(cluster):
    env = {k: v for k, v in _env().items() if k != "KAFSCALE_MCP_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "kafscale", "mcp", "--transport", "http", "--allow-writes", "--bootstrap", cluster.bootstrap],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "bearer token" in proc.stderr
