"""The HTTP edge: Rill's own HTTP/1.1 server protocol, and what a connection may cost before the app
sees a request.

uvicorn runs the process (sockets, TLS, lifespan, signals, graceful shutdown) and is handed the
protocol class; nothing on the wire is uvicorn's:
- `connection.py`: one connection, an asyncio protocol on httptools' parser, with a connection cap,
  a per-client cap (`clients.py`), header, body and idle timeouts, a header size limit, only the
  `chunked` transfer coding, pipelining and 100-continue;
- `cycle.py`: one request's ASGI `receive`/`send`, and the `rill.chunks` direct-write extension;
- `flow.py`: reading and writing paused and resumed by buffer sizes;
- `responses.py`: the edge's own JSON error answers; `status.py` and `headers.py`: status lines and
  the header syntax a response may carry; `scope.py`: addresses and request target in the ASGI scope;
- `limits.py`: the limits, and the cap derived from the process's fd limit.
"""
