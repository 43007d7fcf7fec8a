"""Where the commands write: stream data to stdout (raw bytes, or one compact JSON message per line
for JSON streams), everything meant for the person at the terminal to stderr."""

from __future__ import annotations

import json
import sys

from app.domain.media import media_type

JSON = "application/json"


def note(message: str) -> None:
    """A status line for the person, on stderr, so stdout stays the command's data."""
    print(message, file=sys.stderr, flush=True)


def is_json(content_type: str | None) -> bool:
    return content_type is not None and media_type(content_type) == JSON


class Sink:
    """Writes what reads return to stdout as it arrives (flushed, for pipes and `tail`)."""

    def __init__(self, json_stream: bool) -> None:
        self.json_stream = json_stream
        self.out = sys.stdout.buffer

    def body(self, data: bytes) -> None:
        """A read's body: raw bytes, or for a JSON stream the JSON array of its messages."""
        if self.json_stream:
            self.messages(json.loads(data) if data else [])
        elif data:
            self.out.write(data)
            self.out.flush()

    def messages(self, messages: list[object]) -> None:
        if messages:
            lines = (json.dumps(m, ensure_ascii=False, separators=(",", ":")) + "\n" for m in messages)
            self.out.write("".join(lines).encode())
            self.out.flush()
