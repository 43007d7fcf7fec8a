"""Status lines, built once: a response's first line is a dict lookup, not a format per request.

Every code from 100 to 599 has a line; a code without a registered reason phrase gets an empty one
(`HTTP/1.1 599 \r\n`), which HTTP allows: clients go by the number.
"""

from __future__ import annotations

import http


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %b\r\n" % (status, phrase)


STATUS_LINE: dict[int, bytes] = {status: _status_line(status) for status in range(100, 600)}
