"""`append --generator wrk`: the same closed-loop appends driven by wrk (C, epoll), so the client is not the limit.

wrk runs twice: a warm-up run whose numbers are dropped, then the measured one. A Lua script picks a random
stream per request; its `done()` prints one JSON line that this module reads back.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.bench.run import Run

MARKER = "rill-bench-wrk:"
# wrk's error kinds (summary.errors in done()) and their names in the report; "status" is any 4xx/5xx
ERRORS = {
    "status": "http 4xx/5xx",
    "redirects": "http 3xx",  # counted by the script: wrk itself takes a redirect for a success
    "connect": "connect",
    "read": "read",
    "write": "write",
    "timeout": "timeout",
}

# {paths}, {content_type} and {payload_file} are filled in; `done` prints MARKER and one JSON object.
SCRIPT = """\
local paths = {paths}
local file = assert(io.open({payload_file}, "rb"))
local body = file:read("*a")
file:close()
local requests = {{}}
local threads = {{}}
redirects = 0

function setup(thread)
  table.insert(threads, thread)
end

function response(status)
  if status >= 300 and status < 400 then redirects = redirects + 1 end
end

function init(_)
  -- wrk.init has set the Host header by now
  for i, path in ipairs(paths) do
    requests[i] = wrk.format("POST", path, {{["Content-Type"] = {content_type}}}, body)
  end
  math.randomseed(os.time())
end

function request()
  return requests[math.random(#requests)]
end

function done(summary, latency, _)
  local e = summary.errors
  local moved = 0
  for _, thread in ipairs(threads) do moved = moved + thread:get("redirects") end
  io.write(string.format(
    '%s{{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"redirects":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p99.9_us":%d,"max_us":%d}}\\n',
    {marker}, summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout, moved,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def check_wrk() -> None:
    if shutil.which("wrk") is None:
        raise SystemExit("rill bench append: `wrk` is not installed; `apt-get install wrk` or use --generator python")


def lua_string(text: str) -> str:
    """A Lua string literal holding `text` (UTF-8), every byte outside a safe set escaped as \\ddd."""
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-_.~%:+=&;,")
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03d}" for b in text.encode()) + '"'


def wrk_base(targets: list[str]) -> str:
    """The one scheme://host:port wrk connects to (it drives a single server)."""
    bases = {f"{p.scheme}://{p.netloc}/" for p in map(urlsplit, targets)}
    if len(bases) != 1:
        raise SystemExit("rill bench append --generator wrk drives one server: pass a single --url")
    return bases.pop()


def _whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))  # wrk's -d takes whole seconds only


def _reap(process: subprocess.Popen[bytes]) -> tuple[bytes, int, float]:
    """Output, exit code and CPU seconds (user + system) of a child, read from wait4's rusage."""
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return out, process.returncode, usage.ru_utime + usage.ru_stime


async def _wrk(run: Run, cmd: list[str], seconds: int, label: str) -> tuple[dict[str, Any], float]:
    """Runs wrk with a progress bar (Ctrl-C stops it early, still reporting); its report and CPU seconds."""
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reaping = asyncio.ensure_future(asyncio.to_thread(_reap, process))
    try:
        await run.progress(label, seconds, [reaping])
    finally:
        if not reaping.done() and process.returncode is None:
            process.send_signal(signal.SIGINT)  # wrk stops on SIGINT and still calls done()
        out, code, cpu = await reaping
    text = out.decode(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith(MARKER)]
    if code != 0 or not lines:
        raise RuntimeError(f"wrk failed (exit {code}): {' '.join(text.split())[:500]}")
    return json.loads(lines[-1][len(MARKER) :]), cpu


def _summary(report: dict[str, Any], size: int) -> dict[str, Any]:
    """Recorder.summary's keys from wrk's report: ok counts 2xx (a redirect is no append)."""
    seconds = report["duration_us"] / 1e6
    ok = report["requests"] - report["status"] - report["redirects"]
    out: dict[str, Any] = {
        "ok": ok,
        "per_second": ok / seconds if seconds > 0 else math.nan,
        "mb_per_second": ok * size / seconds / 1e6 if seconds > 0 else math.nan,
    }
    for key in ("p50", "p90", "p99", "p99.9", "max"):
        out[f"{key}_ms"] = report[f"{key}_us"] / 1000 if report["requests"] else math.nan
    out["errors"] = {name: report[kind] for kind, name in ERRORS.items() if report[kind]}
    out["seconds"] = seconds
    return out


async def run_wrk(
    run: Run, targets: list[str], payload: bytes, content_type: str, writers: int, warmup: float, seconds: float
) -> dict[str, Any]:
    """Appends `payload` to random `targets` from `writers` wrk connections; the keys run_append returns."""
    base = wrk_base(targets)
    paths = "{" + ", ".join(lua_string(urlsplit(t).path or "/") for t in targets) + "}"
    with tempfile.TemporaryDirectory(prefix="rill-bench-wrk-") as tmp:
        payload_file = Path(tmp) / "payload"
        payload_file.write_bytes(payload)
        script = Path(tmp) / "append.lua"
        lua = {"content_type": content_type, "payload_file": str(payload_file), "marker": MARKER}
        script.write_text(SCRIPT.format(paths=paths, **{k: lua_string(v) for k, v in lua.items()}))

        def command(duration: int) -> list[str]:
            # --timeout 30s: a slow append is a latency to report, not a wrk timeout error
            return ["wrk", "-t1", f"-c{writers}", f"-d{duration}s", "--timeout", "30s", "-s", str(script), base]

        warm_requests = 0
        if warmup > 0:
            warm, _ = await _wrk(run, command(_whole_seconds(warmup)), _whole_seconds(warmup), "append warm-up (wrk)")
            warm_requests = warm["requests"]
        if run.stopped():  # Ctrl-C in the warm-up: nothing was measured
            report, cpu = dict.fromkeys(["requests", "duration_us", *ERRORS], 0), 0.0
        else:
            report, cpu = await _wrk(run, command(_whole_seconds(seconds)), _whole_seconds(seconds), "append (wrk)")
    summary = _summary(report, len(payload))
    summary["client_cpu"] = cpu / summary["seconds"] if summary["seconds"] > 0 else math.nan
    summary["_requests_total"] = warm_requests + report["requests"]
    return summary
