"""Read errors: malformed and out-of-range offsets, live modes, missing streams, 405.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx
import pytest

from tests.http.helpers import TEXT, ZERO, assert_error, assert_get_error, assert_unchanged, create

BAD_OFFSETS = [
    pytest.param("abc", id="abc"),
    pytest.param("", id="empty"),
    pytest.param("0_1", id="short"),
    pytest.param("0,1", id="comma"),
    pytest.param("0%201", id="space"),
    pytest.param("-2", id="minus-two"),
    pytest.param("NOW", id="NOW"),
    pytest.param("%2E%2E%2F" + ZERO, id="dotdot-prefix"),
    pytest.param(ZERO + "%00", id="nul"),
    pytest.param(ZERO + "%0A", id="lf"),
    pytest.param(ZERO + "%0D%0A", id="crlf"),
    pytest.param(ZERO[:-1], id="15-digits"),
    pytest.param(ZERO + "0", id="17-digits"),
    pytest.param(ZERO.replace("_", "-"), id="dash"),
]


@pytest.mark.parametrize("offset", BAD_OFFSETS)
def test_malformed_offset_is_400(client: httpx.Client, path: str, offset: str) -> None:
    create(client, path, b"data")
    assert_error(client.get(f"{path}?offset={offset}"), 400)


def test_two_offsets_is_400(client: httpx.Client, path: str) -> None:
    resp = create(client, path, b"data")
    tail = resp.headers["stream-next-offset"]
    assert_error(client.get(f"{path}?offset=-1&offset={tail}"), 400)
    assert_error(client.get(f"{path}?offset=-1&offset=-1"), 400)


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_malformed_offset_in_live_modes_is_400(client: httpx.Client, path: str, live: str) -> None:
    create(client, path, b"data")
    assert_get_error(client, f"{path}?offset=abc&live={live}", 400)
    assert_get_error(client, f"{path}?offset=0_1&live={live}", 400)


@pytest.mark.parametrize(
    "offset",
    [
        "0000000000000000_9999999999999999",
        "9999999999999999_9999999999999999",
        "0000000000000000_0000000000000005",  # one past the 4-byte tail
        "9999999999999999_0000000000000000",  # lexicographically beyond every offset the server issues
        "0000000000000001_0000000000000000",
    ],
)
@pytest.mark.parametrize("live", ["", "&live=long-poll", "&live=sse"])
def test_offset_beyond_tail_is_400(client: httpx.Client, path: str, offset: str, live: str) -> None:
    create(client, path, b"data")
    assert_get_error(client, f"{path}?offset={offset}{live}", 400)


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_live_without_offset_is_400(client: httpx.Client, path: str, live: str) -> None:
    create(client, path, b"data")
    assert_get_error(client, f"{path}?live={live}", 400)


@pytest.mark.parametrize("live", ["foo", "", "true", "LONG-POLL", "long_poll"])
def test_bad_live_value_is_400(client: httpx.Client, path: str, live: str) -> None:
    create(client, path, b"data")
    assert_get_error(client, f"{path}?offset=-1&live={live}", 400)


def test_repeated_live_or_cursor_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    assert_get_error(client, f"{path}?offset=-1&live=long-poll&live=sse", 400)
    assert_error(client.get(f"{path}?offset=-1&live=long-poll&cursor=1&cursor=2"), 400)


@pytest.mark.parametrize(
    "query", ["", "?offset=-1", "?offset=now", "?offset=-1&live=long-poll", "?offset=now&live=sse"]
)
def test_read_missing_stream_is_404(client: httpx.Client, path: str, query: str) -> None:
    assert_get_error(client, path + query, 404)


def test_patch_is_405(client: httpx.Client, path: str) -> None:
    assert_error(client.request("PATCH", path, headers=TEXT, content=b"x"), 405)
    create(client, path, b"data")
    resp = client.request("PATCH", path, headers=TEXT, content=b"x")
    assert_error(resp, 405)
    assert "GET" in resp.headers.get("allow", "")
    assert_error(client.request("TRACE", path), 405)
    assert_unchanged(client, path, b"data")
