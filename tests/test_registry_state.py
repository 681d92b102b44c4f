"""The schema registry's pure parts: the state machine (registry/state.py) driven through
its records as the `_schemas` log would replay them, the record codec (Confluent's key
and value JSON), and Avro compatibility in every mode."""

from __future__ import annotations

import json

import pytest

from kafscale.registry import codec
from kafscale.registry.state import RegistryError, RegistryState


def rec(name: str, *fields: tuple[str, object]) -> str:
    return json.dumps({"type": "record", "name": name, "fields": [{"name": n, "type": t} | ({} if d is None else {"default": d}) for n, t, d in fields]})


V1 = rec("User", ("name", "string", None))
V2_DEFAULT = rec("User", ("name", "string", None), ("age", "int", 0))  # adds a field with a default
V2_NO_DEFAULT = rec("User", ("name", "string", None), ("age", "int", None))
V3_DROPPED = rec("User", ("age", "int", 0))


def replay(state: RegistryState, records) -> None:
    """Round-trip every record through the codec, as the log would."""
    for r in records:
        k, v = codec.encode(r)
        state.apply(codec.decode(k, v))


def register(state: RegistryState, subject: str, text: str, refs=(), next_id=None) -> tuple[int, int]:
    plan = state.plan_register(subject, "AVRO", text, tuple(refs))
    if plan.existing is not None:
        return plan.existing.id, plan.existing.version
    sid = plan.id if plan.id is not None else (next_id or state.max_id + 1)
    replay(state, state.register_records(plan, sid))
    return sid, plan.version


def test_register_versions_ids_and_idempotence():
    st = RegistryState()
    assert register(st, "users-value", V1) == (1, 1)
    assert register(st, "users-value", json.dumps(json.loads(V1), indent=4)) == (1, 1)  # whitespace: same schema
    assert register(st, "users-value", V2_DEFAULT) == (2, 2)
    assert register(st, "other-value", V1) == (1, 1)  # same schema in another subject: same global id
    assert st.subjects() == ["other-value", "users-value"]
    assert st.version_numbers("users-value") == [1, 2]
    assert st.get_version("users-value", "latest").id == 2
    assert [(v.subject, v.version) for v in st.id_uses(1)] == [("other-value", 1), ("users-value", 1)]


def test_backward_default_refuses_field_without_default():
    st = RegistryState()
    register(st, "s", V1)
    with pytest.raises(RegistryError) as e:
        register(st, "s", V2_NO_DEFAULT)
    assert (e.value.status, e.value.error_code) == (409, 409)
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in e.value.message


@pytest.mark.parametrize(
    "level, second, third, ok",
    [
        ("BACKWARD", V2_DEFAULT, V3_DROPPED, True),  # drop a field: new reader ignores it
        ("FORWARD", V2_DEFAULT, V3_DROPPED, False),  # old reader needs 'name', which has no default
        ("FULL", V2_DEFAULT, V3_DROPPED, False),  # the old reader needs name
        ("NONE", V2_NO_DEFAULT, rec("User", ("x", "boolean", None)), True),
    ],
)
def test_levels(level, second, third, ok):
    st = RegistryState()
    replay(st, st.set_config("s", level)[0])
    register(st, "s", V1)
    register(st, "s", second)
    if ok:
        register(st, "s", third)
    else:
        with pytest.raises(RegistryError) as e:
            register(st, "s", third)
        assert e.value.error_code == 409


def test_transitive_checks_every_live_version():
    a = rec("R", ("f", "int", None))
    b = rec("R", ("f", "int", None), ("g", "string", "x"))
    c = rec("R", ("g", "string", None))  # reads b (has g) but not a (no g, and no default)
    st = RegistryState()
    register(st, "plain", a)
    register(st, "plain", b)
    register(st, "plain", c)  # BACKWARD: only against b
    st2 = RegistryState()
    replay(st2, st2.set_config("t", "backward_transitive")[0])
    register(st2, "t", a)
    register(st2, "t", b)
    with pytest.raises(RegistryError) as e:
        register(st2, "t", c)
    assert e.value.error_code == 409 and "version 1" in e.value.message


def test_soft_then_hard_delete_and_version_numbers():
    st = RegistryState()
    register(st, "s", V1)
    register(st, "s", V2_DEFAULT)
    with pytest.raises(RegistryError) as e:
        st.delete_subject("s", permanent=True)
    assert e.value.error_code == 40405
    records, versions = st.delete_subject("s", permanent=False)
    assert versions == [1, 2]
    replay(st, records)
    assert st.subjects() == [] and st.subjects(deleted=True) == ["s"]
    with pytest.raises(RegistryError) as e:
        st.get_version("s", 1)
    assert e.value.error_code == 40402
    assert st.get_version("s", 1, deleted=True).deleted
    with pytest.raises(RegistryError) as e:
        st.delete_subject("s", permanent=False)
    assert e.value.error_code == 40404
    assert st.by_id(1).schema == json.dumps(json.loads(V1), separators=(",", ":"))  # ids outlive soft deletes
    records, versions = st.delete_subject("s", permanent=True)
    replay(st, records)
    assert versions == [1, 2] and st.subjects(deleted=True) == []
    with pytest.raises(RegistryError) as e:
        st.by_id(1)
    assert e.value.error_code == 40403
    # A new registration after a hard delete starts at version 1 and is live, also when
    # the whole log (with the old DELETE_SUBJECT record's tombstone) is replayed.
    assert register(st, "s", V1, next_id=3) == (3, 1)
    assert st.get_version("s", "latest").version == 1


def test_version_delete_codes():
    st = RegistryState()
    register(st, "s", V1)
    register(st, "s", V2_DEFAULT)
    with pytest.raises(RegistryError) as e:
        st.delete_version("s", 1, permanent=True)
    assert e.value.error_code == 40407
    records, n = st.delete_version("s", "latest", permanent=False)
    replay(st, records)
    assert n == 2 and st.version_numbers("s") == [1] and st.version_numbers("s", deleted=True) == [1, 2]
    with pytest.raises(RegistryError) as e:
        st.delete_version("s", 2, permanent=False)
    assert e.value.error_code == 40406
    replay(st, st.delete_version("s", 2, permanent=True)[0])
    assert st.version_numbers("s", deleted=True) == [1]
    for bad in ("0", "x", str(2**31)):
        with pytest.raises(RegistryError) as e:
            st.get_version("s", bad)
        assert e.value.error_code == 42202
    with pytest.raises(RegistryError) as e:
        st.get_version("nope", 1)
    assert e.value.error_code == 40401


def test_invalid_schemas_and_references():
    st = RegistryState()
    for bad in ("{not json", json.dumps({"type": "record", "name": "R"}), json.dumps({"type": "nosuch"}), ""):
        with pytest.raises(RegistryError) as e:
            st.plan_register("s", "AVRO", bad, ())
        assert e.value.error_code == 42201
    with pytest.raises(RegistryError) as e:
        st.plan_register("s", "XML", V1, ())
    assert e.value.error_code == 42201
    address = json.dumps({"type": "record", "name": "Address", "namespace": "ex", "fields": [{"name": "city", "type": "string"}]})
    register(st, "address", address)
    person = json.dumps({"type": "record", "name": "Person", "namespace": "ex", "fields": [{"name": "home", "type": "ex.Address"}]})
    with pytest.raises(RegistryError) as e:
        st.plan_register("person", "AVRO", person, ())  # names an unknown type without the reference
    assert e.value.error_code == 42201
    ref = ({"name": "ex.Address", "subject": "address", "version": 1},)
    assert register(st, "person", person, ref) == (2, 1)
    assert st.referenced_by("address", 1) == [2]
    with pytest.raises(RegistryError) as e:
        st.delete_subject("address", permanent=False)
    assert e.value.error_code == 42206


def test_modes_and_configs():
    st = RegistryState()
    register(st, "s", V1)
    replay(st, st.set_mode(None, "readonly")[0])
    with pytest.raises(RegistryError) as e:
        st.plan_register("s", "AVRO", V2_DEFAULT, ())
    assert e.value.error_code == 42205
    replay(st, st.set_mode(None, "READWRITE")[0])
    with pytest.raises(RegistryError) as e:
        st.set_mode(None, "IMPORT")
    assert e.value.error_code == 42205
    with pytest.raises(RegistryError) as e:
        st.set_mode(None, "SOMETIMES")
    assert e.value.error_code == 42204
    with pytest.raises(RegistryError) as e:
        st.set_config(None, "SIDEWAYS")
    assert e.value.error_code == 42203
    assert st.compatibility("s") == "BACKWARD"
    replay(st, st.set_config(None, "FULL")[0])
    assert st.compatibility("s") == "FULL"
    with pytest.raises(RegistryError) as e:
        st.delete_config("s")
    assert e.value.error_code == 40408
    replay(st, st.set_config("s", "NONE")[0])
    assert st.compatibility("s") == "NONE"
    records, previous = st.delete_config("s")
    replay(st, records)
    assert previous == {"compatibilityLevel": "NONE"} and st.compatibility("s") == "FULL"
    # IMPORT mode: explicit ids and versions, no compatibility check
    replay(st, st.set_mode("imported", "IMPORT")[0])
    plan = st.plan_register("imported", "AVRO", V2_NO_DEFAULT, (), schema_id=100, version=7)
    replay(st, st.register_records(plan, plan.id))
    assert st.get_version("imported", 7).id == 100 and st.max_id == 100


def test_codec_matches_confluent_layout():
    key, value = codec.encode((codec.schema_key("s", 1), codec.schema_value("s", 1, 5, "AVRO", '"string"', [], False)))
    assert key == b'{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}'
    assert value == b'{"subject":"s","version":1,"id":5,"schema":"\\"string\\"","deleted":false}'
    assert codec.encode((codec.config_key(None), {"compatibilityLevel": "FULL"})) == (
        b'{"keytype":"CONFIG","subject":null,"magic":0}', b'{"compatibilityLevel":"FULL"}')
    st = RegistryState()
    st.apply(codec.decode(b'{"keytype":"NOOP","magic":0}', None))  # ignored
    for bad in ((b"[1]", None), (b"{", None), (b'{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}', b'{"id":1}')):
        with pytest.raises(codec.BadRecord):
            st.apply(codec.decode(*bad))


def test_schema_ids_of_a_record_set():
    from kafscale.errors import ErrorCode
    from kafscale.protocol import records
    from kafscale.registry.validation import schema_ids

    recs = [(None, b"\x00\x00\x00\x00\x07payload"), (b"\x00\x00\x00\x01\x00k", None), (b"k", b"\x01\x00\x00\x00\x07x"), (None, b"\x00\x00")]
    for codec in (records.COMPRESSION_NONE, records.COMPRESSION_LZ4):
        batch = memoryview(bytearray(records.build_batch(recs, timestamp=0, codec=codec)))
        headers = records.validate_record_set(batch, None)
        before = records.schema_check_decompressions
        assert schema_ids(batch, headers, keys=True, values=True) == [
            (0, "value", 7), (1, "key", 256), (2, "key", None), (2, "value", None), (3, "value", None)]
        assert schema_ids(batch, headers, keys=False, values=True) == [(0, "value", 7), (2, "value", None), (3, "value", None)]
        assert records.schema_check_decompressions - before == (2 if codec else 0)
    # A record whose lengths run past its batch: CORRUPT_MESSAGE, not an exception of ours.
    body = bytes(records.build_batch([(None, b"\x00" * 20)], timestamp=0))[records.HEADER_SIZE:]
    with pytest.raises(records.InvalidRecordError) as e:
        list(records.record_keys_values(body[:-5], 1))
    assert e.value.error_code == ErrorCode.corrupt_message
