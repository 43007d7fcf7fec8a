"""What a response header may hold: the app's names and values are checked before they reach the wire.

A name or value the app got wrong (a CR/LF smuggled from user input, a space in a name) would split
or corrupt the response; the response fails with a RuntimeError instead (run_asgi turns it into a
500 when nothing has been sent yet).

Both patterns are a single character class: one linear scan, nothing to backtrack, so the names (or
the values) of a whole response are checked in one search over their concatenation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Not in a field name (RFC 9110 `token`): controls, DEL, space, tab, and the separators.
INVALID_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
# Not in a field value: controls but horizontal tab (CR and LF above all), and DEL. obs-text
# (0x80-0xff) passes, as HTTP allows.
INVALID_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def check_headers(headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Raises RuntimeError if a name or a value may not be written as is."""
    if INVALID_NAME.search(b"".join([name for name, _ in headers])):
        raise RuntimeError("Invalid HTTP header name.")
    if INVALID_VALUE.search(b"".join([value for _, value in headers])):
        raise RuntimeError("Invalid HTTP header value.")
