"""`rill append URL [DATA|-]`: DATA as one append, or stdin.

Stdin goes line by line: for a JSON stream each line is one message, batched into POSTs of JSON
arrays (up to BATCH_LINES lines or BATCH_BYTES); for other streams each line (newline kept) is
one append, or all of stdin is one with `--raw`. The content type is the stream's own, from a
HEAD. `--producer ID` makes the appends idempotent: the requests carry Producer-Id/-Epoch/-Seq,
the seq one more per request, so running the same input again with the same producer, epoch and
first seq writes nothing twice. The new tail (Stream-Next-Offset) is printed at the end.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import msgspec
from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from app.cli.client import Client, CliError, HttpError
from app.cli.lifecycle import URL_HELP
from app.cli.output import is_json, note

BATCH_LINES = 1000
BATCH_BYTES = 1 << 20
Batch = tuple[bytes, int]  # a request body and the stdin lines it holds

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(sub: Subparsers, common: Callable[[argparse.ArgumentParser], None]) -> None:
    append = sub.add_parser("append", help="append DATA, or stdin line by line; prints the new tail")
    append.add_argument("url", help=URL_HELP)
    append.add_argument("data", nargs="?", default="-", help="what to append as one append; - (default): stdin")
    append.add_argument("--raw", action="store_true", help="all of stdin as one append, not one per line")
    append.add_argument("--producer", metavar="ID", help="idempotent producer id (Producer-Id)")
    append.add_argument("--epoch", type=int, default=0, help="the producer's epoch (default 0)")
    append.add_argument("--seq", type=int, default=0, help="the first request's Producer-Seq (default 0)")
    append.set_defaults(run=run)
    common(append)


@dataclass
class Producer:
    id: str
    epoch: int
    seq: int  # of the next request

    def headers(self) -> dict[str, str]:
        return {"producer-id": self.id, "producer-epoch": str(self.epoch), "producer-seq": str(self.seq)}


class Appender:
    """POSTs bodies to the stream and keeps the tail, the count and the producer's seq."""

    def __init__(self, client: Client, url: str, content_type: str, producer: Producer | None) -> None:
        self.client, self.url, self.content_type, self.producer = client, url, content_type, producer
        self.tail: str | None = None
        self.requests = 0
        self.duplicates = 0

    def post(self, body: bytes) -> None:
        headers = {"content-type": self.content_type}
        if self.producer is not None:
            headers.update(self.producer.headers())
        try:
            response = self.client.request("POST", self.url, headers=headers, content=body)
        except HttpError as exc:
            raise CliError(self.explain(exc)) from None
        self.tail = response.headers.get("stream-next-offset", self.tail)
        self.requests += 1
        if self.producer is not None:
            self.duplicates += response.status_code == 204  # 200 is a fresh append, 204 a retry's echo
            self.producer.seq += 1

    def explain(self, exc: HttpError) -> str:
        """The server's refusal, with what a producer can do about it and how far we got."""
        text, headers, producer = str(exc), exc.response.headers, self.producer
        if producer is not None and exc.code == "producer_stale_epoch":
            seen = headers.get("producer-epoch", "?")
            text = f"producer {producer.id} is fenced: the stream is at its epoch {seen}, past --epoch {producer.epoch}"
        elif producer is not None and exc.code == "producer_seq_gap":
            expected = headers.get("producer-expected-seq", "?")
            text = f"producer {producer.id} sequence gap: the stream expects --seq {expected}, got {producer.seq}"
        elif producer is not None and exc.code == "producer_epoch_seq":
            text = f"producer {producer.id}: a new epoch ({producer.epoch}) must start at --seq 0"
        return self.progressed(text)

    def progressed(self, text: str) -> str:
        """`text` and how far the appends got before it, so that they can be resumed."""
        if self.requests:
            text += f" (after {self.requests} appends; tail {self.tail}"
            text += f", next --seq {self.producer.seq})" if self.producer is not None else ")"
        return text


def run(args: argparse.Namespace) -> int:
    producer = Producer(args.producer, args.epoch, args.seq) if args.producer else None
    if producer is not None and (args.epoch < 0 or args.seq < 0):
        raise CliError("--epoch and --seq are non-negative", 2)
    with Client(args) as client:
        url = client.url(args.url)
        head = client.head(url)
        if head.headers.get("stream-closed") == "true":
            raise CliError(f"{url} is closed: it takes no more appends")
        content_type = head.headers.get("content-type", "application/octet-stream")
        appender = Appender(client, url, content_type, producer)
        if args.data != "-":
            appender.post(args.data.encode())
        else:
            stdin = sys.stdin.buffer
            batches = [_raw(stdin)] if args.raw else _json_batches(stdin) if is_json(content_type) else _lines(stdin)
            _send(appender, batches, stdin)
    if appender.duplicates and producer is not None:
        note(f"{appender.duplicates} of {appender.requests} requests repeated appends producer {producer.id} had made")
    print(appender.tail or head.headers.get("stream-next-offset", ""), flush=True)
    return 0


def _send(appender: Appender, batches: Iterable[Batch], stdin: BinaryIO) -> None:
    with _progress(stdin) as progress:
        lines = sent = 0
        task = progress.add_task("", total=_size(stdin)) if progress else None
        for body, count in _checked(batches, appender):
            if body:
                appender.post(body)
            lines, sent = lines + count, sent + len(body)
            if progress is not None and task is not None:
                progress.update(task, completed=sent, description=f"{lines:,} lines, {decimal(sent)}")


def _checked(batches: Iterable[Batch], appender: Appender) -> Iterator[Batch]:
    """The batches; a bad stdin line's error tells how far the appends before it got."""
    iterator = iter(batches)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except CliError as exc:
            raise CliError(appender.progressed(str(exc)), exc.status) from None
        yield batch


def _progress(stdin: BinaryIO) -> AbstractContextManager[Progress | None]:
    """A progress display on stderr, when stdin is piped in and stderr is a terminal to watch."""
    if stdin.isatty() or not sys.stderr.isatty():
        return nullcontext()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True)


def _size(stdin: BinaryIO) -> float | None:
    """The bytes to come when stdin is a file (the bar's total), else None."""
    try:
        info = os.fstat(stdin.fileno())
        return float(info.st_size - stdin.tell()) if stat.S_ISREG(info.st_mode) else None
    except (OSError, ValueError):
        return None


def _raw(stdin: BinaryIO) -> Batch:
    data = stdin.read()
    return data, data.count(b"\n")


def _lines(stdin: BinaryIO) -> Iterator[Batch]:
    for line in stdin:
        yield line, 1


_one_value = msgspec.json.Decoder(msgspec.Raw)


def _json_batches(stdin: BinaryIO) -> Iterator[Batch]:
    """JSON arrays of the stdin lines (blank lines skipped), each line checked to be one JSON value."""
    batch: list[bytes] = []
    size = skipped = 0
    for number, line in enumerate(stdin, 1):
        item = line.strip()
        if not item:
            skipped += 1
            continue
        try:
            _one_value.decode(item)  # the server's strict parser: Python's also takes NaN and Infinity
        except msgspec.DecodeError as exc:
            raise CliError(f"stdin line {number} is not JSON: {exc}") from None
        if batch and (len(batch) >= BATCH_LINES or size + len(item) + 1 > BATCH_BYTES):
            yield b"[" + b",".join(batch) + b"]", len(batch) + skipped
            batch, size, skipped = [], 0, 0
        batch.append(item)
        size += len(item) + 1
    if batch or skipped:
        yield (b"[" + b",".join(batch) + b"]" if batch else b""), len(batch) + skipped
