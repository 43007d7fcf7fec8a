"""Forks: happy path, missing and deleted sources, fork offsets and content types.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.http.helpers import (
    JSON_CT,
    TEXT,
    ZERO,
    assert_error,
    assert_get_error,
    assert_unchanged,
    create,
    read_all,
    uid,
)


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


def test_a_json_fork_sub_offset_counts_messages_up_to_a_cap(client: httpx.Client, base: str) -> None:
    src, fork, far = f"{base}src-{uid()}", f"{base}fork-{uid()}", f"{base}far-{uid()}"
    create(client, src, b"[" + b", ".join(b"%d" % i for i in range(20_000)) + b"]", JSON_CT)
    headers = {"stream-forked-from": src, "stream-fork-offset": ZERO}
    assert client.put(fork, headers={**headers, "stream-fork-sub-offset": "3"}).status_code == 201
    assert client.get(fork, params={"offset": "-1"}).json() == [0, 1, 2]
    # Past 10,000 messages a sub-offset is refused before it is proposed: each node's apply finds them.
    assert_error(client.put(far, headers={**headers, "stream-fork-sub-offset": "10001"}), 400)
    assert client.head(far).status_code == 404
