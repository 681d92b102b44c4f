"""Listeners (#17): parsing of `--listeners`, `--advertised-listeners` and the protocol map
(pure), and real brokers serving several listeners, each client told the addresses of the
listener it came in on (Metadata, FindCoordinator, DescribeCluster), alone and in a cluster."""

from __future__ import annotations

import tempfile

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from kafscale.security.listeners import Listener, ListenerError, parse_listeners, parse_protocol_map, resolve
from tests.support.broker import BrokerProcess, free_port
from tests.support.servers import etcd_server  # noqa: F401 - fixture
from tests.support.wait import wait_until


# -- pure parsing --------------------------------------------------------------------------


def test_listen_and_advertise_make_one_plaintext_listener():
    bound, adv = resolve("", "", "", "0.0.0.0:9092", "broker-1:9092")
    assert bound == [Listener("PLAINTEXT", "0.0.0.0", 9092, "PLAINTEXT")]
    assert adv == [Listener("PLAINTEXT", "broker-1", 9092, "PLAINTEXT")]


def test_several_listeners_with_custom_names_mapped():
    pmap = parse_protocol_map("internal:SASL_SSL, REPL:PLAINTEXT")
    assert pmap["INTERNAL"] == "SASL_SSL" and pmap["SSL"] == "SSL"
    bound, adv = resolve(
        "PLAINTEXT://:9092,INTERNAL://[::1]:9094,SSL://127.0.0.1:9093", "INTERNAL://kafka.internal:19094", "INTERNAL:SASL_SSL", "", ""
    )
    assert [(l.name, l.host, l.port, l.protocol) for l in bound] == [
        ("PLAINTEXT", "", 9092, "PLAINTEXT"), ("INTERNAL", "::1", 9094, "SASL_SSL"), ("SSL", "127.0.0.1", 9093, "SSL"),
    ]
    assert [(a.name, a.host, a.port) for a in adv] == [("PLAINTEXT", "", 9092), ("INTERNAL", "kafka.internal", 19094), ("SSL", "127.0.0.1", 9093)]
    assert bound[1].tls and bound[1].sasl and not bound[0].tls and str(bound[1]) == "INTERNAL://[::1]:9094"


@pytest.mark.parametrize(
    "listeners, advertised, pmap, message",
    [
        ("CUSTOM://:9092", "", "", "no security protocol"),
        ("PLAINTEXT://:9092,PLAINTEXT://:9093", "", "", "appears twice"),
        ("PLAINTEXT://:notaport", "", "", "not a number"),
        ("PLAINTEXT//:9092", "", "", "not NAME://HOST:PORT"),
        ("PLAINTEXT://:9092", "SSL://x:9093", "", "not among the listeners"),
        ("X://:9092", "", "X:TLS", "unknown security protocol"),
        ("PLAINTEXT://:70000", "", "", "out of range"),
    ],
)
def test_bad_listener_settings_are_refused(listeners, advertised, pmap, message):
    with pytest.raises(ListenerError, match=message):
        resolve(listeners, advertised, pmap, "127.0.0.1:9092", "")


def test_parse_listeners_keeps_order():
    assert [l.name for l in parse_listeners("B://h:1,a://h:2", {"B": "SSL", "A": "PLAINTEXT"})] == ["B", "A"]


# -- real brokers --------------------------------------------------------------------------


def _brokers_seen(bootstrap: str) -> dict[int, tuple[str, int]]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {b.id: (b.host, b.port) for b in md.brokers.values()}


def _multi_listener_broker(extra=(), env=None, data_dir=None, via_env=False) -> tuple[BrokerProcess, int, int]:
    p1, p2 = free_port(), free_port()
    listeners = f"PLAINTEXT://127.0.0.1:{p1},INTERNAL://127.0.0.1:{p2}"
    advertised = f"PLAINTEXT://localhost:{p1},INTERNAL://127.0.0.1:{p2}"
    if via_env:
        env = {**(env or {}), "KAFSCALE_LISTENERS": listeners, "KAFSCALE_ADVERTISED_LISTENERS": advertised,
               "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:PLAINTEXT"}
        args = []
    else:
        args = ["--listeners", listeners, "--advertised-listeners", advertised, "--listener-security-protocol-map", "INTERNAL:PLAINTEXT"]
    b = BrokerProcess(port=p1, data_dir=data_dir, extra_args=[*args, *extra], env=env).start()
    return b, p1, p2


@pytest.fixture(scope="module")
def two_listener_broker():
    b, p1, p2 = _multi_listener_broker(["--group-initial-rebalance-delay-ms", "0"], via_env=True)
    yield b, p1, p2
    b.stop()


def test_each_client_sees_the_listener_it_came_in_on(two_listener_broker):
    b, p1, p2 = two_listener_broker
    assert _brokers_seen(f"127.0.0.1:{p1}") == {0: ("localhost", p1)}
    assert _brokers_seen(f"127.0.0.1:{p2}") == {0: ("127.0.0.1", p2)}
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{p2}"})
    cfg = admin.describe_cluster(include_authorized_operations=False).result(10)
    assert [(n.id, n.host, n.port) for n in cfg.nodes] == [(0, "127.0.0.1", p2)]
    assert "listening on PLAINTEXT 127.0.0.1:%d, INTERNAL 127.0.0.1:%d" % (p1, p2) in b.log_text()


def test_produce_and_group_consume_over_the_second_listener(two_listener_broker):
    _b, _p1, p2 = two_listener_broker
    boot = f"127.0.0.1:{p2}"
    p = Producer({"bootstrap.servers": boot})
    for i in range(5):
        p.produce("listeners-internal", value=f"v{i}".encode())
    assert p.flush(15) == 0
    # The group's coordinator is found through FindCoordinator on the same listener.
    c = Consumer({"bootstrap.servers": boot, "group.id": "listeners-g", "auto.offset.reset": "earliest"})
    c.subscribe(["listeners-internal"])
    got = []
    try:
        wait_until(lambda: (m := c.poll(0.5)) is not None and m.error() is None and got.append(m.value()) is None and len(got) == 5, 30, "five records")
        c.commit(asynchronous=False)
    finally:
        c.close()
    assert got == [f"v{i}".encode() for i in range(5)]


def test_bad_listener_flag_stops_the_broker_with_a_message():
    b = BrokerProcess(extra_args=["--listeners", "CUSTOM://127.0.0.1:1"])
    with pytest.raises(RuntimeError):
        b.start()
    assert "no security protocol" in b.log_text()
    b.stop()


def test_cluster_brokers_register_their_advertised_listeners(etcd_server):  # noqa: F811
    """Two brokers on etcd, each with two listeners: a client on either listener of either
    broker sees both brokers at their addresses of that listener."""
    shared = tempfile.mkdtemp(prefix="kafscale-listeners-")
    prefix = f"/ks-listeners-{free_port()}"
    common = ["--metadata", etcd_server.url, "--metadata-prefix", prefix, "--storage", f"file://{shared}", "--lease-ttl-s", "3"]
    started = []
    try:
        ports = {}
        for node in (1, 2):
            b, p1, p2 = _multi_listener_broker(["--broker-id", str(node), *common])
            started.append(b)
            ports[node] = (p1, p2)
        for node in (1, 2):
            p1, p2 = ports[node]
            want1 = {n: ("localhost", ports[n][0]) for n in (1, 2)}
            want2 = {n: ("127.0.0.1", ports[n][1]) for n in (1, 2)}
            wait_until(lambda p1=p1, want1=want1: _brokers_seen(f"127.0.0.1:{p1}") == want1, 20, "both brokers on PLAINTEXT")
            assert _brokers_seen(f"127.0.0.1:{p2}") == want2
    finally:
        for b in started:
            b.stop()
