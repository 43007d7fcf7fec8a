"""Rows per message: `explode` and `values` on Arrow tables in the segments' schema."""

from __future__ import annotations

import pyarrow as pa

from app.pipeline.ddl import parse_ddl
from app.pipeline.messages import explode, values, with_ordinal
from app.tiering.segment import SCHEMA, Record, table_of

JSON = "application/json"


def table(*rows: tuple[str, bytes]) -> pa.Table:
    """One append a row, (content type, payload) each, at consecutive offsets."""
    pos, parts = 0, []
    for content_type, payload in rows:
        parts.append(table_of("b", "s", content_type, [Record(pos, 0, payload)], SCHEMA))
        pos += len(payload)
    return pa.concat_tables(parts)


def test_json_appends_become_a_row_per_message_and_others_stay_whole() -> None:
    out = explode(table((JSON, b'{"a":1},{"a":2}'), ("text/plain", b"x,y"), (JSON, b"[1,2]")))
    assert out.schema == with_ordinal(SCHEMA)
    assert out["payload"].to_pylist() == [b'{"a":1}', b'{"a":2}', b"x,y", b"[1,2]"]
    assert out["ordinal"].to_pylist() == [0, 1, 0, 0]
    assert out["offset"].to_pylist()[:2] == [out["offset"][0].as_py()] * 2  # a message keeps its append's offset


def test_an_append_a_message_keeps_its_rows_and_bytes() -> None:
    source = table((JSON, b'{"a": 1, "b": [1, 2]}'), (JSON + "; charset=utf-8", b'"s"'))
    out = explode(source)
    assert out["payload"].to_pylist() == source["payload"].to_pylist()
    assert out["ordinal"].to_pylist() == [0, 0]
    assert explode(table(("text/plain", b"a"))).num_rows == 1


def test_values_parse_objects_of_the_schema_and_null_the_rest() -> None:
    kind = pa.struct([("a", pa.int32()), ("b", pa.list_(pa.string()))])
    assert parse_ddl("a INT, b ARRAY<STRING>").fieldNames() == ["a", "b"]
    rows = explode(table((JSON, b'{"a":1,"b":["x"]},{"a":"nope"},7'), ("text/plain", b'{"a":2}')))
    assert values(rows, kind).to_pylist() == [{"a": 1, "b": ["x"]}, None, None, None]


def test_an_empty_table_and_a_mixed_one_explode_too() -> None:
    empty = table((JSON, b"1")).slice(0, 0)
    assert explode(empty).num_rows == 0 and explode(empty).schema == with_ordinal(SCHEMA)
    big = table(*[(JSON, b'{"i":%d}' % i) for i in range(500)], (JSON, b"1,2,3"))
    out = explode(big)
    assert out.num_rows == 503 and out["ordinal"].to_pylist()[-3:] == [0, 1, 2]
    assert out["payload"].to_pylist()[:2] == [b'{"i":0}', b'{"i":1}']


def test_values_read_dates_long_messages_and_ddl_limits() -> None:
    import pytest

    kind = pa.struct([("day", pa.date32()), ("s", pa.string())])
    long = b'{"day":"2024-03-01","s":"' + b"x" * (3 << 20) + b'"}'
    rows = explode(table((JSON, b'{"day":"2024-02-29","s":"a"}'), (JSON, long)))
    got = values(rows, kind).to_pylist()
    assert str(got[0]["day"]) == "2024-02-29" and len(got[1]["s"]) == 3 << 20
    for ddl, message in (("m MAP<STRING, INT>", "MAP is not supported"), ("a INT, a STRING", "named twice"),
                         ("d DECIMAL(40,2)", "out of range")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            parse_ddl(ddl)
