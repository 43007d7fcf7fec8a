"""`rill bench memory` end to end: each kind on a fresh server, a ratio printed, --max-ratio obeyed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.bench.memory import SHAPES, kinds, make_body


def test_json_body_is_an_array_of_about_1_kib_objects_totalling_the_size() -> None:
    body = make_body("json", 1 << 20)
    items = json.loads(body)
    assert len(items) == 1024 and abs(len(body) - (1 << 20)) <= 1
    assert len(make_body("binary", 1000)) == 1000


@pytest.mark.parametrize(
    ("kind", "item", "separator"),
    [("tiny", b"0", b","), ("objects", b'{"a": 0}', b", "), ("nested", b"[0,[0,[0]]]", b",")],
)
def test_json_shapes_are_arrays_of_one_item_repeated_to_about_the_size(
    kind: str, item: bytes, separator: bytes
) -> None:
    size = 1 << 20
    body = make_body(kind, size)
    items = json.loads(body)
    assert body == b"[" + separator.join([item] * len(items)) + b"]"
    assert size - len(item) - len(separator) < len(body) <= size


def test_string_shape_is_one_string_of_the_size() -> None:
    assert json.loads(make_body("string", 1 << 20)) == ["x" * ((1 << 20) - 4)]


def test_kinds_take_a_shape_a_list_or_a_group() -> None:
    assert kinds("both") == ("binary", "json")
    assert kinds("all") == tuple(SHAPES)
    assert kinds("tiny, string") == ("tiny", "string")
    for wrong in ("", "tiny,huge", "everything"):
        with pytest.raises(SystemExit, match="--kind must be"):
            kinds(wrong)


def test_memory_prints_a_ratio_per_kind(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "memory", "--body-mib", "4", "--json-out", str(out)]
    done = subprocess.run([*cmd, "--settle-seconds", "1"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    ratios = re.findall(r"^\s+ratio increase/body\s+(\d+\.\d+)$", done.stdout, re.MULTILINE)
    assert len(ratios) == 2, done.stdout
    assert "| binary | 4.0 MiB | +" in done.stdout and "| json | 4.0 MiB | +" in done.stdout
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"binary", "json"}
    for r in results.values():
        assert r["statuses"] == [204] and r["body_mib"] > 3.9
        assert r["peak_after_mib"] >= r["rss_before_mib"] > 0
        assert r["ratio"] == r["peak_increase_mib"] / r["sent_mib"]
        assert "followers" not in r


def test_memory_with_follower_measures_the_leader_and_both_followers(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "memory", "--body-mib", "4", "--kind", "tiny", "--follower"]
    cmd += ["--raft-tick-seconds", "0.5"]  # a loaded machine keeps its leader through the append
    done = subprocess.run(
        [*cmd, "--settle-seconds", "0", "--json-out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "follower 2" in done.stdout and "| tiny | 4.0 MiB | +" in done.stdout
    r = json.loads(out.read_text())["results"]["tiny"]
    assert r["statuses"] == [204] and [n["role"] for n in r["followers"]] == ["follower", "follower"]
    assert r["follower_ratio"] == max(n["ratio"] for n in r["followers"])
    # Only the leader decodes the body. Besides, it holds the body, the entry and the transport's copies
    # per follower (up to about 5 more); an object per message (issue 26: 2 Mi messages here) added 30.
    assert r["ratio"] < r["follower_ratio"] + 10, done.stdout


def test_memory_exits_1_above_max_ratio() -> None:
    cmd = [sys.executable, "-m", "app.cli", "bench", "memory", "--body-mib", "2", "--kind", "binary"]
    done = subprocess.run(
        [*cmd, "--max-ratio", "0.001", "--settle-seconds", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "max ratio 0.001: FAIL" in done.stdout
