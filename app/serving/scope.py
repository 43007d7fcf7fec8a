"""What the ASGI scope says about a connection and its request target, and how an access line shows them.

The addresses are read once per connection from the transport: `server` and `client` as
(host, port) pairs, `scheme` by whether the transport is TLS. The request target is split into the
scope's `path` (percent-decoded), `raw_path` and `query_string`, under the configured root path.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from typing import Any

import httptools


def remote_addr(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    """The client's (host, port); None for a Unix socket or a peer already gone."""
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        try:
            info = sock.getpeername()
        except OSError:  # uvloop on a Unix socket, or the peer already reset
            return None
        return (str(info[0]), int(info[1])) if isinstance(info, tuple) else None
    info = transport.get_extra_info("peername")
    if isinstance(info, list | tuple) and len(info) == 2:
        return (str(info[0]), int(info[1]))
    return None


def local_addr(transport: asyncio.BaseTransport) -> tuple[str, int | None] | None:
    """The server's (host, port), or (path, None) on a Unix socket."""
    sock: socket.socket | None = transport.get_extra_info("socket")
    info = sock.getsockname() if sock is not None else transport.get_extra_info("sockname")
    if isinstance(info, list | tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


def scheme(transport: asyncio.BaseTransport) -> str:
    return "https" if transport.get_extra_info("sslcontext") else "http"


def request_target(url: bytes, root_path: str) -> tuple[str, bytes, bytes]:
    """The scope's (path, raw_path, query_string) for a request line's target; raises
    httptools.HttpParserInvalidURLError, or UnicodeDecodeError, on one that is not a URL."""
    parsed = httptools.parse_url(url)
    raw_path = parsed.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return root_path + path, root_path.encode("ascii") + raw_path, parsed.query or b""


# For access lines


def client_label(scope: Any) -> str:
    """`host:port` of the client, or "" when unknown."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


def path_with_query(scope: Any) -> str:
    """The path as a log shows it: re-quoted (no control characters in a log line), with its query."""
    path = urllib.parse.quote(scope["path"])
    query: bytes = scope["query_string"]
    return f"{path}?{query.decode('ascii')}" if query else path
