"""What the OpenAPI tests share: the document, the schemathesis schema and checks, the seeded names, `Api`."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import httpx
import schemathesis
import yaml
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core import NOT_SET
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

OPENAPI = Path(__file__).resolve().parents[2] / "openapi" / "rill.yaml"

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


# What the `/ds` sub-resources' examples name (see tests/openapi/test_schemathesis.py).
ZERO = "0000000000000000_0000000000000000"
FIVE = "0000000000000000_0000000000000005"  # the tail of s1 ("hello"); not a boundary of nested/s2
SNAPSHOT_SEEDS = [
    # (stream, offset, content type, blob)
    ("s1", ZERO, "application/octet-stream", b"initial state"),
    ("s1", FIVE, "text/plain", b"state after hello"),
    ("nested/s2", ZERO, "application/json", b'{"count": 0}'),
]
ATTRS_SEEDS = [("nested/s2", {"title": "Nested", "metadata": {"owner": "tests/openapi"}})]


def load_document() -> dict:
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


def seed(base_url: str, *, fresh: bool) -> None:
    """Creates what the schema's examples name. On a fresh server every step must succeed; later
    (`fresh=False`) it restores what generated requests deleted and leaves the rest as it is (a
    stream they closed or trimmed answers 409/410 here, which is fine)."""
    with httpx.Client(base_url=base_url, timeout=10) as c:
        steps = [c.put(f"/ds/{BUCKET}")]
        steps += [c.put(prefix + name, content=body, headers={"content-type": ct}) for prefix, name, ct, body in SEEDS]
        steps += [
            c.put(f"/ds/{BUCKET}/{name}/snapshot/{offset}", content=blob, headers={"content-type": ct})
            for name, offset, ct, blob in SNAPSHOT_SEEDS
        ]
        steps += [c.put(f"/ds/{BUCKET}/{name}/attrs", json=attrs) for name, attrs in ATTRS_SEEDS]
    for response in steps:
        ok = response.status_code in (200, 201, 204) if fresh else response.status_code < 500
        assert ok, (response.request.method, response.request.url, response.status_code, response.text)


# Route templates of the document's operations.
DS = "/ds/{bucket}"
DS_STREAM = "/ds/{bucket}/{stream}"
COMPAT = "/v1/stream/{path}"
LEGACY = "/streams/{id}"
ATTRS = "/ds/{bucket}/{stream}/attrs"
BATCH = "/ds/{bucket}/{stream}/append-batch"
BOOTSTRAP = "/ds/{bucket}/{stream}/bootstrap"
LATEST = "/ds/{bucket}/{stream}/snapshot"
SNAPSHOT = "/ds/{bucket}/{stream}/snapshot/{offset}"
RETENTION = "/ds/{bucket}/{stream}/retention/{offset}"


class Api:
    """Calls one documented operation, checks the response against the document and its status."""

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


def frames(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)
