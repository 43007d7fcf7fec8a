"""`rill tail URL [--sse | --long-poll] [--from now|OFFSET]`: follows a stream live, writing what
arrives to stdout, until Ctrl-C (exit 0) or until the stream is closed (exit 0).

When the server ends a response (SSE responses end about once a minute; long-polls at their
timeout) or the connection drops, the next request continues from the last offset and cursor.

The HTTP runs in a thread of its own; the main thread only waits for what that thread hands over
and writes it. Ctrl-C raises KeyboardInterrupt in the main thread at whatever bytecode it is running,
and inside httpx that can be between httpcore's pool-lock acquire and its `with` block: httpcore's
cleanup, and the client's close, then waited for that non-reentrant lock forever (a tail hung so on
a busy machine). What the main thread runs has no such window: C-level queues, our writes.
"""

from __future__ import annotations

import _thread
import argparse
import base64
import json
import queue
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NoReturn

import httpx

from app.cli.client import Client, Unreachable
from app.cli.lifecycle import URL_HELP
from app.cli.output import Sink, is_json, note
from app.domain.sse import events

READ_TIMEOUT = 90.0  # with nothing at all arriving (SSE pings every 15 s by default): reconnect
MAX_FAILURES = 8  # connection failures in a row before giving up
BACKLOG = 16  # bodies and notes handed to the main thread and not written yet

Task = Callable[[], object]  # what the follower thread hands the main thread to do

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    tail = sub.add_parser("tail", help="follow a stream live until Ctrl-C or until it is closed")
    tail.add_argument("url", help=URL_HELP)
    mode = tail.add_mutually_exclusive_group()
    mode.add_argument("--sse", dest="mode", action="store_const", const="sse", help="Server-Sent Events (default)")
    mode.add_argument(
        "--long-poll",
        dest="mode",
        action="store_const",
        const="long-poll",
        help="long-polls (every byte as stored: over SSE a text stream's CR and CRLF arrive as LF)",
    )
    tail.add_argument("--from", dest="offset", default="now", help="now (default: what comes next), -1, or an offset")
    tail.set_defaults(run=run, mode="sse")
    common(tail)


def run(args: argparse.Namespace) -> int:
    try:
        handover = Handover()
        # Not threading.Thread: its start() waits in Condition.wait, which a KeyboardInterrupt at the wrong
        # bytecode leaves with its lock released twice (a RuntimeError). Neither kind is waited for at exit.
        _thread.start_new_thread(follow_in_thread, (args, handover.put))
        while (task := handover.get()) is not None:
            task()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a tail ends; the follower thread, wherever it is, ends with the process
    return 0


class Handover:
    """The follower thread's tasks for the main thread, at most BACKLOG of them not done yet (a slow
    stdout slows the follower, and so the server, down). SimpleQueues: their get and put are C code,
    with no Python-level lock for a KeyboardInterrupt to leave half taken or half released."""

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self.slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(BACKLOG):
            self.slots.put(None)

    def put(self, task: Task | None) -> None:
        """In the follower thread: waits while BACKLOG tasks are not done."""
        self.slots.get()
        self.tasks.put(task)

    def get(self) -> Task | None:
        """In the main thread, once the previous task is done: the next; None once the tail is over."""
        task = self.tasks.get()
        self.slots.put(None)
        return task


def follow_in_thread(args: argparse.Namespace, hand: Callable[[Task | None], None]) -> None:
    """Follows the stream, handing writes, notes and the error that ends it to the main thread; None
    once the stream is closed."""
    try:
        with Client(args, timeout=httpx.Timeout(10.0, read=READ_TIMEOUT)) as client:
            url = client.url(args.url)
            head = client.head(url)
            follower = Follower(client, url, args.offset, Sink(is_json(head.headers.get("content-type"))), hand)
            follower.follow(follower.sse if args.mode == "sse" else follower.long_poll)
    except BaseException as exc:  # any: the main thread must not wait forever; it reports the error
        hand(partial(_raise, exc))
    else:
        hand(None)


def _raise(exc: BaseException) -> NoReturn:
    raise exc


class Follower:
    """Runs in the follower thread: what `sink` writes and the notes go to `hand`, for the main thread."""

    def __init__(self, client: Client, url: str, offset: str, sink: Sink, hand: Callable[[Task], None]) -> None:
        self.client, self.url, self.offset, self.sink, self.hand = client, url, offset, sink, hand
        self.cursor: str | None = None

    def write(self, data: bytes) -> None:
        self.hand(partial(self.sink.body, data))

    def follow(self, step: Callable[[], bool]) -> None:
        """Runs `step` (one response; True once the stream is closed) until the stream is closed."""
        failures = 0
        while True:
            try:
                if step():
                    return
                failures = 0
            except httpx.ReadTimeout:
                continue  # a quiet connection: ask again
            except (Unreachable, httpx.HTTPError) as exc:
                failures += 1
                if failures > MAX_FAILURES:
                    raise Unreachable(f"{exc} (gave up after {MAX_FAILURES} attempts)") from None
                self.hand(partial(note, f"rill: {exc}; reconnecting"))
                time.sleep(min(0.25 * 2**failures, 5.0))

    def params(self, live: str) -> dict[str, str]:
        params = {"offset": self.offset, "live": live}
        if self.cursor:
            params["cursor"] = self.cursor
        return params

    def long_poll(self) -> bool:
        response = self.client.request("GET", self.url, params=self.params("long-poll"))
        if response.status_code == 200:
            self.write(response.content)
        self.offset = response.headers.get("stream-next-offset", self.offset)
        self.cursor = response.headers.get("stream-cursor", self.cursor)
        return response.headers.get("stream-closed") == "true"

    def sse(self) -> bool:
        with self.client.open("GET", self.url, params=self.params("sse")) as response:
            binary = response.headers.get("stream-sse-data-encoding") == "base64"
            for event in events(response.iter_bytes()):
                if event.kind == "data":
                    self.write(base64.b64decode(event.data) if binary else event.data)
                elif event.kind == "control":
                    control = json.loads(event.data)
                    self.offset = str(control.get("streamNextOffset", self.offset))
                    self.cursor = control.get("streamCursor") or self.cursor
                    if control.get("streamClosed"):
                        return True
        return False
