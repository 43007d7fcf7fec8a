"""`patterns`: how long subscription globs take against long stream names, worst patterns first.

Every replica matches a subscription's pattern against stream names in its apply, so a slow match
stalls the group; these are the shapes a backtracking matcher falls over on.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from app.bench.report import machine
from app.state_machine.glob import MAX_PATTERN_LENGTH, PatternRejected, compile_glob, validate_pattern

REPEAT = 1000


def adversarial(name_length: int) -> list[tuple[str, str, str]]:
    """(label, pattern, name): each pattern against a name of `a`s and one of `a/a/...`."""
    flat = "a" * name_length
    segments = ("a/" * (name_length // 2 + 1))[:name_length]
    half = MAX_PATTERN_LENGTH // 2
    patterns = {
        "**a x8 **b (reported)": "**a" * 8 + "**b",
        "**a x6 **b**": "**a" * 6 + "**b**",
        f"*a x{half - 2} *b*": "*a" * (half - 2) + "*b*",
        f"*a x{half}": "*a" * half,
        "**/ x7 b**": "**/" * 7 + "b**",
        "**a*/ x8 *b*": "**a*/" * 8 + "*b*",
        f"** a* x{half - 2} b*": "**" + "a*" * (half - 2) + "b*",
        "a*": "a*",
    }
    return [(label, p, n) for label, p in patterns.items() for n in (flat, segments)]


def run_patterns(name_length: int = 1024, repeat: int = REPEAT) -> list[dict[str, Any]]:
    """Times each adversarial pattern against each name, `repeat` matches apiece (compiled once)."""
    rows = []
    for label, pattern, name in adversarial(name_length):
        glob = compile_glob(pattern)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            result = glob.matches(name)
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "pattern": label,
                "length": len(pattern),
                "valid": _valid(pattern),
                "name": "a/a/..." if "/" in name else "aaa...",
                "matches": result,
                "mean_ms": sum(times) / len(times) * 1000,
                "worst_ms": max(times) * 1000,
            }
        )
    return rows


def _valid(pattern: str) -> bool:
    try:
        validate_pattern(pattern)
    except PatternRejected:
        return False
    return True


def main() -> None:
    console = Console()
    m = machine()
    rows = run_patterns()
    console.print(f"[bold]patterns[/bold]  {REPEAT} matches each, machine: {m['cores']} cores, {m['date']}")
    table = Table("pattern", "length", "valid", "name", "matches", "mean ms", "worst ms")
    for row in rows:
        table.add_row(
            row["pattern"], str(row["length"]), "yes" if row["valid"] else "no", row["name"],
            "yes" if row["matches"] else "no", f"{row['mean_ms']:.4f}", f"{row['worst_ms']:.4f}",
        )  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    main()
