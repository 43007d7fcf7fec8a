"""Paged listings (`GET /ds`, `GET /ds/{bucket}`) and how their rows are shown: a table on a
terminal, tab-separated lines in a pipe, or one JSON object per line with `--json`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.cli.client import Client

PAGE = 1000  # the servers' largest page


def pages(client: Client, url: str, key: str, prefix: str) -> Iterator[dict[str, Any]]:
    """Every item of a paged listing, following `next` while `has_more`."""
    after = ""
    while True:
        params = {"prefix": prefix, "limit": str(PAGE)}
        if after:
            params["after"] = after
        body = client.request("GET", url, params=params).json()
        yield from body[key]
        if not body.get("has_more") or not body.get("next"):
            return
        after = str(body["next"])


class Column(NamedTuple):
    header: str
    cell: Callable[[dict[str, Any]], str]
    whole: bool = False  # never folded (an offset, to copy and paste); other columns fold when narrow


WIDE = 120  # a terminal narrower than this gets the table without its `optional` columns


def show(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    as_json: bool,
    title: str,
    optional: Sequence[str] = (),
) -> None:
    """Writes the rows to stdout: JSON lines, a table on a terminal, tab-separated lines otherwise
    (every column: they are for scripts)."""
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif sys.stdout.isatty():
        console = Console()
        shown = [c for c in columns if console.width >= WIDE or c.header not in optional]
        console.print(table(rows, shown, title))
    else:
        for row in rows:
            sys.stdout.write("\t".join(c.cell(row) for c in columns) + "\n")
    sys.stdout.flush()


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str) -> Table:
    out = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    out.title = title if not rows else None
    for column in columns:
        out.add_column(column.header, overflow="fold", no_wrap=column.whole)  # folded, never cut
    for row in rows:
        out.add_row(*(Text(c.cell(row)) for c in columns))  # names as text: `[red]` is no markup here
    return out
