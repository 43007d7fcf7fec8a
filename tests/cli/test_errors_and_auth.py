"""Failures are one line on stderr with the server's message and exit 1 (2 for usage errors);
`--token` / `$RILL_TOKEN` reach an `--auth on` server, also through a 307 to another origin."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from app.cli.restore import serve_command
from tests.cli.conftest import TOKEN, invoke, run
from tests.server import RillProcess, free_port

Capture = pytest.CaptureFixture[bytes]


def test_missing_stream_is_exit_1_with_the_servers_message(server: RillProcess, capsysbinary: Capture) -> None:
    httpx.put(server.url + "/ds/errors")
    for argv in (["read"], ["append"], ["tail"]):
        code, out, err = invoke(capsysbinary, *argv, "errors/missing", "--server", server.url)
        assert (code, out) == (1, b""), err
        assert err == "rill: error: 404 stream_not_found: stream not found\n"
    code, _, err = invoke(capsysbinary, "read", "nobucket/x", "--server", server.url)
    assert code == 1 and err.startswith("rill: error: 404")


def test_a_subprocess_failure_has_no_traceback(server: RillProcess) -> None:
    done = run("read", server.url + "/ds/errors/missing")
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr == b"rill: error: 404 stream_not_found: stream not found\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["read", "just-a-name"],
        ["read", "ftp://127.0.0.1/ds/a/b"],
        ["read", "a/b", "--server", "127.0.0.1:4437"],
        ["streams", "list", "a/b"],
        ["append", "a/b", "x", "--producer", "p", "--seq", "-1"],
        ["read", "a/b", "--tls-ca", "/nonexistent/ca.pem"],
        ["read", "http://[::1"],
        ["buckets", "list", "--server", "http://127.0.0.1:44377x"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsysbinary: Capture) -> None:
    code, out, err = invoke(capsysbinary, *argv)
    assert (code, out) == (2, b"") and err.startswith("rill: error: ") and err.count("\n") == 1


def test_argparse_usage_errors_exit_2(capsysbinary: Capture) -> None:
    assert invoke(capsysbinary, "create", "a/b", "--json", "--content-type", "text/plain")[0] == 2
    assert invoke(capsysbinary, "buckets")[0] == 2


def test_connection_refused_is_one_line(capsysbinary: Capture) -> None:
    port = free_port()
    code, _, err = invoke(capsysbinary, "buckets", "list", "--server", f"http://127.0.0.1:{port}")
    assert code == 1 and err == f"rill: error: cannot connect to http://127.0.0.1:{port}: connection refused\n"


def test_a_bad_request_shows_the_servers_message(server: RillProcess, capsysbinary: Capture) -> None:
    httpx.put(server.url + "/ds/errors/j", headers={"content-type": "application/json"})
    code, _, err = invoke(capsysbinary, "read", "errors/j", "--from", "garbage", "--server", server.url)
    assert code == 1 and err.startswith("rill: error: 400 invalid_offset: ")


def test_token_from_flag_and_environment(auth_server: RillProcess, capsysbinary: Capture) -> None:
    s = auth_server.url
    code, _, err = invoke(capsysbinary, "buckets", "list", "--server", s)
    assert code == 1 and err.startswith("rill: error: 401 unauthorized") and "--token" in err
    code, _, err = invoke(capsysbinary, "buckets", "create", "secured", "--server", s, "--token", "rill_wrong")
    assert code == 1 and "401" in err and "--token" not in err
    assert invoke(capsysbinary, "buckets", "create", "secured", "--server", s, "--token", TOKEN)[0] == 0
    env = {"RILL_URL": s, "RILL_TOKEN": TOKEN}
    assert run("create", "secured/s", "--json", env=env).returncode == 0
    done = run("append", "secured/s", stdin=b'{"a": 1}\n', env=env)
    assert done.returncode == 0, done.stderr
    assert run("read", "secured/s", env=env).stdout == b'{"a":1}\n'
    _, out, _ = invoke(capsysbinary, "streams", "list", "secured", "--server", s, "--token", TOKEN)
    assert out.decode().startswith("s\tapplication/json\t")


@pytest.fixture
def redirector(auth_server: RillProcess) -> Iterator[str]:
    """Another origin that answers everything with a 307 to the server, as a follower does."""

    class Redirect(BaseHTTPRequestHandler):
        def _redirect(self) -> None:
            self.send_response(307)
            self.send_header("location", auth_server.url + self.path)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _redirect

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_redirects_keep_the_token(auth_server: RillProcess, redirector: str, capsysbinary: Capture) -> None:
    httpx.put(auth_server.url + "/ds/redirected", headers={"authorization": f"Bearer {TOKEN}"})
    args = ("--server", redirector, "--token", TOKEN)
    assert invoke(capsysbinary, "create", "redirected/r", "--content-type", "text/plain", *args)[0] == 0
    code, out, err = invoke(capsysbinary, "append", "redirected/r", "through a 307", *args)
    assert code == 0, err
    assert invoke(capsysbinary, "read", "redirected/r", "--from", "-1", *args)[1] == b"through a 307"


class Recorder(BaseHTTPRequestHandler):
    """Answers every request with `status` (and a Location of `location`), remembering its headers."""

    status = 307
    location = ""
    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(self.status)
        if self.location:
            self.send_header("location", self.location + self.path)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def test_the_token_never_follows_a_redirect_to_another_host(capsysbinary: Capture) -> None:
    target_handler = type("Target", (Recorder,), {"status": 204, "seen": []})
    target, target_port = _serve(target_handler)
    # Another host name for the same machine: the token must stay behind.
    redirect = type("Away", (Recorder,), {"location": f"http://localhost:{target_port}", "seen": []})
    away, away_port = _serve(redirect)
    try:
        code, _, err = invoke(capsysbinary, "append", f"http://127.0.0.1:{away_port}/ds/b/s", "x", "--token", TOKEN)
        assert code == 1 and "another host" in err and f"localhost:{target_port}" in err
        assert redirect.seen and redirect.seen[0]["authorization"] == f"Bearer {TOKEN}"
        assert target_handler.seen == []  # nothing went there, let alone the token
    finally:
        for httpd in (target, away):
            httpd.shutdown()
            httpd.server_close()


def test_a_redirect_other_than_307_is_an_error(capsysbinary: Capture) -> None:
    moved = type("Moved", (Recorder,), {"status": 302, "location": "http://127.0.0.1:9", "seen": []})
    httpd, port = _serve(moved)
    try:
        code, out, err = invoke(capsysbinary, "read", f"http://127.0.0.1:{port}/ds/b/s")
        assert (code, out) == (1, b"") and "answered 302" in err and err.count("\n") == 1
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("token", ["rill_SE\rCRET", "rill_SE CRET", "rill_SECR\u00c9T", "rill_SE\nCRET"])
def test_a_token_no_header_can_carry_is_refused_without_showing_it(token: str, capsysbinary: Capture) -> None:
    port = free_port()  # nothing is sent: the token is refused before
    code, out, err = invoke(capsysbinary, "read", "a/b", "--server", f"http://127.0.0.1:{port}", "--token", token)
    assert (code, out) == (2, b"") and "SE" not in err and "SECR" not in err and err.count("\n") == 1


def test_a_token_read_from_a_file_keeps_working_without_its_line_break(
    auth_server: RillProcess, capsysbinary: Capture
) -> None:
    code, _, err = invoke(capsysbinary, "buckets", "list", "--server", auth_server.url, "--token", TOKEN + "\n")
    assert code == 0, err


def test_a_header_value_no_header_can_carry_is_a_usage_error(server: RillProcess, capsysbinary: Capture) -> None:
    assert invoke(capsysbinary, "create", "errors/producer", "--server", server.url)[0] == 0
    code, _, err = invoke(
        capsysbinary, "append", "errors/producer", "x", "--producer", "\u00fcn\u00ef", "--server", server.url
    )
    assert code == 2 and err.startswith("rill: error: producer-id: ") and err.count("\n") == 1


def test_restore_says_how_to_serve_with_the_store_it_restored_from() -> None:
    args = argparse.Namespace(
        data_dir=Path("/srv/rill data"), source="s3://b/prod", s3_endpoint_url="http://127.0.0.1:9000",
        s3_region="eu-west-1", s3_path_style=True,
    )  # fmt: skip
    assert serve_command(args) == (
        "RILL_S3_REGION=eu-west-1 RILL_S3_PATH_STYLE=true rill serve --data-dir '/srv/rill data' "
        "--cold-store s3://b/prod --s3-endpoint-url http://127.0.0.1:9000"
    )


class LeaderChanged(BaseHTTPRequestHandler):
    """A stream whose appends are answered as a write in flight through a change of leader is."""

    posts: list[dict[str, str]] = []

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("stream-next-offset", "0")
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.posts.append({k.lower(): v for k, v in self.headers.items()})
        body = b'{"error": {"code": "retry", "message": "leadership changed; retry the request"}}'
        self.send_response(503)
        self.send_header("retry-after", "0.1")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_append_whose_outcome_is_unknown_is_not_sent_twice(capsysbinary: Capture) -> None:
    """Without a producer the server would store a repeat as a second append; with one it dedupes."""
    handler = type("Changed", (LeaderChanged,), {"posts": []})
    httpd, port = _serve(handler)
    try:
        url = f"http://127.0.0.1:{port}/ds/b/s"
        code, _, err = invoke(capsysbinary, "append", url, "once")
        assert code == 1 and "503 retry" in err and "not sent again" in err and len(handler.posts) == 1
        invoke(capsysbinary, "append", url, "safe", "--producer", "p")
        assert len(handler.posts) > 2  # a producer's append is repeated: the server deduplicates it
    finally:
        httpd.shutdown()
        httpd.server_close()
