"""The server honours the OpenAPI document (schemathesis).

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
created first, and restored before each operation's run (operations run in document order, and the
examples of `DELETE /ds/{bucket}/{stream}` would leave the sub-resources documented after it only
missing streams), so generated requests sometimes hit existing streams (reads with data, appends,
idempotent PUTs, 409s) instead of only 404s. The `/ds` ones also get what the `/ds` sub-resources'
examples need: `s1` ("hello") has snapshots at both example offsets (`..._0000` and `..._0005`, the
latter its latest), so snapshot GET/HEAD/DELETE, the latest-snapshot redirect, bootstrap with a
snapshot and retention up to a snapshot all answer something other than 404; `nested/s2` (a JSON
stream whose only boundaries are 0 and its tail: `..._0005` is 400 there) has attributes and a
snapshot at `..._0000`. Generated requests may change all of this (trim `s1` up to `..._0005`, so
its reads from `..._0000` answer 410, delete a snapshot, replace attributes, delete a stream):
every such answer is documented.

The other modules here walk deterministically, with the same checks, through states random
generation rarely reaches.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.openapi.helpers import CHECKS, MAX_EXAMPLES, schema, seed


@pytest.fixture()
def reseeded(seeded: str) -> str:
    """`seeded`, restored before each operation: operations run in document order, and the
    examples of `DELETE /ds/{bucket}/{stream}` would otherwise leave the sub-resources after it
    only missing streams."""
    seed(seeded, fresh=False)
    return seeded


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # `reseeded` runs once per operation, on purpose
    ],
)
def test_server_conforms_to_the_document(case: schemathesis.Case, reseeded: str) -> None:
    case.call_and_validate(base_url=reseeded, checks=CHECKS)
