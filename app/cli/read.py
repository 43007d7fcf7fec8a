"""`rill read URL [--from OFFSET]`: catch-up reads to the tail, written to stdout."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.cli.client import Client
from app.cli.lifecycle import URL_HELP
from app.cli.output import Sink, is_json

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    read = sub.add_parser("read", help="read to the tail: raw bytes, or one JSON message per line for JSON streams")
    read.add_argument("url", help=URL_HELP)
    read.add_argument("--from", dest="offset", default="-1", help="-1 (the start, default), now, or an offset")
    read.set_defaults(run=run)
    common(read)


def run(args: argparse.Namespace) -> int:
    with Client(args) as client:
        url = client.url(args.url)
        offset = args.offset
        sink: Sink | None = None
        while True:
            response = client.request("GET", url, params={"offset": offset})
            sink = sink or Sink(is_json(response.headers.get("content-type")))
            sink.body(response.content)
            offset = response.headers.get("stream-next-offset", offset)
            if response.headers.get("stream-up-to-date") == "true" or response.status_code != 200:
                return 0
