"""Report rendering: ratios against the first server, Markdown for docs/benchmarks.md."""

from __future__ import annotations

import math

from app.bench.report import markdown_table


def test_markdown_table_has_ratio_columns_and_skips_private_keys() -> None:
    results = {
        "rill": {"per_second": 8000.0, "errors": {}, "_requests_total": 1},
        "other": {"per_second": 4000.0, "errors": {409: 2}, "_requests_total": 1},
    }
    table = markdown_table(results)
    lines = table.strip().splitlines()
    assert lines[0] == "| metric | rill | other | rill / other |"
    assert "| per_second | 8,000 | 4,000 | 2.00x |" in lines
    assert "| errors | none | 409: 2 |  |" in lines
    assert "_requests_total" not in table


def test_ratio_is_blank_for_missing_or_nan_values() -> None:
    table = markdown_table({"a": {"x": math.nan, "y": 1.0}, "b": {"x": 1.0, "y": 0.0}})
    assert "| x | - | 1.00 |  |" in table
    assert "| y | 1.00 | 0.00 |  |" in table
