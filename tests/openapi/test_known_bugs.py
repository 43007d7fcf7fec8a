"""Server bugs the fuzzer found, or that were found while writing the document, as fixed reproductions.

Each must get a documented, non-5xx, schema-conforming answer. The comments say what the server did
when the bug was found; the Location ones were fixed in 4451877 and stay as regressions, the rest
stay red until fixed. Each creates what it needs under a fresh name ("{u}"), since the fuzzer may
have deleted the seeded streams by the time these run. The ones found while documenting the /ds
sub-resources (deeply nested JSON gave 500) are fixed and stay as regressions too.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.openapi.helpers import ATTRS, BATCH, BUCKET, CHECKS, COMPAT, DS, DS_STREAM, frames, schema

TEXT = {"body": "hello", "media_type": "text/plain"}
LONG = "9" * 4301
DEEP = "[" * 1000 + "]" * 1000  # 2 KB of JSON nested 1000 deep
DEEP_ATTRS = '{"metadata": {"a": ' + DEEP + "}}"
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
    pytest.param(
        # parse_attrs(): msgspec raises RecursionError (not DecodeError/ValidationError) on JSON
        # nested about 1000 deep, well under the 16 KiB limit -> 500 (nothing is stored).
        [
            ("PUT", DS, {"bucket": "bug-{u}"}, {}),
            ("PUT", DS_STREAM, {"bucket": "bug-{u}", "stream": "s"}, TEXT),
            (
                "PUT",
                ATTRS,
                {"bucket": "bug-{u}", "stream": "s"},
                {"body": DEEP_ATTRS.encode(), "media_type": "application/json"},
            ),
        ],
        id="attrs-deep-json-500",
    ),
    pytest.param(
        # The same through `Stream-Attrs` on create -> 500 (the stream is not created).
        [
            ("PUT", DS, {"bucket": "bug-{u}"}, {}),
            ("PUT", DS_STREAM, {"bucket": "bug-{u}", "stream": "s"}, {"headers": {"Stream-Attrs": DEEP_ATTRS}}),
        ],
        id="stream-attrs-deep-json-500",
    ),
    pytest.param(
        # json_record(): decoding list[msgspec.Raw] still recurses -> RecursionError -> 500 for a
        # deeply nested JSON body on create or append of any family, and for such a frame of an
        # append-batch to a JSON stream (instead of a per-frame 400 result).
        [
            ("PUT", COMPAT, {"path": "bug-{u}"}, {"body": [], "media_type": "application/json"}),
            ("POST", COMPAT, {"path": "bug-{u}"}, {"body": DEEP.encode(), "media_type": "application/json"}),
        ],
        id="json-append-deep-nesting-500",
    ),
    pytest.param(
        [
            ("PUT", DS, {"bucket": "bug-{u}"}, {}),
            ("PUT", DS_STREAM, {"bucket": "bug-{u}", "stream": "j"}, {"body": [], "media_type": "application/json"}),
            (
                "POST",
                BATCH,
                {"bucket": "bug-{u}", "stream": "j"},
                {
                    "headers": {"Content-Type": "application/json"},
                    "body": frames(DEEP.encode()),
                    "media_type": "application/octet-stream",
                },
            ),
        ],
        id="append-batch-deep-json-frame-500",
    ),
]


@pytest.mark.parametrize("steps", KNOWN_BUGS)
def test_known_bug_reproductions(seeded: str, steps: list[tuple[str, str, dict[str, str], dict[str, Any]]]) -> None:
    u = uuid.uuid4().hex[:8]
    for method, template, params, kwargs in steps:
        params = {name: value.replace("{u}", u) for name, value in params.items()}
        case = schema[template][method].Case(path_parameters=params, **kwargs)
        case.call_and_validate(base_url=seeded, checks=CHECKS)


def test_cors_exposes_the_new_protocol_headers(seeded: str) -> None:
    """The document says cross-origin responses expose every protocol header; browsers cannot
    read the retention and snapshot headers unless Access-Control-Expose-Headers names them."""
    with httpx.Client(base_url=seeded, timeout=10) as c:
        response = c.head(f"/ds/{BUCKET}/s1", headers={"Origin": "https://example.com"})
    exposed = {h.strip().lower() for h in response.headers["access-control-expose-headers"].split(",")}
    assert {"stream-earliest-offset", "stream-snapshot-offset", "stream-snapshot-digest"} <= exposed
