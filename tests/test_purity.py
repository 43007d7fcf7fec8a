"""The Raft core and the state machine stay pure: no asyncio, no HTTP, no clock, no direct disk."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
FORBIDDEN = {"asyncio", "time", "datetime", "httpx", "starlette", "uvicorn", "socket", "threading", "rocksdict", "os"}
PURE = sorted([*(APP / "raft").glob("*.py"), *(APP / "state_machine").glob("*.py")])


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(APP)))
def test_pure_module_imports(path: Path) -> None:
    assert not _imports(path) & FORBIDDEN, f"{path.name} imports {_imports(path) & FORBIDDEN}"
