"""Which stream a request names: (bucket, stream id) plus the path prefix its family uses."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from app.domain.errors import bad_request

MAX_STREAM_ID_BYTES = 1024

# Trailing segments that name /ds sub-resources, so no stream id may end in them.
DS_SUBROUTES = ("bootstrap", "attrs", "append-batch", "snapshot", "retention")


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
def validate_stream_id(name: str, *, reserved: tuple[str, ...] = ()) -> None:
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
    if reserved and _ends_in_subroute(segments, reserved):
        raise bad_request("stream id may not end in a reserved sub-route", "invalid_stream_id")


def _ends_in_subroute(segments: list[str], reserved: tuple[str, ...]) -> bool:
    if segments[-1] in reserved:
        return True
    return len(segments) >= 2 and segments[-2] in ("snapshot", "retention")
