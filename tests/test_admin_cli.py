"""The admin commands (`python -m kafscale topics|groups|offsets|produce|consume|cluster`)
run as subprocesses against a live broker, output checked as tables and as --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.broker import REPO, free_port


def cli(broker, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    bootstrap = ["--bootstrap", broker.bootstrap] if broker is not None else []
    return subprocess.run(
        [sys.executable, "-m", "kafscale", *args, *bootstrap],
        input=stdin, capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def rows(table: str) -> list[list[str]]:
    """Rows of a table as split cells, header excluded."""
    lines = [ln for ln in table.splitlines() if ln.strip()]
    return [ln.split() for ln in lines[1:]]


def produce(bootstrap: str, topic: str, n: int, partitions: int = 1) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(15) == 0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    res = admin.list_consumer_group_offsets([req])[group].result(15)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


def consume_and_commit(bootstrap: str, group: str, topic: str, n: int) -> None:
    """Consume n records as a member of `group`, commit, leave."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    assert got == n
    c.commit(asynchronous=False)
    c.close()


# -- topics ------------------------------------------------------------------------------


def test_topics_lifecycle(broker, topic_name):
    out = ok(cli(broker, "topics", "create", topic_name, "--partitions", "3", "--config", "retention.ms=3600000"))
    assert out.strip() == f"created topic {topic_name} with 3 partitions (retention.ms=3600000)"

    listing = ok(cli(broker, "topics", "list"))
    assert listing.splitlines()[0].split() == ["TOPIC", "PARTITIONS"]
    assert [topic_name, "3"] in rows(listing)
    assert {"name": topic_name, "partitions": 3} in json.loads(ok(cli(broker, "topics", "list", "--json")))

    produce(broker.bootstrap, topic_name, 6, partitions=3)
    described = ok(cli(broker, "topics", "describe", topic_name))
    assert f"Topic: {topic_name}" in described
    assert "Config overrides: retention.ms=3600000" in described
    table = described[described.index("PARTITION"):]
    assert table.splitlines()[0].split() == ["PARTITION", "LEADER", "REPLICAS", "ISR", "EARLIEST", "LATEST", "RECORDS"]
    assert rows(table) == [[str(p), "0", "0", "0", "0", "2", "2"] for p in range(3)]
    doc = json.loads(ok(cli(broker, "topics", "describe", topic_name, "--json")))
    assert doc["overrides"] == {"retention.ms": "3600000"}
    assert doc["configs"]["retention.ms"] == "3600000" and "cleanup.policy" in doc["configs"]
    assert [(p["partition"], p["earliest"], p["latest"], p["leader"]) for p in doc["partitions"]] == [(0, 0, 2, 0), (1, 0, 2, 0), (2, 0, 2, 0)]

    again = cli(broker, "topics", "create", topic_name)
    assert again.returncode == 1 and "already exists" in again.stderr

    assert ok(cli(broker, "topics", "delete", topic_name)).strip() == f"deleted topic {topic_name}"
    gone = cli(broker, "topics", "describe", topic_name)
    assert gone.returncode == 1 and f"topic {topic_name!r} does not exist" in gone.stderr
    assert cli(broker, "topics", "delete", topic_name).returncode == 1
    assert topic_name not in ok(cli(broker, "topics", "list"))


def test_topics_create_json_and_invalid(broker, topic_name):
    doc = json.loads(ok(cli(broker, "topics", "create", topic_name, "--partitions", "2", "--json")))
    assert doc == {"name": topic_name, "partitions": 2, "configs": {}, "created": True}
    bad = cli(broker, "topics", "create", topic_name + "-bad", "--config", "retention.ms=soon")
    assert bad.returncode == 1 and "error:" in bad.stderr
    bad = cli(broker, "topics", "create", topic_name + "-x", "--config", "noequals")
    assert bad.returncode == 1 and "key=value" in bad.stderr


def test_topics_alter_config(broker, topic_name):
    ok(cli(broker, "topics", "create", topic_name, "--config", "retention.ms=3600000"))
    out = ok(cli(broker, "topics", "alter-config", topic_name, "--set", "retention.bytes=1048576", "--set", "cleanup.policy=delete", "--delete", "retention.ms"))
    assert f"altered configs of topic {topic_name}" in out
    assert "Config overrides: cleanup.policy=delete, retention.bytes=1048576" in out
    doc = json.loads(ok(cli(broker, "topics", "alter-config", topic_name, "--delete", "cleanup.policy", "--json")))
    assert doc["overrides"] == {"retention.bytes": "1048576"}
    assert json.loads(ok(cli(broker, "topics", "describe", topic_name, "--json")))["overrides"] == {"retention.bytes": "1048576"}

    bad = cli(broker, "topics", "alter-config", topic_name, "--set", "no.such.config=1")
    assert bad.returncode == 1 and "no.such.config" in bad.stderr
    nothing = cli(broker, "topics", "alter-config", topic_name)
    assert nothing.returncode == 1 and "nothing to change" in nothing.stderr
    unknown = cli(broker, "topics", "alter-config", topic_name + "-nope", "--set", "retention.ms=1")
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr


# -- produce / consume / offsets ---------------------------------------------------------


def test_produce_and_consume(broker, topic_name):
    ok(cli(broker, "topics", "create", topic_name))
    proc = cli(broker, "produce", topic_name, "--key-separator", ":", "--header", "source=cli", "--header", "n=1",
               stdin="a:first\nb:second\nc:third:with:colons\n")
    ok(proc)
    assert f"produced 3 records to {topic_name}" in proc.stderr

    out = ok(cli(broker, "consume", topic_name, "--from-beginning", "--exit-at-end", "--format", "%o %k=%v %h"))
    assert out.splitlines() == ["0 a=first source=cli,n=1", "1 b=second source=cli,n=1", "2 c=third:with:colons source=cli,n=1"]

    lines = ok(cli(broker, "consume", topic_name, "--from-beginning", "--max-messages", "2", "--json")).splitlines()
    docs = [json.loads(ln) for ln in lines]
    assert [(d["offset"], d["key"], d["value"]) for d in docs] == [(0, "a", "first"), (1, "b", "second")]
    assert docs[0]["headers"] == [["source", "cli"], ["n", "1"]] and docs[0]["topic"] == topic_name and docs[0]["timestamp"] > 0

    # plain values, no key separator; the default format is the value alone
    ok(cli(broker, "produce", topic_name, stdin="plain\n"))
    assert ok(cli(broker, "consume", topic_name, "--from-beginning", "-e")).splitlines()[-1] == "plain"

    bad = cli(broker, "produce", topic_name, "--key-separator", ":", stdin="k:v\nnoseparator\n")
    assert bad.returncode == 1 and "line 2" in bad.stderr


def test_consume_with_group_commits(broker, topic_name):
    ok(cli(broker, "topics", "create", topic_name))
    produce(broker.bootstrap, topic_name, 5)
    group = topic_name + "-g"
    out = ok(cli(broker, "consume", topic_name, "--from-beginning", "--group", group, "--max-messages", "5"))
    assert out.splitlines() == [f"v{i}" for i in range(5)]
    assert committed(broker.bootstrap, group, topic_name, 1) == {0: 5}


def test_consume_and_produce_unknown_topic(broker_factory, topic_name):
    b = broker_factory(extra_args=["--auto-create-topics", "false"])
    c = cli(b, "consume", topic_name, "--from-beginning", "-e")
    assert c.returncode == 1 and f"topic {topic_name!r} does not exist" in c.stderr
    p = cli(b, "produce", topic_name, stdin="x\n")
    assert p.returncode == 1 and f"topic {topic_name!r} does not exist" in p.stderr


def test_offsets(broker, topic_name):
    ok(cli(broker, "topics", "create", topic_name, "--partitions", "2"))
    produce(broker.bootstrap, topic_name, 6, partitions=2)
    out = ok(cli(broker, "offsets", topic_name))
    assert out.splitlines()[0].split() == ["PARTITION", "EARLIEST", "LATEST"]
    assert rows(out) == [["0", "0", "3"], ["1", "0", "3"]]
    assert json.loads(ok(cli(broker, "offsets", topic_name, "--json")))["partitions"] == [
        {"partition": 0, "earliest": 0, "latest": 3}, {"partition": 1, "earliest": 0, "latest": 3}]
    latest = json.loads(ok(cli(broker, "offsets", topic_name, "--time", "latest", "--json")))
    assert [p["offset"] for p in latest["partitions"]] == [3, 3]
    assert [r[:2] for r in rows(ok(cli(broker, "offsets", topic_name, "--time", "earliest")))] == [["0", "0"], ["1", "0"]]
    past = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    at = json.loads(ok(cli(broker, "offsets", topic_name, "--time", past, "--json")))
    assert [p["offset"] for p in at["partitions"]] == [0, 0] and all(p["timestamp"] for p in at["partitions"])
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert [p["offset"] for p in json.loads(ok(cli(broker, "offsets", topic_name, "--time", future, "--json")))["partitions"]] == [-1, -1]
    bad = cli(broker, "offsets", topic_name, "--time", "yesterday")
    assert bad.returncode == 1 and "ISO 8601" in bad.stderr
    unknown = cli(broker, "offsets", topic_name + "-nope")
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr


# -- cluster -----------------------------------------------------------------------------


def test_cluster_describe(broker):
    out = ok(cli(broker, "cluster", "describe"))
    assert "Cluster id: " in out and "Controller: 0" in out
    table = out[out.index("BROKER"):]
    assert rows(table)[0][:3] == ["0", "127.0.0.1", str(broker.port)]
    doc = json.loads(ok(cli(broker, "cluster", "describe", "--json")))
    assert doc["controller"] == 0 and doc["cluster_id"]
    assert doc["brokers"][0]["id"] == 0 and doc["brokers"][0]["port"] == broker.port and doc["brokers"][0]["controller"]


# -- groups ------------------------------------------------------------------------------


def test_groups_list_describe_delete(broker, topic_name):
    group = topic_name + "-grp"
    ok(cli(broker, "topics", "create", topic_name, "--partitions", "2"))
    produce(broker.bootstrap, topic_name, 8, partitions=2)
    consume_and_commit(broker.bootstrap, group, topic_name, 8)
    produce(broker.bootstrap, topic_name, 2, partitions=2)  # one record of lag per partition

    listing = ok(cli(broker, "groups", "list"))
    assert listing.splitlines()[0].split() == ["GROUP", "STATE", "TYPE", "PROTOCOL"]
    assert [group, "Empty", "consumer", "classic"] in rows(listing)
    assert {"group": group, "state": "Empty", "type": "consumer", "protocol": "classic"} in json.loads(ok(cli(broker, "groups", "list", "--json")))

    out = ok(cli(broker, "groups", "describe", group))
    assert f"Group: {group}" in out and "State: Empty" in out and "Total lag: 2" in out
    table = out[out.index("TOPIC"):]
    assert [r[:5] for r in rows(table)] == [[topic_name, "0", "4", "5", "1"], [topic_name, "1", "4", "5", "1"]]
    doc = json.loads(ok(cli(broker, "groups", "describe", group, "--json")))
    assert doc["state"] == "Empty" and doc["members"] == [] and doc["total_lag"] == 2
    assert [(p["partition"], p["committed"], p["end"], p["lag"]) for p in doc["partitions"]] == [(0, 4, 5, 1), (1, 4, 5, 1)]

    assert ok(cli(broker, "groups", "delete", group)).strip() == f"deleted group {group}"
    assert group not in ok(cli(broker, "groups", "list"))
    again = cli(broker, "groups", "delete", group)
    assert again.returncode == 1 and "does not exist" in again.stderr
    unknown = cli(broker, "groups", "describe", group)
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr


def test_groups_describe_active_member(broker, topic_name):
    group = topic_name + "-active"
    ok(cli(broker, "topics", "create", topic_name))
    produce(broker.bootstrap, topic_name, 3)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": "member-x", "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.2)
        assert c.assignment()
        doc = json.loads(ok(cli(broker, "groups", "describe", group, "--json")))
        assert doc["state"] == "Stable" and len(doc["members"]) == 1
        assert doc["members"][0]["client"] == "member-x" and doc["members"][0]["assignment"] == [f"{topic_name}-0"]

        # Kafka's rule: offsets of a group with members cannot be reset.
        busy = cli(broker, "groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest", "--execute")
        assert busy.returncode == 1 and "is not empty" in busy.stderr
        busy = cli(broker, "groups", "delete", group)
        assert busy.returncode == 1 and "active members" in busy.stderr
    finally:
        c.close()


def test_groups_list_describe_consumer_protocol(broker, topic_name):
    """A KIP-848 group (group.protocol=consumer) is listed and described with its protocol
    and each member's target assignment."""
    group = topic_name + "-kip848"
    ok(cli(broker, "topics", "create", topic_name, "--partitions", "2"))
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "client.id": "member-k", "group.protocol": "consumer"})
    try:
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < 2 and time.monotonic() < deadline:
            c.poll(0.2)
        assert len(c.assignment()) == 2
        assert [group, "Stable", "consumer", "consumer"] in rows(ok(cli(broker, "groups", "list")))
        doc = json.loads(ok(cli(broker, "groups", "describe", group, "--json")))
        assert (doc["state"], doc["protocol"], doc["assignor"]) == ("Stable", "consumer", "uniform")
        [m] = doc["members"]
        assert m["client"] == "member-k" and m["assignment"] == m["target_assignment"] == [f"{topic_name}-0", f"{topic_name}-1"]
        # epochs from the coordinator's ConsumerGroupDescribe: a stable member is at the group's epoch
        assert doc["group_epoch"] >= 1 and doc["assignment_epoch"] == doc["group_epoch"] and m["member_epoch"] == doc["group_epoch"]
        assert m["member_protocol"] == "consumer"
        text = ok(cli(broker, "groups", "describe", group))
        assert "Protocol: consumer" in text and f"Group epoch: {doc['group_epoch']}   Target assignment epoch: {doc['group_epoch']}" in text
        [member_row] = [r for r in rows(text) if r and r[0] == m["member"]]
        assert member_row[1:3] == [str(doc["group_epoch"]), "consumer"] and member_row[-2:] == [f"{topic_name}-0,{topic_name}-1"] * 2
    finally:
        c.close()


def test_groups_configs_and_alter_config(broker, topic_name):
    """A group's configs (GROUP config resources) shown and changed, before the group exists,
    with the broker's refusal passed on."""
    group = topic_name + "-cfg"
    listing = {r[0]: r[1:] for r in rows(ok(cli(broker, "groups", "configs", group)))}
    assert listing["share.auto.offset.reset"] == ["latest", "default"] and len(listing) == 10
    out = ok(cli(broker, "groups", "alter-config", group, "--set", "share.auto.offset.reset=earliest", "--set", "consumer.session.timeout.ms=50000"))
    assert "Config overrides: consumer.session.timeout.ms=50000, share.auto.offset.reset=earliest" in out
    doc = json.loads(ok(cli(broker, "groups", "alter-config", group, "--delete", "consumer.session.timeout.ms", "--json")))
    assert doc["overrides"] == {"share.auto.offset.reset": "earliest"}
    configs = {c["name"]: c for c in json.loads(ok(cli(broker, "groups", "configs", group, "--json")))["configs"]}
    assert configs["share.auto.offset.reset"] == {"name": "share.auto.offset.reset", "value": "earliest", "override": True}
    refused = cli(broker, "groups", "alter-config", group, "--set", "consumer.session.timeout.ms=1000")
    assert refused.returncode == 1 and "group.consumer.min.session.timeout.ms" in refused.stderr and "INVALID_CONFIG" in refused.stderr


def test_groups_reset_offsets(broker, topic_name):
    group = topic_name + "-reset"
    ok(cli(broker, "topics", "create", topic_name, "--partitions", "2"))
    produce(broker.bootstrap, topic_name, 10, partitions=2)
    consume_and_commit(broker.bootstrap, group, topic_name, 10)
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 5, 1: 5}

    # Dry run: the plan, nothing changed.
    dry = cli(broker, "groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest")
    out = ok(dry)
    assert "dry run" in dry.stderr
    assert out.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT", "NEW"]
    assert rows(out) == [[group, topic_name, "0", "5", "0"], [group, topic_name, "1", "5", "0"]]
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 5, 1: 5}

    # --execute moves the committed offsets.
    done = cli(broker, "groups", "reset-offsets", group, "--topic", topic_name, "--to-earliest", "--execute")
    ok(done)
    assert "reset on 2 partitions" in done.stderr
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 0, 1: 0}

    # One partition, to an offset; out-of-range targets are clamped.
    doc = json.loads(ok(cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic_name}:1", "--to-offset", "3", "--execute", "--json")))
    assert doc == {"group": group, "executed": True, "partitions": [{"topic": topic_name, "partition": 1, "current": 0, "new": 3}]}
    ok(cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic_name}:0", "--to-offset", "999", "--execute"))
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 5, 1: 3}

    # By time: an hour ago is before every record -> the start; latest -> the end.
    past = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    ok(cli(broker, "groups", "reset-offsets", group, "--topic", topic_name, "--to-datetime", past, "--execute"))
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 0, 1: 0}
    doc = json.loads(ok(cli(broker, "groups", "reset-offsets", group, "--topic", topic_name, "--to-latest", "--execute", "--json")))
    assert [(p["current"], p["new"]) for p in doc["partitions"]] == [(0, 5), (0, 5)]
    assert committed(broker.bootstrap, group, topic_name, 2) == {0: 5, 1: 5}

    # A consumer of the group now starts where the reset put it.
    ok(cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic_name}:0", "--to-offset", "4", "--execute"))
    out = ok(cli(broker, "consume", topic_name, "--group", group, "--max-messages", "1", "--format", "%p %o"))
    assert out.splitlines() == ["0 4"]

    bad = cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic_name}:7", "--to-earliest")
    assert bad.returncode == 1 and "no partition 7" in bad.stderr
    usage = cli(broker, "groups", "reset-offsets", group, "--topic", topic_name)
    assert usage.returncode == 2 and "one of the arguments" in usage.stderr


# -- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["topics", "list"], ["groups", "list"], ["cluster", "describe"], ["offsets", "t"], ["consume", "t"], ["produce", "t"]])
def test_unreachable_broker_fails_fast(command):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kafscale", *command, "--bootstrap", f"127.0.0.1:{free_port()}"],
                          input="x\n", capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach any broker" in proc.stderr
    assert time.monotonic() - started < 8
