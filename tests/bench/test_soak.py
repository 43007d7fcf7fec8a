"""`rill bench soak` end to end on a real server: a short run must verify every acknowledged append."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def _line(stdout: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}\s+(.*)$", stdout, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{stdout}"
    return match.group(1)


def test_short_soak_passes_and_reports_everything(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "app.cli", "bench", "soak", "--seconds", "5", "--rate", "50"]
    cmd += ["--sample-every", "1", "--json-out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr

    stdout = done.stdout
    assert int(_line(stdout, "lost")) == 0
    assert int(_line(stdout, "duplicated")) == 0
    assert int(_line(stdout, "acknowledged appends").split()[0].replace(",", "")) > 0
    assert _line(stdout, "result") == "PASS"
    assert re.fullmatch(r"start [\d.]+  max [\d.]+  end [\d.]+", _line(stdout, "server RSS MiB"))
    assert re.fullmatch(r"start \d+  max \d+  end \d+", _line(stdout, "server open fds"))
    assert "of a core" in _line(stdout, "client CPU") and "of a core" in _line(stdout, "server CPU")
    assert len(re.findall(r"\d+s [\d.]+/\d+", _line(stdout, "RSS MiB/fds over time"))) >= 3

    result = json.loads(out.read_text())["results"]["server"]
    assert result["failures"] == [] and result["server_alive"]
    assert result["lost"] == result["duplicated"] == result["torn"] == 0
    assert result["rejected_but_stored"] == result["foreign"] == 0
    assert result["bad_5xx"] == 0 and result["client_exceptions"] == 0
    assert result["rss_start_mib"] > 0 and result["rss_max_mib"] >= result["rss_end_mib"]
    assert result["fds_max"] >= result["fds_start"] > 0 and result["stored_mib"] > 0
    assert result["server_cpu_seconds"] > 0 and result["client_cpu_seconds"] > 0
    assert sum(result["requests_by_kind"].values()) >= 200  # 5 s at 50/s, retries on top
    assert {"append-binary", "append-json", "catch-up-read", "sse"} <= set(result["requests_by_kind"])
