"""`rill bench memory` end to end: each kind on a fresh server, a ratio printed, --max-ratio obeyed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from app.bench.memory import make_body


def test_json_body_is_an_array_of_about_1_kib_objects_totalling_the_size() -> None:
    body = make_body("json", 1 << 20)
    items = json.loads(body)
    assert len(items) == 1024 and abs(len(body) - (1 << 20)) <= 1
    assert len(make_body("binary", 1000)) == 1000


def test_memory_prints_a_ratio_per_kind(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "memory", "--body-mib", "4", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    ratios = re.findall(r"^\s+ratio increase/body\s+(\d+\.\d+)$", done.stdout, re.MULTILINE)
    assert len(ratios) == 2, done.stdout
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"binary", "json"}
    for r in results.values():
        assert r["statuses"] == [204] and r["body_mib"] > 3.9
        assert r["peak_after_mib"] >= r["rss_before_mib"] > 0
        assert r["ratio"] == r["peak_increase_mib"] / r["sent_mib"]


def test_memory_exits_1_above_max_ratio() -> None:
    cmd = [sys.executable, "-m", "app.cli", "bench", "memory", "--body-mib", "2", "--kind", "binary"]
    done = subprocess.run([*cmd, "--max-ratio", "0.001"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "max ratio 0.001: FAIL" in done.stdout
