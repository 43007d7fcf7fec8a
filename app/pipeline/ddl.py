"""Spark's DDL schema strings (`id BIGINT, user STRUCT<name: STRING>, tags ARRAY<STRING>`) parsed
without a JVM: a Python data source plans in a worker process that has no SparkContext, so
`StructType.fromDDL` is not available there."""

from __future__ import annotations

import re

from pyspark.sql import types as T

_TOKEN = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*|\d+|'(?:[^'\\]|\\.)*'|[<>(),:])")
_SIMPLE: dict[str, T.DataType] = {
    "string": T.StringType(), "varchar": T.StringType(), "char": T.StringType(),
    "boolean": T.BooleanType(), "bool": T.BooleanType(),
    "tinyint": T.ByteType(), "byte": T.ByteType(), "smallint": T.ShortType(), "short": T.ShortType(),
    "int": T.IntegerType(), "integer": T.IntegerType(), "bigint": T.LongType(), "long": T.LongType(),
    "float": T.FloatType(), "real": T.FloatType(), "double": T.DoubleType(),
    "date": T.DateType(), "timestamp": T.TimestampType(), "timestamp_ltz": T.TimestampType(),
    "timestamp_ntz": T.TimestampNTZType(), "binary": T.BinaryType(),
}  # fmt: skip


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if not text[pos:].strip():
                break
            match = _TOKEN.match(text, pos)
            if match is None:
                raise self.error(f"unexpected {text[pos : pos + 10]!r}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.i = 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"option 'json_schema' is not a DDL schema Rill can read ({what}): {self.text!r}")

    def peek(self) -> str:
        return self.tokens[self.i] if self.i < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token.lower() != expected):
            raise self.error(f"expected {expected or 'more'}, found {token or 'the end'!r}")
        self.i += 1
        return token

    def fields(self, end: str) -> list[T.StructField]:
        out: list[T.StructField] = []
        while True:
            name = self.take()
            name = name[1:-1].replace("``", "`") if name.startswith("`") else name
            if self.peek() == ":":
                self.take()
            kind = self.type()
            nullable = True
            while self.peek().lower() in ("not", "comment"):
                if self.take().lower() == "not":
                    self.take("null")
                    nullable = False
                else:
                    self.take()  # the comment's text
            out.append(T.StructField(name, kind, nullable))
            if self.peek() != ",":
                break
            self.take()
        if self.peek() != end:
            raise self.error(f"unexpected {self.peek()!r}")
        return out

    def type(self) -> T.DataType:
        word = self.take().lower()
        if word in _SIMPLE:
            if self.peek() == "(":  # VARCHAR(10), CHAR(3)
                self.take("(")
                self.take()
                self.take(")")
            return _SIMPLE[word]
        if word in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take("(")
                precision = int(self.take())
                if self.peek() == ",":
                    self.take()
                    scale = int(self.take())
                self.take(")")
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise self.error(f"DECIMAL({precision},{scale}) is out of range")
            return T.DecimalType(precision, scale)
        if word == "array":
            self.take("<")
            element = self.type()
            self.take(">")
            return T.ArrayType(element)
        if word == "map":  # Arrow's JSON reader, which parses the values, has no maps
            raise self.error("MAP is not supported: use a STRUCT of the keys you need")
        if word == "struct":
            self.take("<")
            fields = self.fields(">") if self.peek() != ">" else []
            self.take(">")
            return T.StructType(fields)
        raise self.error(f"unknown type {word!r}")


def parse_ddl(text: str) -> T.StructType:
    """The struct a DDL string like `a INT, b STRUCT<c: STRING>` describes; ValueError if it is not one."""
    parser = _Parser(text)
    if not parser.tokens:
        raise parser.error("it is empty")
    fields = parser.fields("")
    _unique(parser, fields)
    return T.StructType(fields)


def _unique(parser: _Parser, fields: list[T.StructField]) -> None:
    names = [f.name for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise parser.error(f"field(s) {twice} named twice")
    for f in fields:
        if isinstance(f.dataType, T.StructType):
            _unique(parser, f.dataType.fields)
