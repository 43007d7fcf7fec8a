"""The machine a result came from, and results as a table (stdout) and JSON (--json-out)."""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def machine() -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "load_1m": round(load1, 2),
        "load_5m": round(load5, 2),
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "none"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _ratio(mine: Any, other: Any) -> str:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (mine, other))
    if not numbers or not other or math.isnan(mine) or math.isnan(other):
        return ""
    return f"{mine / other:.2f}x"


def _rows(results: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one column per server, then the first server's ratio to each other one."""
    names = list(results)
    header = ["metric", *names, *(f"{names[0]} / {other}" for other in names[1:])]
    rows = []
    for metric in (k for k in results[names[0]] if not k.startswith("_")):
        values = [results[n].get(metric) for n in names]
        rows.append([metric, *(_cell(v) for v in values), *(_ratio(values[0], v) for v in values[1:])])
    return header, rows


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    header, rows = _rows(results)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def print_results(title: str, results: dict[str, dict[str, Any]], console: Console | None = None) -> None:
    """One column per server; with several, a ratio column of the first against each other."""
    console = console or Console()
    m = machine()
    console.print(f"[bold]{title}[/bold]  machine: {m['cores']} cores, load {m['load_1m']} (1 min), {m['date']}")
    header, rows = _rows(results)
    table = Table(*header[:1])
    for column in header[1:]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def write_json(path: Path, workload: str, options: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    document = {"workload": workload, "machine": machine(), "options": options, "results": results}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
