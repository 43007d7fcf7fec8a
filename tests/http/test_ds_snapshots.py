"""HTTP tests for /ds stream snapshots: publish, fetch, latest, compare-and-set, delete, limits.

Also the offset tokens that /snapshot/<offset> and /retention/<offset> accept.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.http.ds_helpers import (
    DIGEST,
    SIXTY_FOUR_MIB,
    create,
    declared_only,
    off,
    parse_multipart,
    read,
    sha,
    snapshot_files,
    tail,
)
from tests.http.helpers import JSON_CT, TEXT, ZERO, assert_error, uid
from tests.server import RillProcess


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def test_snapshot_publish_fetch_idempotent_and_conflict(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"aaa", b"bbb")
    blob = b'{"state": "after aaa"}'
    put = client.put(f"{path}/snapshot/{o1}", headers={"content-type": "application/x-state"}, content=blob)
    assert put.status_code == 201, put.text
    assert put.headers["stream-snapshot-offset"] == o1
    assert put.headers["stream-snapshot-digest"] == sha(blob)
    assert put.headers["stream-next-offset"] == o2

    again = client.put(f"{path}/snapshot/{o1}", headers={"content-type": "application/x-state"}, content=blob)
    assert again.status_code == 204, again.text
    assert again.content == b""
    assert again.headers["stream-snapshot-offset"] == o1
    assert again.headers["stream-snapshot-digest"] == sha(blob)
    assert again.headers["stream-next-offset"] == o2

    assert_error(client.put(f"{path}/snapshot/{o1}", content=b"other bytes"), 409)

    got = client.get(f"{path}/snapshot/{o1}")
    assert got.status_code == 200
    assert got.content == blob
    assert got.headers["content-type"] == "application/x-state"
    assert got.headers["stream-snapshot-offset"] == o1
    assert got.headers["stream-snapshot-digest"] == sha(blob)
    assert got.headers["stream-next-offset"] == o2

    for tag in (got.headers["etag"], "W/" + got.headers["etag"], '"other", ' + got.headers["etag"]):
        cached = client.get(f"{path}/snapshot/{o1}", headers={"if-none-match": tag})
        assert cached.status_code == 304 and cached.content == b"", tag
        assert cached.headers["etag"] == got.headers["etag"]
    assert client.get(f"{path}/snapshot/{o1}", headers={"if-none-match": '"other"'}).content == blob

    head = client.head(f"{path}/snapshot/{o1}")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["stream-snapshot-digest"] == sha(blob)
    assert head.headers["content-length"] == str(len(blob))

    latest = client.get(f"{path}/snapshot")
    assert latest.status_code == 307
    assert latest.headers["location"].endswith(f"{path}/snapshot/{o1}")
    followed = client.get(latest.headers["location"])
    assert followed.status_code == 200 and followed.content == blob
    # The stream's data is untouched by snapshots.
    assert read(client, path).content == b"aaabbb"
    assert tail(client, path) == o2


def test_snapshot_default_content_type_and_offsets_at_ends(client: httpx.Client, path: str) -> None:
    empty, o1 = create(client, path, b"xyz")
    assert empty == ZERO
    assert client.put(f"{path}/snapshot/{ZERO}", content=b"initial").status_code == 201
    assert client.put(f"{path}/snapshot/{o1}", content=b"at tail").status_code == 201  # the tail is a boundary
    got = client.get(f"{path}/snapshot/{ZERO}")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.content == b"initial"
    latest = client.get(f"{path}/snapshot")
    assert latest.status_code == 307 and latest.headers["location"].endswith(f"/snapshot/{o1}")


def test_snapshot_offset_must_be_a_boundary_at_or_below_the_tail(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"hello", b"world")
    inside = off(int(o1[17:]) + 2)  # inside "world"
    assert_error(client.put(f"{path}/snapshot/{inside}", content=b"s"), 400)
    past = off(int(o2[17:]) + 1)
    assert_error(client.put(f"{path}/snapshot/{past}", content=b"s"), 409)
    assert_error(client.put(f"{path}/snapshot/{off(10**9)}", content=b"s"), 409)
    assert_error(client.get(f"{path}/snapshot"), 404)  # none of them was published


def test_snapshot_offsets_of_json_streams_are_record_boundaries(client: httpx.Client, path: str) -> None:
    _, o1, o2 = create(client, path, b"[1,2]", b"[3]", headers=JSON_CT)
    assert_error(client.put(f"{path}/snapshot/{off(1)}", content=b"s"), 400)  # between messages 1 and 2
    assert client.put(f"{path}/snapshot/{o1}", content=b"s").status_code == 201
    assert client.put(f"{path}/snapshot/{o2}", content=b"t").status_code == 201


MALFORMED_OFFSETS = [
    pytest.param("abc", id="word"),
    pytest.param("-1", id="minus-one"),
    pytest.param("now", id="now"),
    pytest.param("42", id="bare-number"),
    pytest.param(ZERO[:-1], id="15-digits"),
    pytest.param(ZERO + "0", id="17-digits"),
    pytest.param(ZERO.replace("_", "-"), id="dash"),
    pytest.param("0000000000000001_0000000000000000", id="reserved-part-not-zero"),
    pytest.param("0000000000000000_000000000000000a", id="hex-digit"),
]


@pytest.mark.parametrize("token", MALFORMED_OFFSETS)
def test_malformed_offset_tokens_are_400(client: httpx.Client, bucket: str, token: str) -> None:
    path = f"/ds/{bucket}/m-{uid()}"
    create(client, path, b"data")
    assert_error(client.put(f"{path}/snapshot/{token}", content=b"s"), 400)
    assert_error(client.get(f"{path}/snapshot/{token}"), 400)
    assert_error(client.delete(f"{path}/snapshot/{token}"), 400)
    assert_error(client.put(f"{path}/retention/{token}"), 400)
    assert_error(client.get(f"{path}/snapshot"), 404)
    assert client.head(path).headers["stream-earliest-offset"] == ZERO


def test_offset_tokens_with_non_ascii_digits_are_400(client: httpx.Client, path: str) -> None:
    create(client, path, b"abc")
    token = ZERO[:-1] + "\u0663"
    assert_error(client.put(f"{path}/snapshot/{token}", content=b"s"), 400)
    assert_error(client.get(f"{path}/snapshot"), 404)


def test_snapshot_missing_is_404(client: httpx.Client, path: str) -> None:
    _, o1 = create(client, path, b"abc")
    assert_error(client.get(f"{path}/snapshot"), 404)
    head = client.head(f"{path}/snapshot")
    assert head.status_code == 404 and head.content == b""
    assert_error(client.get(f"{path}/snapshot/{o1}"), 404)
    assert client.put(f"{path}/snapshot/{ZERO}", content=b"s").status_code == 201
    assert_error(client.get(f"{path}/snapshot/{o1}"), 404)  # a snapshot exists, but not at this offset


def test_snapshot_compare_and_set(client: httpx.Client, path: str) -> None:
    _, o1, o2, o3 = create(client, path, b"a", b"b", b"c")
    # With no snapshot yet nothing can match.
    no_latest = client.put(f"{path}/snapshot/{o1}", headers={"stream-snapshot-match": sha(b"x")}, content=b"s1")
    assert_error(no_latest, 409)
    assert_error(client.get(f"{path}/snapshot"), 404)

    first = client.put(f"{path}/snapshot/{o1}", content=b"s1")
    assert first.status_code == 201
    d1 = first.headers["stream-snapshot-digest"]
    assert DIGEST.match(d1)

    second = client.put(f"{path}/snapshot/{o2}", headers={"stream-snapshot-match": d1}, content=b"s2")
    assert second.status_code == 201, second.text
    d2 = second.headers["stream-snapshot-digest"]
    assert d2 == sha(b"s2") != d1

    stale = client.put(f"{path}/snapshot/{o3}", headers={"stream-snapshot-match": d1}, content=b"s3")
    assert_error(stale, 409)
    assert_error(client.get(f"{path}/snapshot/{o3}"), 404)
    assert client.get(f"{path}/snapshot").headers["location"].endswith(f"/snapshot/{o2}")

    third = client.put(f"{path}/snapshot/{o3}", headers={"stream-snapshot-match": d2}, content=b"s3")
    assert third.status_code == 201, third.text
    assert client.get(f"{path}/snapshot").headers["location"].endswith(f"/snapshot/{o3}")


def test_snapshot_delete(client: httpx.Client, path: str) -> None:
    _, o1, o2, o3 = create(client, path, b"a", b"b", b"c")
    for offset, blob in ((o3, b"newest"), (o1, b"old"), (o2, b"middle")):  # published out of order
        assert client.put(f"{path}/snapshot/{offset}", content=blob).status_code == 201
    # The latest is the highest offset, not the last published.
    assert client.get(f"{path}/snapshot").headers["location"].endswith(f"/snapshot/{o3}")

    assert_error(client.delete(f"{path}/snapshot/{o3}"), 409)
    assert client.get(f"{path}/snapshot/{o3}").content == b"newest"

    deleted = client.delete(f"{path}/snapshot/{o1}")
    assert deleted.status_code == 204, deleted.text
    assert_error(client.get(f"{path}/snapshot/{o1}"), 404)
    assert_error(client.delete(f"{path}/snapshot/{o1}"), 404)
    assert_error(client.delete(f"{path}/snapshot/{ZERO}"), 404)
    assert client.get(f"{path}/snapshot/{o2}").content == b"middle"
    assert client.delete(f"{path}/snapshot/{o2}").status_code == 204
    assert client.get(f"{path}/snapshot").headers["location"].endswith(f"/snapshot/{o3}")


def test_large_snapshot_round_trip_through_the_object_store(client: httpx.Client, rill: RillProcess, path: str) -> None:
    _, o1, o2 = create(client, path, b"first", b"second")
    blob = os.urandom(1_000_000)
    small = os.urandom(1000)
    put = client.put(f"{path}/snapshot/{o1}", headers={"content-type": "application/x-big"}, content=blob)
    assert put.status_code == 201, put.text
    assert put.headers["stream-snapshot-digest"] == sha(blob)
    # Over 256 KiB: the blob went to the default file store under the data dir; small ones stay inline.
    assert f"{hashlib.sha256(blob).hexdigest()}.bin" in snapshot_files(rill)
    assert client.put(f"{path}/snapshot/{ZERO}", content=small).status_code == 201
    assert f"{hashlib.sha256(small).hexdigest()}.bin" not in snapshot_files(rill)

    got = client.get(f"{path}/snapshot/{o1}")
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/x-big"
    assert got.headers["stream-snapshot-digest"] == sha(blob)
    assert got.content == blob

    assert client.put(f"{path}/snapshot/{o1}", content=blob).status_code == 204
    assert_error(client.put(f"{path}/snapshot/{o1}", content=os.urandom(1_000_000)), 409)

    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == o1
    assert parse_multipart(boot) == [("application/x-big", blob), ("text/plain", b"second")]
    assert boot.headers["stream-next-offset"] == o2


def test_snapshot_over_the_size_limit_is_413(client: httpx.Client, rill: RillProcess, path: str) -> None:
    _, o1 = create(client, path, b"abc")
    resp = declared_only(rill, "PUT", f"{path}/snapshot/{o1}", SIXTY_FOUR_MIB + 1, "application/octet-stream")
    assert_error(resp, 413)
    assert_error(client.get(f"{path}/snapshot"), 404)


def test_snapshot_size_limit_is_configurable(tmp_path: Path) -> None:
    server = RillProcess(tmp_path / "data", None, env={"RILL_SNAPSHOT_MAX_BYTES": "1024"}).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.put("/ds/limits").status_code == 201
            offset = c.put("/ds/limits/s", headers=TEXT, content=b"abc").headers["stream-next-offset"]
            assert c.put(f"/ds/limits/s/snapshot/{ZERO}", content=b"x" * 1024).status_code == 201
            assert_error(c.put(f"/ds/limits/s/snapshot/{offset}", content=b"x" * 2048), 413)
    finally:
        server.stop()


def test_latest_snapshot_redirect_for_a_non_ascii_stream_id(client: httpx.Client, bucket: str) -> None:
    name = f"snap {uid()} 日本"
    path = f"/ds/{bucket}/{name}"
    offset = client.put(path, headers=TEXT, content=b"abc").headers["stream-next-offset"]
    assert client.put(f"{path}/snapshot/{offset}", content=b"state").status_code == 201
    latest = client.get(f"{path}/snapshot")
    assert latest.status_code == 307, latest.text
    location = latest.headers["location"]
    assert location.isascii()
    assert location.endswith(f"/ds/{bucket}/{quote(name)}/snapshot/{offset}")
    assert client.get(location).content == b"state"
