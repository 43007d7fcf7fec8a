"""Body size limit and SSE keep-alives, on a separate server (--max-body-bytes 1024, SSE pings every 0.2 s).

Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.http.helpers import FAMILIES, TEXT, assert_error, assert_unchanged, create, family_base, uid
from tests.server import RillProcess

LIMIT = 1024


@pytest.fixture(scope="module")
def small_rill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    root = tmp_path_factory.mktemp("rill-small")
    config = root / "rill.toml"
    config.write_text("sse_ping_seconds = 0.2\n")
    extra = ["--max-body-bytes", str(LIMIT), "--long-poll-timeout", "1", "--config", str(config)]
    server = RillProcess(root / "data", None, *extra).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_client(small_rill: RillProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=small_rill.url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def small_bucket(small_client: httpx.Client) -> str:
    bucket = "small-" + uid()
    assert small_client.put(f"/ds/{bucket}").status_code == 201
    return bucket


@pytest.fixture(params=FAMILIES)
def small_path(
    request: pytest.FixtureRequest, small_client: httpx.Client, small_bucket: str
) -> tuple[httpx.Client, str]:
    return small_client, f"{family_base(request.param, small_bucket)}s-{uid()}"


def _chunks(total: int, size: int = 256) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield b"x" * n
        sent += n


def test_oversized_post_is_413(small_path: tuple[httpx.Client, str]) -> None:
    c, p = small_path
    create(c, p, b"base")
    assert_error(c.post(p, headers=TEXT, content=b"x" * (LIMIT + 1)), 413)
    assert_unchanged(c, p, b"base")
    assert c.post(p, headers=TEXT, content=b"y" * LIMIT).status_code == 204
    assert_unchanged(c, p, b"base" + b"y" * LIMIT)


def test_oversized_chunked_post_is_413(small_path: tuple[httpx.Client, str]) -> None:
    c, p = small_path
    create(c, p, b"base")
    resp = c.post(p, headers=TEXT, content=_chunks(4 * LIMIT))
    assert "content-length" not in resp.request.headers
    assert resp.request.headers.get("transfer-encoding") == "chunked"
    assert_error(resp, 413)
    assert_unchanged(c, p, b"base")
    ok = c.post(p, headers=TEXT, content=_chunks(LIMIT))
    assert ok.status_code == 204
    assert_unchanged(c, p, b"base" + b"x" * LIMIT)


def test_oversized_put_is_413(small_path: tuple[httpx.Client, str]) -> None:
    c, p = small_path
    assert_error(c.put(p, headers=TEXT, content=b"x" * (LIMIT + 1)), 413)
    assert c.head(p).status_code == 404
    assert_error(c.put(p, headers=TEXT, content=_chunks(2 * LIMIT)), 413)
    assert c.head(p).status_code == 404


def test_sse_keepalive_comments_use_lf_only(small_client: httpx.Client) -> None:
    """SSE output must use LF line endings only, keep-alive comments included."""
    p = f"/v1/stream/ping-{uid()}"
    create(small_client, p, b"x")
    raw = b""
    comment = re.compile(rb"(?:^|\n):[^\n]*\n")
    deadline = time.monotonic() + 3
    try:
        with small_client.stream("GET", f"{p}?offset=-1&live=sse", timeout=2) as resp:
            assert resp.status_code == 200
            for chunk in resp.iter_raw():
                raw += chunk
                if comment.search(raw) or time.monotonic() > deadline:
                    break
    except httpx.ReadTimeout:
        pass  # no keep-alive within the window: nothing more to check
    assert raw.startswith(b"event: data\n")
    assert b"\r" not in raw, raw
