"""The built-in schema registry (`kafscale broker --schema-registry`) as clients see it:
confluent-kafka's SchemaRegistryClient, AvroSerializer and AvroDeserializer through a
real broker; schema evolution (409 for an incompatible one); the REST API's error codes;
soft then hard delete; ids that survive a restart, and a kill -9 of the broker owning
`_schemas` in a three-broker etcd cluster."""

from __future__ import annotations

import json
import signal

import pytest
import requests
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.broker import AclBroker, BrokerProcess, free_port, wait_port
from tests.support.servers import etcd_server  # noqa: F401 - fixture
from tests.support.wait import wait_until

USER_V1 = json.dumps({"type": "record", "name": "User", "namespace": "example", "fields": [
    {"name": "name", "type": "string"}, {"name": "favorite_number", "type": "int"}]})
USER_V2 = json.dumps({"type": "record", "name": "User", "namespace": "example", "fields": [
    {"name": "name", "type": "string"}, {"name": "favorite_number", "type": "int"},
    {"name": "email", "type": ["null", "string"], "default": None}]})
USER_BAD = json.dumps({"type": "record", "name": "User", "namespace": "example", "fields": [
    {"name": "name", "type": "string"}, {"name": "favorite_number", "type": "int"}, {"name": "age", "type": "int"}]})
CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


def start_with_registry(advertise: bool = False, **kwargs) -> tuple[BrokerProcess, str]:
    port = free_port()
    extra = [*kwargs.pop("extra_args", []), "--schema-registry", f"0.0.0.0:{port}" if advertise else f"127.0.0.1:{port}"]
    if advertise:  # bound to all interfaces: other brokers are told where to forward
        extra += ["--schema-registry-advertise", f"127.0.0.1:{port}"]
    b = BrokerProcess(extra_args=extra, **kwargs).start()
    wait_port(port, proc=b.proc)
    return b, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def registry():
    b, url = start_with_registry()
    yield b, url
    b.stop()


def test_avro_records_through_kafscale(registry, topic_name):
    b, url = registry
    client = SchemaRegistryClient({"url": url})
    serializer = AvroSerializer(client, USER_V1)
    users = [{"name": f"user-{i}", "favorite_number": i} for i in range(5)]
    p = Producer({"bootstrap.servers": b.bootstrap})
    for u in users:
        p.produce(topic_name, value=serializer(u, SerializationContext(topic_name, MessageField.VALUE)))
    assert p.flush(15) == 0
    registered = client.get_latest_version(f"{topic_name}-value")
    assert registered.version == 1 and registered.schema_id >= 1
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": url}))  # a fresh client: no cached schema
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": topic_name, "auto.offset.reset": "earliest"})
    c.subscribe([topic_name])
    got = []
    try:
        while len(got) < len(users):
            m = c.poll(10)
            assert m is not None, f"only {len(got)} records"
            assert m.error() is None, m.error()
            assert m.value()[0] == 0 and int.from_bytes(m.value()[1:5], "big") == registered.schema_id
            got.append(deserializer(m.value(), SerializationContext(topic_name, MessageField.VALUE)))
    finally:
        c.close()
    assert got == users


def test_compatible_evolution_and_409(registry, topic_name):
    _b, url = registry
    client = SchemaRegistryClient({"url": url})
    subject = f"{topic_name}-value"
    id1 = client.register_schema(subject, Schema(USER_V1, "AVRO"))
    assert client.register_schema(subject, Schema(USER_V1, "AVRO")) == id1  # idempotent
    assert client.test_compatibility(subject, Schema(USER_V2, "AVRO")) is True
    assert client.test_compatibility(subject, Schema(USER_BAD, "AVRO")) is False
    id2 = client.register_schema(subject, Schema(USER_V2, "AVRO"))
    assert id2 != id1
    assert client.get_versions(subject) == [1, 2]
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(subject, Schema(USER_BAD, "AVRO"))
    assert e.value.http_status_code == 409 and e.value.error_code == 409
    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    assert client.register_schema(subject, Schema(USER_BAD, "AVRO")) not in (id1, id2)
    found = client.lookup_schema(subject, Schema(USER_V2, "AVRO"))
    assert (found.schema_id, found.version) == (id2, 2)


def test_rest_error_codes(registry, topic_name):
    _b, url = registry
    subject = f"{topic_name}-value"

    def code(method: str, path: str, body=None) -> tuple[int, int | None]:
        r = requests.request(method, url + path, headers=CT, data=None if body is None else json.dumps(body), timeout=10)
        assert r.headers["Content-Type"].startswith("application/vnd.schemaregistry.v1+json")
        return r.status_code, r.json().get("error_code") if isinstance(r.json(), dict) else None

    assert code("GET", f"/subjects/{subject}/versions") == (404, 40401)
    assert code("GET", f"/subjects/{subject}/versions/latest") == (404, 40401)
    assert code("POST", f"/subjects/{subject}/versions", {"schema": "{not json"}) == (422, 42201)
    assert code("POST", f"/subjects/{subject}/versions", {"schema": json.dumps({"type": "record", "name": "R"})}) == (422, 42201)
    assert code("POST", f"/subjects/{subject}/versions", {"schema": USER_V1, "schemaType": "XML"}) == (422, 42201)
    assert code("POST", f"/subjects/{subject}/versions", {"schema": USER_V1}) == (200, None)
    for bad in ("0", "-2", "one", "2147483648"):
        assert code("GET", f"/subjects/{subject}/versions/{bad}") == (422, 42202)
    assert code("GET", f"/subjects/{subject}/versions/9") == (404, 40402)
    assert code("GET", "/schemas/ids/999999") == (404, 40403)
    assert code("POST", f"/subjects/{subject}", {"schema": USER_V2}) == (404, 40403)
    assert code("PUT", f"/config/{subject}", {"compatibility": "SIDEWAYS"}) == (422, 42203)
    assert code("GET", f"/config/{subject}") == (404, 40408)
    assert requests.get(url + "/schemas/types", timeout=10).json() == ["AVRO"]
    assert requests.get(url + "/config", timeout=10).json() == {"compatibilityLevel": "BACKWARD"}


def test_soft_then_hard_delete(registry, topic_name):
    _b, url = registry
    client = SchemaRegistryClient({"url": url})
    subject = f"{topic_name}-value"
    id1 = client.register_schema(subject, Schema(USER_V1, "AVRO"))
    client.register_schema(subject, Schema(USER_V2, "AVRO"))
    with pytest.raises(SchemaRegistryError) as e:
        client.delete_subject(subject, permanent=True)
    assert e.value.error_code == 40405  # soft first
    assert client.delete_version(subject, 2) == 2
    assert client.get_versions(subject) == [1]
    assert client.delete_subject(subject) == [1]
    assert subject not in client.get_subjects()
    assert requests.get(f"{url}/subjects?deleted=true", timeout=10).json().count(subject) == 1
    assert requests.get(f"{url}/schemas/ids/{id1}", timeout=10).status_code == 200  # ids outlive a soft delete
    with pytest.raises(SchemaRegistryError) as e:
        client.delete_subject(subject)
    assert e.value.error_code == 40404
    assert client.delete_subject(subject, permanent=True) == [1, 2]
    r = requests.get(f"{url}/subjects/{subject}/versions?deleted=true", timeout=10)
    assert (r.status_code, r.json()["error_code"]) == (404, 40401)
    # Registered again after the hard delete: version 1 anew, live.
    client.register_schema(subject, Schema(USER_V1, "AVRO"))
    assert client.get_versions(subject) == [1]


def test_ids_survive_a_restart(tmp_path):
    b, url = start_with_registry(data_dir=str(tmp_path))
    try:
        client = SchemaRegistryClient({"url": url})
        id1 = client.register_schema("restart-value", Schema(USER_V1, "AVRO"))
        id2 = client.register_schema("restart-value", Schema(USER_V2, "AVRO"))
        # A hard-deleted id is not handed out again either.
        id3 = client.register_schema("gone-value", Schema(USER_BAD, "AVRO"))
        client.delete_subject("gone-value")
        client.delete_subject("gone-value", permanent=True)
        b.stop()
        b.start()
        wait_port(int(url.rsplit(":", 1)[1]), proc=b.proc)
        client = SchemaRegistryClient({"url": url})
        assert client.get_schema(id1).schema_str == json.dumps(json.loads(USER_V1), separators=(",", ":"))
        assert client.get_latest_version("restart-value").schema_id == id2
        new = client.register_schema("after-value", Schema(json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}), "AVRO"))
        assert new > id3
    finally:
        b.stop()


def test_three_brokers_kill9_of_the_writer(etcd_server, tmp_path):  # noqa: F811
    """Every broker serves the registry; writes anywhere go to the owner of `_schemas`-0.
    After a kill -9 of that owner the survivors keep every id and hand out new ones
    above them."""
    prefix = f"/ks-registry-{free_port()}"
    common = ["--metadata", etcd_server.url, "--metadata-prefix", prefix, "--storage", f"file://{tmp_path}/objects", "--lease-ttl-s", "3"]
    nodes = []
    try:
        for node in range(3):
            (tmp_path / f"b{node}").mkdir()
            nodes.append(start_with_registry(advertise=node == 0, data_dir=str(tmp_path / f"b{node}"), extra_args=["--broker-id", str(node), *common]))
        ids = {}
        for i, (_b, url) in enumerate(nodes):  # through each broker: two of them forward
            schema = json.dumps({"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "int"}]})
            ids[f"s{i}-value"] = SchemaRegistryClient({"url": url}).register_schema(f"s{i}-value", Schema(schema, "AVRO"))
        assert len(set(ids.values())) == 3
        for _b, url in nodes:  # every broker reads every write at once
            assert sorted(requests.get(url + "/subjects", timeout=10).json()) == sorted(ids)
        admin = AdminClient({"bootstrap.servers": nodes[0][0].bootstrap})
        owner = admin.list_topics("_schemas", timeout=10).topics["_schemas"].partitions[0].leader
        victim = next(n for n in nodes if n[0].extra_args[1] == str(owner))
        victim[0].stop(signal.SIGKILL)
        survivors = [n for n in nodes if n is not victim]
        schema = json.dumps({"type": "record", "name": "After", "fields": [{"name": "g", "type": "string"}]})
        new_id = wait_until(lambda: SchemaRegistryClient({"url": survivors[0][1]}).register_schema("after-value", Schema(schema, "AVRO")),
                            30, "a registration after the writer's kill -9")
        assert new_id > max(ids.values())
        for _b, url in survivors:
            client = SchemaRegistryClient({"url": url})
            for subject, sid in ids.items():
                assert client.get_latest_version(subject).schema_id == sid
            assert client.get_latest_version("after-value").schema_id == new_id
    finally:
        for b, _url in nodes:
            b.stop()


def test_tls_and_basic_auth(tmp_path):
    from kafscale.security import certs

    paths = certs.write_self_signed(str(tmp_path))
    port = free_port()
    b = BrokerProcess(extra_args=["--schema-registry", f"127.0.0.1:{port}", "--schema-registry-tls", "true",
                                  "--ssl-cert", paths["cert"], "--ssl-key", paths["key"]],
                      env={"KAFSCALE_SCHEMA_REGISTRY_BASIC_AUTH": "app:s3cret"}).start()
    try:
        wait_port(port, proc=b.proc)
        url = f"https://localhost:{port}"
        good = SchemaRegistryClient({"url": url, "ssl.ca.location": paths["ca"], "basic.auth.user.info": "app:s3cret"})
        assert good.register_schema("secure-value", Schema(USER_V1, "AVRO")) >= 1
        for conf in ({"basic.auth.user.info": "app:wrong"}, {}):
            with pytest.raises(SchemaRegistryError) as e:
                SchemaRegistryClient({"url": url, "ssl.ca.location": paths["ca"], **conf}).get_subjects()
            assert e.value.http_status_code == 401
        with pytest.raises(Exception):  # noqa: B017 - plain HTTP on the TLS port: no answer
            requests.get(f"http://localhost:{port}/subjects", timeout=5).json()
    finally:
        b.stop()


def _produce_errors(bootstrap: str, topic: str, items, **conf) -> list:
    """The delivery errors (None: delivered) of each (key, value), produced one by one."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0, **conf})
    out = []
    for key, value in items:
        got = []
        p.produce(topic, key=key, value=value, on_delivery=lambda err, _m: got.append(err))
        p.flush(15)
        assert got, "no delivery report"
        out.append(got[0])
    return out


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_produce_validation(registry, topic_name, compression):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    b, url = registry
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, config={"confluent.value.schema.validation": "true"})])[topic_name].result(15)
    plain = f"{topic_name}-plain"
    admin.create_topics([NewTopic(plain, 1)])[plain].result(15)
    client = SchemaRegistryClient({"url": url})
    serializer = AvroSerializer(client, USER_V1)
    good = serializer({"name": "ada", "favorite_number": 7}, SerializationContext(topic_name, MessageField.VALUE))
    other_id = client.register_schema(f"{topic_name}-other", Schema(USER_V2, "AVRO"))  # registered, but not for this topic
    unregistered = b"\x00" + other_id.to_bytes(4, "big") + good[5:]
    errors = _produce_errors(b.bootstrap, topic_name, [(None, good), (b"k", b"plain text"), (None, unregistered), (b"k", None), (None, b"\x00\x00")],
                             **{"compression.type": compression})
    codes = [e.code() if e is not None else None for e in errors]
    assert codes == [None, KafkaError.INVALID_RECORD, KafkaError.INVALID_RECORD, None, KafkaError.INVALID_RECORD]
    # A topic without the config takes anything.
    assert _produce_errors(b.bootstrap, plain, [(None, b"plain text")]) == [None]
    # Only the valid record and the tombstone are in the log.
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": topic_name, "auto.offset.reset": "earliest"})
    c.subscribe([topic_name])
    values = []
    try:
        while len(values) < 2:
            m = c.poll(10)
            assert m is not None and m.error() is None
            values.append(m.value())
    finally:
        c.close()
    assert values == [good, None]


def test_key_validation_and_config_checks(registry, topic_name):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    b, url = registry
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    bad = admin.create_topics([NewTopic(f"{topic_name}-bad", 1, config={"confluent.key.schema.validation": "maybe"})])[f"{topic_name}-bad"]
    with pytest.raises(Exception) as e:
        bad.result(15)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
    admin.create_topics([NewTopic(topic_name, 1)])[topic_name].result(15)
    assert _produce_errors(b.bootstrap, topic_name, [(b"raw-key", b"v")]) == [None]
    entry = ConfigEntry("confluent.key.schema.validation", "true", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name, incremental_configs=[entry])
    admin.incremental_alter_configs([res])[res].result(15)
    key_id = SchemaRegistryClient({"url": url}).register_schema(f"{topic_name}-key", Schema('"string"', "AVRO"))
    key = b"\x00" + key_id.to_bytes(4, "big") + b"\x06abc"
    wait_until(lambda: _produce_errors(b.bootstrap, topic_name, [(b"raw-key", b"v")])[0] is not None, 10, "the altered config to apply")
    assert _produce_errors(b.bootstrap, topic_name, [(key, b"any value"), (None, b"v")]) == [None, None]


def test_acls_map_subjects_to_their_topics(tmp_path):
    """With --authorizer acls: basic auth against the broker's users, WRITE on a subject's
    topic to register, DESCRIBE to read; lists show only what the user may DESCRIBE."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    reg = free_port()
    b = AclBroker(("admin", "alice", "bob"), "User:admin", ["--acl-refresh-ms", "200", "--schema-registry", f"127.0.0.1:{reg}"], data_dir=str(tmp_path)).start()
    try:
        wait_port(reg, proc=b.proc)
        admin = AdminClient(b.sasl_conf("admin"))
        acls = [AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW),
                AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW)]
        for fut in admin.create_acls(acls).values():
            fut.result(10)
        url = f"http://127.0.0.1:{reg}"

        def client(user: str, password: str | None = None) -> SchemaRegistryClient:
            return SchemaRegistryClient({"url": url, "basic.auth.user.info": f"{user}:{password or user + '-secret'}"})

        sid = wait_until(lambda: client("alice").register_schema("orders-value", Schema(USER_V1, "AVRO")), 10, "alice's WRITE on orders")
        with pytest.raises(SchemaRegistryError) as e:
            client("bob").register_schema("orders-value", Schema(USER_V2, "AVRO"))
        assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
        assert client("bob").get_schema(sid).schema_str  # READ implies DESCRIBE: the deserializer's lookup
        assert client("bob").get_latest_version("orders-value").schema_id == sid
        client("admin").register_schema("secret-value", Schema(USER_V1, "AVRO"))
        assert client("bob").get_subjects() == ["orders-value"]
        assert sorted(client("admin").get_subjects()) == ["orders-value", "secret-value"]
        for who in (client("bob"), client("alice")):
            with pytest.raises(SchemaRegistryError) as e:
                who.get_latest_version("secret-value")
            assert e.value.http_status_code == 403
            with pytest.raises(SchemaRegistryError) as e:
                who.set_compatibility(level="NONE")  # global config: ALTER_CONFIGS on the cluster
            assert e.value.http_status_code == 403
        with pytest.raises(SchemaRegistryError) as e:
            client("alice", "wrong").get_subjects()
        assert e.value.http_status_code == 401
    finally:
        b.stop()


def test_schemas_cli(registry, topic_name, tmp_path):
    import subprocess
    import sys

    from tests.support.broker import REPO

    _b, url = registry
    subject = f"{topic_name}-value"
    v1, v2, bad = tmp_path / "v1.avsc", tmp_path / "v2.avsc", tmp_path / "bad.avsc"
    v1.write_text(USER_V1)
    v2.write_text(USER_V2)
    bad.write_text(USER_BAD)

    def cli(*args: str, registry_url: str = url) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kafscale", "schemas", *args, "--registry", registry_url],
                              capture_output=True, text=True, timeout=60, cwd=REPO)

    r = cli("register", subject, str(v1), "--json")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert first["version"] == 1 and first["id"] >= 1
    assert cli("register", subject, str(v2)).returncode == 0
    r = cli("compat", subject, str(bad))
    assert r.returncode == 1 and r.stdout.startswith("incompatible") and "READER_FIELD_MISSING_DEFAULT_VALUE" in r.stdout
    assert cli("compat", subject, str(v2)).stdout.strip() == "compatible"
    r = cli("register", subject, str(bad))
    assert r.returncode == 1 and "error_code 409" in r.stderr
    listed = {row["subject"]: row for row in json.loads(cli("list", "--prefix", topic_name, "--json").stdout)}
    assert listed[subject]["latest_version"] == 2
    r = cli("get", subject, "--version", "1", "--json")
    assert json.loads(r.stdout)["id"] == first["id"] and json.loads(r.stdout)["versions"] == [1, 2]
    r = cli("get", "--id", str(first["id"]))
    assert r.returncode == 0 and '"favorite_number"' in r.stdout
    assert cli("config", subject, "--set", "full").stdout.strip() == f"{subject}: FULL"
    assert cli("delete", subject, "--version", "2").stdout.strip() == f"soft-deleted {subject} versions 2"
    assert cli("delete", subject).returncode == 0
    assert cli("delete", subject, "--permanent").stdout.strip() == f"hard-deleted {subject} versions 1, 2"
    r = cli("get", subject)
    assert r.returncode == 1 and "error_code 40401" in r.stderr
    assert cli("list", registry_url=f"http://127.0.0.1:{free_port()}").returncode == 2


def test_references_and_import_mode(registry, topic_name):
    _b, url = registry

    def call(method: str, path: str, body=None):
        r = requests.request(method, url + path, headers=CT, data=None if body is None else json.dumps(body), timeout=10)
        return r.status_code, r.json()

    address = json.dumps({"type": "record", "name": "Address", "namespace": "ex", "fields": [{"name": "city", "type": "string"}]})
    person = json.dumps({"type": "record", "name": "Person", "namespace": "ex", "fields": [{"name": "home", "type": "ex.Address"}]})
    a_subject, p_subject = f"{topic_name}-address", f"{topic_name}-person"
    status, a = call("POST", f"/subjects/{a_subject}/versions", {"schema": address})
    assert status == 200
    assert call("POST", f"/subjects/{p_subject}/versions", {"schema": person})[1]["error_code"] == 42201  # unknown type without the reference
    ref = [{"name": "ex.Address", "subject": a_subject, "version": 1}]
    status, p = call("POST", f"/subjects/{p_subject}/versions", {"schema": person, "references": ref})
    assert status == 200
    assert call("GET", f"/subjects/{p_subject}/versions/1")[1]["references"] == ref
    assert call("GET", f"/schemas/ids/{p['id']}")[1]["references"] == ref
    assert call("GET", f"/subjects/{a_subject}/versions/1/referencedby")[1] == [p["id"]]
    assert call("DELETE", f"/subjects/{a_subject}")[1]["error_code"] == 42206
    # IMPORT mode: a subject takes explicit ids and versions (a migration from another registry).
    imported = f"{topic_name}-imported"
    assert call("PUT", f"/mode/{imported}", {"mode": "IMPORT"}) == (200, {"mode": "IMPORT"})
    status, body = call("POST", f"/subjects/{imported}/versions", {"schema": USER_V1, "id": 90_000, "version": 5})
    assert (status, body) == (200, {"id": 90_000})
    assert call("GET", f"/subjects/{imported}/versions/5")[1]["id"] == 90_000
    assert call("PUT", f"/mode/{imported}", {"mode": "READONLY"})[0] == 200
    assert call("POST", f"/subjects/{imported}/versions", {"schema": USER_V2})[1]["error_code"] == 42205
    assert call("DELETE", f"/mode/{imported}") == (200, {"mode": "READONLY"})


def test_console_shows_subjects_and_versions(registry, topic_name):
    import html

    from tests.support.console import ConsoleProcess

    b, url = registry
    client = SchemaRegistryClient({"url": url})
    subject = f"{topic_name}-value"
    id1 = client.register_schema(subject, Schema(USER_V1, "AVRO"))
    id2 = client.register_schema(subject, Schema(USER_V2, "AVRO"))
    console = ConsoleProcess(b.bootstrap, ["--schema-registry", url, "--metrics-port-offset", "-1"]).start()
    try:
        page = requests.get(f"{console.url}/schemas", params={"q": topic_name}, timeout=15)
        assert page.status_code == 200
        assert 'href="/schemas"' in page.text and f'href="/schemas/{subject}"' in page.text
        assert f"<td class=\"n\">2</td><td class=\"n\">{id2}</td>" in page.text
        first = requests.get(f"{console.url}/schemas/{subject}", params={"version": "1"}, timeout=15)
        assert first.status_code == 200
        text = html.unescape(first.text)
        assert f"<td>{id1}</td>" in text and '"favorite_number"' in text and '"email"' not in text
        assert 'id="compatibility">BACKWARD<' in text
        missing = requests.get(f"{console.url}/schemas/{topic_name}-nothing", timeout=15)
        assert missing.status_code == 404 and "40401" in missing.text
    finally:
        console.stop()
