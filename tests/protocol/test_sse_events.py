"""SSE data events keep every byte of a text payload through a parser that follows the SSE spec."""

from __future__ import annotations

import base64

import pytest

from app.protocol.sse_events import data_event


def parse_data(event: bytes) -> str:
    """What EventSource (and the Durable Streams clients) make of one event's data lines."""
    data = []
    for line in event.decode().split("\n"):
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(data)


@pytest.mark.parametrize(
    "text", [" leading space", "  two", "a\n indented\n", "plain", "", " ", "tab\tand  spaces ", "x\r\n y"]
)
def test_text_survives_a_spec_parser(text: str) -> None:
    expected = text.replace("\r\n", "\n")  # SSE has no way to carry CR: line ends are normalised
    assert parse_data(data_event(text.encode(), binary=False)) == expected


def test_binary_is_base64() -> None:
    payload = bytes(range(256))
    assert base64.b64decode(parse_data(data_event(payload, binary=True))) == payload
