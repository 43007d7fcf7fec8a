"""The architecture's rules, checked on the imports: cores stay pure, folders are layers, layers
only point down.

Every top-level package under app/ (and each entry module at its root) sits in exactly one layer,
lowest first. A module may import from its own folder, from other folders of its layer and from the
layers below, never from one above; and neither folders nor modules import each other in a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
FORBIDDEN = {"asyncio", "time", "datetime", "httpx", "starlette", "uvicorn", "socket", "threading", "rocksdict", "os"}
PURE = sorted([*(APP / "raft").glob("*.py"), *(APP / "state_machine").glob("*.py"), *(APP / "domain").glob("*.py")])

LAYERS: list[tuple[str, ...]] = [
    ("domain",),
    ("storage", "counters", "runtime"),
    ("raft",),
    ("state_machine",),
    ("tiering", "pipeline", "subscriptions"),
    ("cluster", "security", "serving"),
    ("config",),
    ("service",),
    ("protocol",),
    ("routes", "observability", "console"),
    ("server", "cli", "bench"),
]
ROOT_MODULES = {"__init__.py", "server.py", "config.py"}


def _module(path: Path) -> str:
    parts = path.relative_to(APP).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "app":
                names.update(f"app.{alias.name}" for alias in node.names)
    return names


def folder(module: str) -> str:
    return module.split(".")[0]


def layer_of(module: str) -> int:
    """The layer of a dotted module under app: its folder's."""
    for index, names in enumerate(LAYERS):
        if folder(module) in names:
            return index
    raise AssertionError(f"app.{module} is in no layer: add its folder to LAYERS")


def _graph() -> dict[str, set[str]]:
    """Every module under app and the app modules it imports (at any depth, TYPE_CHECKING included)."""
    graph: dict[str, set[str]] = {}
    known = {_module(p) for p in APP.rglob("*.py")}
    for path in APP.rglob("*.py"):
        targets = set()
        for name in _imports(path):
            if name.startswith("app."):
                target = name.removeprefix("app.")
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]  # `from app.x import name` names a module or a symbol
                targets.add(target)
        graph[_module(path)] = targets - {_module(path)}
    return graph


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


SOURCES = sorted(p for p in APP.rglob("*.py") if p.relative_to(APP).parts != ("__init__.py",))


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(APP)))
def test_pure_module_imports(path: Path) -> None:
    roots = {name.split(".")[0] for name in _imports(path)}
    assert not roots & FORBIDDEN, f"{path.name} imports {roots & FORBIDDEN}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(APP)))
def test_imports_point_down(path: Path) -> None:
    here = layer_of(_module(path))
    upward = [name for name in _imports(path) if name.startswith("app.") and layer_of(name.removeprefix("app.")) > here]
    assert not upward, f"app.{_module(path)} (layer {LAYERS[here]}) imports from higher layers: {upward}"


def test_every_folder_sits_in_one_layer() -> None:
    folders = {folder(_module(p)) for p in SOURCES}
    named = [name for names in LAYERS for name in names]
    assert sorted(named) == sorted(set(named)), "a folder is named in two layers"
    assert not folders - set(named), f"folders in no layer: {sorted(folders - set(named))}"
    assert not set(named) - folders, f"layers name folders that do not exist: {sorted(set(named) - folders)}"


def test_no_import_cycles_between_folders() -> None:
    graph = _graph()
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder(module), set()).update(folder(t) for t in targets if folder(t) != folder(module))
    assert not cycles(folders), f"folders importing each other: {cycles(folders)}"


def test_no_import_cycles_between_modules() -> None:
    found = cycles(_graph())
    assert not found, f"modules importing each other: {found}"


def test_layer_check_catches_an_upward_import_and_a_cycle() -> None:
    assert layer_of("tiering.worker") < layer_of("service.engine") < layer_of("protocol.reads") < layer_of("routes.ds")
    assert layer_of("routes.cluster") == layer_of("routes.ds")
    assert layer_of("cluster.driver") < layer_of("service.engine")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_app_root_holds_only_the_entry_points() -> None:
    loose = {p.name for p in APP.glob("*.py")} - ROOT_MODULES
    assert not loose, f"modules at app/ root belong in a package: {sorted(loose)}"


def test_no_module_reaches_into_the_raft_core() -> None:
    """Only the cluster driver holds the pure core; everyone else asks `RaftNode.status()`."""
    outside = [p for p in APP.rglob("*.py") if p.relative_to(APP).parts[0] not in ("cluster", "raft")]
    offenders = [
        str(p.relative_to(APP))
        for p in outside
        if any(isinstance(n, ast.Attribute) and n.attr == "core" for n in ast.walk(ast.parse(p.read_text())))
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    "module",
    [
        "app.tiering.segment",
        "app.pipeline.datasource",
        "app.pipeline.planning",
        "app.pipeline.cold",
        "app.domain.offsets",
    ],
)
def test_executor_modules_load_no_web_framework(module: str) -> None:
    """Spark executors import these: they must not pull in Starlette (or the server)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
