"""The OpenAPI document: valid, served verbatim, and honoured by the running server (schemathesis).

The schemathesis run is property-based: for every operation of `openapi/rill.yaml` it sends
generated requests (examples, coverage and fuzzing phases; valid and invalid data) to the
session's `rill` server and checks every response:

* `not_a_server_error`: no 5xx;
* `status_code_conformance`: the status is documented for the operation;
* `content_type_conformance`: the Content-Type is documented for that status;
* `response_headers_conformance`: required headers are present, and documented headers match
  their schemas (offsets, cursors, `true` flags, producer integers, ...);
* `response_schema_conformance`: JSON bodies (errors, bucket listings, JSON reads) match.

Bounds, so the whole module runs in about a minute:

* at most `MAX_EXAMPLES` generated cases per operation (plus the schema's examples and
  schemathesis' coverage cases), no Hypothesis deadline, no `too_slow` health check;
* the session server's long-poll timeout is 1 s (tests/conftest.py), so a long-poll GET at
  the tail of an existing stream returns 204 after about a second;
* `live=sse` is NOT excluded from generation: schemathesis 4 reads `text/event-stream` itself
  and validates every event against the document's `SseEvent` schema. An SSE response on an open
  stream never ends by itself (the server keeps it open for `sse_max_seconds`, 60 s by default),
  so schemathesis stops reading after `MAX_STREAM_EVENTS` complete events, and `REQUEST_TIMEOUT`
  bounds every request, an event stream included, in total. A read with backlog sends data +
  control at once (2 events: returns immediately); a read at the tail of an open stream sends one
  control event and then idles, so it costs `REQUEST_TIMEOUT`; a closed stream's response ends by
  itself. If SSE cases ever make this module slow, drop "sse" from the `live` enum of the
  schema used for generation rather than raising the limits.

Streams and a bucket named in the schema's `examples` (`schemathesis`, `s1`, `nested/s2`) are
created first, so generated requests sometimes hit existing streams (reads with data, appends,
idempotent PUTs, 409s) instead of only 404s.

Two deterministic tests complete the picture with the same checks: `test_protocol_flows_conform`
walks through states random generation rarely reaches (304, long-poll 204, producer 200/204/403/409,
closed streams, forks and soft deletion, non-empty buckets), and `test_known_bug_reproductions`
replays the server bugs found so far (red until each is fixed, then a regression test).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core import NOT_SET
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server import RillProcess

OPENAPI = Path(__file__).resolve().parent.parent / "openapi" / "rill.yaml"

MAX_EXAMPLES = 40
REQUEST_TIMEOUT = 3.0  # seconds; well above the fixture's 1 s long-poll timeout
MAX_STREAM_EVENTS = 2  # an SSE response is cut after its first data + control pair

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

BUCKET = "schemathesis"
# (route prefix, stream id, content type, initial body) for every family.
SEEDS = [
    (prefix, name, content_type, body)
    for prefix in (f"/ds/{BUCKET}/", "/streams/", "/v1/stream/")
    for name, content_type, body in (
        ("s1", "text/plain", b"hello"),
        ("nested/s2", "application/json", b'[{"n":1},{"n":2}]'),
    )
]


def _load_document() -> dict:
    with OPENAPI.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _schema_for_generation() -> schemathesis.schemas.BaseSchema:
    config = SchemathesisConfig.from_dict(
        {
            "request-timeout": REQUEST_TIMEOUT,
            "max-stream-events": MAX_STREAM_EVENTS,
            "generation": {"mode": "all", "max-examples": MAX_EXAMPLES},
        }
    )
    return schemathesis.openapi.from_path(OPENAPI, config=config)


schema = _schema_for_generation()


def test_document_is_valid_openapi() -> None:
    document = _load_document()
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_server_serves_the_document(client: httpx.Client) -> None:
    response = client.get("/openapi.yaml")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/yaml")
    assert response.content == OPENAPI.read_bytes()
    assert yaml.safe_load(response.content) == _load_document()


@pytest.fixture(scope="module")
def seeded(rill: RillProcess) -> Iterator[str]:
    """The bucket and streams the schema's examples name, so generated requests can hit them."""
    with httpx.Client(base_url=rill.url, timeout=10) as c:
        assert c.put(f"/ds/{BUCKET}").status_code in (200, 201)
        for prefix, name, content_type, body in SEEDS:
            response = c.put(prefix + name, content=body, headers={"content-type": content_type})
            assert response.status_code in (200, 201), response.text
    yield rill.url


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_server_conforms_to_the_document(case: schemathesis.Case, seeded: str) -> None:
    case.call_and_validate(base_url=seeded, checks=CHECKS)


# Deterministic flows. Random generation rarely reaches states that need a sequence of requests
# (an ETag to revalidate, a producer's history, a closed stream, a soft-deleted fork source, a
# non-empty bucket), so these walk through them and validate every response against the
# document with the same checks, plus the status the protocol requires.

DS = "/ds/{bucket}"
DS_STREAM = "/ds/{bucket}/{stream}"
COMPAT = "/v1/stream/{path}"
LEGACY = "/streams/{id}"


class Api:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def __call__(
        self,
        method: str,
        template: str,
        params: dict[str, str],
        status: int,
        *,
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
        body: Any = NOT_SET,
        media_type: str | None = None,
    ) -> schemathesis.Response:
        case = schema[template][method].Case(
            path_parameters=params,
            headers=headers or {},
            query=query or {},
            body=body,
            media_type=media_type if body is not NOT_SET else None,
        )
        response = case.call_and_validate(base_url=self.base_url, checks=CHECKS)
        assert response.status_code == status, (method, template, params, response.status_code, response.content)
        return response


def header(response: schemathesis.Response, name: str) -> str | None:
    values = response.headers.get(name.lower())
    return values[0] if values else None


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


# Server bugs the fuzzer found, or that were found while writing the document, as fixed
# reproductions: each must get a documented, non-5xx, schema-conforming answer. The comments say
# what the server did when the bug was found; the Location ones were fixed in 4451877 and stay as
# regressions, the rest stay red until fixed. Each creates what it needs under a fresh name
# ("{u}"), since the fuzzer may have deleted the seeded streams by the time these run.
TEXT = {"body": "hello", "media_type": "text/plain"}
LONG = "9" * 4301
KNOWN_BUGS = [
    pytest.param(
        # CORS preflights are answered by CORSMiddleware, which wraps the router that adds the
        # security headers: no X-Content-Type-Options / Cross-Origin-Resource-Policy.
        [
            (
                "OPTIONS",
                COMPAT,
                {"path": "bug-{u}"},
                {"headers": {"Origin": "https://example.com", "Access-Control-Request-Method": "GET"}},
            )
        ],
        id="preflight-lacks-security-headers",
    ),
    pytest.param(
        # Location carries the decoded path: a non-Latin-1 id makes the reply unencodable -> 500
        # (the stream is created anyway).
        [("PUT", COMPAT, {"path": "bug-{u}/\u4e2d"}, {})],
        id="location-non-latin1-500",
    ),
    pytest.param(
        # A control character in the id ends up raw in Location: uvicorn refuses the header and
        # drops the connection without any response (the stream is created anyway).
        [("PUT", COMPAT, {"path": "bug-{u}/a\x07b"}, {})],
        id="location-control-char-no-response",
    ),
    pytest.param(
        # Location is not percent-encoded: a space is sent raw ("http://host/v1/stream/bug-../a b").
        [("PUT", COMPAT, {"path": "bug-{u}/a b"}, {})],
        id="location-not-percent-encoded",
    ),
    pytest.param(
        # next_cursor(): "\u00b2".isdigit() is True but int("\u00b2") raises -> 500
        # (with live=sse the stream is cut right after the headers).
        [
            ("PUT", COMPAT, {"path": "bug-{u}"}, TEXT),
            ("GET", COMPAT, {"path": "bug-{u}"}, {"query": {"offset": "-1", "live": "long-poll", "cursor": "\u00b2"}}),
        ],
        id="cursor-superscript-digit-500",
    ),
    pytest.param(
        # int() of a cursor longer than 4300 digits raises (sys.get_int_max_str_digits()) -> 500.
        [
            ("PUT", COMPAT, {"path": "bug-{u}"}, TEXT),
            ("GET", COMPAT, {"path": "bug-{u}"}, {"query": {"offset": "-1", "live": "long-poll", "cursor": LONG}}),
        ],
        id="cursor-too-long-500",
    ),
    pytest.param(
        # Bucket listing: "\u00b2".isdigit() passes the limit check, int("\u00b2") raises -> 500.
        [
            ("PUT", DS, {"bucket": "bug-{u}"}, {}),
            ("GET", DS, {"bucket": "bug-{u}"}, {"query": {"limit": "\u00b2"}}),
        ],
        id="bucket-limit-superscript-digit-500",
    ),
    pytest.param(
        # StreamTarget.resolve(): urlsplit() raises ValueError on an invalid IPv6 netloc -> 500.
        [("PUT", COMPAT, {"path": "bug-{u}"}, {"headers": {"Stream-Forked-From": "http://[x/y"}})],
        id="fork-from-invalid-url-500",
    ),
    pytest.param(
        # Accepted on PUT, but the expiry is after 9999-12-31T23:59:59.999Z in UTC: HEAD cannot
        # format Stream-Expires-At (year 10000) -> 500 on every HEAD of that stream.
        [
            ("PUT", COMPAT, {"path": "bug-{u}"}, {"headers": {"Stream-Expires-At": "9999-12-31T23:59:59-23:59"}}),
            ("HEAD", COMPAT, {"path": "bug-{u}"}, {}),
        ],
        id="expires-at-beyond-year-9999-head-500",
    ),
]


@pytest.mark.parametrize("steps", KNOWN_BUGS)
def test_known_bug_reproductions(seeded: str, steps: list[tuple[str, str, dict[str, str], dict[str, Any]]]) -> None:
    u = uuid.uuid4().hex[:8]
    for method, template, params, kwargs in steps:
        params = {name: value.replace("{u}", u) for name, value in params.items()}
        case = schema[template][method].Case(path_parameters=params, **kwargs)
        case.call_and_validate(base_url=seeded, checks=CHECKS)
