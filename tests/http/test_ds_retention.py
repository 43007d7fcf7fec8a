"""HTTP tests for /ds stream retention: discarding history before an offset, and forks of trimmed streams.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import httpx
import pytest

from tests.http.ds_helpers import create, off, parse_multipart, read
from tests.http.helpers import TEXT, ZERO, assert_error, uid


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def test_retention_discards_history_before_an_offset(client: httpx.Client, path: str) -> None:
    _, o1, o2, o3 = create(client, path, b"a", b"bb", b"ccc")
    put = client.put(f"{path}/retention/{o1}")
    assert put.status_code == 204, put.text
    assert put.headers["stream-earliest-offset"] == o1

    gone = client.get(path, params={"offset": ZERO})
    assert_error(gone, 410)
    assert gone.headers["stream-earliest-offset"] == o1
    assert read(client, path).content == b"bbccc"  # -1: the earliest retained offset
    assert read(client, path, o1).content == b"bbccc"
    assert read(client, path, o2).content == b"ccc"
    head = client.head(path)
    assert head.headers["stream-earliest-offset"] == o1
    assert head.headers["stream-next-offset"] == o3

    again = client.put(f"{path}/retention/{o1}")
    assert again.status_code == 204
    assert again.headers["stream-earliest-offset"] == o1

    backwards = client.put(f"{path}/retention/{ZERO}")
    assert_error(backwards, 409)
    assert backwards.headers["stream-earliest-offset"] == o1

    inside = off(int(o2[17:]) + 1)  # inside "ccc"
    assert_error(client.put(f"{path}/retention/{inside}"), 400)
    assert_error(client.put(f"{path}/retention/{off(int(o3[17:]) + 1)}"), 409)
    assert client.head(path).headers["stream-earliest-offset"] == o1

    # Snapshots before the retained history are refused; at or after it are fine.
    early = client.put(f"{path}/snapshot/{ZERO}", content=b"s")
    assert_error(early, 410)
    assert early.headers["stream-earliest-offset"] == o1
    assert client.put(f"{path}/snapshot/{o1}", content=b"s").status_code == 201

    # Bootstrap after retention starts at the snapshot at the earliest offset.
    boot = client.get(f"{path}/bootstrap")
    assert parse_multipart(boot) == [("application/octet-stream", b"s"), ("text/plain", b"bb"), ("text/plain", b"ccc")]


def test_retention_without_a_snapshot_bootstrap_starts_at_the_earliest(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"old", b"new")
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    boot = client.get(f"{path}/bootstrap")
    assert boot.headers["stream-snapshot-offset"] == "-1"
    assert boot.headers["stream-next-offset"] == o2
    assert parse_multipart(boot)[1:] == [("text/plain", b"new")]


def test_retention_may_not_pass_the_latest_snapshot(client: httpx.Client, path: str) -> None:
    _, o1, o2, o3 = create(client, path, b"a", b"b", b"c")
    assert client.put(f"{path}/snapshot/{o1}", content=b"s1").status_code == 201
    assert_error(client.put(f"{path}/retention/{o2}"), 409)
    assert client.head(path).headers["stream-earliest-offset"] == ZERO
    assert read(client, path, ZERO).content == b"abc"
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    # A newer snapshot lets retention move on, up to it.
    assert client.put(f"{path}/snapshot/{o3}", content=b"s3").status_code == 201
    moved = client.put(f"{path}/retention/{o3}")
    assert moved.status_code == 204
    assert moved.headers["stream-earliest-offset"] == o3
    empty = read(client, path)
    assert empty.content == b""
    assert empty.headers["stream-up-to-date"] == "true"
    assert_error(client.get(path, params={"offset": o2}), 410)


def test_retention_to_the_tail_without_snapshot(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"x", b"y")
    assert client.put(f"{path}/retention/{o2}").status_code == 204
    assert read(client, path).content == b""
    assert_error(client.get(path, params={"offset": o1}), 410)
    assert client.post(path, headers=TEXT, content=b"z").status_code == 204
    assert read(client, path).content == b"z"
    assert read(client, path, o2).content == b"z"


def test_fork_before_the_source_earliest_is_400(client: httpx.Client, bucket: str, path: str) -> None:
    _, o1, o2 = create(client, path, b"aa", b"bb")
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    fork = f"/ds/{bucket}/f-{uid()}"
    bad = client.put(fork, headers={"stream-forked-from": path, "stream-fork-offset": ZERO})
    assert_error(bad, 400)
    assert client.head(fork).status_code == 404
    ok = client.put(fork, headers={"stream-forked-from": path, "stream-fork-offset": o2})
    assert ok.status_code == 201, ok.text
    assert ok.headers["stream-next-offset"] == o2


def test_fork_at_minus_one_of_a_trimmed_source_starts_at_its_earliest(
    client: httpx.Client, bucket: str, path: str
) -> None:
    """-1 is where a read of -1 starts: what the source still has (it was offset 0, refused as gone)."""
    _, o1, o2 = create(client, path, b"aa", b"bb")
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    fork = f"/ds/{bucket}/f-{uid()}"
    made = client.put(fork, headers={"stream-forked-from": path, "stream-fork-offset": "-1"})
    assert made.status_code == 201, made.text
    assert made.headers["stream-next-offset"] == o1
    assert client.post(fork, content=b"cc", headers=TEXT).status_code in (200, 204)
    assert read(client, fork).content == b"cc"
    assert client.head(fork).headers["stream-earliest-offset"] == o1
    sub = f"/ds/{bucket}/f-{uid()}"  # and a sub-offset into the earliest record
    made = client.put(
        sub, headers={"stream-forked-from": path, "stream-fork-offset": "-1", "stream-fork-sub-offset": "1"}
    )
    assert made.status_code == 201, made.text
    assert read(client, sub).content == b"b"
    assert read(client, path).content == b"bb"  # the source is as it was


def test_fork_of_a_trimmed_source_reports_its_history_as_gone(client: httpx.Client, bucket: str, path: str) -> None:
    _, o1, o2 = create(client, path, b"aaa", b"bbb")
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    fork = f"/ds/{bucket}/f-{uid()}"
    assert client.put(fork, headers={"stream-forked-from": path, "stream-fork-offset": o2}).status_code == 201
    assert read(client, fork).content == b"bbb"
    assert client.head(fork).headers["stream-earliest-offset"] == o1
    assert_error(client.get(fork, params={"offset": ZERO}), 410)


def test_head_reports_automatic_retention(client: httpx.Client, path: str) -> None:
    assert client.put(path, headers={**TEXT, "stream-retention": "max-bytes=1000, max-age=60"}).status_code == 201
    assert client.head(path).headers["stream-retention"] == "max-age=60, max-bytes=1000"
    other = path + "-plain"
    assert client.put(other, headers=TEXT).status_code == 201
    assert "stream-retention" not in client.head(other).headers
