"""Deterministic protocol flows, each response validated against the OpenAPI document.

Random generation rarely reaches states that need a sequence of requests (an ETag to revalidate, a
producer's history, a closed stream, a soft-deleted fork source, a non-empty bucket), so this walks
through them (304, long-poll 204, producer 200/204/403/409, closed streams, forks and soft deletion,
non-empty buckets) with the schemathesis run's checks, plus the status the protocol requires.
"""

from __future__ import annotations

import uuid

from tests.openapi.helpers import COMPAT, DS, DS_STREAM, LEGACY, Api, header


def test_protocol_flows_conform(seeded: str) -> None:
    api = Api(seeded)
    u = uuid.uuid4().hex[:8]

    # Buckets: create (idempotent), describe, refuse to delete while not empty, 405 on POST.
    bucket = {"bucket": f"flow-{u}"}
    api("PUT", DS, bucket, 201)
    api("PUT", DS, bucket, 200)
    api("POST", DS, bucket, 405)
    api("OPTIONS", DS, bucket, 204)
    a = {**bucket, "stream": "a/b"}
    created = api("PUT", DS_STREAM, a, 201, body="hello", media_type="text/plain")
    assert header(created, "location").endswith(f"/ds/flow-{u}/a/b")
    listing = api("GET", DS, bucket, 200, query={"limit": "1"})
    assert listing.json()["streams"][0]["name"] == "a/b"
    api("HEAD", DS, bucket, 200)
    api("DELETE", DS, bucket, 409)

    # Catch-up read, revalidation, offset=now, long-poll timeout at the tail.
    read = api("GET", DS_STREAM, a, 200, query={"offset": "-1"})
    assert read.content == b"hello"
    api("GET", DS_STREAM, a, 304, headers={"If-None-Match": header(read, "etag")})
    tail = header(api("GET", DS_STREAM, a, 200, query={"offset": "now"}), "stream-next-offset")
    api("GET", DS_STREAM, a, 204, query={"offset": tail, "live": "long-poll"})
    api("GET", DS_STREAM, a, 400, query={"live": "long-poll"})

    # Appends: Stream-Seq, idempotent producers, content type, close.
    api("POST", DS_STREAM, a, 204, headers={"Stream-Seq": "001"}, body=" world", media_type="text/plain")
    api("POST", DS_STREAM, a, 409, headers={"Stream-Seq": "001"}, body="!", media_type="text/plain")
    api("POST", DS_STREAM, a, 409, body={"x": 1}, media_type="application/json")
    producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    api("POST", DS_STREAM, a, 200, headers=producer, body="p0", media_type="text/plain")
    api("POST", DS_STREAM, a, 204, headers=producer, body="p0", media_type="text/plain")
    gap = api("POST", DS_STREAM, a, 409, headers={**producer, "Producer-Seq": "5"}, body="p5", media_type="text/plain")
    assert header(gap, "producer-expected-seq") == "1"
    api("POST", DS_STREAM, a, 200, headers={**producer, "Producer-Epoch": "1"}, body="e1", media_type="text/plain")
    stale = api("POST", DS_STREAM, a, 403, headers={**producer, "Producer-Seq": "1"}, body="x", media_type="text/plain")
    assert header(stale, "producer-epoch") == "1"
    api("POST", DS_STREAM, a, 400, headers={"Producer-Id": "p"}, body="x", media_type="text/plain")
    api("POST", DS_STREAM, a, 204, headers={"Stream-Closed": "true"})
    closed = api("POST", DS_STREAM, a, 409, body="late", media_type="text/plain")
    assert header(closed, "stream-closed") == "true"
    tail = header(api("HEAD", DS_STREAM, a, 200), "stream-next-offset")
    api("GET", DS_STREAM, a, 204, query={"offset": tail, "live": "long-poll"})
    # SSE on a closed stream ends by itself: data, then the final control event.
    api("GET", DS_STREAM, a, 200, query={"offset": "-1", "live": "sse"})
    api("DELETE", DS_STREAM, a, 204)
    api("DELETE", DS_STREAM, a, 404)
    api("GET", DS_STREAM, a, 404)
    api("DELETE", DS, bucket, 204)
    api("GET", DS, bucket, 404)

    # JSON and binary streams, TTL metadata (compat family).
    j = {"path": f"flow-{u}/json"}
    api("PUT", COMPAT, j, 201, body=[{"n": 1}, {"n": 2}], media_type="application/json")
    assert api("GET", COMPAT, j, 200).json() == [{"n": 1}, {"n": 2}]
    api("POST", COMPAT, j, 400, body=[], media_type="application/json")
    api("PUT", COMPAT, j, 409, body="x", media_type="text/plain")
    b = {"path": f"flow-{u}/bin"}
    api(
        "PUT",
        COMPAT,
        b,
        201,
        headers={"Stream-TTL": "3600", "Stream-Closed": "true"},
        body=b"\x00\xff",
        media_type="application/octet-stream",
    )
    assert header(api("HEAD", COMPAT, b, 200), "stream-ttl") == "3600"
    sse = api("GET", COMPAT, b, 200, query={"offset": "-1", "live": "sse"})
    assert header(sse, "stream-sse-data-encoding") == "base64"
    both = {"Stream-TTL": "1", "Stream-Expires-At": "2099-01-01T00:00:00Z"}
    api("PUT", COMPAT, {"path": f"flow-{u}/both"}, 400, headers=both)

    # Forks and soft deletion (legacy family).
    src, fork = {"id": f"flow-{u}/src"}, {"id": f"flow-{u}/fork"}
    api("PUT", LEGACY, src, 201, body="source", media_type="text/plain")
    api("PUT", LEGACY, fork, 201, headers={"Stream-Forked-From": f"/streams/flow-{u}/src"})
    api("PUT", LEGACY, {"id": f"flow-{u}/f2"}, 404, headers={"Stream-Forked-From": f"/streams/flow-{u}/none"})
    api("PUT", LEGACY, {"id": f"flow-{u}/f3"}, 400, headers={"Stream-Fork-Sub-Offset": "1"})
    api("DELETE", LEGACY, src, 204)
    api("HEAD", LEGACY, src, 410)
    api("GET", LEGACY, src, 410)
    api("POST", LEGACY, src, 410, body="x", media_type="text/plain")
    api("PUT", LEGACY, src, 409, body="source", media_type="text/plain")
    assert api("GET", LEGACY, fork, 200).content == b"source"
    api("DELETE", LEGACY, fork, 204)
    api("HEAD", LEGACY, src, 404)
    api("OPTIONS", LEGACY, src, 204)
