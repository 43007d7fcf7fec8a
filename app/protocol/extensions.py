"""The `/ds` sub-resources of a stream: attrs, append-batch, bootstrap, __ds/records, snapshot and retention."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import Send

from app.protocol import append_batch, attrs, bootstrap, records, retention, stream_snapshots
from app.protocol.errors import answer, error_reply
from app.protocol.http import Call, Reply
from app.protocol.target import SUBROUTES, StreamTarget
from app.service.engine import Engine


@dataclass(frozen=True)
class Extension:
    target: StreamTarget
    kind: str
    arg: str | None  # the offset in snapshot/{offset} and retention/{offset}


async def serve_extension(engine: Engine, call: Call, ext: Extension, send: Send) -> None:
    await answer(call, send, _dispatch(engine, call, ext))


async def _dispatch(engine: Engine, call: Call, ext: Extension) -> Reply:
    allowed = SUBROUTES[ext.kind][0 if ext.arg is None else 1]
    if call.method == "OPTIONS" and allowed:
        return Reply(204, {"allow": ", ".join((*allowed, "OPTIONS"))})
    if call.method not in allowed:
        if not allowed:
            return error_reply(404, "not_found", f"{ext.kind} needs an offset: {ext.kind}/{{offset}}")
        return error_reply(
            405, "method_not_allowed", f"{call.method} is not allowed here", {"allow": ", ".join((*allowed, "OPTIONS"))}
        )
    target, method, arg = ext.target, call.method, ext.arg
    if ext.kind == "attrs":
        return await (attrs.put_attrs(engine, call, target) if method == "PUT" else attrs.get_attrs(engine, target))
    if ext.kind == "append-batch":
        return await append_batch.append_batch(engine, call, target)
    if ext.kind == "bootstrap":
        return await bootstrap.bootstrap(engine, call, target)
    if ext.kind == "__ds/records":
        return await records.get_records(engine, call, target)
    if ext.kind == "retention":
        assert arg is not None
        return await retention.put_retention(engine, target, arg)
    if arg is None:
        return await stream_snapshots.latest(engine, target)
    if method == "PUT":
        return await stream_snapshots.publish(engine, call, target, arg)
    if method == "DELETE":
        return await stream_snapshots.delete(engine, target, arg)
    return await stream_snapshots.fetch(engine, target, arg, call.private, call.headers.get("if-none-match"))
