"""Which stream a request names: (bucket, stream id) plus the path prefix its family uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote_to_bytes, urlsplit

from app.domain.errors import bad_request
from app.domain.names import stream_id_problem

# The /ds sub-resources of a stream, as trailing path segments: kind -> (methods without an
# offset argument, methods with one, as in snapshot/{offset}). No /ds stream id may end in them.
NAMESPACE = "__ds"  # the protocol's sub-resources of a stream live under {stream}/__ds/
SUBROUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "attrs": (("GET", "HEAD", "PUT"), ()),
    "append-batch": (("POST",), ()),
    "bootstrap": (("GET", "HEAD"), ()),
    "__ds/records": (("GET", "HEAD"), ()),
    "snapshot": (("GET", "HEAD"), ("GET", "HEAD", "PUT", "DELETE")),
    "retention": ((), ("PUT",)),
}
WITH_OFFSET = tuple(kind for kind, (_, with_arg) in SUBROUTES.items() if with_arg)


@dataclass(frozen=True)
class StreamTarget:
    bucket: str
    name: str
    base: str  # the path prefix stream ids live under, ending in "/"

    def resolve(self, reference: str) -> str:
        """A stream id from a path (or URL) in the same family, e.g. Stream-Forked-From.

        The path is percent-decoded as a request path is, so the Location of a stream names it."""
        try:
            path = urlsplit(reference).path if "://" in reference else reference
        except ValueError:
            raise bad_request("Stream-Forked-From is not a valid path or URL", "invalid_fork") from None
        path = _percent_decode(_header_bytes(path), "Stream-Forked-From")
        # Outside the family's base a path is read as an id in the same bucket: the conformance suite,
        # run against every family, names its fork sources by their compat paths.
        name = path[len(self.base) :] if path.startswith(self.base) else path.lstrip("/")
        validate_stream_id(name)
        return name


def decode_path(raw: bytes) -> str:
    """A request's path from the bytes the client sent (ASGI `raw_path`), percent-decoded as strict
    UTF-8: servers decode `scope["path"]` leniently, turning `%ff` into U+FFFD, another stream's id."""
    return _percent_decode(raw, "the request path")


# A `%` not followed by two hex digits: left as it is by unquote, so `a%zz` and `a%25zz` would name
# one stream.
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _percent_decode(raw: bytes, what: str) -> str:
    escaped = b"%" in raw
    if escaped and _BAD_ESCAPE.search(raw):
        raise bad_request(f"{what} has a % that is not followed by two hex digits", "invalid_stream_id")
    try:
        return (unquote_to_bytes(raw) if escaped else raw).decode()
    except UnicodeDecodeError:
        raise bad_request(f"{what} is not valid UTF-8 once percent-decoded", "invalid_stream_id") from None


def _header_bytes(value: str) -> bytes:
    # Header values arrive decoded as latin-1, so this gives back the bytes the client sent.
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # a value built in process, already text
        return value.encode()


@lru_cache(maxsize=65536)
def validate_stream_id(name: str, *, ds: bool = False) -> None:
    """Raises a 400 ProtocolError for a bad id; good ids are remembered (this runs per request)."""
    problem = stream_id_problem(name)
    if problem is not None:
        raise bad_request(problem, "invalid_stream_id")
    segments = name.split("/")
    if NAMESPACE in segments:  # in every family: the control routes live under it
        message = f"stream id may not have a {NAMESPACE} segment (the protocol's namespace)"
        raise bad_request(message, "invalid_stream_id")
    if ds and _ends_in_subroute(segments):
        raise bad_request("stream id may not end in a reserved sub-route", "invalid_stream_id")


def _ends_in_subroute(segments: list[str]) -> bool:
    return segments[-1] in SUBROUTES or (len(segments) >= 2 and segments[-2] in WITH_OFFSET)


def split_subroute(segments: list[str]) -> tuple[str, str, str | None] | None:
    """(stream id, kind, offset) when a /ds stream path names a sub-resource; None otherwise."""
    if len(segments) >= 3 and segments[-2] == NAMESPACE and f"{NAMESPACE}/{segments[-1]}" in SUBROUTES:
        return "/".join(segments[:-2]), f"{NAMESPACE}/{segments[-1]}", None
    if len(segments) >= 2 and segments[-1] in SUBROUTES:
        return "/".join(segments[:-1]), segments[-1], None
    if len(segments) >= 3 and segments[-2] in WITH_OFFSET:
        return "/".join(segments[:-2]), segments[-2], segments[-1]
    return None


# The protocol's control routes under a root (a path prefix, possibly empty, in a family):
# {root}/__ds/jwks.json and {root}/__ds/subscriptions/{id}[/streams[/{path}]|/claim|/ack|/release|/callback].
SUBSCRIPTION_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_ACTIONS = ("claim", "ack", "release", "callback")


@dataclass(frozen=True)
class ControlTarget:
    bucket: str
    root: str  # below the family's base, without slashes at either end; "" for the base itself
    base: str
    kind: str  # "jwks", "list", "subscription", "streams", "stream" or one of _ACTIONS
    sub_id: str | None = None
    arg: str | None = None  # the stream path of .../streams/{path}


def split_control(bucket: str, base: str, segments: list[str]) -> ControlTarget | None:
    """The control route a path names (`segments` below the family's base), or None."""
    try:
        at = segments.index(NAMESPACE)
    except ValueError:
        return None
    root, rest = "/".join(segments[:at]), segments[at + 1 :]
    if not rest or rest[0] not in ("subscriptions", "jwks.json"):
        return None
    if root:
        validate_stream_id(root)
    if rest == ["jwks.json"]:
        return ControlTarget(bucket, root, base, "jwks")
    if rest == ["subscriptions"] and root:
        return ControlTarget(bucket, root, base, "list")  # {stream}/__ds/subscriptions: its consumer groups
    if rest[0] != "subscriptions" or len(rest) < 2:
        raise bad_request("a subscription route names one: __ds/subscriptions/{id}", "invalid_subscription_id")
    sub_id, tail = rest[1], rest[2:]
    if not SUBSCRIPTION_ID.fullmatch(sub_id):
        raise bad_request("subscription ids are 1 to 128 of A-Z, a-z, 0-9 and ._~-", "invalid_subscription_id")
    if not tail:
        return ControlTarget(bucket, root, base, "subscription", sub_id)
    if tail == ["streams"]:
        return ControlTarget(bucket, root, base, "streams", sub_id)
    if tail[0] == "streams":
        path = "/".join(tail[1:])
        validate_stream_id(path)
        return ControlTarget(bucket, root, base, "stream", sub_id, path)
    if len(tail) == 1 and tail[0] in _ACTIONS:
        return ControlTarget(bucket, root, base, tail[0], sub_id)
    raise bad_request(f"no such subscription route: {'/'.join(tail)}", "INVALID_SUBSCRIPTION_ROUTE")
