"""POST errors: content type, empty and invalid bodies, Stream-Seq, missing streams.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx

from tests.http.helpers import BINARY, JSON_CT, TEXT, assert_error, assert_unchanged, create, producer, read_all


def test_post_content_type_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, b"text")
    assert_error(client.post(path, headers=JSON_CT, content=b'{"x":1}'), 409)
    assert_error(client.post(path, headers=BINARY, content=b"bin"), 409)
    assert_error(client.post(path, headers={**JSON_CT, **producer("p", 0, 0)}, content=b'{"x":1}'), 409)
    # Whatever the JSON body holds: the stream's content type is checked first, as the reference does.
    for body in (b"{not json", b"[]", b"\xff"):
        assert_error(client.post(path, headers=JSON_CT, content=body), 409)
    assert_unchanged(client, path, b"text")
    assert_error(client.post(path + "-missing", headers=JSON_CT, content=b"{not json"), 404)
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
