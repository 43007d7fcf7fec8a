"""HTTP tests for the /ds stream sub-resources: snapshot, bootstrap, retention, attrs and append-batch.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import struct
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.http.helpers import TEXT, assert_error, uid
from tests.server import RillProcess

JSON_CT = {"content-type": "application/json"}
ZERO = "0000000000000000_0000000000000000"
OFFSET = re.compile(r"^0{16}_\d{16}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
SIXTY_FOUR_MIB = 64 * 1024 * 1024


# ------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(scope="module")
def bucket(client: httpx.Client) -> str:
    name = "ext-" + uid()
    assert client.put(f"/ds/{name}").status_code == 201
    return name


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket."""
    return f"/ds/{bucket}/s-{uid()}"


def off(pos: int) -> str:
    return f"0000000000000000_{pos:016d}"


def sha(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def create(client: httpx.Client, path: str, *appends: bytes, headers: dict[str, str] | None = None) -> list[str]:
    """Creates the stream (empty), appends each body separately; the offsets: [empty tail, after 1st, ...]."""
    hdrs = TEXT if headers is None else headers
    resp = client.put(path, headers=hdrs)
    assert resp.status_code == 201, resp.text
    offsets = [resp.headers["stream-next-offset"]]
    for body in appends:
        resp = client.post(path, headers={"content-type": hdrs.get("content-type", "text/plain")}, content=body)
        assert resp.status_code == 204, resp.text
        offsets.append(resp.headers["stream-next-offset"])
    return offsets


def tail(client: httpx.Client, path: str) -> str:
    resp = client.head(path)
    assert resp.status_code == 200
    return resp.headers["stream-next-offset"]


def read(client: httpx.Client, path: str, offset: str = "-1") -> httpx.Response:
    resp = client.get(path, params={"offset": offset})
    assert resp.status_code == 200, resp.text
    return resp


def frames(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def parse_multipart(resp: httpx.Response) -> list[tuple[str, bytes]]:
    """(content type, body) of each part of a multipart/mixed response, split by its boundary."""
    main, _, params = resp.headers["content-type"].partition(";")
    assert main.strip().lower() == "multipart/mixed", resp.headers
    found = re.search(r'boundary="?([^";\s]+)"?', params)
    assert found, params
    delimiter = b"\r\n--" + found.group(1).encode()
    pieces = (b"\r\n" + resp.content).split(delimiter)
    assert pieces[0] == b"", "the body must start with the first boundary"
    assert pieces[-1].startswith(b"--") and pieces[-1][2:].strip() == b"", "missing close delimiter"
    parts = []
    for piece in pieces[1:-1]:
        assert piece.startswith(b"\r\n"), piece[:40]
        head, sep, body = piece[2:].partition(b"\r\n\r\n")
        assert sep, piece[:200]
        headers = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, colon, value = line.partition(":")
            assert colon, line
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            assert int(headers["content-length"]) == len(body)
        parts.append((headers.get("content-type", "text/plain"), body))
    return parts


def declared_only(rill: RillProcess, method: str, path: str, length: int, content_type: str) -> httpx.Response:
    """Sends only the head of a request declaring a `length`-byte body, and reads the answer."""
    with socket.create_connection(("127.0.0.1", rill.port), timeout=5) as sock:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{rill.port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode())
        raw = http.client.HTTPResponse(sock)
        raw.begin()
        body = raw.read()
        return httpx.Response(raw.status, headers=raw.getheaders(), content=body)


def snapshot_files(rill: RillProcess) -> set[str]:
    return {p.name for p in Path(rill.data_dir, "cold").rglob("*.bin")}


# ------------------------------------------------------------------------------------------------
# Snapshots


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

    head = client.head(f"{path}/snapshot/{o1}")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["stream-snapshot-digest"] == sha(blob)

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


# ------------------------------------------------------------------------------------------------
# Bootstrap


def test_bootstrap_without_snapshot_json_one_part_per_message(client: httpx.Client, path: str) -> None:
    create(client, path, b'[{"a":1},{"b":2}]', b'"three"', headers=JSON_CT)
    batch = client.post(f"{path}/append-batch", headers=JSON_CT, content=frames(b"[4,5]", b"6"))
    assert [r["status"] for r in batch.json()] == [204, 204]
    end = tail(client, path)

    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == "-1"
    assert boot.headers["stream-next-offset"] == end
    assert boot.headers["stream-up-to-date"] == "true"
    assert "stream-closed" not in boot.headers
    parts = parse_multipart(boot)
    assert parts[0][1] == b""  # no snapshot: an empty first part
    assert [ct for ct, _ in parts[1:]] == ["application/json"] * 6
    assert [json.loads(body) for _, body in parts[1:]] == [{"a": 1}, {"b": 2}, "three", 4, 5, 6]

    # Reading on from Stream-Next-Offset gives exactly what came after.
    assert client.post(path, headers=JSON_CT, content=b'{"later":true}').status_code == 204
    after = read(client, path, boot.headers["stream-next-offset"])
    assert after.json() == [{"later": True}]


def test_bootstrap_with_snapshot_byte_stream(client: httpx.Client, path: str) -> None:
    _, o1, _, o3 = create(client, path, b"a", b"bb", b"ccc")
    blob = b"state after a"
    put = client.put(f"{path}/snapshot/{o1}", headers={"content-type": "application/x-snap"}, content=blob)
    assert put.status_code == 201

    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == o1
    assert boot.headers["stream-next-offset"] == o3
    assert boot.headers["stream-up-to-date"] == "true"
    assert parse_multipart(boot) == [("application/x-snap", blob), ("text/plain", b"bb"), ("text/plain", b"ccc")]

    # A snapshot at the tail: nothing after it.
    assert client.put(f"{path}/snapshot/{o3}", content=b"all").status_code == 201
    boot = client.get(f"{path}/bootstrap")
    assert boot.headers["stream-snapshot-offset"] == o3
    assert parse_multipart(boot) == [("application/octet-stream", b"all")]
    assert client.post(path, headers=TEXT, content=b"dddd").status_code == 204
    assert read(client, path, boot.headers["stream-next-offset"]).content == b"dddd"


def test_bootstrap_of_an_empty_stream(client: httpx.Client, path: str) -> None:
    (empty,) = create(client, path)
    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-snapshot-offset"] == "-1"
    assert boot.headers["stream-next-offset"] == empty
    assert boot.headers["stream-up-to-date"] == "true"
    assert [body for _, body in parse_multipart(boot)] == [b""]


def test_bootstrap_of_a_closed_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b"one", b"two")
    closed = client.post(path, headers={"stream-closed": "true"})
    assert closed.status_code == 204
    boot = client.get(f"{path}/bootstrap")
    assert boot.status_code == 200
    assert boot.headers["stream-closed"] == "true"
    assert boot.headers["stream-up-to-date"] == "true"
    assert [body for _, body in parse_multipart(boot)] == [b"", b"one", b"two"]
    head = client.head(f"{path}/bootstrap")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["stream-closed"] == "true"
    assert head.headers["content-type"].startswith("multipart/mixed")


@pytest.mark.parametrize("live", ["long-poll", "sse", "", "true"])
def test_bootstrap_with_live_is_400(client: httpx.Client, path: str, live: str) -> None:
    create(client, path, b"x")
    assert_error(client.get(f"{path}/bootstrap", params={"live": live}), 400)


# ------------------------------------------------------------------------------------------------
# Retention


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


def test_fork_of_a_trimmed_source_reports_its_history_as_gone(client: httpx.Client, bucket: str, path: str) -> None:
    _, o1, o2 = create(client, path, b"aaa", b"bbb")
    assert client.put(f"{path}/retention/{o1}").status_code == 204
    fork = f"/ds/{bucket}/f-{uid()}"
    assert client.put(fork, headers={"stream-forked-from": path, "stream-fork-offset": o2}).status_code == 201
    assert read(client, fork).content == b"bbb"
    assert client.head(fork).headers["stream-earliest-offset"] == o1
    assert_error(client.get(fork, params={"offset": ZERO}), 410)


# ------------------------------------------------------------------------------------------------
# Attributes


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


# ------------------------------------------------------------------------------------------------
# Append-batch


def test_append_batch_byte_stream(client: httpx.Client, path: str) -> None:
    (start,) = create(client, path)
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(b"alpha", b"be", b"gamma!"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    results = resp.json()
    assert [r["status"] for r in results] == [204, 204, 204]
    assert [r["next_offset"] for r in results] == [off(5), off(7), off(13)]
    assert all("error" not in r for r in results)
    assert start == ZERO
    assert read(client, path).content == b"alphabegamma!"
    assert tail(client, path) == off(13)
    # Each frame is its own append: its own bootstrap part, and a boundary.
    assert [body for _, body in parse_multipart(client.get(f"{path}/bootstrap"))] == [b"", b"alpha", b"be", b"gamma!"]
    assert client.put(f"{path}/snapshot/{off(5)}", content=b"s").status_code == 201


def test_append_batch_json_with_an_invalid_frame(client: httpx.Client, path: str) -> None:
    create(client, path, headers=JSON_CT)
    body = frames(b'{"a": 1}', b"{oops", b"[2, 3]", b'"four"')
    resp = client.post(f"{path}/append-batch", headers=JSON_CT, content=body)
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert [r["status"] for r in results] == [204, 400, 204, 204]
    assert isinstance(results[1]["error"], str) and results[1]["error"]
    assert "next_offset" not in results[1]
    assert results[0]["next_offset"] < results[2]["next_offset"] < results[3]["next_offset"]
    assert results[3]["next_offset"] == tail(client, path)
    assert read(client, path).json() == [{"a": 1}, 2, 3, "four"]


def test_append_batch_of_1000_frames(client: httpx.Client, path: str) -> None:
    create(client, path)
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(*[b"%04d" % i for i in range(1000)]))
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert len(results) == 1000
    assert {r["status"] for r in results} == {204}
    assert results[-1]["next_offset"] == off(4000)
    assert read(client, path).content == b"".join(b"%04d" % i for i in range(1000))


MALFORMED_BATCHES = [
    pytest.param(b"", id="empty-body"),
    pytest.param(b"\x00\x00", id="truncated-length"),
    pytest.param(frames(b"ok") + b"\x00\x00\x00", id="truncated-length-after-frame"),
    pytest.param(struct.pack(">I", 10) + b"short", id="short-frame"),
    pytest.param(frames(b"ok") + struct.pack(">I", 3) + b"ab", id="short-last-frame"),
    pytest.param(struct.pack(">I", 0), id="zero-length-frame"),
    pytest.param(frames(b"ok") + struct.pack(">I", 0) + frames(b"ok"), id="zero-length-in-the-middle"),
    pytest.param(frames(*[b"x"] * 1001), id="1001-frames"),
]


@pytest.mark.parametrize("body", MALFORMED_BATCHES)
def test_malformed_append_batch_is_400_and_appends_nothing(client: httpx.Client, path: str, body: bytes) -> None:
    _, before = create(client, path, b"seed")
    assert_error(client.post(f"{path}/append-batch", headers=TEXT, content=body), 400)
    assert tail(client, path) == before
    assert read(client, path).content == b"seed"


def test_append_batch_to_a_closed_stream_fails_per_frame(client: httpx.Client, path: str) -> None:
    _, end = create(client, path, b"final")
    assert client.post(path, headers={"stream-closed": "true"}).status_code == 204
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(b"late", b"later"))
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert [r["status"] for r in results] == [409, 409]
    assert all(isinstance(r["error"], str) and r["error"] for r in results)
    assert tail(client, path) == end
    assert read(client, path).content == b"final"


def test_append_batch_with_the_wrong_content_type_is_409(client: httpx.Client, path: str) -> None:
    _, end = create(client, path, b"text")
    assert_error(client.post(f"{path}/append-batch", headers=JSON_CT, content=frames(b"1", b"2")), 409)
    assert tail(client, path) == end
    assert read(client, path).content == b"text"


def test_append_batch_over_the_body_limit_is_413(client: httpx.Client, rill: RillProcess, path: str) -> None:
    _, end = create(client, path, b"x")
    assert_error(declared_only(rill, "POST", f"{path}/append-batch", SIXTY_FOUR_MIB + 1, "text/plain"), 413)
    assert tail(client, path) == end


# ------------------------------------------------------------------------------------------------
# Unknown streams and buckets, methods, OPTIONS


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
