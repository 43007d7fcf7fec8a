"""The HTTP edge: what a connection may cost before the app sees a request.

`connection.py` is uvicorn's httptools protocol with a connection cap, header, body and idle
timeouts, a header size limit, only the `chunked` transfer coding, and JSON bodies on every error it
writes itself. `limits.py` holds those limits and derives the cap from the process's fd limit.
"""
