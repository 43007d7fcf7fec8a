"""Closing streams: close-only, append-and-close, producer close, created closed.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx

from tests.http.helpers import TEXT, assert_error, assert_unchanged, create, producer, tail_of


def test_close_only_then_append_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    close = client.post(path, headers={"stream-closed": "true"})
    assert "content-type" not in close.request.headers
    assert close.status_code == 204
    assert close.headers["stream-closed"] == "true"
    final = close.headers["stream-next-offset"]
    assert final == tail_of(client, path)
    assert client.head(path).headers["stream-closed"] == "true"

    for headers, body in [(TEXT, b"late"), ({**TEXT, "stream-closed": "true"}, b"late")]:
        resp = client.post(path, headers=headers, content=body)
        assert_error(resp, 409)
        assert resp.headers["stream-closed"] == "true"
        assert resp.headers["stream-next-offset"] == final

    again = client.post(path, headers={"stream-closed": "true"})
    assert again.status_code == 204 and again.headers["stream-closed"] == "true"

    get = client.get(path)
    assert get.content == b"data"
    assert get.headers["stream-closed"] == "true"
    assert get.headers["stream-up-to-date"] == "true"
    at_tail = client.get(path, params={"offset": final})
    assert at_tail.content == b"" and at_tail.headers["stream-closed"] == "true"


def test_append_and_close(client: httpx.Client, path: str) -> None:
    create(client, path, b"first ")
    resp = client.post(path, headers={**TEXT, "stream-closed": "true"}, content=b"last")
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"
    assert_error(client.post(path, headers=TEXT, content=b"x"), 409)
    assert_unchanged(client, path, b"first last")


def test_producer_close_only_is_204(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    resp = client.post(path, headers={"stream-closed": "true", **producer("p", 0, 0)})
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"
    assert client.head(path).headers["stream-closed"] == "true"
    late = client.post(path, headers={**TEXT, **producer("p", 0, 1)}, content=b"late")
    assert_error(late, 409)
    assert late.headers["stream-closed"] == "true"
    assert_unchanged(client, path, b"data")


def test_create_closed(client: httpx.Client, path: str) -> None:
    resp = client.put(path, headers={**TEXT, "stream-closed": "true"}, content=b"sealed")
    assert resp.status_code == 201
    assert resp.headers["stream-closed"] == "true"
    assert_error(client.post(path, headers=TEXT, content=b"x"), 409)
    assert_unchanged(client, path, b"sealed")
