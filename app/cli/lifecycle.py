"""`rill create`, `rill close` and `rill delete`: a stream's life."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.cli.client import Client
from app.cli.output import JSON, note

URL_HELP = "a stream URL, a path on --server (/v1/stream/x), or BUCKET/STREAM for {server}/ds/BUCKET/STREAM"

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parsers(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    create = sub.add_parser("create", help="create a stream (a no-op if it exists with the same settings)")
    create.add_argument("url", help=URL_HELP)
    kind = create.add_mutually_exclusive_group()
    kind.add_argument("--json", action="store_true", help="a JSON stream: messages keep their boundaries")
    kind.add_argument("--content-type", help="the stream's content type (default: the server's, octet-stream)")
    create.add_argument("--ttl", type=int, metavar="SECONDS", help="delete it after this long without use")
    create.set_defaults(run=create_stream)
    close = sub.add_parser("close", help="close a stream: no more appends; readers see the end")
    close.add_argument("url", help=URL_HELP)
    close.set_defaults(run=close_stream)
    delete = sub.add_parser("delete", help="delete a stream")
    delete.add_argument("url", help=URL_HELP)
    delete.set_defaults(run=delete_stream)
    for parser in (create, close, delete):
        common(parser)


def create_stream(args: argparse.Namespace) -> int:
    headers: dict[str, str] = {}
    if args.json or args.content_type:
        headers["content-type"] = JSON if args.json else args.content_type
    if args.ttl is not None:
        headers["stream-ttl"] = str(args.ttl)
    with Client(args) as client:
        url = client.url(args.url)
        response = client.request("PUT", url, headers=headers)
    kind = response.headers.get("content-type", "")
    note(f"created {url} ({kind})" if response.status_code == 201 else f"{url} already exists ({kind})")
    return 0


def close_stream(args: argparse.Namespace) -> int:
    """Prints the final tail."""
    with Client(args) as client:
        response = client.request("POST", client.url(args.url), headers={"stream-closed": "true"})
    print(response.headers.get("stream-next-offset", ""), file=sys.stdout, flush=True)
    return 0


def delete_stream(args: argparse.Namespace) -> int:
    with Client(args) as client:
        url = client.url(args.url)
        client.request("DELETE", url)
    note(f"deleted {url}")
    return 0
