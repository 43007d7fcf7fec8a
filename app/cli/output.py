"""Where the commands write: stream data to stdout (raw bytes, or one compact JSON message per line
for JSON streams), everything meant for the person at the terminal to stderr."""

from __future__ import annotations

import json
import re
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
            messages = message_texts(data) if data else []
            if messages:
                self.out.write("".join(m + "\n" for m in messages).encode())
                self.out.flush()
        elif data:
            self.out.write(data)
            self.out.flush()


# A JSON string, or whitespace outside one (each alternative consumes what the other cannot: linear).
_STRING_OR_SPACE = re.compile(r'("(?:[^"\\]|\\.)*")|[ \t\r\n]+')
_DECODER = json.JSONDecoder()


def message_texts(data: bytes) -> list[str]:
    """The messages of a JSON array as their own text, made compact (one line each): parsed and
    written again, 1.10 would print as 1.1 and 1e400 as Infinity, which is not JSON."""
    text = _STRING_OR_SPACE.sub(lambda m: m.group(1) or "", data.decode())
    if not text.startswith("[") or not text.endswith("]"):
        raise ValueError("a JSON stream's read is not a JSON array")
    out, at = [], 1
    while at < len(text) - 1:
        _, end = _DECODER.raw_decode(text, at)
        out.append(text[at:end])
        at = end + 1 if text[end] == "," else end
    return out
