"""One error model: Kafka error codes come from `kafscale.errors` and travel in KafkaError.

The source scan reads src/ as Python syntax trees (no regular expressions over text, so
strings, comments and offsets or sizes that happen to be small integers are not matched)
and reports every place an integer literal stands for a Kafka error code:

- an import of kio's error enum anywhere but errors.py (the codes have one home);
- an integer assigned to a name that is a Kafka error's name (`NOT_LEADER_OR_FOLLOWER = 6`,
  `NONE, OFFSET_OUT_OF_RANGE = 0, 1`), to a `*_ERROR` name, or to an `error_code` / `error`
  name, attribute or string subscript (`r.error = 0`, `out["error_code"] = 1`, a dataclass
  field `error_code: int = 0`);
- `error_code=<int>` as a keyword argument, `"error_code": <int>` in a dict display;
- a comparison of an `error_code` / `error` / `code` name or attribute with an integer or
  with a tuple, list or set holding one (`e.error_code == 6`, `code not in (3, 6)`);
- a conditional choosing between an `error_code` and an integer (`x.error_code if ok else 0`);
  where an integer counts above, so does a conditional with an integer branch
  (`p.error = FENCED if older else 76`);
- an integer passed to KafkaError or to a class of src/ derived from it
  (`InvalidRecordError("too big", 10)`), found by following class bases by name.

A dict display counts only when not all of its values are integers: a table keyed by type
name (the wire widths in protocol/validate.py, `"error_code": 2`) holds no error code.
"""

from __future__ import annotations

import ast
import pathlib
import pickle

import datetime

import pytest

from kafscale.errors import ErrorCode, KafkaError, retriable
from kafscale.protocol.error_response import RequestError, error_code_for
from kafscale.protocol.records import InvalidRecordError
from kafscale.storage.failures import StorageError
from tests.support.raw import RawClient, error_code, req
from tests.support.wait import wait_until

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "kafscale"
ERRORS_MODULE = SRC / "errors.py"
CODE_NAMES = frozenset(name.upper() for name in ErrorCode.__members__)
CODE_HOLDERS = frozenset({"error_code", "error"})  # names and attributes that hold a code
COMPARED_HOLDERS = CODE_HOLDERS | {"code"}


def _int_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _bare(node: ast.AST) -> bool:
    """An integer literal, or a conditional with one as a branch (`A if ok else 76`)."""
    if isinstance(node, ast.IfExp):
        return _bare(node.body) or _bare(node.orelse)
    return _int_literal(node)


def _holds_int(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_int_literal(e) for e in node.elts)
    return _int_literal(node)


def _name_of(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value  # out["error_code"] = ...
    return None


def _assigned(target: ast.AST, value: ast.AST):
    """(target name, value) pairs of an assignment, tuples unpacked element by element."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _assigned(t, v)
    elif (name := _name_of(target)) is not None:
        yield name, value


def _is_code_name(name: str) -> bool:
    return name in CODE_NAMES or name.endswith("_ERROR") or name in CODE_HOLDERS


def kafka_error_classes(trees) -> frozenset[str]:
    """Names of KafkaError and of every class in `trees` derived from it (by base name)."""
    bases: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(n for b in node.bases if (n := _name_of(b)))
    found = {"KafkaError"}
    while grown := {name for name, of in bases.items() if name not in found and of & found}:
        found |= grown
    return frozenset(found)


def bare_error_codes(tree: ast.AST, error_classes: frozenset[str] = frozenset({"KafkaError"})) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "kio.schema.errors":
            found.append((node.lineno, "imports kio.schema.errors (use kafscale.errors)"))
        elif isinstance(node, ast.Import) and any(a.name == "kio.schema.errors" for a in node.names):
            found.append((node.lineno, "imports kio.schema.errors (use kafscale.errors)"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name, value in _assigned(target, node.value):
                    if _is_code_name(name) and _bare(value):
                        found.append((node.lineno, f"{name} = <int>"))
        elif isinstance(node, ast.keyword) and node.arg == "error_code" and _bare(node.value):
            found.append((node.value.lineno, "error_code=<int>"))
        elif isinstance(node, ast.Dict) and not all(_int_literal(v) for v in node.values):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "error_code" and _bare(value):
                    found.append((value.lineno, '"error_code": <int>'))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_name_of(o) in COMPARED_HOLDERS for o in operands) and any(_holds_int(o) for o in operands):
                found.append((node.lineno, "compares an error code with <int>"))
        elif isinstance(node, ast.IfExp):
            branches = (node.body, node.orelse)
            if any(_name_of(b) in CODE_HOLDERS for b in branches) and any(_int_literal(b) for b in branches):
                found.append((node.lineno, "error code or <int>"))
        elif isinstance(node, ast.Call) and _name_of(node.func) in error_classes:
            if any(_int_literal(a) for a in node.args) or any(_int_literal(k.value) for k in node.keywords):
                found.append((node.lineno, f"{_name_of(node.func)}(..., <int>)"))
    return sorted(found)


def test_no_bare_error_code_integers_in_src():
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(SRC.rglob("*.py"))}
    error_classes = kafka_error_classes(trees.values())
    assert {"StorageError", "InvalidRecordError", "RequestError", "TopicError"} <= error_classes
    offenders = []
    for path, tree in trees.items():
        if path == ERRORS_MODULE:
            continue
        for line, what in bare_error_codes(tree, error_classes):
            offenders.append(f"{path.relative_to(SRC.parent)}:{line}: {what}")
    assert offenders == [], "Kafka error codes written as integers (name them via kafscale.errors.ErrorCode):\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "snippet",
    [
        "NOT_LEADER_OR_FOLLOWER = 6",
        "NONE, OFFSET_OUT_OF_RANGE = 0, 1",
        "KAFKA_STORAGE_ERROR: int = 56",
        "MY_OWN_ERROR = -1",
        "class P:\n    error_code: int = 0",
        "r.error = 3",
        "p.error = ErrorCode.fenced_leader_epoch if older else 76",
        "out['error_code'] = 1",
        "make(cls, error_code=ErrorCode.none if ok else 3)",
        "make(cls, error_code=0)",
        "out = {'partition_index': p.index, 'error_code': 1}",
        "if e.error_code == 6: pass",
        "if code not in (UNKNOWN_TOPIC_OR_PARTITION, 6): pass",
        "x = p.error_code if ok else 0",
        "raise KafkaError(6, 'moved')",
        "raise records.InvalidRecordError('too big', 10)",
        "raise StorageError('gone', error_code=1)",
        "from kio.schema.errors import ErrorCode",
        "import kio.schema.errors",
    ],
)
def test_scan_catches(snippet):
    error_classes = kafka_error_classes([ast.parse("class StorageError(KafkaError): pass\nclass InvalidRecordError(KafkaError, ValueError): pass")])
    assert bare_error_codes(ast.parse(snippet), error_classes), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "PRODUCE = 0",  # an API key
        "HEADER_SIZE = 61",
        "LATEST, EARLIEST = -1, -2",  # ListOffsets timestamps
        "NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower",
        "make(cls, error_code=ErrorCode.none, throttle_time=0, partition_index=3)",
        "if p.offset == -1: pass",
        "out['offset'] = -1",
        "p.error = ErrorCode.fenced_leader_epoch if older else ErrorCode.unknown_leader_epoch",
        "raise ValueError(f'bad offset {offset}')",
        "raise CorruptSegmentError(key, 'truncated', byte=0)",  # not a KafkaError
        "_FIXED_SIZES = {'int16': 2, 'error_code': 2}",  # wire widths by type name
        "message = 'error_code=6'  # a string, not code",
        "if e.error_code == ErrorCode.not_leader_or_follower: pass",
    ],
)
def test_scan_passes(snippet):
    assert bare_error_codes(ast.parse(snippet)) == [], snippet


def test_retriable_flags_follow_kafka():
    # Apache Kafka's RetriableException subclasses (client retries, refreshing metadata)
    for code in (
        ErrorCode.not_leader_or_follower,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.kafka_storage_error,
        ErrorCode.request_timed_out,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.corrupt_message,
        ErrorCode.leader_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
    ):
        assert code.retriable and retriable(int(code)), code
    # ... and the fatal ones: the request itself is wrong
    for code in (
        ErrorCode.none,
        ErrorCode.unknown_server_error,
        ErrorCode.offset_out_of_range,
        ErrorCode.message_too_large,
        ErrorCode.invalid_request,
        ErrorCode.invalid_record,
        ErrorCode.out_of_order_sequence_number,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.topic_already_exists,
        ErrorCode.unsupported_version,
    ):
        assert not code.retriable and not retriable(int(code)), code
    assert retriable(32767) is False  # not a Kafka code


def test_codes_are_the_protocol_integers():
    assert (ErrorCode.none, ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error) == (0, 6, 56)
    assert (ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch) == (74, 75)
    assert ErrorCode.unknown_server_error == -1


def test_kafka_error_carries_code_and_message():
    e = KafkaError(ErrorCode.not_leader_or_follower, "t-0 moved to another broker")
    assert e.code is ErrorCode.not_leader_or_follower and e.error_code == 6
    assert str(e) == "t-0 moved to another broker" and e.retriable
    assert KafkaError(56, "store down").code is ErrorCode.kafka_storage_error  # ints are accepted
    assert str(KafkaError(ErrorCode.invalid_request)) == "invalid_request"  # the code's name when no message
    assert repr(e) == "KafkaError(not_leader_or_follower, 't-0 moved to another broker')"
    with pytest.raises(ValueError):
        KafkaError(32767, "no such code")


def test_layer_errors_are_kafka_errors_with_their_codes():
    storage = StorageError("object store unavailable")  # storage's default: KAFKA_STORAGE_ERROR
    assert isinstance(storage, KafkaError) and storage.code is ErrorCode.kafka_storage_error and storage.retriable
    moved = StorageError("moved", ErrorCode.not_leader_or_follower)
    assert (moved.code, str(moved)) == (ErrorCode.not_leader_or_follower, "moved")
    bad = InvalidRecordError("record batch CRC32C mismatch", ErrorCode.corrupt_message)
    assert isinstance(bad, KafkaError) and isinstance(bad, ValueError) and bad.error_code == ErrorCode.corrupt_message
    refused = RequestError(ErrorCode.invalid_request, "no topics")
    assert isinstance(refused, KafkaError) and (refused.code, str(refused)) == (ErrorCode.invalid_request, "no topics")
    # what the server answers when a handler lets one escape
    assert [error_code_for(x) for x in (storage, moved, bad, refused)] == [56, 6, 2, 42]
    assert error_code_for(RuntimeError("bug")) == ErrorCode.unknown_server_error


def test_kafka_error_survives_pickling():
    # Errors cross process boundaries (the pipeline's workers); the code must come along.
    for e in (KafkaError(ErrorCode.request_timed_out, "slow"), StorageError("moved", ErrorCode.not_leader_or_follower)):
        back = pickle.loads(pickle.dumps(e))
        assert (type(back), back.code, str(back)) == (type(e), e.code, str(e))


LIST_OFFSETS, FETCH, OFFSET_FOR_LEADER_EPOCH = 2, 1, 23
LATEST = -1


def test_a_leader_epoch_newer_than_the_brokers_is_unknown_leader_epoch(broker, topic_name):
    """A client ahead of the broker's leader epoch gets UNKNOWN_LEADER_EPOCH (75) from
    ListOffsets, Fetch and OffsetForLeaderEpoch, and one behind it FENCED_LEADER_EPOCH
    (74). (ListOffsets and Fetch answered 76, UNSUPPORTED_COMPRESSION_TYPE, while the
    codes were integers written by hand.)"""
    with RawClient(broker.bootstrap) as c:
        def leader_epoch():
            part = c.metadata([topic_name]).topics[0].partitions
            return part and part[0].leader_id >= 0 and part[0].leader_epoch + 1  # +1: epoch 0 is a value

        epoch = wait_until(leader_epoch, 20, f"a leader for {topic_name}") - 1
        assert error_code(c.list_offsets(topic_name, 0, LATEST).error_code) == ErrorCode.none

        def list_offsets(current):
            p = req(LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=current, timestamp=LATEST)
            t = req(LIST_OFFSETS, 7, "ListOffsetsTopic", name=topic_name, partitions=(p,))
            body = req(LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=(t,))
            return error_code(c.request(LIST_OFFSETS, 7, body).topics[0].partitions[0].error_code)

        def fetch(current):
            fp = req(FETCH, 12, "FetchPartition", partition=0, current_leader_epoch=current, fetch_offset=0,
                     last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
            ft = req(FETCH, 12, "FetchTopic", topic=topic_name, partitions=(fp,))
            body = req(FETCH, 12, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
                       isolation_level=0, session_id=0, session_epoch=-1, topics=(ft,), forgotten_topics_data=(), rack_id="")
            return error_code(c.request(FETCH, 12, body).responses[0].partitions[0].error_code)

        def offset_for_leader_epoch(current):
            p = req(OFFSET_FOR_LEADER_EPOCH, 4, "OffsetForLeaderPartition", partition=0, current_leader_epoch=current, leader_epoch=0)
            t = req(OFFSET_FOR_LEADER_EPOCH, 4, "OffsetForLeaderTopic", topic=topic_name, partitions=(p,))
            body = req(OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=(t,))
            return error_code(c.request(OFFSET_FOR_LEADER_EPOCH, 4, body).topics[0].partitions[0].error_code)

        for ask in (list_offsets, fetch, offset_for_leader_epoch):
            assert ask(epoch) == ErrorCode.none, ask.__name__
            assert ask(epoch + 1) == ErrorCode.unknown_leader_epoch == 75, ask.__name__
            if epoch > 0:
                assert ask(epoch - 1) == ErrorCode.fenced_leader_epoch == 74, ask.__name__
