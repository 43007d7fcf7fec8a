"""Live SSE subscribers at a stream's tail, served together.

A subscriber that has caught up joins its stream's feed. When an apply changes the stream, the feed
reads the new records once (from the shared tail in memory), renders the data and control events
once, frames them once as an HTTP chunk, and writes the same bytes to every subscriber at that
position. Only a subscriber whose request carried a cursor at or past the current interval gets a
control event of its own (the protocol's jitter rule).

A subscriber whose unsent bytes pass `sse_buffer_bytes` when an event is due is disconnected, and
resumes from its offset when it reconnects: a slow reader never holds the others back, and holds
at most that much plus one event (a read chunk) of memory.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import Any, Protocol

from starlette.types import Send

from app.protocol.cursor import next_cursor
from app.protocol.reads import render_body
from app.protocol.sse_events import PING, control_event, data_event, frame, is_binary
from app.service.engine import Engine
from app.state_machine.reader import ColdMiss
from app.state_machine.records import StreamMeta

log = logging.getLogger("rill.fanout")


class Release(Enum):
    ENDED = "ended"  # the stream closed, or is gone: the response ends
    CATCH_UP = "catch_up"  # the next records are not local: the subscriber reads them itself
    DROPPED = "dropped"  # too slow, or its connection closed


class Sink(Protocol):
    def offer(self, framed: bytes, event: bytes, limit: int) -> bool:
        """Hands over an event (and the same, framed as a chunk); False if the subscriber is gone, or
        had more than `limit` bytes not yet taken (then it is dropped: it resumes by reconnecting)."""
        ...


class DirectSink:
    """Writes the shared chunk straight to the connection (see app/serving/cycle.py)."""

    __slots__ = ("_writer",)

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def offer(self, framed: bytes, event: bytes, limit: int) -> bool:
        return bool(self._writer.offer(framed, limit))


class QueueSink:
    """For a server without direct writes: events queue here and the subscriber's task sends them."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.size = 0
        self.dropped = False
        self.finished = False
        self.wake = asyncio.Event()

    def offer(self, framed: bytes, event: bytes, limit: int) -> bool:
        if self.dropped:
            return False
        if self.size > limit:
            self.dropped = True
            self.pending, self.size = [], 0
            self.wake.set()
            return False
        self.pending.append(event)
        self.size += len(event)
        self.wake.set()
        return True

    async def pump(self, send: Send) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.pending:
                events, self.pending, self.size = self.pending, [], 0
                await send({"type": "http.response.body", "body": b"".join(events), "more_body": True})
            if self.finished:
                return

    async def finish(self, pump: asyncio.Future[None]) -> None:
        """Sends what is queued, then stops the pump (never mid-send: no event is lost)."""
        self.finished = True
        self.wake.set()
        await pump


class Subscriber:
    __slots__ = ("cursor", "done", "last_write", "offer", "pos")

    def __init__(self, pos: int, cursor: int | None, sink: Sink) -> None:
        self.pos = pos
        self.cursor = cursor  # the request's cursor, if it had one
        self.offer = sink.offer  # bound once: called per subscriber per event
        self.done: asyncio.Future[Release] = asyncio.get_running_loop().create_future()
        self.last_write = 0.0


Feed = dict[int, list[Subscriber]]  # position -> the subscribers waiting there


class Fanout:
    """Every stream's feed on one node: made once, with the node's routes (app/routes/__init__.py)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.feeds: dict[int, Feed] = {}  # sid -> its feed
        self._due: set[int] = set()
        self._scheduled = False
        self._pinger: asyncio.Task[None] | None = None
        engine.signals.listen(self._changed)

    def join(self, meta: StreamMeta, sub: Subscriber) -> None:
        """Adds a subscriber that has read everything up to `sub.pos`; call with no await since reading."""
        self.feeds.setdefault(meta.sid, {}).setdefault(sub.pos, []).append(sub)
        sub.last_write = asyncio.get_running_loop().time()
        if self._pinger is None or self._pinger.done():
            self._pinger = asyncio.create_task(self._ping_forever())

    def leave(self, sid: int, sub: Subscriber) -> None:
        feed = self.feeds.get(sid)
        waiting = feed.get(sub.pos) if feed is not None else None
        if feed is None or waiting is None or sub not in waiting:
            return
        waiting.remove(sub)
        if not waiting:
            del feed[sub.pos]
        if not feed:
            del self.feeds[sid]

    def _changed(self, sids: set[int]) -> None:
        due = sids & self.feeds.keys()
        if due:
            self._due |= due
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        due, self._due = self._due, set()
        for sid in due:
            feed = self.feeds.pop(sid, None)
            if feed:
                try:
                    self._advance(sid, feed)
                except Exception:  # a bug must not leave this stream's readers, or the next streams', waiting
                    log.exception("the fan-out of stream %d failed: its readers read on their own", sid)
                    for subs in feed.values():
                        for sub in subs:
                            _release(sub, Release.CATCH_UP)

    def _advance(self, sid: int, feed: Feed) -> None:
        engine = self.engine
        meta = engine.stream(sid)
        now = engine.now_ms()
        if meta is None or meta.deleted or meta.expired(now, engine.touched(sid)):
            for subs in feed.values():
                for sub in subs:
                    _release(sub, Release.ENDED)
            return
        for pos, subs in feed.items():
            if pos < meta.tail or meta.closed:
                self._send_from(meta, pos, subs, now)
            else:
                self._wait_at(sid, pos, subs)

    def _wait_at(self, sid: int, pos: int, subs: list[Subscriber]) -> None:
        if subs:
            self.feeds.setdefault(sid, {}).setdefault(pos, []).extend(subs)

    def _send_from(self, meta: StreamMeta, pos: int, subs: list[Subscriber], now: int) -> None:
        """Sends [pos, tail) to `subs`, rendered once per chunk, then leaves them waiting at the tail."""
        engine, binary = self.engine, is_binary(meta.content_type)
        shared_cursor = next_cursor(now, None)
        current = int(shared_cursor)
        limit = engine.limits.sse_buffer_bytes
        written_at = asyncio.get_running_loop().time()
        while subs:
            if pos >= meta.tail:
                if not meta.closed:
                    self._wait_at(meta.sid, pos, subs)
                    return
                closing = control_event(pos, None, True, True)
                for sub in subs:
                    _write(sub, frame(closing), closing, limit, written_at)
                    _release(sub, Release.ENDED)
                return
            try:
                chunk = engine.read_local(meta, pos)
            except (LookupError, ColdMiss):
                chunk = None  # evicted to the object store: fetching it is each reader's own business
            if chunk is None or not chunk.payloads:
                for sub in subs:
                    _release(sub, Release.CATCH_UP)
                return
            pos = chunk.next_pos
            at_tail = pos >= meta.tail
            closed = meta.closed and at_tail
            data = data_event(render_body(meta, chunk), binary)
            event = data + control_event(pos, shared_cursor, at_tail, closed)
            framed = frame(event)
            kept = []
            for sub in subs:  # the hot loop of a fan-out: _write inlined for the shared event
                if sub.cursor is not None and sub.cursor >= current:  # a cursor of its own: jitter
                    own = data + control_event(pos, next_cursor(now, str(sub.cursor)), at_tail, closed)
                    ok = _write(sub, frame(own), own, limit, written_at)
                elif sub.done.done():
                    ok = False
                elif sub.offer(framed, event, limit):
                    sub.last_write = written_at
                    ok = True
                else:
                    _release(sub, Release.DROPPED)
                    ok = False
                if ok:
                    sub.pos = pos
                    kept.append(sub)
            subs = kept
            if closed:
                for sub in subs:
                    _release(sub, Release.ENDED)
                return

    async def _ping_forever(self) -> None:
        """A comment to subscribers that got nothing for a while, so proxies keep their connections."""
        interval = self.engine.limits.sse_ping_seconds
        loop = asyncio.get_running_loop()
        framed = frame(PING)
        while self.feeds:
            await asyncio.sleep(interval / 2)
            now = loop.time()
            quiet_since = now - interval
            for feed in list(self.feeds.values()):
                for subs in list(feed.values()):
                    for sub in list(subs):
                        if sub.last_write <= quiet_since:
                            _write(sub, framed, PING, self.engine.limits.sse_buffer_bytes, now)


def _write(sub: Subscriber, framed: bytes, event: bytes, limit: int, now: float) -> bool:
    """Hands a subscriber its bytes; False (and lets it go) if it is gone or too far behind: a limit on
    what it has not taken yet, before this event, so it holds at most one event more."""
    if sub.done.done():
        return False
    if not sub.offer(framed, event, limit):
        _release(sub, Release.DROPPED)
        return False
    sub.last_write = now
    return True


def _release(sub: Subscriber, why: Release) -> None:
    if not sub.done.done():
        sub.done.set_result(why)
