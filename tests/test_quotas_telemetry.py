"""Client quotas stored in the metadata store (DescribeClientQuotas / AlterClientQuotas with
Kafka's validation and filters) and KIP-714 telemetry answered with an empty subscription
(#18). Raw requests over every version kio has: the Python admin clients installed here have
no quota API."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Producer

from kafscale.errors import ErrorCode
from kafscale.metadata import quotas
from kafscale.protocol.codec import kio_versions
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

INVALID_REQUEST = ErrorCode.invalid_request.value


@pytest.fixture(scope="module")
def qbroker():
    """A broker of its own: quotas are cluster-wide state that other tests must not see."""
    b = BrokerProcess().start()
    yield b
    b.stop()


def versions(api_key: int, bootstrap: str) -> range:
    with RawClient(bootstrap) as c:
        [api] = [a for a in c.request(18, 3, req(18, 3, client_software_name="t", client_software_version="1")).api_keys if a.api_key == api_key]
    return range(max(api.min_version, kio_versions(api_key)[0]), api.max_version + 1)  # old versions: test_old_versions.py


def alter(bootstrap: str, entity: dict, ops: dict, validate_only: bool = False, v: int = 1):
    """ops: key -> value (None: remove). Returns (error code, message) of the one entry."""
    e = tuple(req(49, v, "EntityData", entity_type=k, entity_name=n) for k, n in entity.items())
    o = tuple(req(49, v, "OpData", key=k, value=0.0 if val is None else float(val), remove=val is None) for k, val in ops.items())
    with RawClient(bootstrap) as c:
        [r] = c.request(49, v, req(49, v, entries=(req(49, v, "EntryData", entity=e, ops=o),), validate_only=validate_only)).entries
    return error_code(r.error_code), r.error_message


def describe(bootstrap: str, components, strict: bool = False, v: int = 1):
    """components: (type, match_type, match). Returns (error code, {entity: values} or None)."""
    comps = tuple(req(48, v, "ComponentData", entity_type=t, match_type=m, match=s) for t, m, s in components)
    with RawClient(bootstrap) as c:
        resp = c.request(48, v, req(48, v, components=comps, strict=strict))
    if resp.entries is None:
        return error_code(resp.error_code), None
    return error_code(resp.error_code), {
        tuple(sorted((x.entity_type, x.entity_name) for x in e.entity)): {x.key: x.value for x in e.values} for e in resp.entries
    }


def test_alter_and_describe_client_quotas(qbroker):
    b = qbroker.bootstrap
    for v in versions(49, b):
        assert alter(b, {"user": "alice"}, {"producer_byte_rate": 1048576, "request_percentage": 12.5}, v=v) == (0, None)
    assert alter(b, {"user": "alice", "client-id": "app"}, {"consumer_byte_rate": 2048}) == (0, None)
    assert alter(b, {"client-id": None}, {"producer_byte_rate": 4096}) == (0, None)  # the default client id
    assert alter(b, {"ip": "10.0.0.1"}, {"connection_creation_rate": 5}) == (0, None)
    assert alter(b, {"user": "bob"}, {"producer_byte_rate": 1}, validate_only=True) == (0, None)  # nothing stored
    alice = (("user", "alice"),)
    everything = {
        alice: {"producer_byte_rate": 1048576.0, "request_percentage": 12.5},
        (("client-id", "app"), ("user", "alice")): {"consumer_byte_rate": 2048.0},
        (("client-id", None),): {"producer_byte_rate": 4096.0},
        (("ip", "10.0.0.1"),): {"connection_creation_rate": 5.0},
    }
    for v in versions(48, b):
        assert describe(b, [], v=v) == (0, everything), v
    # Kafka's filters: exact, default, specified; strict = no other entity types
    assert describe(b, [("user", 0, "alice")]) == (0, {k: everything[k] for k in (alice, (("client-id", "app"), ("user", "alice")))})
    assert describe(b, [("user", 0, "alice")], strict=True) == (0, {alice: everything[alice]})
    assert describe(b, [("client-id", 1, None)]) == (0, {(("client-id", None),): {"producer_byte_rate": 4096.0}})
    assert describe(b, [("client-id", 2, None)]) == (0, {k: everything[k] for k in ((("client-id", "app"), ("user", "alice")), (("client-id", None),))})
    assert describe(b, [("ip", 2, None)]) == (0, {(("ip", "10.0.0.1"),): {"connection_creation_rate": 5.0}})
    # removing keys; an entity with none left is gone
    assert alter(b, {"user": "alice"}, {"request_percentage": None}) == (0, None)
    assert describe(b, [("user", 0, "alice")], strict=True)[1] == {alice: {"producer_byte_rate": 1048576.0}}
    assert alter(b, {"user": "alice"}, {"producer_byte_rate": None}) == (0, None)
    assert describe(b, [("user", 0, "alice")], strict=True)[1] == {}
    # stored in the metadata store: a restart keeps them
    qbroker.restart()
    assert describe(b, [("ip", 2, None)]) == (0, {(("ip", "10.0.0.1"),): {"connection_creation_rate": 5.0}})


@pytest.mark.parametrize("entity,ops", [
    ({}, {"producer_byte_rate": 1}),                                  # empty entity
    ({"group": "g"}, {"producer_byte_rate": 1}),                      # unknown entity type
    ({"user": ""}, {"producer_byte_rate": 1}),                        # empty name
    ({"user": "u", "ip": "1.2.3.4"}, {"producer_byte_rate": 1}),      # ip combined
    ({"ip": "not-an-ip"}, {"connection_creation_rate": 1}),
    ({"user": "u"}, {"connection_creation_rate": 1}),                 # an ip key on a user
    ({"user": "u"}, {"no_such_quota": 1}),
    ({"user": "u"}, {"producer_byte_rate": 0}),                       # must be > 0
    ({"user": "u"}, {"producer_byte_rate": 1.5}),                     # integral
    ({"user": "u"}, {"producer_byte_rate": 1e30}),                    # too large for a long
])
def test_alter_client_quotas_refused_as_kafka(qbroker, entity, ops):
    code, msg = alter(qbroker.bootstrap, entity, ops)
    assert code == INVALID_REQUEST and msg, (entity, ops)


def test_describe_client_quotas_bad_filters(qbroker):
    b = qbroker.bootstrap
    assert describe(b, [("user", 0, None)]) == (INVALID_REQUEST, None)          # exact needs a name
    assert describe(b, [("user", 1, "x")]) == (INVALID_REQUEST, None)           # default takes none
    assert describe(b, [("user", 2, None), ("user", 2, None)]) == (INVALID_REQUEST, None)
    assert describe(b, [("ip", 2, None), ("user", 2, None)]) == (INVALID_REQUEST, None)
    assert describe(b, [("group", 2, None)]) == (ErrorCode.unsupported_version.value, None)


def test_quota_matcher_unit():
    m = quotas.matcher([("user", quotas.MATCH_SPECIFIED, None)], strict=False)
    assert m((("user", "a"),)) and m((("client-id", "c"), ("user", None))) and not m((("client-id", "c"),))


def test_get_telemetry_subscriptions_empty(qbroker):
    b = qbroker.bootstrap
    with RawClient(b) as c:
        r = c.request(71, 0, req(71, 0, client_instance_id=uuid.UUID(int=0)))
        assert error_code(r.error_code) == 0 and r.client_instance_id.int != 0
        assert (r.requested_metrics, r.subscription_id) == ((), 0)
        mine = uuid.uuid4()
        assert c.request(71, 0, req(71, 0, client_instance_id=mine)).client_instance_id == mine
        p = c.request(72, 0, req(72, 0, client_instance_id=mine, subscription_id=0, terminating=True, compression_type=0, metrics=b""))
        assert error_code(p.error_code) == 0


def test_librdkafka_gets_the_empty_subscription_and_pushes_nothing(qbroker):
    lines = []
    logger = logging.getLogger("rdkafka-telemetry")
    logger.addHandler(logging.Handler())
    logger.handlers[-1].emit = lambda rec: lines.append(rec.getMessage())
    logger.setLevel(logging.DEBUG)
    p = Producer({"bootstrap.servers": qbroker.bootstrap, "debug": "telemetry", "logger": logger, "enable.metrics.push": True})
    delivered = []
    p.produce("telemetry-topic", b"v", on_delivery=lambda e, m: delivered.append(e))
    assert p.flush(20) == 0 and delivered == [None]

    def parsed() -> bool:
        p.poll(0.2)  # librdkafka's log lines reach the logger through poll
        text = "\n".join(lines)
        return "Parsing: subscription id 0" in text and "Parsing: requested metrics count 0" in text

    wait_until(parsed, 15, "librdkafka to parse the empty subscription")
    text = "\n".join(lines)
    assert "PUSH" not in text, text[-3000:]  # librdkafka logs each push under PUSH
