"""Header names and values the app may write: what would split or corrupt a response is refused."""

from __future__ import annotations

import time

import pytest

from app.serving.headers import INVALID_NAME, INVALID_VALUE, check_headers

TOKEN_CHARS = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def test_valid_headers_pass() -> None:
    check_headers([])
    check_headers([(b"content-type", b"text/plain; charset=utf-8"), (b"etag", b'"a\tb"')])
    check_headers([(TOKEN_CHARS, b"visible ascii " + bytes(range(0x20, 0x7F)))])
    check_headers([(b"x-obs-text", bytes(range(0x80, 0x100)))])  # obs-text: allowed in values


@pytest.mark.parametrize("char", [*range(0x00, 0x21), 0x7F, *b'()<>@,;:\\"[]={}'])
def test_a_name_with_a_control_space_or_separator_is_refused(char: int) -> None:
    with pytest.raises(RuntimeError, match="name"):
        check_headers([(b"x-ok", b"v"), (b"x-" + bytes([char]) + b"y", b"v")])


@pytest.mark.parametrize("char", [c for c in range(0x20) if c != 0x09] + [0x7F])
def test_a_value_with_a_control_character_is_refused(char: int) -> None:
    with pytest.raises(RuntimeError, match="value"):
        check_headers([(b"x-ok", b"v"), (b"x-bad", b"a" + bytes([char]) + b"b")])


def test_response_splitting_is_refused() -> None:
    with pytest.raises(RuntimeError):
        check_headers([(b"location", b"/x\r\nset-cookie: owned=1")])


def test_the_patterns_are_single_character_classes() -> None:
    # One class, no quantifiers: a linear scan whatever the input (no backtracking to exploit).
    for pattern in (INVALID_NAME, INVALID_VALUE):
        assert pattern.pattern.startswith(b"[") and pattern.pattern.endswith(b"]")
    long_value = b"a" * (8 << 20)
    start = time.monotonic()
    check_headers([(b"x-long", long_value)] * 4)
    assert time.monotonic() - start < 2.0
