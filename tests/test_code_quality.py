"""The codebase stays typed and lint-clean: mypy over app/, ruff over everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_mypy_app() -> None:
    result = _run("mypy", "app")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    result = _run("ruff", "check", "app", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
