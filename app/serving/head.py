"""What a request's head must satisfy once it is complete, before its request runs."""

from __future__ import annotations


class Reject(Exception):
    """Raised in a parser callback: the request is answered with this error and the connection closed."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def check_head(
    url: bytes, headers: list[tuple[bytes, bytes]], coding: bytes | None, upgrade: bool, read: int, limit: int
) -> None:
    """Raises Reject for a head too large (`read`: the bytes read while it arrived, an upper bound of
    its size, so it is counted exactly only past the limit), a transfer coding other than chunked,
    or an Upgrade with a body (the parser stops at an Upgrade's head: its body would be parsed as
    requests of their own)."""
    if read > limit and len(url) + sum(len(name) + len(value) + 4 for name, value in headers) > limit:
        raise Reject(431, "headers_too_large", f"the request line and headers exceed {limit} bytes")
    if coding is not None and coding.strip().lower() != b"chunked":
        raise Reject(501, "unsupported_transfer_coding", "the only supported Transfer-Encoding is chunked")
    if upgrade and (
        coding is not None or any(n == b"content-length" and v.strip() not in (b"", b"0") for n, v in headers)
    ):
        raise Reject(400, "bad_request", "an Upgrade request may not have a body")
