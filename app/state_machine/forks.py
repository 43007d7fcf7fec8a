"""Where a new fork starts: its source, the fork offset, and the sub-offset prefix it copies.

A fork references its source (which counts its forks and is only soft-deleted while it has any)
and stores only its own records from the fork offset on; reads below it walk to the source.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.media import media_type
from app.state_machine import records as r
from app.state_machine.commands import Code, CreateStream, Outcome
from app.state_machine.expiry import live
from app.state_machine.reader import is_boundary, record_prefix
from app.state_machine.table import StreamTable


@dataclass
class ForkPoint:
    source: r.StreamMeta
    offset: int
    # The first `fork_sub` bytes (or JSON messages) of the source's record at `offset`: the fork's first record.
    prefix: bytes = b""


def fork_point(table: StreamTable, cmd: CreateStream, now: int) -> ForkPoint | Outcome:
    """The fork point `cmd` asks for (it names a `fork_stream`), or the outcome that refuses it."""
    assert cmd.fork_stream is not None
    source = live(table, cmd.bucket, cmd.fork_stream, now, cmd.source_touched)
    if source is None:
        return Outcome(Code.NOT_FOUND, "fork source not found")
    if source.deleted:
        return Outcome(Code.SOURCE_DELETED, "fork source is deleted")
    if cmd.content_type_given and media_type(source.content_type) != media_type(cmd.content_type):
        return Outcome(Code.CONTENT_TYPE_MISMATCH, "fork content type differs from its source")
    offset = source.tail if cmd.fork_offset is None else cmd.fork_offset
    if offset < source.earliest:
        return Outcome(Code.BAD_FORK_OFFSET, "fork offset is before the source's retained history")
    if offset > source.tail or not is_boundary(table, source, offset):
        return Outcome(Code.BAD_FORK_OFFSET, "fork offset is not a message boundary of the source")
    point = ForkPoint(source, offset)
    if cmd.fork_sub:
        prefix = record_prefix(table, source, offset, cmd.fork_sub, cmd.evicted_record)
        if prefix is None:
            return Outcome(Code.BAD_SUB_OFFSET, "fork sub-offset exceeds the message at the fork offset")
        point.prefix = prefix
    return point
