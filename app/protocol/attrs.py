"""`GET|PUT /ds/{bucket}/{stream}/attrs`: application-owned JSON beside a stream, and `Stream-Attrs`."""

from __future__ import annotations

import msgspec

from app.domain.errors import bad_request
from app.protocol.bodies import read_body
from app.protocol.http import Call, Reply
from app.protocol.responses import NO_STORE, raise_for
from app.protocol.target import StreamTarget
from app.service.engine import Engine
from app.state_machine.commands import SetAttrs

MAX_ATTRS_BYTES = 16 * 1024


class Attrs(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    title: str | None = None
    metadata: dict[str, object] | None = None


_decoder = msgspec.json.Decoder(Attrs)
_encoder = msgspec.json.Encoder(order="sorted")


def parse_attrs(raw: bytes) -> bytes:
    """Validated attributes in canonical form (sorted keys, no spaces); b"" for `{}`."""
    if len(raw) > MAX_ATTRS_BYTES:
        raise bad_request(f"attributes exceed {MAX_ATTRS_BYTES} bytes", "attrs_too_large")
    try:
        attrs = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        message = f'attributes must be {{"title"?: string, "metadata"?: object}}: {exc}'
        raise bad_request(message, "invalid_attrs") from None
    except UnicodeDecodeError:  # msgspec raises it, not DecodeError, for bad UTF-8 inside a string
        raise bad_request("attributes must be JSON in valid UTF-8", "invalid_attrs") from None
    canonical = _encoder.encode(attrs)
    if len(canonical) > MAX_ATTRS_BYTES:  # what is stored: `1E15` is stored as `1000000000000000.0`
        raise bad_request(f"attributes exceed {MAX_ATTRS_BYTES} bytes once stored", "attrs_too_large")
    return b"" if canonical == b"{}" else canonical


async def get_attrs(engine: Engine, target: StreamTarget) -> Reply:
    meta = await engine.find_latest(target.bucket, target.name)
    headers = {"content-type": "application/json", "cache-control": NO_STORE}
    return Reply(200, headers, meta.attrs or b"{}")


async def put_attrs(engine: Engine, call: Call, target: StreamTarget) -> Reply:
    # Past 16 KiB, parse_attrs answers 400.
    body = await read_body(call, engine.limits.max_body_bytes, engine.body_budget)
    attrs = parse_attrs(body)
    engine.find(target.bucket, target.name)
    raise_for(
        await engine.submit(SetAttrs(target.bucket, target.name, attrs, engine.touched_at(target.bucket, target.name)))
    )
    return Reply(204, {})
