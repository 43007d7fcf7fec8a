"""The part of each stream not tiered yet, read from a Rill server for the `rill` data source.

The cold tier holds each stream up to the end of its manifest's last segment; the rest is only on
the servers. A batch read plans, per stream, the segments of the manifest and one hot range from
there to the stream's tail at planning time, so the two meet without overlap or gap. The hot range
is read through `GET /ds/{bucket}/{stream}/__ds/records` (Arrow IPC, the segments' schema). Records
tiered and evicted after planning answer 409 there; they are then read from their segments.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote

import httpx
import pyarrow as pa

from app.domain.offsets import format_offset
from app.tiering.segment import offset_of

log = logging.getLogger("rill.pipeline")

TIMEOUT = httpx.Timeout(30.0, connect=5.0)
PAGE = 1000  # streams per listing request (the server's most)


class ServerError(RuntimeError):
    """The server refused a request the read needs (a missing bucket or stream, a bad token)."""


class DataLoss(RuntimeError):
    """Records a read was to include were removed by retention before it got to them."""


@dataclass(frozen=True)
class Server:
    url: str  # base URL, e.g. http://127.0.0.1:4437
    token: str | None = None

    def client(self) -> httpx.Client:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url.rstrip("/"), headers=headers, timeout=TIMEOUT)


def stream_path(bucket: str, stream: str) -> str:
    return f"/ds/{quote(bucket, safe='')}/{quote(stream, safe='/')}"


def _error_code(response: httpx.Response) -> str | None:
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def refused(response: httpx.Response, what: str) -> ServerError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return ServerError(f"{what}: {response.status_code} {message}")


def list_tails(server: Server, bucket: str, stream: str | None, prefix: str | None) -> dict[str, int]:
    """Each selected stream's tail position, from the server's listing; a missing bucket or stream raises."""
    return {name: tail for name, (_, tail) in list_streams(server, bucket, stream, prefix).items()}


def list_streams(server: Server, bucket: str, stream: str | None, prefix: str | None) -> dict[str, tuple[int, int]]:
    """Each selected live stream's earliest retained position and tail, from the server's listing."""
    tails: dict[str, tuple[int, int]] = {}
    after = ""
    with server.client() as http:
        while True:
            params = {"prefix": stream if stream is not None else prefix or "", "limit": str(PAGE)}
            if after:
                params["after"] = after
            response = http.get(f"/ds/{quote(bucket, safe='')}", params=params)
            if response.status_code != 200:
                raise refused(response, f"listing bucket {bucket!r} on {server.url}")
            page = response.json()
            for entry in page["streams"]:
                if stream is None or entry["name"] == stream:
                    # A server from before `earliest_offset` has retention's bound in HEAD only: 0 here.
                    first = offset_of(entry["earliest_offset"]) if "earliest_offset" in entry else 0
                    tails[entry["name"]] = (first, offset_of(entry["next_offset"]))
            if not page.get("has_more"):
                break
            after = page["next"]
    if stream is not None and stream not in tails:
        raise ServerError(f"stream {stream!r} does not exist in bucket {bucket!r} on {server.url}")
    return tails


def earliest(server: Server, bucket: str, names: list[str]) -> dict[str, int]:
    """Each stream's earliest retained position (what retention has not removed), by HEAD."""
    out: dict[str, int] = {}
    with server.client() as http:
        for name in names:
            response = http.head(stream_path(bucket, name))
            if response.status_code == 404:
                continue  # deleted since it was listed
            if response.status_code != 200:
                raise refused(response, f"HEAD of {bucket}/{name} on {server.url}")
            out[name] = offset_of(response.headers["stream-earliest-offset"])
    return out


@dataclass
class Tiered(Exception):
    """The records from `pos` up to `upto` were evicted to the object store after planning; they
    are in the segments of `holder` (the stream itself, or for a fork's inherited part its source)."""

    pos: int
    upto: int
    holder: str


def _holder(response: httpx.Response, stream: str) -> str:
    return unquote(response.headers.get("stream-tiered-stream", "")) or stream


@dataclass
class _Page:
    """One answer of the records route: rows (200), an evicted run (409) or retention's start (410)."""

    table: pa.Table | None = None
    next_pos: int = 0
    up_to_date: bool = False
    tiered: Tiered | None = None
    earliest: int | None = None


def _page(server: Server, http: httpx.Client, bucket: str, stream: str, pos: int, limit: int = 0) -> _Page:
    params = {"offset": format_offset(pos), **({"limit": str(limit)} if limit else {})}
    response = http.get(stream_path(bucket, stream) + "/__ds/records", params=params)
    headers = response.headers
    if response.status_code == 409 and "stream-tiered-offset" in headers:
        return _Page(tiered=Tiered(pos, offset_of(headers["stream-tiered-offset"]), _holder(response, stream)))
    if response.status_code == 410 and "stream-earliest-offset" in headers:
        return _Page(earliest=offset_of(headers["stream-earliest-offset"]))
    if response.status_code == 404 and _error_code(response) in ("stream_not_found", "bucket_not_found"):
        # Deleted since the batch was planned: nothing more to read. Failing would fail every replay
        # of the batch too, and the query could never go on.
        log.warning("%s/%s was deleted before it was read from %s", bucket, stream, format_offset(pos))
        return _Page(pa.table({}), pos, up_to_date=True)
    if response.status_code != 200:
        raise refused(response, f"reading {bucket}/{stream} at {format_offset(pos)} from {server.url}")
    table = pa.ipc.open_stream(response.content).read_all()
    return _Page(table, offset_of(headers["stream-next-offset"]), "stream-up-to-date" in headers)


def after_records(
    server: Server, bucket: str, stream: str, lo: int, count: int, in_segments: Callable[[str, int, int], Iterator[int]]
) -> int:
    """The position after the first `count` appends that start at or after `lo` (the tail if there
    are fewer): from the server's records route, and from `in_segments(holder, lo, hi)` (the start
    positions of the appends in [lo, hi) from the segments) where the server evicted them."""
    pos, left = lo, count
    with server.client() as http:
        while left > 0:
            page = _page(server, http, bucket, stream, pos, min(left, 100_000))
            if page.tiered is not None:  # as many starts as needed: each segment read is a whole object
                starts = list(itertools.islice(in_segments(page.tiered.holder, pos, page.tiered.upto), left + 1))
                if len(starts) > left:
                    return starts[left]
                left -= len(starts)
                pos = max(page.tiered.upto, pos + 1)
            elif page.earliest is not None:
                pos = max(pos + 1, page.earliest)
            else:
                assert page.table is not None
                left -= page.table.num_rows
                if not page.table.num_rows or page.next_pos <= pos or page.up_to_date:
                    return page.next_pos
                pos = page.next_pos
    return pos


def next_start(
    server: Server, bucket: str, stream: str, pos: int, in_segments: Callable[[str, int, int], Iterator[int]]
) -> int:
    """Where the first append that starts at or after `pos` starts; the tail if none does."""
    with server.client() as http:
        while True:
            page = _page(server, http, bucket, stream, pos, 1)
            if page.tiered is not None:
                found = next(iter(in_segments(page.tiered.holder, pos, page.tiered.upto)), None)
                if found is not None:
                    return found
                pos = max(page.tiered.upto, pos + 1)
            elif page.earliest is not None:
                return max(pos, page.earliest)
            else:
                assert page.table is not None
                return offset_of(page.table["offset"][0].as_py()) if page.table.num_rows else page.next_pos


def records(server: Server, bucket: str, stream: str, lo: int, hi: int, lossless: bool = False) -> Iterator[pa.Table]:
    """The records starting in [lo, hi), as tables of the segments' schema, in offset order.

    Raises Tiered when the server holds them only in the object store now (the caller reads
    those from segments and calls again from `upto`). Records retention removed are skipped, or
    with `lossless` raise DataLoss."""
    pos = lo
    with server.client() as http:
        while pos < hi:
            page = _page(server, http, bucket, stream, pos)
            if page.tiered is not None:
                raise page.tiered
            if page.earliest is not None:
                if lossless:
                    raise DataLoss(
                        f"{bucket}/{stream}: records from {format_offset(pos)} to {format_offset(page.earliest)} "
                        "were removed by retention before they were read (failOnDataLoss=false skips them)"
                    )
                pos = max(pos, page.earliest)
                continue
            assert page.table is not None
            if page.table.num_rows:
                yield page.table
            if page.next_pos <= pos:
                break  # at the tail: nothing more was appended since planning (a deleted stream's last read)
            pos = page.next_pos


def read_range(
    server: Server,
    bucket: str,
    stream: str,
    lo: int,
    hi: int,
    from_segments: Callable[[str, int, int], Iterator[pa.Table]],
    lossless: bool = False,
) -> Iterator[pa.Table]:
    """Records starting in [lo, hi): from the server, and from `from_segments(holder, lo, hi)` for
    those it has evicted to the object store (a fork's inherited ones are its source's, renamed)."""
    pos = lo
    while pos < hi:
        try:
            for table in records(server, bucket, stream, pos, hi, lossless):
                yield table
                pos = offset_of(table["next_offset"][-1].as_py())
            return
        except Tiered as moved:
            upto = min(moved.upto, hi)
            if upto <= moved.pos:
                where = format_offset(moved.pos)
                raise ServerError(f"{bucket}/{stream}: no records at {where} on the server or tiered") from None
            for table in from_segments(moved.holder, moved.pos, upto):
                if moved.holder != stream:
                    column = table.schema.get_field_index("stream")
                    table = table.set_column(column, "stream", pa.array([stream] * table.num_rows, pa.string()))
                yield table
            pos = upto
