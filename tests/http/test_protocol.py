"""HTTP tests for the stream protocol, run against every route family (/ds/<bucket>/, /streams/, /v1/stream/).

Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.http.helpers import TEXT, assert_error, uid
from tests.server import RillProcess

JSON_CT = {"content-type": "application/json"}
BINARY = {"content-type": "application/octet-stream"}
OFFSET = re.compile(r"^\d{16}_\d{16}$")
ZERO = "0000000000000000_0000000000000000"
FAMILIES = ["ds", "legacy", "compat"]


# ------------------------------------------------------------------------------------------------
# Helpers


def assert_get_error(client: httpx.Client, url: str, status: int) -> None:
    """Like assert_error for a GET that might wrongly open an SSE stream: fail at once instead of waiting on it."""
    with client.stream("GET", url, timeout=5) as resp:
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            pytest.fail(f"GET {url}: expected {status}, got {resp.status_code} with an SSE stream")
        resp.read()
    assert_error(resp, status)


def read_all(client: httpx.Client, path: str) -> bytes:
    resp = client.get(path, params={"offset": "-1"})
    assert resp.status_code == 200, resp.text
    return resp.content


def assert_unchanged(client: httpx.Client, path: str, expected: bytes) -> None:
    assert read_all(client, path) == expected


def tail_of(client: httpx.Client, path: str) -> str:
    resp = client.head(path)
    assert resp.status_code == 200
    return resp.headers["stream-next-offset"]


def producer(pid: str, epoch: int | str, seq: int | str) -> dict[str, str]:
    return {"producer-id": pid, "producer-epoch": str(epoch), "producer-seq": str(seq)}


def create(client: httpx.Client, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> httpx.Response:
    resp = client.put(path, headers=TEXT if headers is None else headers, content=body)
    assert resp.status_code == 201, resp.text
    return resp


@pytest.fixture(scope="module")
def ds_bucket(rill: RillProcess) -> str:
    name = "proto-" + uid()
    assert httpx.put(f"{rill.url}/ds/{name}").status_code == 201
    return name


def family_base(family: str, bucket: str) -> str:
    return {"ds": f"/ds/{bucket}/", "legacy": "/streams/", "compat": "/v1/stream/"}[family]


@pytest.fixture(params=FAMILIES)
def base(request: pytest.FixtureRequest, ds_bucket: str) -> str:
    return family_base(request.param, ds_bucket)


@pytest.fixture()
def path(base: str) -> str:
    """A fresh stream path (not yet created) in the family under test."""
    return f"{base}s-{uid()}"


# ------------------------------------------------------------------------------------------------
# Happy paths


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


# ------------------------------------------------------------------------------------------------
# PUT errors


def test_put_config_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, b"keep")
    assert_error(client.put(path, headers=JSON_CT), 409)
    assert_error(client.put(path, headers=BINARY), 409)
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": "3600"}), 409)
    assert_error(client.put(path, headers={**TEXT, "stream-expires-at": "2099-01-01T00:00:00Z"}), 409)
    assert client.head(path).headers["content-type"] == "text/plain"
    assert "stream-ttl" not in client.head(path).headers
    assert_unchanged(client, path, b"keep")


def test_put_ttl_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, headers={**TEXT, "stream-ttl": "3600"})
    assert client.head(path).headers["stream-ttl"] == "3600"
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": "7200"}), 409)
    assert_error(client.put(path, headers=TEXT), 409)
    assert client.put(path, headers={**TEXT, "stream-ttl": "3600"}).status_code == 200
    assert client.head(path).headers["stream-ttl"] == "3600"


@pytest.mark.parametrize("ttl", ["abc", "-1", "00060", "+60", "60.5", "1e3", "", "99999999999999999999"])
def test_invalid_stream_ttl_is_400(client: httpx.Client, path: str, ttl: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": ttl}), 400)
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "expires",
    ["not-a-timestamp", "2025-01-01", "2025-01-01T12:34:56", "2025-13-01T00:00:00Z", "2025-02-30T00:00:00Z", ""],
)
def test_invalid_stream_expires_at_is_400(client: httpx.Client, path: str, expires: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-expires-at": expires}), 400)
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "expires", ["2099-01-01T12:34:56.789Z", "2099-01-01T12:34:56.789+00:00", "2099-01-01T12:34:56Z"]
)
def test_valid_stream_expires_at_is_accepted(client: httpx.Client, path: str, expires: str) -> None:
    assert client.put(path, headers={**TEXT, "stream-expires-at": expires}).status_code == 201
    assert client.put(path, headers={**TEXT, "stream-expires-at": expires}).status_code == 200


def test_ttl_and_expires_at_together_is_400(client: httpx.Client, path: str) -> None:
    headers = {**TEXT, "stream-ttl": "3600", "stream-expires-at": "2099-01-01T00:00:00Z"}
    assert_error(client.put(path, headers=headers), 400)
    assert client.head(path).status_code == 404


def test_put_invalid_json_body_is_400(client: httpx.Client, path: str) -> None:
    assert_error(client.put(path, headers=JSON_CT, content=b"{ invalid json }"), 400)
    assert client.head(path).status_code == 404


def test_put_bad_stream_closed_value_is_400(client: httpx.Client, path: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-closed": "maybe"}), 400)
    assert client.head(path).status_code == 404


# ------------------------------------------------------------------------------------------------
# POST errors


def test_post_content_type_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, b"text")
    assert_error(client.post(path, headers=JSON_CT, content=b'{"x":1}'), 409)
    assert_error(client.post(path, headers=BINARY, content=b"bin"), 409)
    assert_error(client.post(path, headers={**JSON_CT, **producer("p", 0, 0)}, content=b'{"x":1}'), 409)
    assert_unchanged(client, path, b"text")
    # Case and parameters do not matter.
    assert client.post(path, headers={"content-type": "TEXT/PLAIN; charset=utf-8"}, content=b"!").status_code == 204
    assert_unchanged(client, path, b"text!")


def test_post_empty_body_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    assert_error(client.post(path, headers=TEXT, content=b""), 400)
    assert_error(client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b""), 400)
    assert_error(client.post(path, headers={**TEXT, "stream-closed": "false"}, content=b""), 400)
    assert_unchanged(client, path, b"data")
    assert "stream-closed" not in client.head(path).headers


def test_post_missing_content_type_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    resp = client.post(path, content=b"more")
    assert "content-type" not in resp.request.headers
    assert_error(resp, 400)
    assert_unchanged(client, path, b"data")


def test_post_invalid_json_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b'{"ok":true}', JSON_CT)
    for bad in [b"{ invalid json }", b'[{"a":1},', b"[1,]", b"nul", b'{"a":1} {"b":2}']:
        assert_error(client.post(path, headers=JSON_CT, content=bad), 400)
    assert_error(client.post(path, headers={**JSON_CT, **producer("p", 0, 0)}, content=b"{bad"), 400)
    assert_unchanged(client, path, b'[{"ok":true}]')
    # The producer was not registered by the rejected request: seq 0 is still fresh.
    assert client.post(path, headers={**JSON_CT, **producer("p", 0, 0)}, content=b"1").status_code == 200


def test_json_empty_array_post_is_400_but_put_is_ok(client: httpx.Client, path: str) -> None:
    put = client.put(path, headers=JSON_CT, content=b"[]")
    assert put.status_code == 201
    assert read_all(client, path) == b"[]"
    assert_error(client.post(path, headers=JSON_CT, content=b"[]"), 400)
    assert_error(client.post(path, headers={**JSON_CT, **producer("p", 0, 0)}, content=b"[ ]"), 400)
    assert read_all(client, path) == b"[]"
    assert client.head(path).headers["stream-next-offset"] == put.headers["stream-next-offset"]


def test_json_offset_inside_a_message_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b'{"a":"xxxxxxxx"}', JSON_CT)
    assert_error(client.get(path, params={"offset": "0000000000000000_0000000000000003"}), 400)


def test_stream_seq_regression_is_409(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, "stream-seq": "001"}, content=b"a").status_code == 204
    assert client.post(path, headers={**TEXT, "stream-seq": "002"}, content=b"b").status_code == 204
    assert_error(client.post(path, headers={**TEXT, "stream-seq": "001"}, content=b"x"), 409)
    assert_error(client.post(path, headers={**TEXT, "stream-seq": "002"}, content=b"x"), 409)
    assert_error(client.post(path, headers={**TEXT, "stream-seq": "0019"}, content=b"x"), 409)  # "0019" < "002"
    assert_unchanged(client, path, b"ab")


def test_stream_seq_is_lexicographic(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, "stream-seq": "2"}, content=b"a").status_code == 204
    assert_error(client.post(path, headers={**TEXT, "stream-seq": "10"}, content=b"x"), 409)
    assert client.post(path, headers={**TEXT, "stream-seq": "3"}, content=b"b").status_code == 204
    assert_error(client.post(path, headers={**TEXT, "stream-seq": ""}, content=b"x"), 400)
    assert_unchanged(client, path, b"ab")


def test_post_to_missing_stream_is_404(client: httpx.Client, path: str) -> None:
    assert_error(client.post(path, headers=TEXT, content=b"x"), 404)
    assert_error(client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b"x"), 404)
    assert_error(client.post(path, headers={"stream-closed": "true"}), 404)
    assert client.head(path).status_code == 404


def test_post_bad_stream_closed_value_is_400(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    assert_error(client.post(path, headers={"stream-closed": "yes"}), 400)
    assert_error(client.post(path, headers={**TEXT, "stream-closed": "1"}, content=b"x"), 400)
    assert_unchanged(client, path, b"data")
    assert "stream-closed" not in client.head(path).headers


# ------------------------------------------------------------------------------------------------
# Idempotent producers

PARTIAL_PRODUCERS = [
    pytest.param({"producer-id": "p"}, id="id-only"),
    pytest.param({"producer-epoch": "0"}, id="epoch-only"),
    pytest.param({"producer-seq": "0"}, id="seq-only"),
    pytest.param({"producer-id": "p", "producer-epoch": "0"}, id="id-epoch"),
    pytest.param({"producer-id": "p", "producer-seq": "0"}, id="id-seq"),
    pytest.param({"producer-epoch": "0", "producer-seq": "0"}, id="epoch-seq"),
    pytest.param(producer("", 0, 0), id="empty-id"),
    pytest.param(producer("p" * 257, 0, 0), id="id-too-long"),
]


@pytest.mark.parametrize("headers", PARTIAL_PRODUCERS)
def test_partial_or_empty_producer_headers_are_400(client: httpx.Client, path: str, headers: dict[str, str]) -> None:
    create(client, path, b"data")
    assert_error(client.post(path, headers={**TEXT, **headers}, content=b"x"), 400)
    assert_unchanged(client, path, b"data")
    # Also before the stream-existence check.
    assert_error(client.post(f"{path}-missing", headers={**TEXT, **headers}, content=b"x"), 400)


@pytest.mark.parametrize("bad", ["1abc", "0xyz", "1e3", "-1", "+1", "1.0", "", "9007199254740992"])
@pytest.mark.parametrize("field", ["epoch", "seq"])
def test_producer_bad_integers_are_400(client: httpx.Client, path: str, field: str, bad: str) -> None:
    create(client, path, b"data")
    headers = producer("p", 0, 0)
    headers[f"producer-{field}"] = bad
    assert_error(client.post(path, headers={**TEXT, **headers}, content=b"x"), 400)
    assert_unchanged(client, path, b"data")


def test_producer_accept_and_duplicate(client: httpx.Client, path: str) -> None:
    create(client, path)
    offsets = []
    for seq, chunk in enumerate([b"a", b"b", b"c"]):
        resp = client.post(path, headers={**TEXT, **producer("p", 0, seq)}, content=chunk)
        assert resp.status_code == 200, resp.text
        assert resp.headers["producer-epoch"] == "0"
        assert resp.headers["producer-seq"] == str(seq)
        assert OFFSET.match(resp.headers["stream-next-offset"])
        offsets.append(resp.headers["stream-next-offset"])
    assert offsets == sorted(offsets)

    dup = client.post(path, headers={**TEXT, **producer("p", 0, 1)}, content=b"b")
    assert dup.status_code == 204
    assert dup.content == b""
    assert dup.headers["producer-seq"] == "2"  # the highest accepted, not the request's
    assert dup.headers["producer-epoch"] == "0"
    dup_last = client.post(path, headers={**TEXT, **producer("p", 0, 2)}, content=b"c")
    assert dup_last.status_code == 204
    assert dup_last.headers["producer-seq"] == "2"
    assert_unchanged(client, path, b"abc")

    nxt = client.post(path, headers={**TEXT, **producer("p", 0, 3)}, content=b"d")
    assert nxt.status_code == 200
    assert_unchanged(client, path, b"abcd")


def test_producers_are_independent(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("A", 0, 0)}, content=b"A0").status_code == 200
    assert client.post(path, headers={**TEXT, **producer("B", 0, 0)}, content=b"B0").status_code == 200
    assert client.post(path, headers={**TEXT, **producer("A", 0, 1)}, content=b"A1").status_code == 200
    assert_unchanged(client, path, b"A0B0A1")


def test_producer_duplicate_is_checked_before_stream_seq(client: httpx.Client, path: str) -> None:
    create(client, path)
    headers = {**TEXT, **producer("p", 0, 0), "stream-seq": "app-seq-001"}
    assert client.post(path, headers=headers, content=b"once").status_code == 200
    assert client.post(path, headers=headers, content=b"once").status_code == 204
    assert_unchanged(client, path, b"once")


def test_producer_stale_epoch_is_403(client: httpx.Client, path: str) -> None:
    create(client, path)
    ok = client.post(path, headers={**TEXT, **producer("p", 1, 0)}, content=b"e1")
    assert ok.status_code == 200 and ok.headers["producer-epoch"] == "1"
    for seq in (0, 1):
        resp = client.post(path, headers={**TEXT, **producer("p", 0, seq)}, content=b"zombie")
        assert_error(resp, 403)
        assert resp.headers["producer-epoch"] == "1"
    assert_unchanged(client, path, b"e1")


def test_producer_sequence_gap_is_409(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b"a").status_code == 200
    resp = client.post(path, headers={**TEXT, **producer("p", 0, 2)}, content=b"c")
    assert_error(resp, 409)
    assert resp.headers["producer-expected-seq"] == "1"
    assert resp.headers["producer-received-seq"] == "2"
    fresh = client.post(path, headers={**TEXT, **producer("q", 0, 5)}, content=b"q")
    assert_error(fresh, 409)
    assert fresh.headers["producer-expected-seq"] == "0"
    assert fresh.headers["producer-received-seq"] == "5"
    assert_unchanged(client, path, b"a")
    assert client.post(path, headers={**TEXT, **producer("p", 0, 1)}, content=b"b").status_code == 200
    assert_unchanged(client, path, b"ab")


def test_producer_epoch_bump_with_nonzero_seq_is_400(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b"a").status_code == 200
    assert_error(client.post(path, headers={**TEXT, **producer("p", 1, 5)}, content=b"x"), 400)
    assert_unchanged(client, path, b"a")
    bumped = client.post(path, headers={**TEXT, **producer("p", 1, 0)}, content=b"b")
    assert bumped.status_code == 200
    assert bumped.headers["producer-epoch"] == "1" and bumped.headers["producer-seq"] == "0"
    assert_unchanged(client, path, b"ab")


# ------------------------------------------------------------------------------------------------
# Closing


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


# ------------------------------------------------------------------------------------------------
# Read errors


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


# ------------------------------------------------------------------------------------------------
# Conditional GET


def test_etag_and_if_none_match(client: httpx.Client, path: str) -> None:
    create(client, path, b"v1")
    first = client.get(path, params={"offset": "-1"})
    tag = first.headers["etag"]
    assert tag
    not_modified = client.get(path, params={"offset": "-1"}, headers={"if-none-match": tag})
    assert not_modified.status_code == 304
    assert not_modified.content == b""
    wrong = client.get(path, params={"offset": "-1"}, headers={"if-none-match": '"wrong-etag"'})
    assert wrong.status_code == 200 and wrong.content == b"v1"
    assert client.post(path, headers=TEXT, content=b"v2").status_code == 204
    after = client.get(path, params={"offset": "-1"}, headers={"if-none-match": tag})
    assert after.status_code == 200
    assert after.content == b"v1v2"
    assert after.headers["etag"] != tag


# ------------------------------------------------------------------------------------------------
# Long-poll


def test_long_poll_times_out_with_204(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"data").headers["stream-next-offset"]
    started = time.monotonic()
    resp = client.get(path, params={"offset": tail, "live": "long-poll"})
    elapsed = time.monotonic() - started
    assert resp.status_code == 204
    assert resp.content == b""
    assert 0.5 < elapsed < 5
    assert re.fullmatch(r"\d+", resp.headers["stream-cursor"])
    assert resp.headers["stream-up-to-date"] == "true"
    assert resp.headers["stream-next-offset"] == tail
    assert resp.headers["x-content-type-options"] == "nosniff"
    # The 204 offset is a resume point.
    assert client.post(path, headers=TEXT, content=b"+new").status_code == 204
    assert client.get(path, params={"offset": resp.headers["stream-next-offset"]}).content == b"+new"


def test_long_poll_with_data_is_immediate_and_cursor_advances(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    first = client.get(path, params={"offset": "-1", "live": "long-poll"})
    assert first.status_code == 200 and first.content == b"data"
    cursor = first.headers["stream-cursor"]
    assert re.fullmatch(r"\d+", cursor)
    assert first.headers["stream-up-to-date"] == "true"
    second = client.get(path, params={"offset": "-1", "live": "long-poll", "cursor": cursor})
    assert second.status_code == 200
    assert int(second.headers["stream-cursor"]) > int(cursor)


def test_long_poll_wakes_on_append(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"old").headers["stream-next-offset"]

    def append_later() -> None:
        time.sleep(0.2)
        client.post(path, headers=TEXT, content=b"new")

    writer = threading.Thread(target=append_later)
    writer.start()
    try:
        resp = client.get(path, params={"offset": tail, "live": "long-poll"})
    finally:
        writer.join()
    assert resp.status_code == 200
    assert resp.content == b"new"
    assert resp.headers["stream-up-to-date"] == "true"
    assert re.fullmatch(r"\d+", resp.headers["stream-cursor"])


def test_long_poll_on_closed_stream_returns_at_once(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    final = client.post(path, headers={"stream-closed": "true"}).headers["stream-next-offset"]
    started = time.monotonic()
    resp = client.get(path, params={"offset": final, "live": "long-poll"})
    assert time.monotonic() - started < 0.8
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"
    assert resp.headers["stream-up-to-date"] == "true"
    assert resp.headers["stream-next-offset"] == final


# ------------------------------------------------------------------------------------------------
# SSE


def _parse_block(block: str) -> tuple[str, str] | None:
    event, data = None, []
    for line in block.split("\n"):
        if line.startswith(":"):
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if event is None or not data:
        return None
    return event, "\n".join(data)


def read_sse(
    client: httpx.Client, url: str, until: Callable[[str, str], bool] | None = None, timeout: float = 5.0
) -> tuple[httpx.Response, list[tuple[str, str]], str, bool]:
    """GETs an SSE URL; returns (response, [(event, data)], raw text, whether the server ended the body).

    Stops early once `until(event, data)` is true for a received event.
    """
    events: list[tuple[str, str]] = []
    raw = ""
    with client.stream("GET", url, timeout=timeout) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp, events, resp.text, True
        buffer = ""
        for text in resp.iter_text():
            raw += text
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                parsed = _parse_block(block)
                if parsed is None:
                    continue
                events.append(parsed)
                if until is not None and until(*parsed):
                    return resp, events, raw, False
    return resp, events, raw, True


def _up_to_date(event: str, data: str) -> bool:
    return event == "control" and "upToDate" in data


def assert_data_control_pairs(events: list[tuple[str, str]]) -> None:
    for i, (event, _) in enumerate(events):
        assert event in ("data", "control"), events
        if event == "data":
            assert i + 1 < len(events) and events[i + 1][0] == "control", events


def test_sse_text_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b"line1\nline2")
    assert client.post(path, headers=TEXT, content=b"\nline3").status_code == 204
    tail = tail_of(client, path)
    resp, events, raw, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert "no-cache" in resp.headers["cache-control"]
    assert "content-length" not in resp.headers
    assert "stream-sse-data-encoding" not in resp.headers
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert "\r" not in raw
    assert raw.startswith("event: data\n")
    assert "data:line1\n" in raw and "data:line3\n" in raw
    assert_data_control_pairs(events)
    assert "".join(d for e, d in events if e == "data") == "line1\nline2\nline3"
    controls = [json.loads(d) for e, d in events if e == "control"]
    last = controls[-1]
    assert last["streamNextOffset"] == tail
    assert last["upToDate"] is True
    assert re.fullmatch(r"\d+", last["streamCursor"])
    assert "streamClosed" not in last
    assert all("upToDate" not in c for c in controls[:-1])
    assert re.search(r"event: control\n(data:\{[^}]+\})\n\n", raw)


def test_sse_empty_stream_and_offset_now(client: httpx.Client, path: str) -> None:
    tail = create(client, path).headers["stream-next-offset"]
    for offset in ("-1", "now"):
        _, events, _, _ = read_sse(client, f"{path}?offset={offset}&live=sse", _up_to_date)
        assert [e for e, _ in events] == ["control"]
        control = json.loads(events[0][1])
        assert control["upToDate"] is True
        assert control["streamNextOffset"] == tail


def test_sse_json_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b'[{"n":1}]', JSON_CT)
    assert client.post(path, headers=JSON_CT, content=b'{"n":2}').status_code == 204
    resp, events, _, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert "stream-sse-data-encoding" not in resp.headers
    assert_data_control_pairs(events)
    values = [v for e, d in events if e == "data" for v in json.loads(d)]
    assert values == [{"n": 1}, {"n": 2}]


def test_sse_binary_stream_is_base64(client: httpx.Client, path: str) -> None:
    payload = b"\x00\x01\n\r\xffHello"
    create(client, path, payload, BINARY)
    tail = tail_of(client, path)
    resp, events, _, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert resp.status_code == 200
    assert resp.headers["stream-sse-data-encoding"] == "base64"
    assert resp.headers["content-type"] == "text/event-stream"
    assert_data_control_pairs(events)
    decoded = b""
    for event, data in events:
        if event == "data":
            assert len(data) % 4 == 0
            decoded += base64.b64decode(data, validate=True)
    assert decoded == payload
    control = json.loads(events[-1][1])
    assert control["streamNextOffset"] == tail and control["upToDate"] is True


def test_sse_closed_stream_ends_the_response(client: httpx.Client, path: str) -> None:
    create(client, path, b"bye", {**TEXT, "stream-closed": "true"})
    tail = tail_of(client, path)
    resp, events, raw, ended = read_sse(client, f"{path}?offset=-1&live=sse")
    assert resp.status_code == 200
    assert ended, "the server must end the SSE body after the closing control event"
    assert events[0] == ("data", "bye")
    assert events[-1][0] == "control"
    last = json.loads(events[-1][1])
    assert last["streamClosed"] is True
    assert last["streamNextOffset"] == tail
    assert "streamCursor" not in last
    assert raw.endswith("\n\n")
    # At the tail of a closed stream: just the closing control, then the end.
    _, events, _, ended = read_sse(client, f"{path}?offset={tail}&live=sse")
    assert ended
    assert [e for e, _ in events] == ["control"]
    assert json.loads(events[0][1])["streamClosed"] is True


def test_sse_live_append_then_close(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"initial").headers["stream-next-offset"]

    def close_later() -> None:
        time.sleep(0.2)
        client.post(path, headers={**TEXT, "stream-closed": "true"}, content=b"final")

    writer = threading.Thread(target=close_later)
    writer.start()
    try:
        _, events, _, ended = read_sse(client, f"{path}?offset={tail}&live=sse")
    finally:
        writer.join()
    assert ended
    assert "".join(d for e, d in events if e == "data") == "final"
    assert json.loads(events[-1][1])["streamClosed"] is True


# ------------------------------------------------------------------------------------------------
# Forks


def test_fork_happy_path(client: httpx.Client, base: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    mid = create(client, src, b"first").headers["stream-next-offset"]
    assert client.post(src, headers=TEXT, content=b"second").status_code == 204
    resp = client.put(fork, headers={"stream-forked-from": src, "stream-fork-offset": mid})
    assert resp.status_code == 201, resp.text
    assert resp.headers["content-type"] == "text/plain"
    assert "stream-forked-from" not in resp.headers
    assert client.post(fork, headers=TEXT, content=b"+fork").status_code == 204
    assert read_all(client, fork) == b"first+fork"
    assert read_all(client, src) == b"firstsecond"
    again = client.put(fork, headers={"stream-forked-from": src, "stream-fork-offset": mid})
    assert again.status_code == 200


def test_fork_missing_source_is_404(client: httpx.Client, base: str) -> None:
    fork = f"{base}fork-{uid()}"
    assert_error(client.put(fork, headers={**TEXT, "stream-forked-from": f"{base}nonexistent-{uid()}"}), 404)
    assert client.head(fork).status_code == 404


@pytest.mark.parametrize(
    "offset",
    ["9999999999999999_9999999999999999", "0000000000000000_0000000000000099", "abc", "0_1", ""],
)
def test_fork_bad_offset_is_400(client: httpx.Client, base: str, offset: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    create(client, src, b"data")
    assert_error(client.put(fork, headers={**TEXT, "stream-forked-from": src, "stream-fork-offset": offset}), 400)
    assert client.head(fork).status_code == 404
    assert_unchanged(client, src, b"data")


def test_fork_offset_inside_json_message_is_400(client: httpx.Client, base: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    create(client, src, b'{"a":"xxxx"}', JSON_CT)
    headers = {"stream-forked-from": src, "stream-fork-offset": "0000000000000000_0000000000000002"}
    assert_error(client.put(fork, headers=headers), 400)
    assert client.head(fork).status_code == 404


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({"stream-fork-sub-offset": "1"}, id="sub-offset"),
        pytest.param({"stream-fork-sub-offset": "0"}, id="sub-offset-zero"),
        pytest.param({"stream-fork-offset": ZERO}, id="fork-offset"),
    ],
)
def test_fork_offsets_without_fork_source_are_400(client: httpx.Client, path: str, headers: dict[str, str]) -> None:
    assert_error(client.put(path, headers={**TEXT, **headers}), 400)
    assert client.head(path).status_code == 404


@pytest.mark.parametrize("sub", ["-1", "abc", "1.5", "05", "+1", "6"])
def test_fork_bad_sub_offset_is_400(client: httpx.Client, base: str, sub: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    create(client, src, b"hello")
    headers = {"stream-forked-from": src, "stream-fork-offset": ZERO, "stream-fork-sub-offset": sub}
    assert_error(client.put(fork, headers=headers), 400)
    assert client.head(fork).status_code == 404


def test_fork_content_type_mismatch_is_409_and_leaks_no_reference(client: httpx.Client, base: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    create(client, src, b"text")
    assert_error(client.put(fork, headers={**JSON_CT, "stream-forked-from": src}), 409)
    assert client.head(fork).status_code == 404
    assert_unchanged(client, src, b"text")
    # No fork holds the source: deleting it is a hard delete.
    assert client.delete(src).status_code == 204
    assert client.head(src).status_code == 404


def test_fork_onto_existing_stream_with_other_config_is_409(client: httpx.Client, base: str) -> None:
    src, target = f"{base}src-{uid()}", f"{base}target-{uid()}"
    create(client, src, b"text")
    create(client, target, b'{"x":1}', JSON_CT)
    assert_error(client.put(target, headers={**TEXT, "stream-forked-from": src}), 409)
    assert_unchanged(client, target, b'[{"x":1}]')


def test_soft_deleted_source_is_410(client: httpx.Client, base: str) -> None:
    src, fork = f"{base}src-{uid()}", f"{base}fork-{uid()}"
    create(client, src, b"preserved")
    assert client.put(fork, headers={"stream-forked-from": src}).status_code == 201
    assert client.delete(src).status_code == 204

    assert client.head(src).status_code == 410
    assert_error(client.get(src), 410)
    assert_error(client.get(f"{src}?offset=-1&live=long-poll"), 410)
    assert_get_error(client, f"{src}?offset=-1&live=sse", 410)
    assert_error(client.post(src, headers=TEXT, content=b"x"), 410)
    assert_error(client.post(src, headers={"stream-closed": "true"}), 410)
    assert_error(client.delete(src), 410)
    assert_error(client.put(src, headers=TEXT), 409)
    assert_error(client.put(f"{base}fork2-{uid()}", headers={"stream-forked-from": src}), 409)

    assert read_all(client, fork) == b"preserved"
    # Deleting the last fork collects the source.
    assert client.delete(fork).status_code == 204
    deadline = time.monotonic() + 3
    while client.head(src).status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.head(src).status_code == 404
    create(client, src, b"fresh")
    assert read_all(client, src) == b"fresh"


# ------------------------------------------------------------------------------------------------
# Body size limit and SSE keep-alives (a separate server: --max-body-bytes 1024, SSE pings every 0.2 s)

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
