"""Server-Sent Events from a byte stream: `event:` and `data:` fields, comments skipped."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class Event:
    kind: str
    data: bytes  # the event's data lines joined with "\n"


class EventParser:
    """Events from bytes fed in any split; each comes out at the blank line that ends it."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.kind, self.data = "message", list[bytes]()

    def feed(self, chunk: bytes) -> list[Event]:
        found: list[Event] = []
        self.buffer += chunk
        start = 0
        while (end := self.buffer.find(b"\n", start)) >= 0:
            line = bytes(self.buffer[start:end]).removesuffix(b"\r")
            start = end + 1
            if not line:
                if self.data:
                    found.append(Event(self.kind, b"\n".join(self.data)))
                self.kind, self.data = "message", []
                continue
            if line.startswith(b":"):
                continue  # a comment: the server's keep-alive ping
            name, _, value = line.partition(b":")
            value = value.removeprefix(b" ")
            if name == b"event":
                self.kind = value.decode("utf-8", "replace")
            elif name == b"data":
                self.data.append(value)
        del self.buffer[:start]
        return found


def events(chunks: Iterable[bytes]) -> Iterator[Event]:
    """The events in `chunks` (any split), each yielded at the blank line that ends it."""
    parser = EventParser()
    for chunk in chunks:
        yield from parser.feed(chunk)
