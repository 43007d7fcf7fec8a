"""`rill tail URL [--sse | --long-poll] [--from now|OFFSET]`: follows a stream live, writing what
arrives to stdout, until Ctrl-C (exit 0) or until the stream is closed (exit 0).

When the server ends a response (SSE responses end about once a minute; long-polls at their
timeout) or the connection drops, the next request continues from the last offset and cursor.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from app.commands.client import Client, Unreachable
from app.commands.lifecycle import URL_HELP
from app.commands.output import Sink, is_json, note
from app.commands.sse import events

READ_TIMEOUT = 90.0  # with nothing at all arriving (SSE pings every 15 s by default): reconnect
MAX_FAILURES = 8  # connection failures in a row before giving up

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    tail = sub.add_parser("tail", help="follow a stream live until Ctrl-C or until it is closed")
    tail.add_argument("url", help=URL_HELP)
    mode = tail.add_mutually_exclusive_group()
    mode.add_argument("--sse", dest="mode", action="store_const", const="sse", help="Server-Sent Events (default)")
    mode.add_argument("--long-poll", dest="mode", action="store_const", const="long-poll", help="long-polls")
    tail.add_argument("--from", dest="offset", default="now", help="now (default: what comes next), -1, or an offset")
    tail.set_defaults(run=run, mode="sse")
    common(tail)


def run(args: argparse.Namespace) -> int:
    try:
        with Client(args, timeout=httpx.Timeout(10.0, read=READ_TIMEOUT)) as client:
            url = client.url(args.url)
            head = client.head(url)
            follower = Follower(client, url, args.offset, Sink(is_json(head.headers.get("content-type"))))
            follower.follow(follower.sse if args.mode == "sse" else follower.long_poll)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a tail ends
    return 0


class Follower:
    def __init__(self, client: Client, url: str, offset: str, sink: Sink) -> None:
        self.client, self.url, self.offset, self.sink = client, url, offset, sink
        self.cursor: str | None = None

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
                note(f"rill: {exc}; reconnecting")
                time.sleep(min(0.25 * 2**failures, 5.0))

    def params(self, live: str) -> dict[str, str]:
        params = {"offset": self.offset, "live": live}
        if self.cursor:
            params["cursor"] = self.cursor
        return params

    def long_poll(self) -> bool:
        response = self.client.request("GET", self.url, params=self.params("long-poll"))
        if response.status_code == 200:
            self.sink.body(response.content)
        self.offset = response.headers.get("stream-next-offset", self.offset)
        self.cursor = response.headers.get("stream-cursor", self.cursor)
        return response.headers.get("stream-closed") == "true"

    def sse(self) -> bool:
        with self.client.open("GET", self.url, params=self.params("sse")) as response:
            binary = response.headers.get("stream-sse-data-encoding") == "base64"
            for event in events(response.iter_bytes()):
                if event.kind == "data":
                    self.sink.body(base64.b64decode(event.data) if binary else event.data)
                elif event.kind == "control":
                    control = json.loads(event.data)
                    self.offset = str(control.get("streamNextOffset", self.offset))
                    self.cursor = control.get("streamCursor") or self.cursor
                    if control.get("streamClosed"):
                        return True
        return False
