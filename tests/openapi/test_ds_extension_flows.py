"""The /ds sub-resources, walked through deterministically, each response validated against the document.

Every status of every documented operation that a single node can produce without special setup
(413 needs 64 MiB, 503 a broken object store, 307 a cluster): attributes, append-batch, snapshots,
bootstrap, retention and the 410 `offset_trimmed` of reads, `Stream-Attrs` / `Stream-Retention` on
create, OPTIONS, 404 and 410 everywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

import httpx
import schemathesis

from tests.openapi.helpers import (
    ATTRS,
    BATCH,
    BOOTSTRAP,
    DS,
    DS_STREAM,
    LATEST,
    RETENTION,
    SNAPSHOT,
    ZERO,
    Api,
    frames,
    header,
)

SECURITY = {"x-content-type-options": "nosniff", "cross-origin-resource-policy": "cross-origin"}


def off(pos: int) -> str:
    return f"0000000000000000_{pos:016d}"


def digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def multipart_parts(response: schemathesis.Response) -> list[tuple[str, bytes]]:
    """(content type, body) of each part of a bootstrap, split by the boundary of its Content-Type."""
    found = re.fullmatch(r"multipart/mixed; boundary=(\S+)", header(response, "content-type") or "")
    assert found, response.headers
    delimiter = b"--" + found.group(1).encode()
    pieces = response.content.split(delimiter)
    assert pieces[0] == b"" and pieces[-1] == b"--\r\n", response.content[:200]
    parts = []
    for piece in pieces[1:-1]:
        head, _, body = piece.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n"))
        assert body.endswith(b"\r\n")
        body = body[:-2]
        assert int(fields["content-length"]) == len(body)
        parts.append((fields["content-type"], body))
    return parts


def allowed(response: schemathesis.Response) -> set[str]:
    return {m.strip() for m in (header(response, "allow") or "").split(",")}


def test_ds_extension_flows_conform(seeded: str) -> None:
    api = Api(seeded)
    u = uuid.uuid4().hex[:8]
    bucket = {"bucket": f"ext-{u}"}

    # Bucket retention is a default for its streams, set on create only (a later PUT is 200, unchanged).
    api("PUT", DS, bucket, 201, headers={"Stream-Retention": "max-age=86400"})
    api("PUT", DS, bucket, 200, headers={"Stream-Retention": "max-bytes=1"})
    for bad in ("max-age=0", "max-age=1, max-age=2", "ttl=5", "max-age"):
        api("PUT", DS, {"bucket": f"bad-{u}"}, 400, headers={"Stream-Retention": bad})
    api("GET", DS, {"bucket": f"bad-{u}"}, 404)

    # Create with Stream-Attrs (canonical JSON compared) and retention (the bucket's when none).
    s = {**bucket, "stream": "orders/a"}
    attrs = {"title": "Orders", "metadata": {"team": "shop", "tags": [1, "x"]}}
    created = api(
        "PUT", DS_STREAM, s, 201, headers={"Stream-Attrs": json.dumps(attrs)}, body="a", media_type="text/plain"
    )
    assert header(created, "stream-next-offset") == off(1)
    same = {
        "Stream-Attrs": json.dumps(attrs, separators=(",", ":"), sort_keys=True),
        "Stream-Retention": "max-age=86400",
    }
    api("PUT", DS_STREAM, s, 200, headers=same, body="a", media_type="text/plain")
    api("PUT", DS_STREAM, s, 409, body="a", media_type="text/plain")  # attributes differ
    other = {"Stream-Attrs": json.dumps(attrs), "Stream-Retention": "max-bytes=1048576"}
    api("PUT", DS_STREAM, s, 409, headers=other, body="a", media_type="text/plain")
    for bad in ('{"title": 5}', '{"color": "red"}', "[]", "nope"):
        api("PUT", DS_STREAM, {**bucket, "stream": "never"}, 400, headers={"Stream-Attrs": bad})
    api("PUT", DS_STREAM, {**bucket, "stream": "never"}, 400, headers={"Stream-Retention": "max-age=-1"})
    api("HEAD", DS_STREAM, {**bucket, "stream": "never"}, 404)

    # Attributes: read, replace whole, clear; invalid bodies change nothing; the PUT counts in
    # idempotent-create matching from then on.
    assert api("GET", ATTRS, s, 200).json() == attrs
    api("HEAD", ATTRS, s, 200)
    api("PUT", ATTRS, s, 204, body={"title": "Renamed"}, media_type="application/json")
    assert api("GET", ATTRS, s, 200).json() == {"title": "Renamed"}
    api("PUT", DS_STREAM, s, 409, headers={"Stream-Attrs": json.dumps(attrs)}, body="a", media_type="text/plain")
    api("PUT", DS_STREAM, s, 200, headers={"Stream-Attrs": '{"title":"Renamed"}'}, body="a", media_type="text/plain")
    for invalid in ({"title": 5}, {"metadata": [1]}, {"extra": True}, ["x"], {"title": "x" * (16 * 1024)}):
        api("PUT", ATTRS, s, 400, body=invalid, media_type="application/json")
    assert api("GET", ATTRS, s, 200).json() == {"title": "Renamed"}
    api("PUT", ATTRS, s, 204, body={}, media_type="application/json")
    assert api("GET", ATTRS, s, 200).json() == {}

    # Append-batch: one result per frame; bad framing is 400 and a wrong Content-Type 409, both
    # appending nothing.
    results = api("POST", BATCH, s, 200, body=frames(b"bb", b"ccc"), media_type="text/plain").json()
    assert results == [{"status": 204, "next_offset": off(3)}, {"status": 204, "next_offset": off(6)}]
    for framing in (b"", b"\x00\x00", frames(b"x") + b"\x00\x00\x00\x00", frames(b"x")[:-1], frames(*[b"x"] * 1001)):
        api("POST", BATCH, s, 400, body=framing, media_type="text/plain")
    api("POST", BATCH, s, 409, body=frames(b"x"), media_type="application/octet-stream")
    assert header(api("HEAD", DS_STREAM, s, 200), "stream-next-offset") == off(6)
    j = {**bucket, "stream": "orders/json"}
    api("PUT", DS_STREAM, j, 201, body=[], media_type="application/json")
    mixed = api(
        "POST",
        BATCH,
        j,
        200,
        headers={"Content-Type": "application/json"},
        body=frames(b'{"a": 1}', b"{oops", b"[2, 3]"),
        media_type="application/octet-stream",
    ).json()
    assert [r["status"] for r in mixed] == [204, 400, 204]
    assert mixed[1] == {"status": 400, "error": "invalid_json"}
    assert api("GET", DS_STREAM, j, 200).json() == [{"a": 1}, 2, 3]

    # Bootstrap without a snapshot: an empty first part, then one part per message (JSON: per value).
    boot = api("GET", BOOTSTRAP, j, 200)
    assert header(boot, "stream-snapshot-offset") == "-1"
    assert header(boot, "stream-snapshot-digest") is None
    assert header(boot, "stream-up-to-date") == "true"
    parts = multipart_parts(boot)
    assert parts[0] == ("application/octet-stream", b"")
    assert [json.loads(body) for _, body in parts[1:]] == [{"a": 1}, 2, 3]
    for live in ("long-poll", "sse", ""):
        api("GET", BOOTSTRAP, j, 400, query={"live": live})

    # Snapshots: boundaries at or below the tail only; idempotent by content; compare-and-set.
    first = api("PUT", SNAPSHOT, {**s, "offset": off(1)}, 201, body=b"state@1", media_type="application/octet-stream")
    assert header(first, "stream-snapshot-offset") == off(1)
    assert header(first, "stream-snapshot-digest") == digest(b"state@1")
    assert header(first, "stream-next-offset") == off(6)
    again = api("PUT", SNAPSHOT, {**s, "offset": off(1)}, 204, body=b"state@1", media_type="application/octet-stream")
    assert header(again, "stream-snapshot-digest") == digest(b"state@1")
    api("PUT", SNAPSHOT, {**s, "offset": off(1)}, 409, body=b"different", media_type="application/octet-stream")
    api("PUT", SNAPSHOT, {**s, "offset": off(2)}, 400, body=b"inside bb", media_type="application/octet-stream")
    api("PUT", SNAPSHOT, {**s, "offset": off(7)}, 409, body=b"past the tail", media_type="application/octet-stream")
    api("PUT", SNAPSHOT, {**s, "offset": "0000000000000001_0000000000000000"}, 400, body=b"x", media_type="text/plain")
    stale = {"Stream-Snapshot-Match": digest(b"not the latest")}
    api("PUT", SNAPSHOT, {**s, "offset": off(3)}, 409, headers=stale, body={"n": 3}, media_type="application/json")
    match = {"Stream-Snapshot-Match": digest(b"state@1")}
    api("PUT", SNAPSHOT, {**s, "offset": off(3)}, 201, headers=match, body={"n": 3}, media_type="application/json")
    big = bytes(range(256)) * 1200  # over 256 KiB: through the object store
    api("PUT", SNAPSHOT, {**s, "offset": off(0)}, 201, body=big, media_type="application/octet-stream")
    assert api("GET", SNAPSHOT, {**s, "offset": off(0)}, 200).content == big
    got = api("GET", SNAPSHOT, {**s, "offset": off(3)}, 200)
    assert got.json() == {"n": 3}
    assert header(got, "content-type") == "application/json"
    assert header(got, "etag") == '"' + hashlib.sha256(got.content).hexdigest() + '"'
    api("HEAD", SNAPSHOT, {**s, "offset": off(3)}, 200)
    api("GET", SNAPSHOT, {**s, "offset": off(6)}, 404)
    api("GET", SNAPSHOT, {**s, "offset": "latest"}, 400)
    latest = api("GET", LATEST, s, 307)
    assert header(latest, "location") == f"/ds/ext-{u}/orders/a/snapshot/{off(3)}"
    api("HEAD", LATEST, s, 307)
    api("GET", LATEST, j, 404)
    api("HEAD", LATEST, j, 404)

    boot = api("GET", BOOTSTRAP, s, 200)
    assert header(boot, "stream-snapshot-offset") == off(3)
    assert header(boot, "stream-snapshot-digest") == digest(got.content)
    assert header(boot, "stream-next-offset") == off(6)
    assert multipart_parts(boot) == [("application/json", got.content), ("text/plain", b"ccc")]
    api("HEAD", BOOTSTRAP, s, 200)

    api("DELETE", SNAPSHOT, {**s, "offset": off(3)}, 409)  # the latest
    api("DELETE", SNAPSHOT, {**s, "offset": off(0)}, 204)
    api("DELETE", SNAPSHOT, {**s, "offset": off(0)}, 404)
    api("DELETE", SNAPSHOT, {**s, "offset": "0000000000000000_00000000000000xx"}, 400)

    # Retention: boundaries only, never past the latest snapshot or the tail, never backwards.
    api("PUT", RETENTION, {**s, "offset": off(2)}, 400)
    api("PUT", RETENTION, {**s, "offset": off(6)}, 409)  # past the latest snapshot (at 3)
    api("PUT", RETENTION, {**s, "offset": off(9)}, 409)  # past the tail
    api("PUT", RETENTION, {**s, "offset": "now"}, 400)
    kept = api("PUT", RETENTION, {**s, "offset": off(3)}, 204)
    assert (header(kept, "stream-earliest-offset"), header(kept, "stream-next-offset")) == (off(3), off(6))
    assert header(api("PUT", RETENTION, {**s, "offset": off(3)}, 204), "stream-earliest-offset") == off(3)
    back = api("PUT", RETENTION, {**s, "offset": off(1)}, 409)
    assert header(back, "stream-earliest-offset") == off(3)

    # After retention: HEAD reports the earliest offset, reads before it are 410 with it, -1 starts there.
    assert header(api("HEAD", DS_STREAM, s, 200), "stream-earliest-offset") == off(3)
    for query in ({"offset": off(1)}, {"offset": ZERO, "live": "long-poll"}, {"offset": ZERO, "live": "sse"}):
        trimmed = api("GET", DS_STREAM, s, 410, query=query)
        assert trimmed.json()["error"]["code"] == "offset_trimmed"
        assert header(trimmed, "stream-earliest-offset") == off(3)
    assert api("GET", DS_STREAM, s, 200, query={"offset": "-1"}).content == b"ccc"
    early = api("PUT", SNAPSHOT, {**s, "offset": off(1)}, 410, body=b"state@1", media_type="application/octet-stream")
    assert header(early, "stream-earliest-offset") == off(3)
    assert api("GET", SNAPSHOT, {**s, "offset": off(1)}, 200).content == b"state@1"  # still readable
    api("DELETE", SNAPSHOT, {**s, "offset": off(1)}, 204)
    # A stream that was never trimmed reports the start of its offset space.
    assert header(api("HEAD", DS_STREAM, j, 200), "stream-earliest-offset") == ZERO

    # Closed streams: append-batch fails per frame, bootstrap says so, attributes still change.
    api("POST", DS_STREAM, s, 204, headers={"Stream-Closed": "true"})
    late = api("POST", BATCH, s, 200, body=frames(b"late", b"later"), media_type="text/plain").json()
    assert late == [{"status": 409, "error": "stream_closed", "next_offset": off(6)}] * 2
    closed = api("GET", BOOTSTRAP, s, 200)
    assert header(closed, "stream-closed") == "true"
    api("PUT", ATTRS, s, 204, body={"title": "archived"}, media_type="application/json")

    # OPTIONS: 204 with Allow whether or not the stream exists; preflights go to the CORS layer.
    missing = {**bucket, "stream": "missing"}
    for template, params, methods in (
        (ATTRS, s, {"GET", "HEAD", "PUT"}),
        (BATCH, s, {"POST"}),
        (BOOTSTRAP, s, {"GET", "HEAD"}),
        (LATEST, missing, {"GET", "HEAD"}),
        (SNAPSHOT, {**s, "offset": ZERO}, {"GET", "HEAD", "PUT", "DELETE"}),
        (RETENTION, {**missing, "offset": ZERO}, {"PUT"}),
    ):
        assert allowed(api("OPTIONS", template, params, 204)) == methods | {"OPTIONS"}
    # Any origin may read; only the origins in cors_origins (none here) may write.
    preflight = {"Origin": "https://example.com", "Access-Control-Request-Method": "GET"}
    api("OPTIONS", SNAPSHOT, {**s, "offset": ZERO}, 200, headers=preflight)
    api("OPTIONS", SNAPSHOT, {**s, "offset": ZERO}, 400, headers={**preflight, "Access-Control-Request-Method": "PUT"})
    api("OPTIONS", ATTRS, {**bucket, "stream": "a/attrs"}, 400)  # ids may not end in a sub-route

    # Unknown streams and buckets: 404 everywhere (and nothing is created); invalid ids: 400.
    def every_operation(params: dict[str, str]) -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
        at = {**params, "offset": ZERO}
        blob = {"body": b"s", "media_type": "application/octet-stream"}
        return [
            ("GET", ATTRS, params, {}),
            ("HEAD", ATTRS, params, {}),
            ("PUT", ATTRS, params, {"body": {"title": "t"}, "media_type": "application/json"}),
            ("POST", BATCH, params, {"body": frames(b"x"), "media_type": "text/plain"}),
            ("GET", BOOTSTRAP, params, {}),
            ("HEAD", BOOTSTRAP, params, {}),
            ("GET", LATEST, params, {}),
            ("HEAD", LATEST, params, {}),
            ("GET", SNAPSHOT, at, {}),
            ("HEAD", SNAPSHOT, at, {}),
            ("PUT", SNAPSHOT, at, blob),
            ("DELETE", SNAPSHOT, at, {}),
            ("PUT", RETENTION, at, {}),
        ]

    for where in (missing, {"bucket": f"none-{u}", "stream": "s"}):
        for method, template, params, kwargs in every_operation(where):
            api(method, template, params, 404, **kwargs)
    api("HEAD", DS_STREAM, missing, 404)
    for method, template, params, kwargs in every_operation({**bucket, "stream": "a/snapshot"}):
        api(method, template, params, 400, **kwargs)

    # Soft-deleted streams (a fork still reads them): 410 everywhere.
    src, fork = {**bucket, "stream": "src"}, {**bucket, "stream": "fork"}
    api("PUT", DS_STREAM, src, 201, body="source", media_type="text/plain")
    api("PUT", DS_STREAM, fork, 201, headers={"Stream-Forked-From": f"/ds/ext-{u}/src"})
    api("DELETE", DS_STREAM, src, 204)
    for method, template, params, kwargs in every_operation(src):
        api(method, template, params, 410, **kwargs)
    api("DELETE", DS_STREAM, fork, 204)
    api("GET", ATTRS, src, 404)

    # Methods a sub-resource does not support: 405 with Allow and the JSON error (not documented
    # per operation, so checked here by hand); retention without an offset is no route (404).
    with httpx.Client(base_url=seeded, timeout=10) as c:
        base = f"/ds/ext-{u}/orders/a"
        for method, sub, methods in (
            ("POST", "attrs", {"GET", "HEAD", "PUT"}),
            ("GET", "append-batch", {"POST"}),
            ("PUT", "bootstrap", {"GET", "HEAD"}),
            ("DELETE", "snapshot", {"GET", "HEAD"}),
            ("POST", f"snapshot/{ZERO}", {"GET", "HEAD", "PUT", "DELETE"}),
            ("GET", f"retention/{ZERO}", {"PUT"}),
        ):
            response = c.request(method, f"{base}/{sub}")
            assert response.status_code == 405, (method, sub, response.text)
            assert methods <= {m.strip() for m in response.headers["allow"].split(",")}
            assert response.json()["error"]["code"] == "method_not_allowed"
            assert SECURITY.items() <= dict(response.headers).items()
        for method in ("GET", "PUT", "OPTIONS"):
            response = c.request(method, f"{base}/retention")
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
