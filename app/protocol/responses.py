"""Rendering: state machine outcomes to HTTP statuses, and the protocol's response headers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.domain.errors import ProtocolError
from app.domain.offsets import format_offset
from app.protocol.headers import format_expires_at
from app.state_machine.commands import Code, Outcome
from app.state_machine.records import StreamMeta

if TYPE_CHECKING:
    from app.service.engine import Engine

# Error outcomes: (status, message when the outcome carries none).
_ERRORS: dict[Code, tuple[int, str]] = {
    Code.NOT_FOUND: (404, "stream not found"),
    Code.BUCKET_NOT_FOUND: (404, "bucket not found"),
    Code.BUCKET_NOT_EMPTY: (409, "bucket still holds streams"),
    Code.GONE: (410, "stream was deleted; forks still reference its data"),
    Code.CONFIG_MISMATCH: (409, "stream exists with a different configuration"),
    Code.CONTENT_TYPE_MISMATCH: (409, "content type does not match the stream"),
    Code.STREAM_CLOSED: (409, "stream is closed"),
    Code.SEQ_CONFLICT: (409, "Stream-Seq must be greater than the last one"),
    Code.SOURCE_DELETED: (409, "fork source is deleted"),
    Code.BAD_FORK_OFFSET: (400, "fork offset is not a boundary at or below the source's tail"),
    Code.BAD_SUB_OFFSET: (400, "fork sub-offset is out of range"),
    Code.STALE_EPOCH: (403, "producer epoch is stale"),
    Code.SEQ_GAP: (409, "producer sequence gap"),
    Code.BAD_EPOCH_SEQ: (400, "a new producer epoch must start at seq 0"),
    Code.NOT_BOUNDARY: (400, "the offset is not a message boundary"),
    Code.BEYOND_TAIL: (409, "the offset is past the stream's tail"),
    Code.TRIMMED: (410, "the offset is before the retained history"),
    Code.RETENTION_BACKWARDS: (409, "retention never moves backwards"),
    Code.BEYOND_SNAPSHOT: (409, "retention may not pass the latest snapshot"),
    Code.SNAPSHOT_CONFLICT: (409, "a different snapshot exists at this offset"),
    Code.SNAPSHOT_MISMATCH: (409, "the latest snapshot does not match Stream-Snapshot-Match"),
    Code.SNAPSHOT_NOT_FOUND: (404, "no snapshot at this offset"),
    Code.SNAPSHOT_LATEST: (409, "the latest snapshot cannot be deleted"),
}

# Error codes a client sees where they differ from the outcome's name: a missing (or deleted but
# forked) stream answers the same code whichever method found it so, as reads do (app/service/engine.py).
_CODES = {Code.NOT_FOUND: "stream_not_found", Code.GONE: "stream_gone"}

CACHE_PUBLIC = "public, max-age=60, stale-while-revalidate=300"
CACHE_PRIVATE = "private, max-age=60, stale-while-revalidate=300"  # data behind a token
NO_STORE = "no-store"


def raise_for(outcome: Outcome) -> None:
    """Turns an error outcome into a ProtocolError carrying the protocol's headers."""
    entry = _ERRORS.get(outcome.code)
    if entry is None:
        return
    status, default = entry
    headers: dict[str, str] = {}
    if outcome.code is Code.STREAM_CLOSED:
        headers["stream-closed"] = "true"
        headers["stream-next-offset"] = format_offset(outcome.next_pos)
    elif outcome.code is Code.STALE_EPOCH and outcome.producer_epoch is not None:
        headers["producer-epoch"] = str(outcome.producer_epoch)
    elif outcome.code in (Code.TRIMMED, Code.RETENTION_BACKWARDS):
        headers["stream-earliest-offset"] = format_offset(outcome.earliest)
    elif outcome.code is Code.SEQ_GAP:
        headers["producer-expected-seq"] = str(outcome.expected_seq)
        headers["producer-received-seq"] = str(outcome.received_seq)
    code = _CODES.get(outcome.code, outcome.code.value)
    raise ProtocolError(status, code, outcome.message or default, headers)


def write_headers(outcome: Outcome) -> dict[str, str]:
    headers = {"stream-next-offset": format_offset(outcome.next_pos)}
    if outcome.closed:
        headers["stream-closed"] = "true"
    if outcome.producer_epoch is not None:
        headers["producer-epoch"] = str(outcome.producer_epoch)
        headers["producer-seq"] = str(outcome.producer_seq)
    return headers


def metadata_headers(meta: StreamMeta) -> dict[str, str]:
    """What HEAD reports: type, tail, lifetime and closure."""
    headers = {
        "content-type": meta.content_type,
        "stream-next-offset": format_offset(meta.tail),
        "stream-earliest-offset": format_offset(meta.earliest),
        "cache-control": NO_STORE,
    }
    if meta.ttl is not None:
        headers["stream-ttl"] = str(meta.ttl)
    if meta.expires_at is not None:
        headers["stream-expires-at"] = format_expires_at(meta.expires_at)
    if meta.closed:
        headers["stream-closed"] = "true"
    retention = format_retention(meta.retention_age, meta.retention_bytes)
    if retention is not None:
        headers["stream-retention"] = retention
    return headers


def format_retention(age: int | None, size: int | None) -> str | None:
    """`Stream-Retention`'s form (`max-age=SECONDS, max-bytes=N`), or None without either limit."""
    limits = [f"{name}={n}" for name, n in (("max-age", age), ("max-bytes", size)) if n is not None]
    return ", ".join(limits) or None


def trimmed(meta: StreamMeta) -> ProtocolError:
    return ProtocolError(
        410, Code.TRIMMED.value, "the offset is before the retained history",
        {"stream-earliest-offset": format_offset(meta.earliest)},
    )  # fmt: skip


def etag(meta: StreamMeta, start: int, end: int, closed: bool) -> str:
    return f'"{meta.sid}:{start}:{end}{":c" if closed else ""}"'


_ENTITY_TAG = re.compile(r'(?:W/)?("[^"]*")')


def etag_matches(if_none_match: str | None, tag: str) -> bool:
    """Whether If-None-Match names `tag`: `*`, or a list of entity tags compared weakly (RFC 9110)."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    return tag in _ENTITY_TAG.findall(if_none_match)


async def refuse_early(
    engine: Engine, refusal: Callable[[], Outcome | None], raise_: Callable[[Outcome], None] = raise_for
) -> None:
    """Raises the refusal the applied state gives, confirmed after a read barrier (a new leader may
    not have applied all it committed yet); returns when the request may be proposed. A request
    that will be refused makes no log entry for every replica to store and apply."""
    refused = await confirmed(engine, refusal)
    if refused is not None:
        raise_(refused)


async def confirmed(engine: Engine, check: Callable[[], Outcome | None]) -> Outcome | None:
    """What `check` finds in the applied state, found again after a read barrier (a new leader may not
    have applied all it committed yet); None as soon as it finds nothing."""
    if check() is None:
        return None
    await engine.read_barrier()
    return check()
