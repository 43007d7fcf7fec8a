"""One client connection: an asyncio protocol on httptools' request parser, with the edge's limits.

uvicorn runs it (`uvicorn.run(..., http=protocol_for(limits))`) and owns the sockets, the TLS, the
lifespan and the signals; from uvicorn it takes only the public Config and ServerState it is built
with: the app, the root path, the connections and tasks uvicorn waits for on shutdown, the default
headers (date, server) and the lifespan state each request's scope gets a copy of. Everything on the
wire is its own: parsing through httptools, pipelining, keep-alive, flow control (flow.py), the
request/response cycle (cycle.py) and its own error answers (responses.py).

A connection is in one phase at a time, by what the parser is waiting for: IDLE (between requests,
or a response is under way), HEAD (a request has begun, its headers have not all arrived) or BODY.
Each phase has a deadline: IDLE the keep-alive timeout (none while a response is under way, so a
long-poll or SSE response is never cut), HEAD the header timeout, BODY the body timeout and minimum
rate, on the clock that runs only while the server is reading for the app.

One timer handle per connection, re-armed lazily: callbacks only note times, and the timer, when it
fires, reads the current phase's deadline and either acts or sleeps until it. A request on a busy
keep-alive connection costs no timer work; the timer wakes about once per keep-alive period.

A connection past `max_connections`, or past `max_connections_per_client` from its client's address
(app/serving/clients.py), is answered with a 503 and closed before anything is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from app.counters.counts import RequestCounters
from app.serving.clients import ClientSlots, client_key
from app.serving.cycle import EXTENSION, TAKE_OVER, Cycle
from app.serving.flow import FlowControl
from app.serving.head import Reject, check_head
from app.serving.limits import LINGER_SECONDS, EdgeLimits, Warnings
from app.serving.responses import error_response
from app.serving.scope import local_addr, remote_addr, request_target, scheme

_IDLE, _HEAD, _BODY = 0, 1, 2
EDGE_FAMILY = "edge"  # the route family the edge's own refusals are counted under (no route was chosen)
# A timer may fire a hair before its deadline; re-arming it for that is not worth a loop turn.
_SLACK = 0.005
# uvicorn's logger names: the log configuration (app/observability/logs.py) and operators know them.
logger = logging.getLogger("uvicorn.error")
access_logger = logging.getLogger("uvicorn.access")


class EdgeProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection, bounded: see the module's docstring."""

    limits = EdgeLimits()  # protocol_for() binds the server's limits
    clients = ClientSlots(limits.max_connections_per_client)  # and the server's count of connections per address
    warnings = Warnings()  # and when it last logged a refusal
    requests: RequestCounters | None = None  # and the server's request counts (what the edge refuses itself)

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # uvicorn builds one per connection, as protocol_class(config=, server_state=, app_state=, _loop=).
        if not config.loaded:
            config.load()
        self.app: Any = config.loaded_app
        self.root_path: str = config.root_path
        self.asgi_version: str = config.asgi_version
        # uvicorn silences its access logger when access_log is off; handlers are what a line needs.
        self.access_log = bool(config.access_log) and access_logger.hasHandlers()
        self.loop = _loop or asyncio.get_running_loop()
        self.server_state = server_state
        self.app_state = app_state  # the lifespan's state: each request's scope gets a shallow copy
        # uvicorn's shutdown calls shutdown() on every member and waits for the set, then the tasks, to empty.
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.parser = httptools.HttpRequestParser(self)
        self._take_over = self.take_over  # bound once per connection, not per request
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3 is strict here anyway
            # A request with `Connection: close` followed by more bytes is still answered.
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        # The connection
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.flow: FlowControl = None  # type: ignore[assignment]
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.cycle: Cycle | None = None  # the latest request's
        self.pipeline: deque[tuple[Cycle, Any]] = deque()  # requests read while a response is under way
        # The request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.scope: dict[str, Any] = {}
        self.expect_100_continue = False
        # The limits' bookkeeping
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._phase = _IDLE
        self._done = False  # answered or refused: nothing more reaches the parser
        self._upgraded = False  # an Upgrade request's head was parsed: nothing after it is
        self._running: Cycle | None = None  # the request whose response is under way (or was last)
        self._idle_since = 0.0
        # The read being parsed: its size, and whether it started between two requests.
        self._feed_len = 0
        self._feed_fresh = False
        self._head_start = 0.0
        self._head_bytes = 0  # bytes read while in HEAD: bounds what the parser buffers
        self._coding: bytes | None = None
        self._body_start = 0.0
        self._body_last = 0.0
        self._body_bytes = 0
        self._stalled_bytes = 0  # read in BODY without body progress: trailers, framing
        self._paused_at: float | None = None
        self._paused_total = 0.0
        self._client: str | None = None  # the address this connection counts against, if it counts

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._refuse(transport)
            return
        key = client_key(transport.get_extra_info("peername"))
        if self.clients.counted(key):
            assert key is not None
            if not self.clients.take(key):
                self._refuse_client(transport, key)
                return
            self._client = key
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport, self.pause_clock, self.resume_clock)
        self.server = local_addr(transport)
        self.client = remote_addr(transport)
        self.scheme = scheme(transport)
        self._idle_since = self.loop.time()
        self._arm(self._idle_since + self.limits.keepalive_timeout)

    def take_over(self, head: bytes, protocol: asyncio.Protocol) -> None:
        """Hands the connection to `protocol` (an Upgrade the app accepted): `head`, its 101, goes out
        first; this request, and this protocol's limits, timers and per-client slot are done with."""
        transport = self.transport
        if transport.is_closing() or self._done or self.pipeline:
            # Closing, or already answered (a bad request after this one's head), or more requests
            # behind it: the bytes that follow are not the new protocol's.
            raise ConnectionResetError("the connection cannot be taken over")
        if self.cycle is not None:
            self.cycle.response_started = self.cycle.response_complete = True
        self._done = True
        self.connection_lost(ConnectionAbortedError("taken over"))  # not None: the transport stays open
        self.flow.resume_reading()
        transport.write(head)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.connections.discard(self)
        if self._client is not None:
            self.clients.give(self._client)
            self._client = None
        # The response under way and the request parsed last (queued behind it when pipelined).
        for cycle in (self._running, self.cycle):
            if cycle is not None:
                if not cycle.response_complete:
                    cycle.disconnected = True
                cycle.wake()
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]  # the parser holds this protocol: break the cycle

    def eof_received(self) -> None:
        """The client half-closed: the transport closes (once what is written has gone out). A
        client that closes sends the same FIN as one that only stops writing, and a long-poll or SSE
        reader that left must not be held until it times out."""

    def pause_writing(self) -> None:  # the transport's buffer passed its high-water mark
        if self.flow is not None:
            self.flow.pause_writing()

    def resume_writing(self) -> None:
        if self.flow is not None:
            self.flow.resume_writing()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: an idle connection closes now, a busy one after its response
        (a live read's ends now: it is told its client left)."""
        latest = self.cycle
        if latest is None or latest.response_complete:
            if self.transport is not None:
                self.transport.close()
            return
        latest.keep_alive = False  # requests pipelined before it are still answered
        for cycle in (self._running, latest):  # the response under way, and the request queued behind it
            if cycle is not None and not cycle.response_complete:
                cycle.stop()

    def data_received(self, data: bytes) -> None:
        if self._done or self._upgraded:
            return  # answered, or after an Upgrade's head: what the client still sends is drained and dropped
        self._feed_len = len(data)
        self._feed_fresh = self._phase == _IDLE
        body_before = self._body_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            reason = exc.__context__
            if isinstance(reason, Reject):
                self._fail(reason.status, reason.code, reason.message)
            else:
                logger.warning("Invalid HTTP request received.")
                detail = "" if isinstance(exc, httptools.HttpParserCallbackError) else f": {exc}"
                self._fail(400, "bad_request", "invalid HTTP request" + detail)
            return
        except httptools.HttpParserUpgrade:
            pass  # the parser stops at an Upgrade's head (on_headers_complete saw it coming)
        limit = self.limits.max_header_bytes
        if self._phase == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > limit:
                self._fail(431, "headers_too_large", f"the request line and headers exceed {limit} bytes")
        elif self._phase == _BODY:
            if self._body_bytes != body_before:
                self._stalled_bytes = 0
            else:
                self._stalled_bytes += len(data)
                if self._stalled_bytes > limit:
                    self._fail(431, "headers_too_large", f"the request's trailers exceed {limit} bytes")

    # Parser callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        self._phase = _HEAD
        self._head_start = self.loop.time()
        # A request that begins mid-read after another one's bytes: this read is not counted (it
        # is at most one read past the limit); every later read in HEAD is.
        self._head_bytes = 0 if self._feed_fresh else -self._feed_len
        self._feed_fresh = False
        self._coding = None
        if self._paused_at is not None:
            self._paused_at = self._head_start  # the pause counts from here, not from before the request
        self._arm(self._head_start + self.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url  # the target may come in pieces, one per read

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase != _HEAD:
            return  # a chunked body's trailers: not part of the request's ASGI headers
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        elif name == b"transfer-encoding":
            self._coding = value if self._coding is None else self._coding + b"," + value
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        read = max(self._head_bytes, 0) + self._feed_len
        # Served with ws="none": an Upgrade request (bodiless, or refused) is answered as plain HTTP,
        # then the connection closes; nothing after its head is parsed.
        self._upgraded = self.parser.should_upgrade()
        check_head(self.url, self.headers, self._coding, self._upgraded, read, self.limits.max_header_bytes)
        now = self.loop.time()
        self._phase = _BODY
        self._body_start = self._body_last = now
        self._body_bytes = self._stalled_bytes = 0
        self._paused_total = 0.0
        if self._paused_at is not None or self.expect_100_continue:
            self._paused_at = now  # the client may wait for 100 Continue, sent when the app reads
        self._start_cycle()
        if self._paused_at is None:
            self._arm(now + self.limits.body_timeout)

    def _start_cycle(self) -> None:
        """The request's scope completed and its Cycle made: run now, or queued behind the response
        under way. No concurrency limit (max_connections is the bound) and no WebSocket: an Upgrade
        request is served as plain HTTP."""
        scope = self.scope
        scope["method"] = self.parser.get_method().decode("ascii")
        http_version = self.parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"], scope["raw_path"], scope["query_string"] = request_target(self.url, self.root_path)
        existing = self.cycle
        cycle = self.cycle = Cycle(
            scope,
            self.transport,
            self.flow,
            self.server_state.default_headers,
            # HTTP/1.0 is answered and closed, even with `Connection: keep-alive`.
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive() and not self._upgraded,
            expect_100_continue=self.expect_100_continue,
            on_response=self.on_response_complete,
            access_log=self.access_log,
        )
        scope["extensions"] = {EXTENSION: cycle, TAKE_OVER: self._take_over}
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:  # pipelined: queued behind the response under way, and nothing more read meanwhile
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    def _start_asgi_task(self, cycle: Cycle, app: Any) -> None:
        self._running = cycle
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._body_last = self.loop.time()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.body_received(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.message_complete()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            if self.pipeline:
                # Still queued: nothing more is read until they are answered (a request that wants its
                # body resumes reading itself), so a client pipelining without reading its answers
                # holds one read's worth of requests, not all the write buffer lets through.
                return
            self.flow.resume_reading()
            return
        self.flow.resume_reading()
        if self._phase == _IDLE:
            self._idle_since = self.loop.time()
            self._arm(self._idle_since + self.limits.keepalive_timeout)

    # The clock that runs while the server reads (FlowControl calls these)

    def pause_clock(self) -> None:
        if self._paused_at is None:
            self._paused_at = self.loop.time()

    def resume_clock(self) -> None:
        if self._paused_at is None:
            return
        now = self.loop.time()
        paused = now - self._paused_at
        self._paused_at = None
        if self._phase == _HEAD:
            self._head_start += paused
        elif self._phase == _BODY:
            self._paused_total += paused
            self._body_last = now
        deadline = self._deadline()
        if deadline is not None:
            self._arm(deadline)

    # Deadlines

    def _deadline(self) -> float | None:
        """When the current phase runs out; None while nothing is held against the client."""
        limits = self.limits
        if self._phase == _IDLE:
            if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
                return None  # a response is under way (a long-poll, SSE): the app decides its length
            return self._idle_since + limits.keepalive_timeout
        if self._paused_at is not None:
            return None
        if self._phase == _HEAD:
            return self._head_start + limits.header_timeout
        stalled = self._body_last + limits.body_timeout
        if limits.body_min_rate <= 0:
            return stalled
        # Past the grace the average rate over the reading time must stay at body_min_rate.
        reading_since = self._body_start + self._paused_total
        return min(stalled, reading_since + max(limits.body_timeout, self._body_bytes / limits.body_min_rate))

    def _arm(self, deadline: float) -> None:
        """Makes the timer fire no later than `deadline` (an earlier firing re-arms itself)."""
        if self._done:
            return
        if self._timer is not None:
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._done or self.transport.is_closing():
            return
        deadline = self._deadline()
        if deadline is None:
            return
        if deadline - self.loop.time() > _SLACK:
            self._arm(deadline)
        elif self._phase == _HEAD:
            timeout = self.limits.header_timeout
            self._fail(408, "request_timeout", f"the request's headers did not arrive within {timeout:g} s")
        elif self._phase == _BODY:
            self._fail(408, "request_timeout", "the request body arrived too slowly")
        else:
            self.transport.close()  # idle past the keep-alive timeout: closed without a word

    # Refusing and failing

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Past max_connections: a 503 and an immediate close, before reading anything."""
        if self.warnings.due("max_connections", self.loop.time()):
            logger.warning("max_connections (%d) reached: refusing new connections", self.limits.max_connections)
        message = f"the server has {self.limits.max_connections} connections open; retry shortly"
        self._answer_and_close(transport, "too_many_connections", message)

    def _refuse_client(self, transport: asyncio.Transport, key: str) -> None:
        """Past max_connections_per_client: the same, for one address's new connection."""
        limit = self.clients.limit
        if self.warnings.due("max_connections_per_client", self.loop.time()):
            logger.warning("max_connections_per_client (%d) reached by %s: refusing its new connections", limit, key)
        message = f"this client address has {limit} connections open, as many as one may; close some or retry shortly"
        self._answer_and_close(transport, "too_many_connections_from_client", message)

    def _answer_and_close(self, transport: asyncio.Transport, code: str, message: str) -> None:
        self.transport = transport  # for connection_lost
        self._done = True
        self._count_refusal(503)
        default_headers = self.server_state.default_headers
        transport.write(error_response(503, code, message, default_headers, retry_after=1))
        transport.close()

    def _can_answer(self) -> bool:
        """Whether an error written now would be read as the answer to the request being parsed."""
        if self.pipeline:
            return False  # queued requests would take it as theirs
        cycle = self.cycle
        if cycle is None:
            return True
        return not cycle.response_started if self._phase == _BODY else cycle.response_complete

    def _fail(self, status: int, code: str, message: str) -> None:
        """Answers the request being parsed with an error, if nothing else is on the wire, and closes."""
        answer = self._can_answer()
        if self._phase != _BODY:
            self._count_refusal(status)  # no app saw it (past its head, the request's app counts it)
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() reports a disconnect, its send() is dropped
            cycle.keep_alive = False
            cycle.wake()
        if not answer:
            self.transport.close()
            return
        self.transport.write(error_response(status, code, message, self.server_state.default_headers))
        self._linger()

    def _count_refusal(self, status: int) -> None:
        if self.requests is not None:
            self.requests.finished(EDGE_FAMILY, "other", status, None)

    def _linger(self) -> None:
        """Half-closes and drains what the client still sends, for a while: closing with unread input
        sends a reset, which can destroy the answer before the client reads it."""
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()
        self._timer = self.loop.call_later(LINGER_SECONDS, transport.close)


def protocol_for(limits: EdgeLimits, requests: RequestCounters | None = None) -> type[EdgeProtocol]:
    """An EdgeProtocol class bound to `limits`, for uvicorn's `http=` (it makes one per connection);
    what it refuses before any app sees a request is counted in `requests`, as family "edge"."""
    chosen, slots, _warnings, counted = limits, ClientSlots(limits.max_connections_per_client), Warnings(), requests

    class RillHttpProtocol(EdgeProtocol):
        limits = chosen
        clients = slots  # one count per server: create_app exempts the cluster's nodes from it
        warnings = _warnings
        requests = counted

    return RillHttpProtocol
