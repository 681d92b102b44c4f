"""Brokers reaching each other over a secured listener (#15, #17): a cluster whose only
listener is SASL_SSL, with ACLs on, runs transactions whose partitions live on both brokers
(the coordinator writes markers to the other broker as its SASL user over TLS); the broker's
SCRAM client against the SCRAM server; settings that cannot work are refused at start."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType

from kafscale.security import certs, scram
from tests.support.broker import REPO, BrokerProcess, free_port
from tests.support.servers import ETCD_BIN
from tests.support.wait import wait_until
from tests.test_cluster import backends  # noqa: F401  (fixture)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_client_against_the_server(mechanism):
    cred = scram.make_credential(mechanism, "broker-secret", 4096)

    def exchange(password: str, server_cred=cred) -> None:
        client, server = scram.ScramClient(mechanism, "broker", password), scram.ScramServer(mechanism)
        assert server.client_first(client.first()) == "broker"
        final = client.final(server.server_first(server_cred))
        client.verify(server.client_final(final))

    exchange("broker-secret")
    with pytest.raises(scram.ScramError, match="invalid credentials"):
        exchange("wrong")
    # a server that does not hold this password's keys cannot sign the exchange
    client, server = scram.ScramClient(mechanism, "broker", "broker-secret"), scram.ScramServer(mechanism)
    server.client_first(client.first())
    client.final(server.server_first(cred))
    with pytest.raises(scram.ScramError, match="signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))
    with pytest.raises(scram.ScramError, match="refused"):
        client.verify(b"e=invalid-proof")


def test_broker_refuses_an_inter_broker_sasl_listener_without_credentials(tmp_path):
    port = free_port()
    out = subprocess.run(
        [sys.executable, "-m", "kafscale", "broker", "--listeners", f"SASL_PLAINTEXT://127.0.0.1:{port}", "--data-dir", str(tmp_path), "--http", ""],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, "KAFSCALE_INTER_BROKER_SASL_PASSWORD": ""},
    )
    assert out.returncode != 0
    assert "--inter-broker-sasl-username" in out.stderr + out.stdout


def _client(port: int, ca: str, user: str) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL", "ssl.ca.location": ca,
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


@pytest.mark.skipif(not os.path.exists(ETCD_BIN), reason="etcd binary not installed (make system-deps)")
@pytest.mark.timeout(180)
def test_transactions_across_brokers_over_sasl_ssl_with_acls(backends, tmp_path):  # noqa: F811
    etcd, moto = backends
    paths = certs.write_self_signed(str(tmp_path / "tls"))
    users = tmp_path / "users.txt"
    users.write_text("broker:broker-secret\nadmin:admin-secret\napp:app-secret\n")
    tag = uuid.uuid4().hex[:8]
    brokers: dict[int, BrokerProcess] = {}
    try:
        def start(node: int) -> None:
            port = free_port()
            brokers[node] = BrokerProcess(
                port=port,
                extra_args=[
                    "--broker-id", str(node), "--metadata", etcd.url, "--metadata-prefix", f"/ib-{tag}",
                    "--storage", f"s3://ib-{tag}/data", "--lease-ttl-s", "3",
                    "--listeners", f"SASL_SSL://127.0.0.1:{port}",
                    "--ssl-cert", paths["cert"], "--ssl-key", paths["key"], "--ssl-ca", paths["ca"],
                    "--sasl-users-file", str(users), "--sasl-mechanisms", "PLAIN",
                    "--inter-broker-sasl-username", "broker",
                    "--authorizer", "acls", "--super-users", "User:broker;User:admin",
                    "--group-initial-rebalance-delay-ms", "0",
                ],
                env={**moto.env, "KAFSCALE_S3_CREATE_BUCKET": "true", "KAFSCALE_INTER_BROKER_SASL_PASSWORD": "broker-secret"},
            ).start()  # fmt: skip

        # The ACLs are made through broker 0 before broker 1 starts, so broker 1 loads them at
        # start (other brokers see new ACLs within --acl-refresh-ms: test_acl_enforcement).
        start(0)
        ca = paths["ca"]
        admin = AdminClient(_client(brokers[0].port, ca, "admin"))
        topic, tid = f"ib-{tag}", f"tx-{tag}"
        for f in admin.create_topics([NewTopic(topic, 4, 1)]).values():
            f.result(30)
        allow, lit = AclPermissionType.ALLOW, ResourcePatternType.LITERAL
        bindings = [
            AclBinding(ResourceType.TOPIC, topic, lit, "User:app", "*", AclOperation.ALL, allow),
            AclBinding(ResourceType.TRANSACTIONAL_ID, tid, lit, "User:app", "*", AclOperation.ALL, allow),
            AclBinding(ResourceType.GROUP, "*", lit, "User:app", "*", AclOperation.READ, allow),
        ]
        for f in admin.create_acls(bindings).values():
            f.result(15)
        start(1)

        def leaders() -> set[int]:
            md = admin.list_topics(topic, timeout=10)
            t = md.topics.get(topic)
            return {p.leader for p in t.partitions.values()} if t and t.error is None and len(t.partitions) == 4 else set()

        wait_until(lambda: leaders() == {0, 1}, 30, "both brokers to own partitions of the topic")

        p = Producer({**_client(brokers[0].port, ca, "app"), "transactional.id": tid, "transaction.timeout.ms": 30000})
        p.init_transactions(30)
        for commit in (True, False):
            p.begin_transaction()
            for part in range(4):
                p.produce(topic, value=f"{'kept' if commit else 'dropped'}-{part}".encode(), partition=part)
            (p.commit_transaction if commit else p.abort_transaction)(30)

        c = Consumer({**_client(brokers[1].port, ca, "app"), "group.id": f"g-{tag}", "isolation.level": "read_committed",
                      "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(topic, part, 0) for part in range(4)])
        got, eof = [], set()

        def read_all() -> bool:
            m = c.poll(0.5)
            if m is not None:
                if m.error() is None:
                    got.append(m.value())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
            return len(eof) == 4 and len(got) >= 4

        # Only markers written on both brokers move every partition's last stable offset
        # past the transactions: without them read_committed reads nothing there.
        wait_until(read_all, 60, "read_committed to reach the end of every partition")
        c.close()
        assert sorted(got) == [b"kept-0", b"kept-1", b"kept-2", b"kept-3"]
        logs = "\n".join(b.log_text() for b in brokers.values())
        assert "markers for producer" not in logs, logs[-3000:]  # no failed marker write on the way
    finally:
        for b in brokers.values():
            b.stop()
