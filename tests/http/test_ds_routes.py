"""HTTP tests for the /ds stream sub-resources' routing: unknown streams and buckets, methods, OPTIONS.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import httpx
import pytest

from tests.http.ds_helpers import create, frames, tail
from tests.http.helpers import ZERO, assert_error, uid


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def requests_on(path: str) -> list[tuple[str, str, bytes]]:
    return [
        ("GET", f"{path}/attrs", b""),
        ("PUT", f"{path}/attrs", b'{"title": "x"}'),
        ("POST", f"{path}/append-batch", frames(b"x")),
        ("GET", f"{path}/bootstrap", b""),
        ("GET", f"{path}/snapshot", b""),
        ("GET", f"{path}/snapshot/{ZERO}", b""),
        ("PUT", f"{path}/snapshot/{ZERO}", b"blob"),
        ("DELETE", f"{path}/snapshot/{ZERO}", b""),
        ("PUT", f"{path}/retention/{ZERO}", b""),
    ]


@pytest.mark.parametrize("where", ["stream", "bucket", "deleted-stream"])
def test_sub_resources_of_unknown_streams_are_404(client: httpx.Client, bucket: str, where: str) -> None:
    if where == "bucket":
        path = f"/ds/nob-{uid()}/s"
    else:
        path = f"/ds/{bucket}/gone-{uid()}"
        if where == "deleted-stream":
            create(client, path, b"x")
            assert client.delete(path).status_code == 204
    for method, url, body in requests_on(path):
        err = assert_error(client.request(method, url, content=body), 404)
        assert err["code"].endswith("not_found"), (method, url, err)
    for url in (f"{path}/attrs", f"{path}/bootstrap", f"{path}/snapshot"):
        head = client.head(url)
        assert head.status_code == 404 and head.content == b""
    assert client.head(path).status_code == 404  # and nothing was created along the way


WRONG_METHODS = [
    ("POST", "attrs", {"GET", "HEAD", "PUT"}),
    ("DELETE", "attrs", {"GET", "HEAD", "PUT"}),
    ("PUT", "bootstrap", {"GET", "HEAD"}),
    ("POST", "bootstrap", {"GET", "HEAD"}),
    ("GET", "append-batch", {"POST"}),
    ("PUT", "append-batch", {"POST"}),
    ("PUT", "snapshot", {"GET", "HEAD"}),
    ("DELETE", "snapshot", {"GET", "HEAD"}),
    ("POST", f"snapshot/{ZERO}", {"GET", "HEAD", "PUT", "DELETE"}),
    ("PATCH", f"snapshot/{ZERO}", {"GET", "HEAD", "PUT", "DELETE"}),
    ("GET", f"retention/{ZERO}", {"PUT"}),
    ("DELETE", f"retention/{ZERO}", {"PUT"}),
]


@pytest.mark.parametrize(("method", "sub", "allowed"), WRONG_METHODS)
def test_wrong_methods_are_405_with_allow(
    client: httpx.Client, path: str, method: str, sub: str, allowed: set[str]
) -> None:
    _, end = create(client, path, b"x")
    resp = client.request(method, f"{path}/{sub}", content=b"")
    assert_error(resp, 405)
    allow = {m.strip() for m in resp.headers["allow"].split(",")}
    assert allowed <= allow
    assert method not in allow
    assert tail(client, path) == end


OPTIONS = [
    ("attrs", {"GET", "HEAD", "PUT", "OPTIONS"}),
    ("append-batch", {"POST", "OPTIONS"}),
    ("bootstrap", {"GET", "HEAD", "OPTIONS"}),
    ("snapshot", {"GET", "HEAD", "OPTIONS"}),
    (f"snapshot/{ZERO}", {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}),
    (f"retention/{ZERO}", {"PUT", "OPTIONS"}),
]


@pytest.mark.parametrize(("sub", "allowed"), OPTIONS)
def test_options_is_204_with_allow(client: httpx.Client, path: str, sub: str, allowed: set[str]) -> None:
    create(client, path)
    resp = client.options(f"{path}/{sub}")
    assert resp.status_code == 204
    assert resp.content == b""
    assert {m.strip() for m in resp.headers["allow"].split(",")} == allowed


@pytest.mark.parametrize("method", ["PUT", "GET", "OPTIONS"])
def test_retention_without_an_offset_is_404(client: httpx.Client, path: str, method: str) -> None:
    create(client, path, b"abc")
    assert_error(client.request(method, f"{path}/retention"), 404)
    assert client.head(path).headers["stream-earliest-offset"] == ZERO
