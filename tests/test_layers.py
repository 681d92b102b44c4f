"""Layers point one way: the import graph between the top-level packages of
`src/kafscale` (protocol, broker, storage, metadata, groups, cluster, pipeline, ops, cli,
and top-level modules such as errors.py) has no cycle, and a few rules hold.

Imports are read with `ast`, not by importing, so a lazy import inside a function counts
as much as one at module level. Between packages, imports under `if TYPE_CHECKING:` are
left out: they never run, and a type annotation naming a higher layer does not make the
lower layer depend on it at run time. Between files (modules), every import counts, those
under TYPE_CHECKING too: no two files may need each other, even only to name a type
(`test_no_import_cycle_between_files`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "src" / "kafscale"


def _unit_of(path: Path) -> str:
    """Top-level package (`storage`) or top-level module (`errors`) a file belongs to."""
    rel = path.relative_to(PACKAGE_ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_ROOT).with_suffix("")
    parts = ["kafscale", *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_modules(path: Path, for_files: bool = False) -> list[tuple[str, int]]:
    """(absolute module name, line) of every run-time import in the file. `for_files`: of
    those under `if TYPE_CHECKING:` too, and `from package import name` as `package.name`
    (a module's own package, imported before it anyway, is no dependency of its own)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking_guard(node) and not for_files:
            for child in node.orelse:  # the `else:` branch does run
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's own package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if for_files:  # each name as `module.name`: file_graph keeps what is a module of it
                found.extend((f"{module}.{alias.name}", node.lineno) for alias in node.names)
            else:
                found.append((module, node.lineno))
                # `from kafscale import storage` imports a package by its alias name.
                if module == "kafscale":
                    found.extend((f"kafscale.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: ["file:line", ...]} for imports between different units."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        unit = _unit_of(path)
        graph.setdefault(unit, {})
        for module, line in _imported_modules(path):
            parts = module.split(".")
            if parts[0] != "kafscale" or len(parts) < 2:
                continue
            target = parts[1]
            if target != unit:
                where = f"{path.relative_to(PACKAGE_ROOT.parent)}:{line}"
                graph[unit].setdefault(target, []).append(where)
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {unit: WHITE for unit in graph}
    stack: list[str] = []

    def dfs(unit: str) -> list[str] | None:
        colour[unit] = GREY
        stack.append(unit)
        for target in sorted(graph.get(unit, {})):
            state = colour.get(target, BLACK)  # a target with no file of its own: a leaf
            if state == GREY:
                return stack[stack.index(target) :] + [target]
            if state == WHITE:
                cycle = dfs(target)
                if cycle:
                    return cycle
        stack.pop()
        colour[unit] = BLACK
        return None

    for unit in sorted(graph):
        if colour[unit] == WHITE:
            cycle = dfs(unit)
            if cycle:
                return cycle
    return None


def file_graph() -> dict[str, dict[str, list[str]]]:
    """module -> {module of src/ it imports: ["file:line", ...]}, counting every import:
    at module level, inside functions and under TYPE_CHECKING."""
    modules = {_module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}
    graph: dict[str, dict[str, list[str]]] = {}
    for name, path in modules.items():
        graph[name] = {}
        for module, line in _imported_modules(path, for_files=True):
            while module and module not in modules:  # `from x import name`: x when name is no module
                module = module.rpartition(".")[0]
            if module and module != name:
                where = f"{path.relative_to(PACKAGE_ROOT.parent)}:{line}"
                locations = graph[name].setdefault(module, [])
                if where not in locations:
                    locations.append(where)
    return graph


# Import circles between files that are still to be broken, as the import that closes each
# (importer, imported) and who is breaking it. Every entry must still exist: remove it
# with the import (test_allowed_file_cycles_are_still_there).
ALLOWED_FILE_EDGES: dict[tuple[str, str], str] = {}


def _without(graph: dict[str, dict[str, list[str]]], edges) -> dict[str, dict[str, list[str]]]:
    return {a: {b: w for b, w in targets.items() if (a, b) not in edges} for a, targets in graph.items()}


def test_no_import_cycle_between_files():
    graph = _without(file_graph(), ALLOWED_FILE_EDGES)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between files: " + " -> ".join(cycle) + "".join(
        f"\n  {a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(cycle, cycle[1:])
    )


def test_allowed_file_cycles_are_still_there():
    graph = file_graph()
    gone = [edge for edge in ALLOWED_FILE_EDGES if edge[1] not in graph.get(edge[0], {})]
    assert gone == [], f"no longer imported, remove from ALLOWED_FILE_EDGES: {gone}"


def test_file_graph_counts_function_level_and_type_checking_imports():
    graph = file_graph()
    # under TYPE_CHECKING (broker/router.py names the broker's parts for BrokerServices)
    assert "kafscale.storage.logs" in graph["kafscale.broker.router"]
    # inside a function (registry/types.py loads the Avro module when first asked)
    assert "kafscale.registry.avro_schema" in graph["kafscale.registry.types"]
    # `from kafscale.broker import authz_checks, memory`: the modules, not the package
    assert {"kafscale.broker.authz_checks", "kafscale.broker.memory"} <= set(graph["kafscale.broker.server"])


def test_file_cycle_check_sees_a_circle(tmp_path, monkeypatch):
    fake_root = tmp_path / "kafscale"
    (fake_root / "storage").mkdir(parents=True)
    (fake_root / "storage" / "logs.py").write_text("from kafscale.storage import merger\n")
    (fake_root / "storage" / "merger.py").write_text("if TYPE_CHECKING:\n    from kafscale.storage.logs import LogManager\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE_ROOT", fake_root)
    assert find_cycle(file_graph()) in (
        ["kafscale.storage.logs", "kafscale.storage.merger", "kafscale.storage.logs"],
        ["kafscale.storage.merger", "kafscale.storage.logs", "kafscale.storage.merger"],
    )


def _edges_to(graph, source: str, forbidden: set[str]) -> dict[str, list[str]]:
    return {t: w for t, w in graph.get(source, {}).items() if t in forbidden}


def test_graph_sees_the_known_packages():
    """Guards the parser itself: a graph with no edges would pass every rule below."""
    graph = import_graph()
    for unit in ("protocol", "broker", "storage", "metadata", "groups", "cluster", "ops"):
        assert unit in graph
    assert "storage" in graph["broker"] and "errors" in graph["protocol"]


def test_no_cycle_between_top_level_packages():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle) + "".join(
        f"\n  {a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(cycle, cycle[1:])
    )


def test_metadata_imports_no_storage():
    graph = import_graph()
    assert _edges_to(graph, "metadata", {"storage"}) == {}


def test_ops_imports_no_broker():
    """ops (metrics, health, logging) is imported by the broker, never the other way."""
    graph = import_graph()
    assert _edges_to(graph, "ops", {"broker", "cli"}) == {}


def test_ops_imports_nothing_of_broker_at_any_level():
    """ops reads the broker through the read model it defines (ops/read_model.py, which
    broker/ops_view.py implements): no import of broker/ from ops/, at module level, in a
    function, or under TYPE_CHECKING."""
    found = [
        f"{path.name}:{line} imports {module}"
        for path in sorted((PACKAGE_ROOT / "ops").rglob("*.py"))
        for module, line in _imported_modules(path, for_files=True)
        if module == "kafscale.broker" or module.startswith("kafscale.broker.")
    ]
    assert found == []


def test_protocol_imports_only_errors():
    graph = import_graph()
    assert set(graph["protocol"]) <= {"errors"}, graph["protocol"]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import kafscale.storage.logs", "kafscale.storage.logs"),
        ("def f():\n    from kafscale.broker.app import Broker", "kafscale.broker.app"),
        ("if TYPE_CHECKING:\n    from kafscale.broker import app", None),
        ("if typing.TYPE_CHECKING:\n    import kafscale.broker", None),
        ("from ..storage import segment", "kafscale.storage"),
    ],
)
def test_parser_reads_imports(tmp_path, monkeypatch, source, expected):
    fake_root = tmp_path / "kafscale"
    (fake_root / "metadata").mkdir(parents=True)
    path = fake_root / "metadata" / "store.py"
    path.write_text(source + "\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE_ROOT", fake_root)
    modules = [m for m, _ in _imported_modules(path)]
    assert modules == ([expected] if expected else [])


def _dotted(node: ast.AST) -> str:
    """`self.broker.logs` for an attribute chain; '?' for anything else at its root."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript):
        return _dotted(node.value) + "[]"
    return "?"


def _reaches_into_the_broker(source: str, filename: str) -> list[str]:
    """Private attributes of broker objects read, and broker objects patched, by ops code.

    A broker object is anything reached through a name or attribute called `broker` (or `b`,
    the collector's name for it), or a local name bound to one (`logs = self.broker.logs`)."""
    tree = ast.parse(source, filename=filename)
    aliases: set[str] = set()

    def on_broker(chain: str) -> bool:
        parts = chain.replace("[]", "").split(".")
        return parts[0] in aliases or any(part in ("broker", "b") for part in parts)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and on_broker(_dotted(node.value)):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if on_broker(_dotted(node.value)):
                found.append(f"{filename}:{node.lineno} reads {_dotted(node)}")
        elif isinstance(node, ast.Attribute) and node.attr == "__dict__" and on_broker(_dotted(node.value)):
            found.append(f"{filename}:{node.lineno} reads {_dotted(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_"):
                found.append(f"{filename}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and on_broker(_dotted(target.value)):
                    found.append(f"{filename}:{node.lineno} patches {_dotted(target)}")
    return found


def test_ops_observes_the_broker_through_public_hooks_only():
    """Subsystems own their counters and hooks: ops neither replaces a router handler or a
    method of a broker object, nor reads a private attribute (`broker.server._server`)."""
    found = []
    for path in sorted((PACKAGE_ROOT / "ops").glob("*.py")):
        found += _reaches_into_the_broker(path.read_text(), path.name)
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        'srv = getattr(self.broker.server, "_server", None)',
        "x = self.broker.logs._topics",
        "logs = self.broker.logs\nlogs.metrics_flushed = f",
        "self.broker.router.apis[key] = api",
        'self.broker.logs.__dict__.pop("metrics_flushed", None)',
    ],
)
def test_reach_check_sees_patching_and_private_reads(source):
    assert _reaches_into_the_broker(source, "m.py"), source


def test_reach_check_leaves_own_state_alone():
    source = "self.broker = broker\nself._runner = None\nhooks = self.broker.server.request_hooks\nhooks.remove(f)\nhandle._tasks = []"
    assert _reaches_into_the_broker(source, "m.py") == []


def test_cluster_is_wired_by_construction():
    """The cluster gets what it calls on ownership loss as constructor arguments: nothing
    assigns an attribute of a cluster afterwards, and cluster/ names no storage type, not
    even for type checking."""
    patched = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if _unit_of(path) == "cluster":
            text = path.read_text()
            assert "kafscale.storage" not in text, path
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and _dotted(target.value).split(".")[-1] == "cluster":
                        patched.append(f"{path.name}:{node.lineno} {_dotted(target)}")
    assert patched == []


def _private_reaches(source: str, filename: str, modules_only: bool) -> list[str]:
    """`x._name` where x is not self/cls: another object's private state. With
    modules_only, only where x is a module the file imports (`records._I64`)."""
    tree = ast.parse(source, filename=filename)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.update(a.asname or a.name for a in node.names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if modules_only and not (isinstance(owner, ast.Name) and owner.id in imported and owner.id[:1].islower()):
                continue
            found.append(f"{filename}:{node.lineno} reads {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_names():
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        found += _private_reaches(path.read_text(), str(path.relative_to(PACKAGE_ROOT)), modules_only=True)
    assert found == []


def test_storage_and_handlers_use_other_objects_public_members_only():
    """The merger, retention and recovery work through the partition log's public methods
    (swap_segments, the reader's segment_view), never its lock or state fields."""
    found = []
    for path in sorted([*(PACKAGE_ROOT / "storage").glob("*.py"), *(PACKAGE_ROOT / "broker" / "handlers").glob("*.py")]):
        found += _private_reaches(path.read_text(), str(path.relative_to(PACKAGE_ROOT)), modules_only=False)
    assert found == []


@pytest.mark.parametrize(
    "source, modules_only",
    [
        ("from kafscale.protocol import records\nx = records._I64", True),
        ("async def merge(mgr, lg):\n    async with lg._flush_lock:\n        pass", False),
        ("view = await mgr._segment_view(t, p, seg)", False),
    ],
)
def test_private_reach_check_sees_them(source, modules_only):
    assert _private_reaches(source, "m.py", modules_only)


def test_private_reach_check_leaves_own_state_and_objects_alone():
    source = "import asyncio\nself._lock = asyncio.Lock()\nx = lg.state.segments\nasyncio.get_running_loop()"
    assert _private_reaches(source, "m.py", modules_only=False) == []


# The pipeline's decoding modules: record bodies are read through protocol's record
# readers, so the decoder can be tested, benchmarked and reused without storage or Spark.
PIPELINE_DECODING = ["pipeline/segments/decode.py"]
# What they may import of ours: the protocol (and, were it needed, the segment format's home).
DECODING_MAY_IMPORT = ("kafscale.protocol", "kafscale.storage.segment")


def test_pipeline_decoding_imports_only_protocol():
    found = []
    for rel in PIPELINE_DECODING:
        path = PACKAGE_ROOT / rel
        assert path.is_file(), rel  # a renamed module must be named here again
        for module, line in _imported_modules(path):
            ours = module == "kafscale" or module.startswith("kafscale.")
            if ours and not any(module == m or module.startswith(m + ".") for m in DECODING_MAY_IMPORT):
                found.append(f"{rel}:{line} imports {module}")
    assert found == []
