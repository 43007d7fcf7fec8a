"""One request/response cycle: uvicorn's, with a leaner start of the response.

uvicorn writes a response's head and body in two socket writes, and checks each header name and
value with its own regular-expression search. A response of known length (and one with no body)
here goes out in one write with its body, and the names and values are each checked in one
search over all of them (the patterns are character classes, so that is the same check). The
fallback 500 (the app raised before responding) is JSON.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

from app.domain.errors import error_body
from app.serving.responses import SECURITY_HEADERS


class Cycle(RequestResponseCycle):
    _head: bytes | None = None  # a head held back to go out with the body

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started and not self.access_log:
            if not self.disconnected and not self.flow.write_paused:
                self._start(message)
                return
        elif self._head is not None and message["type"] == "http.response.body":
            head, self._head = self._head, None
            if not self.disconnected:
                body = message.get("body", b"")
                if self.scope["method"] != "HEAD" and body:
                    self.transport.write(head + body)
                    self.expected_content_length -= len(body)
                    message = {**message, "body": b""}
                else:
                    self.transport.write(head)
        await super().send(message)

    def _start(self, message: Any) -> None:
        """uvicorn's handling of `http.response.start`, in fewer steps."""
        self.response_started = True
        self.waiting_for_100_continue = False
        status = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        names = b"".join(name for name, _ in headers)
        if HEADER_RE.search(names):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join(value for _, value in headers)):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content.extend([name, b": ", value, b"\r\n"])
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        no_body = self.scope["method"] == "HEAD" or status in (204, 304)
        if self.chunked_encoding is None and not no_body:
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        if self.chunked_encoding:
            self.transport.write(b"".join(content))  # a streaming body: its head goes out now
        else:
            self._head = b"".join(content)

    async def send_500_response(self) -> None:
        body = error_body("internal_error", "internal server error")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
            *SECURITY_HEADERS,
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
