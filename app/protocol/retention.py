"""`PUT /ds/{bucket}/{stream}/retention/{offset}`, and `Stream-Retention` for automatic retention."""

from __future__ import annotations

from app.domain.errors import bad_request
from app.domain.offsets import format_offset, parse_position
from app.protocol.headers import parse_uint
from app.protocol.http import Reply
from app.protocol.responses import raise_for, refuse_early
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine import history as rules
from app.state_machine.commands import Retain


def parse_retention(value: str | None) -> tuple[int | None, int | None]:
    """`max-age=SECONDS`, `max-bytes=N`, or both comma-separated -> (age, bytes)."""
    if value is None:
        return None, None
    limits: dict[str, int] = {}
    for item in value.split(","):
        name, sep, number = item.strip().partition("=")
        amount = parse_uint(number.strip())
        if not sep or name not in ("max-age", "max-bytes") or name in limits or not amount:
            raise bad_request("Stream-Retention is max-age=SECONDS and/or max-bytes=N", "invalid_retention")
        limits[name] = amount
    return limits.get("max-age"), limits.get("max-bytes")


async def put_retention(engine: Engine, target: StreamTarget, token: str) -> Reply:
    pos = parse_position(token)
    engine.find(target.bucket, target.name)
    command = Retain(target.bucket, target.name, pos, touched=engine.touched_at(target.bucket, target.name))
    await refuse_early(engine, lambda: rules.retain_refusal(engine.table, command, engine.now_ms()))
    outcome = await engine.submit(command)
    raise_for(outcome)
    headers = {
        "stream-earliest-offset": format_offset(outcome.earliest),
        "stream-next-offset": format_offset(outcome.next_pos),
    }
    return Reply(204, headers)
