"""The chaos run's report of the nodes' log errors keeps each traceback whole, down to its exception."""

from __future__ import annotations

from pathlib import Path

from app.bench.chaos.cluster import log_errors

LOG = """\
2026-11-26 08:09:20,000 INFO rill.raft: became leader
2026-11-26 08:09:21,633 ERROR asyncio: Task exception was never retrieved
future: <Task finished name='Task-9' coro=<f() done> exception=ValueError('x')>
Traceback (most recent call last):
  File "a.py", line 1, in f
    raise ValueError("x")
ValueError: x
2026-11-26 08:09:22,000 INFO rill.raft: something else
"""


def test_a_traceback_is_kept_whole_and_ordinary_lines_are_not(tmp_path: Path) -> None:
    (tmp_path / "n2.log").write_text(LOG)
    (tmp_path / "n1.log").write_text("2026-11-26 08:00:00,000 INFO all well\n")
    found = log_errors(tmp_path)
    assert found == [
        "n2: 2026-11-26 08:09:21,633 ERROR asyncio: Task exception was never retrieved",
        "n2: future: <Task finished name='Task-9' coro=<f() done> exception=ValueError('x')>",
        "n2: Traceback (most recent call last):",
        'n2:   File "a.py", line 1, in f',
        'n2:     raise ValueError("x")',
        "n2: ValueError: x",
    ]
