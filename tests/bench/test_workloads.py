"""Short smoke runs of every workload against a real Rill: correctness of the counts, never speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx

from app.bench.append import AppendOptions, run_append
from app.bench.fanout import FanoutOptions, run_fanout
from app.bench.replay import ReplayOptions, run_replay
from app.bench.run import Run
from tests.server import RillProcess


def test_append_counts_add_up(rill: RillProcess) -> None:
    opts = AppendOptions(streams=5, writers=4, size=64, seconds=1.0, warmup=0.2)
    result = asyncio.run(run_append(Run([rill.url + "/v1/stream"]), opts))
    assert result["errors"] == {}
    assert result["ok"] > 0
    assert result["per_second"] == result["ok"] / result["seconds"]
    assert result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["client_cpu"] >= 0


def test_append_with_idempotent_producers_has_no_errors(rill: RillProcess) -> None:
    assert httpx.put(rill.url + "/ds/benchmark").status_code in (200, 201)
    opts = AppendOptions(streams=3, writers=3, size=32, seconds=0.8, warmup=0.1, producers=True)
    result = asyncio.run(run_append(Run([rill.url + "/ds/benchmark"]), opts))
    assert result["errors"] == {} and result["ok"] > 0


def test_fanout_delivers_everything_exactly_once(rill: RillProcess) -> None:
    opts = FanoutOptions(subscribers=5, rate=40, seconds=1.0)
    result = asyncio.run(run_fanout(Run([rill.url + "/v1/stream"]), opts))
    assert result["sent"] > 0
    assert result["expected"] == result["sent"] * 5
    assert result["delivered"] == result["expected"]
    assert result["losses"] == 0 and result["duplicates"] == 0


def test_replay_reads_every_byte(rill: RillProcess) -> None:
    opts = ReplayOptions(streams=2, events=50, size=100, readers=3)
    result = asyncio.run(run_replay(Run([rill.url + "/streams"]), opts))
    assert result["clients"] == 6
    assert result["bytes_read"] == result["bytes_expected"] == 2 * 3 * 50 * 100


def test_cli_prints_a_table_and_writes_json(rill: RillProcess, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "append", "--url", rill.url + "/v1/stream"]
    cmd += ["--seconds", "0.5", "--warmup", "0.1", "--streams", "2", "--writers", "2", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "per_second" in done.stdout and "machine: " in done.stdout
    document = json.loads(out.read_text())
    assert document["workload"] == "append" and document["machine"]["cores"] >= 1
    assert document["results"]["server"]["ok"] > 0


def test_compare_starts_rill_and_reports_server_cpu(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "compare", "append", "--skip-reference", "--baseline"]
    cmd += ["--seconds", "0.5", "--warmup", "0.1", "--streams", "2", "--writers", "2", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"rill", "bare uvicorn (empty 204)"}
    assert results["rill"]["ok"] > 0 and results["rill"]["errors"] == {}
    assert results["rill"]["server_cpu_us_per_op"] > 0
    assert results["rill"]["disk_fsync_p50_ms"] >= 0
