"""Which stream a request names: (bucket, stream id) plus the path prefix its family uses."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from app.domain.errors import bad_request

MAX_STREAM_ID_BYTES = 1024

# The /ds sub-resources of a stream, as trailing path segments: kind -> (methods without an
# offset argument, methods with one, as in snapshot/{offset}). No /ds stream id may end in them.
SUBROUTES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "attrs": (("GET", "HEAD", "PUT"), ()),
    "append-batch": (("POST",), ()),
    "bootstrap": (("GET", "HEAD"), ()),
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
        """A stream id from a path (or URL) in the same family, e.g. Stream-Forked-From."""
        try:
            path = urlsplit(reference).path if "://" in reference else reference
        except ValueError:
            raise bad_request("Stream-Forked-From is not a valid path or URL", "invalid_fork") from None
        name = path[len(self.base) :] if path.startswith(self.base) else path.lstrip("/")
        validate_stream_id(name)
        return name


@lru_cache(maxsize=65536)
def validate_stream_id(name: str, *, ds: bool = False) -> None:
    """Raises a 400 ProtocolError for a bad id; good ids are remembered (this runs per request)."""
    if not name:
        raise bad_request("stream id is empty", "invalid_stream_id")
    if len(name.encode()) > MAX_STREAM_ID_BYTES:
        raise bad_request("stream id is longer than 1 KiB", "invalid_stream_id")
    if "\x00" in name:
        raise bad_request("stream id contains NUL", "invalid_stream_id")
    segments = name.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise bad_request("stream id has an empty, '.' or '..' segment", "invalid_stream_id")
    if ds and _ends_in_subroute(segments):
        raise bad_request("stream id may not end in a reserved sub-route", "invalid_stream_id")


def _ends_in_subroute(segments: list[str]) -> bool:
    return segments[-1] in SUBROUTES or (len(segments) >= 2 and segments[-2] in WITH_OFFSET)


def split_subroute(segments: list[str]) -> tuple[str, str, str | None] | None:
    """(stream id, kind, offset) when a /ds stream path names a sub-resource; None otherwise."""
    if len(segments) >= 2 and segments[-1] in SUBROUTES:
        return "/".join(segments[:-1]), segments[-1], None
    if len(segments) >= 3 and segments[-2] in WITH_OFFSET:
        return "/".join(segments[:-2]), segments[-2], segments[-1]
    return None
