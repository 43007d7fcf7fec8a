"""Server-Sent Events from a byte stream: `event:` and `data:` fields, comments skipped."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class Event:
    kind: str
    data: bytes  # the event's data lines joined with "\n"


def events(chunks: Iterable[bytes]) -> Iterator[Event]:
    """The events in `chunks` (any split), each yielded at the blank line that ends it."""
    buffer = bytearray()
    kind, data = "message", list[bytes]()
    for chunk in chunks:
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end]).removesuffix(b"\r")
            start = end + 1
            if not line:
                if data:
                    yield Event(kind, b"\n".join(data))
                kind, data = "message", []
                continue
            if line.startswith(b":"):
                continue  # a comment: the server's keep-alive ping
            name, _, value = line.partition(b":")
            value = value.removeprefix(b" ")
            if name == b"event":
                kind = value.decode("utf-8", "replace")
            elif name == b"data":
                data.append(value)
        del buffer[:start]
