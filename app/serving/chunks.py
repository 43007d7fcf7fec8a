"""Direct writes for long-lived streaming responses.

SSE fan-out renders a batch once and hands the same framed bytes to every subscriber. Going through
ASGI's `send` would cost a coroutine, a message dict and uvicorn's checks per subscriber per batch;
this writes the chunk straight to the connection's transport. It is offered in the request scope
as `scope["extensions"]["rill.chunks"]`; an app run under another server falls back to `send`.
"""

from __future__ import annotations

import contextlib
import socket
import struct

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

EXTENSION = "rill.chunks"


class ChunkWriter:
    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    @property
    def ready(self) -> bool:
        """Whether a chunked response has started and the body may be written directly."""
        cycle = self._cycle
        return cycle.response_started and not cycle.response_complete and bool(cycle.chunked_encoding)

    @property
    def closed(self) -> bool:
        return self._cycle.disconnected or self._cycle.transport.is_closing()

    def write(self, framed: bytes) -> None:
        """Writes bytes already framed as a chunk (`len-in-hex CRLF data CRLF`)."""
        self._cycle.transport.write(framed)

    def buffered(self) -> int:
        """Bytes written but not yet taken by the socket."""
        return self._cycle.transport.get_write_buffer_size()

    def abort(self) -> None:
        """Drops the connection and what is buffered for it: the client reconnects from its offset."""
        transport = self._cycle.transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # a reset, so the kernel drops its send buffer too
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
