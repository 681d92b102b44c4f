"""DescribeClientQuotas answers each entity's components and values in Apache Kafka's order
(#31): client-id before user, values in the iteration order of the java.util.HashMaps Kafka's
metadata image keeps them in (metadata/quotas.py `kafka_order`). Clients such as
@platformatic/kafka compare the answer exactly. Raw frames over TCP to a real broker; the
HashMap model is checked against the JVM's own HashMap."""

from __future__ import annotations

import random
import shutil
import string
import subprocess

import pytest

from kafscale.metadata import quotas
from tests.support.broker import BrokerProcess
from tests.support.raw import RawClient, req

PRODUCER, CONSUMER, REQUEST, MUTATION = "producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"

# entity -> the quotas set in one AlterClientQuotas, in an order unlike Kafka's answer
SET = [
    ({"user": "alice"}, {PRODUCER: 1048576, REQUEST: 12.5, CONSUMER: 2097152}),
    ({"client-id": "app"}, {REQUEST: 50, MUTATION: 2.5, CONSUMER: 4096, PRODUCER: 8192}),
    ({"user": "alice", "client-id": "app"}, {PRODUCER: 1024, CONSUMER: 2048}),
    ({"user": None, "client-id": None}, {PRODUCER: 1000, CONSUMER: 1000}),  # the defaults of both
    ({"user": None}, {REQUEST: 200, MUTATION: 10}),
    ({"client-id": None}, {PRODUCER: 512, REQUEST: 25}),
    ({"ip": "10.0.0.1"}, {"connection_creation_rate": 5}),
    ({"ip": None}, {"connection_creation_rate": 100}),
]

# What Apache Kafka answers for those entities (entity components, then values). Three
# quotas come as Kafka was observed to answer them (consumer, request, producer); the others
# follow from the same HashMaps: with all four keys the map has grown to 8 buckets; with
# two, producer_byte_rate and request_percentage share a bucket of 4 and keep the order in
# which the delta's own 16-bucket map hands them over (request first).
KAFKA_ANSWER = [
    ([("user", "alice")], [(CONSUMER, 2097152.0), (REQUEST, 12.5), (PRODUCER, 1048576.0)]),
    ([("client-id", "app")], [(PRODUCER, 8192.0), (CONSUMER, 4096.0), (MUTATION, 2.5), (REQUEST, 50.0)]),
    ([("client-id", "app"), ("user", "alice")], [(CONSUMER, 2048.0), (PRODUCER, 1024.0)]),
    ([("client-id", None), ("user", None)], [(CONSUMER, 1000.0), (PRODUCER, 1000.0)]),
    ([("user", None)], [(MUTATION, 10.0), (REQUEST, 200.0)]),
    ([("client-id", None)], [(REQUEST, 25.0), (PRODUCER, 512.0)]),
    ([("ip", "10.0.0.1")], [("connection_creation_rate", 5.0)]),
    ([("ip", None)], [("connection_creation_rate", 100.0)]),
]


@pytest.fixture(scope="module")
def quota_broker():
    """A broker of its own: quotas are cluster-wide and the defaults set here throttle."""
    b = BrokerProcess().start()
    with RawClient(b.bootstrap) as c:
        for entity, ops in SET:
            e = tuple(req(49, 1, "EntityData", entity_type=k, entity_name=n) for k, n in entity.items())
            o = tuple(req(49, 1, "OpData", key=k, value=float(v), remove=False) for k, v in ops.items())
            [r] = c.request(49, 1, req(49, 1, entries=(req(49, 1, "EntryData", entity=e, ops=o),), validate_only=False)).entries
            assert r.error_code == 0, (entity, r.error_message)
    yield b
    b.stop()


def describe(bootstrap: str, v: int, components=(), strict: bool = False):
    comps = tuple(req(48, v, "ComponentData", entity_type=t, match_type=m, match=s) for t, m, s in components)
    with RawClient(bootstrap) as c:
        return c.request(48, v, req(48, v, components=comps, strict=strict))


def answer(resp) -> list:
    """The entries as sent: components and values in wire order. Kafka's order of whole entries
    depends on its image's history, so entries are compared sorted."""
    return sorted((([(x.entity_type, x.entity_name) for x in e.entity], [(x.key, x.value) for x in e.values]) for e in resp.entries), key=repr)


def by_entity(entries, *wanted) -> list:
    return sorted((e for e in entries if sorted(e[0], key=repr) in [sorted(w, key=repr) for w in wanted]), key=repr)


@pytest.mark.parametrize("v", [0, 1])
def test_full_answer_in_kafkas_order(quota_broker, v):
    resp = describe(quota_broker.bootstrap, v)
    assert (resp.error_code, resp.error_message) == (0, None)
    assert answer(resp) == sorted(KAFKA_ANSWER, key=repr)


def test_filtered_answers_keep_kafkas_order(quota_broker):
    b = quota_broker.bootstrap
    alice = [("user", "alice")]
    both = [("client-id", "app"), ("user", "alice")]
    assert answer(describe(b, 1, [("user", 0, "alice")])) == by_entity(KAFKA_ANSWER, alice, both)
    assert answer(describe(b, 1, [("user", 1, None), ("client-id", 1, None)], strict=True)) == by_entity(KAFKA_ANSWER, [("client-id", None), ("user", None)])
    assert answer(describe(b, 1, [("ip", 2, None)])) == by_entity(KAFKA_ANSWER, [("ip", "10.0.0.1")], [("ip", None)])


def test_java_string_hash():
    # Values of Java's String.hashCode, including a character outside the BMP (two UTF-16 units).
    assert [quotas.java_string_hash(s) for s in ("", "user", "hello", "\U0001F600")] == [0, 3599307, 99162322, 31 * 0xD83D + 0xDE00]
    assert quotas.java_string_hash("polygenelubricants") == (-2147483648) & 0xFFFFFFFF


@pytest.mark.skipif(shutil.which("java") is None, reason="no JVM (the pipeline tests need one too)")
def test_hashmap_order_is_the_jvms(tmp_path):
    """java_hashmap_order against java.util.HashMap itself: random key sets, insertion
    orders and initial capacities, the quota keys and entity types among them."""
    rng = random.Random(31)
    pool = [PRODUCER, CONSUMER, REQUEST, MUTATION, "connection_creation_rate", "user", "client-id", "ip"]
    cases = []
    for _ in range(300):
        keys = rng.sample(pool, rng.randint(1, len(pool)))
        keys += ["".join(rng.choices(string.ascii_letters + "é_-", k=rng.randint(1, 12))) for _ in range(rng.choice([0, 0, 3, 20]))]
        cases.append((rng.choice([None, 0, 1, 2, 3, 5, 16]), keys))
    program = tmp_path / "HashOrder.java"
    program.write_text(
        "import java.io.*; import java.util.*;\n"
        "public class HashOrder { public static void main(String[] a) throws IOException {\n"
        "  BufferedReader in = new BufferedReader(new InputStreamReader(System.in, \"UTF-8\"));\n"
        "  PrintStream out = new PrintStream(System.out, true, \"UTF-8\");\n"
        "  for (String line; (line = in.readLine()) != null; ) {\n"
        "    String[] p = line.split(\"\\t\");\n"
        "    Map<String, Integer> m = p[0].equals(\"-\") ? new HashMap<>() : new HashMap<>(Integer.parseInt(p[0]));\n"
        "    for (int i = 1; i < p.length; i++) m.put(p[i], i);\n"
        "    out.println(String.join(\"\\t\", m.keySet()));\n"
        "  } } }\n", encoding="utf-8")
    stdin = "".join(("-" if cap is None else str(cap)) + "\t" + "\t".join(keys) + "\n" for cap, keys in cases)
    proc = subprocess.run(["java", str(program)], input=stdin.encode(), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    jvm = proc.stdout.decode("utf-8").splitlines()
    assert len(jvm) == len(cases)
    for (cap, keys), line in zip(cases, jvm):
        assert quotas.java_hashmap_order(keys, cap) == line.split("\t"), (cap, keys)
