"""API keys have one home, `protocol/api_keys.py` `ApiKey`: it matches kio's table, and the
source scan (syntax trees of src/, as tests/test_error_model.py reads them) finds no other
module defining an API key's name as a number, nor an API key written as a bare integer
where one is compared, registered or adapted."""

from __future__ import annotations

import ast
import pathlib

import pytest
from kio.schema.index import api_key_map

from kafscale.protocol.api_keys import ApiKey

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "kafscale"
HOME = SRC / "protocol" / "api_keys.py"
NAMES = frozenset(ApiKey.__members__)
KEY_HOLDERS = frozenset({"api_key", "key"})  # names and attributes holding an API key
KEY_TAKERS = frozenset({"register", "Adapter", "schema", "response", "encode_request"})  # first argument: an API key


def test_enum_is_kios_table():
    assert {k.value: k.name.lower() for k in ApiKey} == dict(api_key_map)


def _int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _holds_int(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_int(e) for e in node.elts)
    return _int(node)


def _name_of(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def bare_api_keys(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename=filename)
    found = []
    for node in tree.body:  # module level only: a class body (acl.Operation) is its own enum
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Name) and t.id in NAMES:
                        found.append(f"{filename}:{node.lineno} defines {t.id}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_name_of(o) in KEY_HOLDERS for o in operands) and any(_holds_int(o) for o in operands):
                found.append(f"{filename}:{node.lineno} compares an API key with a number")
        elif isinstance(node, ast.Call) and node.args and _name_of(node.func) in KEY_TAKERS and _int(node.args[0]):
            found.append(f"{filename}:{node.lineno} {_name_of(node.func)}({node.args[0].value}, ...)")
    return found


def test_src_names_api_keys_through_the_enum():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path != HOME:
            found += bare_api_keys(path.read_text(), str(path.relative_to(SRC)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "PRODUCE = 0",
        "API_VERSIONS, SASL_HANDSHAKE = 18, 17",
        "if api_key == 8:\n    pass",
        "ok = header.api_key in (17, 36)",
        "router.register(19, create_topics)",
        "a = Adapter(27, 0, 1, None)",
    ],
)
def test_scan_sees_bare_keys(source):
    assert bare_api_keys(source, "m.py"), source


def test_scan_leaves_other_numbers_alone():
    source = "class Operation(IntEnum):\n    DESCRIBE_CONFIGS = 8\nif version == 3:\n    x = ApiKey.PRODUCE\nrouter.register(ApiKey.FETCH, fetch)"
    assert bare_api_keys(source, "m.py") == []
