"""`rill subs list STREAM` (a stream's consumer groups, with their lag) and `rill subs show ROOT ID`
(one subscription: its streams, acknowledged offsets and lease)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from app.cli.client import Client, UsageError
from app.cli.listing import Column, show

GROUPS: list[Column] = [
    Column("id", lambda g: str(g["id"])),
    Column("type", lambda g: str(g.get("type", ""))),
    Column("acked", lambda g: str(g.get("acked_offset", "")), whole=True),
    Column("lag bytes", lambda g: str(g.get("lag_bytes", ""))),
    Column("lag msgs", lambda g: "?" if g.get("lag_messages") is None else str(g["lag_messages"])),
    Column("holder", lambda g: str(g.get("holder") or "-")),
]
STREAMS: list[Column] = [
    Column("path", lambda s: str(s["path"])),
    Column("link", lambda s: str(s.get("link_type", ""))),
    Column("acked", lambda s: str(s.get("acked_offset", "")), whole=True),
    Column("tail", lambda s: str(s.get("tail_offset", "-")), whole=True),
]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    subs = sub.add_parser("subs", help="subscriptions (consumer groups)")
    commands = subs.add_subparsers(dest="subs_command", required=True)
    listing = commands.add_parser("list", help="the subscriptions a stream belongs to, with their lag")
    listing.add_argument("url", help="a stream URL, a path on --server, or BUCKET/STREAM")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(run=list_groups)
    common(listing)
    detail = commands.add_parser("show", help="one subscription: its streams, offsets and lease")
    detail.add_argument("root", help="the root it lives under: a URL or path, e.g. /v1/stream or /ds/BUCKET/ROOT")
    detail.add_argument("id", help="the subscription's id")
    detail.set_defaults(run=show_subscription)
    common(detail)


def list_groups(args: argparse.Namespace) -> int:
    with Client(args) as client:
        url = client.url(args.url).rstrip("/") + "/__ds/subscriptions"
        groups = client.request("GET", url).json()["subscriptions"]
    show(groups, GROUPS, args.json, "no subscriptions cover this stream")
    return 0


def show_subscription(args: argparse.Namespace) -> int:
    if not args.id or "/" in args.id:
        raise UsageError(f"{args.id!r} is not a subscription id")
    with Client(args) as client:
        root = args.root if args.root.startswith(("http://", "https://")) else f"{client.server}/{args.root.strip('/')}"
        url = f"{root.rstrip('/')}/__ds/subscriptions/{quote(args.id)}"
        view: dict[str, Any] = client.request("GET", url).json()
    head = {k: v for k, v in view.items() if k != "streams"}
    sys.stdout.write(json.dumps(head, ensure_ascii=False) + "\n")
    show(view.get("streams", []), STREAMS, False, "no streams yet")
    return 0
