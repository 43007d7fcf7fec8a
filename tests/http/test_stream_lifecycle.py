"""Happy paths of the stream protocol: create, append, read, HEAD, delete, JSON, OPTIONS.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import re

import httpx

from tests.http.helpers import BINARY, JSON_CT, OFFSET, TEXT, assert_error, create, read_all, tail_of


def test_create_append_read_head_delete(client: httpx.Client, path: str) -> None:
    put = client.put(path, headers=TEXT)
    assert put.status_code == 201
    assert put.headers["content-type"] == "text/plain"
    assert put.headers["location"].endswith(path)
    assert put.headers["location"].startswith("http://")
    assert OFFSET.match(put.headers["stream-next-offset"])
    empty_tail = put.headers["stream-next-offset"]
    assert put.headers["x-content-type-options"] == "nosniff"

    again = client.put(path, headers={"content-type": "TEXT/PLAIN"})
    assert again.status_code == 200
    assert again.headers["stream-next-offset"] == empty_tail

    post = client.post(path, headers=TEXT, content=b"hello ")
    assert post.status_code == 204
    assert post.content == b""
    first = post.headers["stream-next-offset"]
    assert first > empty_tail
    post2 = client.post(path, headers=TEXT, content=b"world")
    assert post2.status_code == 204
    second = post2.headers["stream-next-offset"]
    assert second > first

    get = client.get(path)
    assert get.status_code == 200
    assert get.content == b"hello world"
    assert get.headers["content-type"] == "text/plain"
    assert get.headers["stream-next-offset"] == second
    assert get.headers["stream-up-to-date"] == "true"
    assert get.headers.get("etag")
    assert "stream-closed" not in get.headers

    resume = client.get(path, params={"offset": first})
    assert resume.content == b"world"
    at_tail = client.get(path, params={"offset": second})
    assert at_tail.status_code == 200 and at_tail.content == b""
    assert at_tail.headers["stream-up-to-date"] == "true"

    head = client.head(path)
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == "text/plain"
    assert head.headers["stream-next-offset"] == second
    assert "content-length" not in head.headers  # a GET's body has a length; 0 would misstate it
    assert "no-store" in head.headers["cache-control"]
    assert "stream-closed" not in head.headers

    deleted = client.delete(path)
    assert deleted.status_code == 204
    assert_error(client.get(path), 404)
    assert client.head(path).status_code == 404
    assert_error(client.delete(path), 404)
    assert_error(client.post(path, headers=TEXT, content=b"x"), 404)

    # Re-created fresh.
    create(client, path, b"new")
    assert read_all(client, path) == b"new"


def test_put_without_content_type_defaults_to_octet_stream(client: httpx.Client, path: str) -> None:
    resp = client.put(path)
    assert resp.status_code == 201
    assert resp.headers["content-type"] == "application/octet-stream"
    assert client.head(path).headers["content-type"] == "application/octet-stream"


def test_put_with_body_and_binary_round_trip(client: httpx.Client, path: str) -> None:
    body = bytes(range(256))
    resp = create(client, path, body, BINARY)
    tail = resp.headers["stream-next-offset"]
    get = client.get(path)
    assert get.content == body
    assert get.headers["stream-next-offset"] == tail
    assert get.headers["stream-up-to-date"] == "true"


def test_offset_now(client: httpx.Client, path: str) -> None:
    create(client, path, b"history")
    resp = client.get(path, params={"offset": "now"})
    assert resp.status_code == 200
    assert resp.content == b""
    assert resp.headers["stream-up-to-date"] == "true"
    assert resp.headers["stream-next-offset"] == tail_of(client, path)
    assert "no-store" in resp.headers["cache-control"]
    assert_error(client.get(f"{path}-missing", params={"offset": "now"}), 404)


def test_unknown_query_params_are_ignored(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    resp = client.get(f"{path}?offset=-1&foo=bar&baz=qux")
    assert resp.status_code == 200 and resp.content == b"data"


def test_json_stream_round_trip(client: httpx.Client, path: str) -> None:
    create(client, path, b'{"a":1}', JSON_CT)
    assert client.post(path, headers=JSON_CT, content=b'[{"b":2},{"c":3}]').status_code == 204
    with_params = {"content-type": "application/json; charset=utf-8"}
    assert client.post(path, headers=with_params, content=b"42").status_code == 204
    resp = client.get(path)
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == [{"a": 1}, {"b": 2}, {"c": 3}, 42]
    now = client.get(path, params={"offset": "now"})
    assert now.content == b"[]"


def test_options_does_not_need_a_stream(client: httpx.Client, path: str) -> None:
    resp = client.options(
        path,
        headers={
            "origin": "https://example.com",
            "access-control-request-method": "GET",
            "access-control-request-headers": "if-none-match",
        },
    )
    assert resp.status_code in (200, 204)
    assert re.search(r"if-none-match|\*", resp.headers["access-control-allow-headers"].lower())


def test_html_a_writer_stored_is_served_in_a_sandbox(client: httpx.Client, path: str) -> None:
    """A stream's bytes come from its writers: opened in a browser, HTML gets an origin of its own, and
    its scripts no access to this one (the console and its token live here)."""
    page = b"<script>alert(document.domain)</script>"
    assert client.put(path, headers={"content-type": "text/html"}, content=page).status_code == 201
    read = client.get(path, params={"offset": "-1"})
    assert read.content == page and read.headers["content-security-policy"] == "sandbox"
