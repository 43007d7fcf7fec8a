"""Rows as Spark sees them: one per message in JSON streams, one per append in the others.

A JSON stream stores each append as its messages joined by commas. Rill gives messages inside an
append no offsets of their own, so a message's row keeps its append's `offset` and `next_offset`
and adds its place in the append as `ordinal` (0 for the only row of any other append). With the
option `json_schema` (a DDL string) a `value` column holds each message parsed to that struct (null
where a message does not parse to it, as Spark's `from_json` does).
"""

from __future__ import annotations

import io

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from app.domain.media import JSON, media_type

ORDINAL = pa.field("ordinal", pa.int32(), nullable=False)
VALUE = "value"
_appends = msgspec.json.Decoder(list[list[msgspec.Raw]])


def with_ordinal(schema: pa.Schema) -> pa.Schema:
    """`schema` with `ordinal` after `next_offset`."""
    return schema.insert(schema.get_field_index("next_offset") + 1, ORDINAL)


def explode(table: pa.Table) -> pa.Table:
    """One row per message of the JSON appends in `table` (others stay one row), with `ordinal`."""
    at = table.schema.get_field_index("next_offset") + 1
    kinds = pc.unique(table["content_type"]).to_pylist()
    json_kinds = [k for k in kinds if media_type(k) == JSON]
    zeros = pc.fill_null(pa.nulls(table.num_rows, pa.int32()), 0)
    if not json_kinds:
        return table.add_column(at, ORDINAL, zeros)
    payload = table["payload"]
    if len(json_kinds) < len(kinds):  # JSON and other appends together (never within one stream)
        is_json = pc.is_in(table["content_type"], value_set=pa.array(json_kinds)).to_pylist()
        texts = payload.to_pylist()
        chosen = [t for t, j in zip(texts, is_json, strict=True) if j]
        decoded = iter(_appends.decode(b"[[" + b"],[".join(chosen) + b"]]"))
        mixed = [next(decoded) if j else [msgspec.Raw(t)] for t, j in zip(texts, is_json, strict=True)]
        return _split(table, mixed, at)
    messages = _appends.decode(_bracketed(payload))
    whole = sum(len(m[0]) for m in messages if len(m) == 1)
    if all(len(m) == 1 for m in messages) and whole == (pc.sum(pc.binary_length(payload)).as_py() or 0):
        return table.add_column(at, ORDINAL, zeros)  # an append a message: nothing to split
    return _split(table, messages, at)


def _bracketed(payload: pa.ChunkedArray) -> bytes:
    """`[[p1],[p2],…]` of the appends' payloads, built by Arrow: one decode then finds every message
    of every append (an append is stored as its messages joined by commas)."""
    kind = payload.type
    wrapped = pc.binary_join_element_wise(pa.scalar(b"[", kind), payload, pa.scalar(b"],", kind), pa.scalar(b"", kind))
    array = wrapped.combine_chunks() if isinstance(wrapped, pa.ChunkedArray) else wrapped
    size = pc.sum(pc.binary_length(array)).as_py() or 0
    data = memoryview(array.buffers()[2])[:size] if size else memoryview(b",")
    return b"".join((b"[", data[:-1], b"]"))


def _split(table: pa.Table, messages: list[list[msgspec.Raw]], at: int) -> pa.Table:
    rows: list[int] = []
    ordinals: list[int] = []
    for i, found in enumerate(messages):
        rows += [i] * len(found)
        ordinals += range(len(found))
    texts = [bytes(m) for found in messages for m in found]
    out = table.take(pa.array(rows, pa.int64()))
    column = out.schema.get_field_index("payload")
    out = out.set_column(column, out.schema.field(column), pa.array(texts, out.schema.field(column).type))
    return out.add_column(at, ORDINAL, pa.array(ordinals, pa.int32()))


def values(table: pa.Table, kind: pa.StructType) -> pa.Array:
    """Each JSON row's payload parsed to `kind`; null for other rows and for what does not parse."""
    is_json = [media_type(t) == JSON for t in table["content_type"].to_pylist()]
    payloads = table["payload"].to_pylist()
    objects = [i for i, (j, p) in enumerate(zip(is_json, payloads, strict=True)) if j and p.lstrip()[:1] == b"{"]
    parsed: list[dict[str, object] | None] = [None] * table.num_rows
    if objects:
        try:
            found = _parse([payloads[i] for i in objects], kind).to_pylist()
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # one message does not fit: parse them one by one
            found = [_parse_one(payloads[i], kind) for i in objects]
        for i, value in zip(objects, found, strict=True):
            parsed[i] = value
    return pa.array(parsed, kind)


def _parse(messages: list[bytes], kind: pa.StructType) -> pa.StructArray:
    # Arrow's JSON reader parses no dates: they are read as text and cast after.
    as_read = _dates_as_text(kind)
    assert isinstance(as_read, pa.StructType)
    schema = pa.schema(list(as_read))
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    # Messages are JSON texts; newlines inside them are whitespace, so one per line needs none of them.
    lines = b"\n".join(m.replace(b"\n", b" ").replace(b"\r", b" ") for m in messages)
    block = max(1 << 20, max(map(len, messages)) + 1)  # a block holds at least the longest message
    parsed = pj.read_json(io.BytesIO(lines), read_options=pj.ReadOptions(block_size=block), parse_options=options)
    columns = [parsed[name].combine_chunks() for name in schema.names]
    return pa.StructArray.from_arrays(columns, fields=list(as_read)).cast(kind)


def _dates_as_text(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_date(kind):
        return pa.string()
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(_dates_as_text(field.type)) for field in kind])
    if pa.types.is_list(kind):
        return pa.list_(_dates_as_text(kind.value_type))
    return kind


def _parse_one(message: bytes, kind: pa.StructType) -> dict[str, object] | None:
    try:
        value: dict[str, object] | None = _parse([message], kind).to_pylist()[0]
        return value
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
