"""The status-line table."""

from __future__ import annotations

import http

from app.serving.status import STATUS_LINE


def test_every_code_has_a_line_with_its_reason() -> None:
    assert STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"
    assert STATUS_LINE[204] == b"HTTP/1.1 204 No Content\r\n"
    assert STATUS_LINE[431] == b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    assert STATUS_LINE[503] == b"HTTP/1.1 503 Service Unavailable\r\n"
    assert set(STATUS_LINE) == set(range(100, 600))
    for status in http.HTTPStatus:
        if 100 <= status < 600:
            assert STATUS_LINE[status] == f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode()


def test_a_code_without_a_reason_gets_an_empty_one() -> None:
    assert STATUS_LINE[299] == b"HTTP/1.1 299 \r\n"
    assert STATUS_LINE[599] == b"HTTP/1.1 599 \r\n"
