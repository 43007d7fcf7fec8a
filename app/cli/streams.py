"""`rill streams list BUCKET`: a bucket's streams, paged through to the end."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from app.cli.client import Client, UsageError
from app.cli.listing import Column, pages, show

COLUMNS: list[Column] = [
    Column("name", lambda s: str(s["name"])),
    Column("type", lambda s: str(s.get("content_type", ""))),
    Column("next offset", lambda s: str(s.get("next_offset", "")), whole=True),
    Column("closed", lambda s: "yes" if s.get("closed") else "no"),
    Column("created", lambda s: str(s.get("created_at") or "-")),
]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    streams = sub.add_parser("streams", help="list a bucket's streams")
    commands = streams.add_subparsers(dest="streams_command", required=True)
    listing = commands.add_parser("list", help="the streams of a bucket, in name order")
    listing.add_argument("bucket", help="a /ds bucket, or compat.v1 (/v1/stream/...) or legacy.streams (/streams/...)")
    listing.add_argument("--prefix", default="", help="only streams whose name starts with this")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(run=list_streams)
    common(listing)


def list_streams(args: argparse.Namespace) -> int:
    if not args.bucket or "/" in args.bucket:
        raise UsageError(f"{args.bucket!r} is not a bucket name")
    with Client(args) as client:
        url = f"{client.server}/ds/{quote(args.bucket, safe='')}"
        rows = list(pages(client, url, "streams", args.prefix))
    show(rows, COLUMNS, args.json, f"no streams in {args.bucket}", optional=("created",))
    return 0
