"""HTTP tests for /ds stream attributes: /attrs and the Stream-Attrs header on create.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.http.ds_helpers import create, off, read, tail
from tests.http.helpers import TEXT, assert_error, uid


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def test_attrs_default_replace_and_clear(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    empty = client.get(f"{path}/attrs")
    assert empty.status_code == 200
    assert empty.headers["content-type"] == "application/json"
    assert empty.json() == {}

    full = {"title": "Orders", "metadata": {"owner": "team-a", "tags": ["x", 1], "nested": {"k": None}}}
    put = client.put(f"{path}/attrs", content=json.dumps(full).encode())
    assert put.status_code == 204, put.text
    assert put.content == b""
    assert client.get(f"{path}/attrs").json() == full
    head = client.head(f"{path}/attrs")
    assert head.status_code == 200 and head.content == b""

    assert client.put(f"{path}/attrs", content=b'{"title": "Renamed"}').status_code == 204
    assert client.get(f"{path}/attrs").json() == {"title": "Renamed"}  # replaced whole: metadata is gone
    assert client.put(f"{path}/attrs", content=b'{"metadata": {"a": 1}}').status_code == 204
    assert client.get(f"{path}/attrs").json() == {"metadata": {"a": 1}}
    assert client.put(f"{path}/attrs", content=b"{}").status_code == 204
    assert client.get(f"{path}/attrs").json() == {}
    assert read(client, path).content == b"data"


INVALID_ATTRS = [
    pytest.param(b'{"title": "t", "color": "red"}', id="unknown-field"),
    pytest.param(b'{"title": 5}', id="title-number"),
    pytest.param(b'{"metadata": [1, 2]}', id="metadata-list"),
    pytest.param(b'{"metadata": "text"}', id="metadata-string"),
    pytest.param(b"[]", id="array"),
    pytest.param(b'"title"', id="string"),
    pytest.param(b"{not json", id="not-json"),
    pytest.param(b"", id="empty-body"),
]


@pytest.mark.parametrize("body", INVALID_ATTRS)
def test_invalid_attrs_are_400(client: httpx.Client, path: str, body: bytes) -> None:
    create(client, path)
    assert client.put(f"{path}/attrs", content=b'{"title": "kept"}').status_code == 204
    assert_error(client.put(f"{path}/attrs", content=body), 400)
    assert client.get(f"{path}/attrs").json() == {"title": "kept"}


def attrs_of_size(size: int) -> bytes:
    body = b'{"title":"' + b"x" * (size - 12) + b'"}'
    assert len(body) == size
    return body


def test_attrs_up_to_16_kib(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.put(f"{path}/attrs", content=attrs_of_size(16 * 1024)).status_code == 204
    assert client.get(f"{path}/attrs").json() == json.loads(attrs_of_size(16 * 1024))
    assert_error(client.put(f"{path}/attrs", content=attrs_of_size(16 * 1024 + 1)), 400)
    assert client.get(f"{path}/attrs").json() == json.loads(attrs_of_size(16 * 1024))


def test_attrs_that_grow_past_16_kib_when_stored_are_400(client: httpx.Client, path: str) -> None:
    """The limit is on what is stored: `1E15` (4 bytes) is stored as `1000000000000000.0` (18), so
    16 KiB of them stored about 62 KB."""
    create(client, path)
    numbers = b"[" + b",".join([b"1E15"] * 3200) + b"]"
    body = b'{"metadata":{"n":' + numbers + b"}}"
    assert len(body) <= 16 * 1024
    resp = client.put(f"{path}/attrs", content=body)
    assert_error(resp, 400)
    assert resp.json()["error"]["code"] == "attrs_too_large"
    assert client.get(f"{path}/attrs").json() == {}


def test_attrs_well_over_16_kib_are_400(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert_error(client.put(f"{path}/attrs", content=attrs_of_size(20_000)), 400)


def test_attrs_on_a_closed_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b"x")
    assert client.post(path, headers={"stream-closed": "true"}).status_code == 204
    assert client.put(f"{path}/attrs", content=b'{"title": "archived"}').status_code == 204
    assert client.get(f"{path}/attrs").json() == {"title": "archived"}
    head = client.head(path)
    assert head.headers["stream-closed"] == "true"


def test_attrs_change_neither_offsets_nor_etags(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"one", b"two")
    before = read(client, path)
    middle = read(client, path, o1)
    assert client.put(f"{path}/attrs", content=b'{"title": "t", "metadata": {"v": 1}}').status_code == 204
    after = read(client, path)
    assert after.headers["etag"] == before.headers["etag"]
    assert after.headers["stream-next-offset"] == before.headers["stream-next-offset"] == o2
    assert read(client, path, o1).headers["etag"] == middle.headers["etag"]
    assert tail(client, path) == o2
    cached = client.get(path, params={"offset": "-1"}, headers={"if-none-match": before.headers["etag"]})
    assert cached.status_code == 304
    nxt = client.post(path, headers=TEXT, content=b"three")
    assert nxt.status_code == 204
    assert nxt.headers["stream-next-offset"] == off(int(o2[17:]) + 5)


def test_stream_attrs_header_in_idempotent_create(client: httpx.Client, path: str) -> None:
    attrs = '{"title": "T", "metadata": {"b": 1, "a": [1, 2]}}'
    created = client.put(path, headers={**TEXT, "stream-attrs": attrs})
    assert created.status_code == 201
    assert client.get(f"{path}/attrs").json() == json.loads(attrs)
    # The same attributes, written differently (key order, spacing): the same stream.
    same = client.put(path, headers={**TEXT, "stream-attrs": '{"metadata":{"a":[1,2],"b":1},"title":"T"}'})
    assert same.status_code == 200
    assert_error(client.put(path, headers={**TEXT, "stream-attrs": '{"title": "other"}'}), 409)
    assert client.get(f"{path}/attrs").json() == json.loads(attrs)


@pytest.mark.parametrize("attrs", ['{"bogus": 1}', '{"title": []}', "nope"])
def test_invalid_stream_attrs_header_on_create_is_400(client: httpx.Client, path: str, attrs: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-attrs": attrs}), 400)
    assert client.head(path).status_code == 404
