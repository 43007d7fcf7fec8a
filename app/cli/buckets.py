"""`rill buckets list | create | delete`: the /ds family's buckets."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from app.cli.client import Client
from app.cli.listing import Column, pages, show
from app.cli.output import note

COLUMNS: list[Column] = [
    Column("name", lambda b: str(b["name"])),
    Column("created", lambda b: str(b.get("created_at") or "-")),
    Column("builtin", lambda b: "yes" if b.get("builtin") else "no"),
]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    buckets = sub.add_parser("buckets", help="list, create and delete buckets (the /ds family)")
    commands = buckets.add_subparsers(dest="buckets_command", required=True)
    listing = commands.add_parser("list", help="the buckets, in name order (built-in ones too)")
    listing.add_argument("--prefix", default="", help="only buckets whose name starts with this")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(run=list_buckets)
    create = commands.add_parser("create", help="create a bucket (nothing happens if it exists)")
    create.add_argument("name", help="4 to 64 of a-z, 0-9, _ and -")
    create.add_argument(
        "--retention",
        metavar="SPEC",
        help="default retention of its streams, e.g. 'max-age=86400, max-bytes=1000000000'",
    )
    create.set_defaults(run=create_bucket)
    delete = commands.add_parser("delete", help="delete an empty bucket")
    delete.add_argument("name")
    delete.set_defaults(run=delete_bucket)
    for parser in (listing, create, delete):
        common(parser)


def list_buckets(args: argparse.Namespace) -> int:
    with Client(args) as client:
        rows = list(pages(client, client.server + "/ds", "buckets", args.prefix))
    show(rows, COLUMNS, args.json, "no buckets")
    return 0


def create_bucket(args: argparse.Namespace) -> int:
    headers = {"stream-retention": args.retention} if args.retention else {}
    with Client(args) as client:
        response = client.request("PUT", _url(client, args.name), headers=headers)
    note(f"created bucket {args.name}" if response.status_code == 201 else f"bucket {args.name} already exists")
    return 0


def delete_bucket(args: argparse.Namespace) -> int:
    with Client(args) as client:
        client.request("DELETE", _url(client, args.name))
    note(f"deleted bucket {args.name}")
    return 0


def _url(client: Client, name: str) -> str:
    return f"{client.server}/ds/{quote(name, safe='')}"
