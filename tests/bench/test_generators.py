"""The out-of-process load generators against a real Rill: the Node SSE subscribers and wrk appends."""

from __future__ import annotations

import asyncio
import http.server
import shutil
import threading

import pytest

from app.bench.append import AppendOptions, run_append
from app.bench.fanout import FanoutOptions, run_fanout
from app.bench.run import Run
from tests.server import RillProcess


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (`node`) for app/bench/fanout_client.mjs")
def test_node_fanout_client_delivers_everything_exactly_once(rill: RillProcess) -> None:
    opts = FanoutOptions(subscribers=20, rate=20, seconds=2.0, drain=5.0, client="node")
    result = asyncio.run(run_fanout(Run([rill.url + "/v1/stream"]), opts))
    assert result["sent"] >= 20
    assert result["expected"] == result["sent"] * 20
    assert result["delivered"] == result["expected"]
    assert result["losses"] == 0 and result["duplicates"] == 0
    assert 0 <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"] < 5000
    assert 0 < result["client_cpu"] < 1.5


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (`apt-get install wrk`)")
def test_wrk_append_generator_has_no_errors(rill: RillProcess) -> None:
    opts = AppendOptions(streams=5, writers=4, size=64, seconds=1.0, warmup=0.0, generator="wrk")
    result = asyncio.run(run_append(Run([rill.url + "/v1/stream"]), opts))
    assert result["errors"] == {}
    assert result["ok"] > 0
    assert result["per_second"] == result["ok"] / result["seconds"]
    assert result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["_requests_total"] >= result["ok"]
    assert 0 < result["client_cpu"] < 1.5


def test_wrk_generator_refuses_idempotent_producers() -> None:
    with pytest.raises(SystemExit, match="--producers needs --generator python"):
        AppendOptions(generator="wrk", producers=True).check()


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (apt-get install wrk)")
def test_wrk_counts_a_redirect_as_no_append() -> None:
    class Redirect(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_PUT(self) -> None:
            self._answer(201)

        def do_POST(self) -> None:
            self._answer(307)

        def _answer(self, status: int) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(status)
            self.send_header("location", "http://127.0.0.1:1/elsewhere")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/stream"
        opts = AppendOptions(streams=2, writers=2, seconds=1, warmup=0, generator="wrk")
        result = asyncio.run(run_append(Run([url]), opts))
    finally:
        server.shutdown()
    assert result["ok"] == 0 and result["errors"]["http 3xx"] > 0
