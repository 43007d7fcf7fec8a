"""The architecture's rules, checked on the imports: cores stay pure, layers only point down.

Layers, lowest first: a module may import from its own layer and the layers below it, never from
one above. `cluster.routes` and `cluster.cli` live beside the cluster's driver but are an HTTP
adapter and a command, so they sit with the routes and the CLI.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
FORBIDDEN = {"asyncio", "time", "datetime", "httpx", "starlette", "uvicorn", "socket", "threading", "rocksdict", "os"}
PURE = sorted([*(APP / "raft").glob("*.py"), *(APP / "state_machine").glob("*.py"), *(APP / "domain").glob("*.py")])

LAYERS: list[tuple[str, ...]] = [
    ("domain",),
    ("storage", "observability.counters", "runtime"),
    ("raft",),
    ("state_machine",),
    ("tiering", "pipeline", "subscriptions"),
    ("node", "cluster", "security", "serving"),
    ("protocol",),
    ("routes", "cluster.routes", "observability", "console"),
    ("server", "config", "cli", "cluster.cli", "bench", "commands"),
]
ROOT_MODULES = {"__init__.py", "server.py", "cli.py", "config.py", "node.py"}


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


def layer_of(module: str) -> int:
    """The layer of a dotted module under app (the longest matching name wins)."""
    best, best_len = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = index, len(name)
    if best < 0:
        raise AssertionError(f"app.{module} is in no layer: add it to LAYERS")
    return best


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


def test_layer_check_catches_an_upward_import() -> None:
    assert layer_of("tiering.worker") < layer_of("node") < layer_of("protocol.reads") < layer_of("routes.ds")
    assert layer_of("cluster.routes") == layer_of("routes")
    assert layer_of("cluster.driver") == layer_of("node")


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


@pytest.mark.parametrize("module", ["app.tiering.segment", "app.pipeline.datasource", "app.domain.offsets"])
def test_executor_modules_load_no_web_framework(module: str) -> None:
    """Spark executors import these: they must not pull in Starlette (or the server)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
