"""`--log-format json`: one JSON object per line, uvicorn's access lines with their fields named."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx

from app.observability.logs import JsonFormatter
from tests.server import RillProcess


def test_a_record_becomes_one_json_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("rill.x", logging.ERROR, __file__, 1, "bad %s\nline", ("input",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "error" and parsed["logger"] == "rill.x" and parsed["message"] == "bad input\nline"
    assert parsed["time"].endswith("Z") and "ValueError: boom" in parsed["error"]


def test_the_server_logs_json_lines(tmp_path: Path) -> None:
    node = RillProcess(tmp_path / "data", None, "--log-format", "json", "--access-log").start()
    try:
        httpx.get(node.url + "/v1/stream/missing")
    finally:
        node.stop()
    lines = [json.loads(line) for line in node.log_path.read_text().splitlines() if line.strip()]
    assert any(line["logger"] == "uvicorn.error" and "startup complete" in line["message"] for line in lines)
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any(a["path"] == "/v1/stream/missing" and a["status"] == 404 and a["method"] == "GET" for a in access)
