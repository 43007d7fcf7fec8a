"""The `rill` data source's options, checked once on the driver, and the bounds a read is held to.

Plain data (frozen dataclasses), so a read's options pickle to the executors as they are.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import datasource as sds
from pyspark.sql.types import StructType

from app.domain.offsets import format_offset
from app.pipeline.ddl import parse_ddl
from app.pipeline.hot import Server
from app.tiering.store import StoreOptions

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TOKEN = re.compile(r"\d{16}_\d{16}")
_S3_OPTIONS = ("s3_endpoint_url", "region", "access_key_id", "secret_access_key", "session_token", "path_style")
OPTIONS = (
    "store", "path", "bucket", "stream", "prefix", "from_offset", "to_offset", "start_time", "end_time", "json_schema",
)  # fmt: skip
_SERVER = ("url", "token", "include_hot")
STREAM_ONLY = ("startingoffsets", "maxbytespertrigger", "maxrecordspertrigger", "failondataloss")
_PACKING = ("max_partition_bytes", "min_partitions", "arrow")


@dataclass(frozen=True)
class Range:
    """An interval of comparable values (offset tokens or µs since the epoch); a None end is unbounded."""

    lo: Any = None
    lo_strict: bool = False
    hi: Any = None
    hi_strict: bool = True

    def above(self, value: Any, strict: bool) -> Range:
        if self.lo is None or value > self.lo or (value == self.lo and strict):
            return replace(self, lo=value, lo_strict=strict)
        return self

    def below(self, value: Any, strict: bool) -> Range:
        if self.hi is None or value < self.hi or (value == self.hi and strict):
            return replace(self, hi=value, hi_strict=strict)
        return self

    def overlaps(self, least: Any, most: Any, most_open: bool = False) -> bool:
        """Whether some value in [least, most] (or [least, most) when most_open) can fall in the range."""
        if self.lo is not None and (most < self.lo or (most == self.lo and (self.lo_strict or most_open))):
            return False
        return not (self.hi is not None and (least > self.hi or (least == self.hi and self.hi_strict)))

    def mask(self, column: pa.Array | pa.ChunkedArray, scalar_type: pa.DataType) -> pa.Array | None:
        """The rows of `column` inside the range, or None when the range is unbounded."""
        parts = []
        if self.lo is not None:
            parts.append((pc.greater if self.lo_strict else pc.greater_equal)(column, pa.scalar(self.lo, scalar_type)))
        if self.hi is not None:
            parts.append((pc.less if self.hi_strict else pc.less_equal)(column, pa.scalar(self.hi, scalar_type)))
        return None if not parts else parts[0] if len(parts) == 1 else pc.and_(parts[0], parts[1])


@dataclass(frozen=True)
class Bounds:
    """What a read is restricted to; `streams` None means any stream."""

    streams: frozenset[str] | None = None
    offsets: Range = field(default_factory=Range)
    times: Range = field(default_factory=Range)  # µs since the epoch, like Spark's timestamps
    nothing: bool = False  # a filter no row can pass (another bucket)

    def only_streams(self, names: Iterable[str]) -> Bounds:
        names = frozenset(names)
        return replace(self, streams=names if self.streams is None else self.streams & names)


def micros(value: Any, name: str) -> int:
    """µs since the epoch of an ISO 8601 time or a number of ms; a time without a zone is UTC."""
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value) * 1000
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"option {name!r} must be an ISO 8601 time or ms since the epoch, not {value!r}") from None
    if not isinstance(value, dt.datetime):
        raise ValueError(f"option {name!r} must be a time, not {value!r}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return (value - EPOCH) // dt.timedelta(microseconds=1)


def _count(value: str | None, name: str, least: int) -> int:
    if value is None:
        return least
    if not value.strip().isdigit() or int(value) < least:
        raise ValueError(f"option {name!r} must be a whole number of at least {least}, not {value!r}")
    return int(value)


def _token(value: str, name: str) -> str:
    value = value.strip()
    if value.isdigit():
        return format_offset(int(value))
    if not TOKEN.fullmatch(value):
        raise ValueError(f"option {name!r} must be an offset token (0000000000000000_0000000000000042), not {value!r}")
    return value


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, checked; plain data so it pickles to executors."""

    store: str
    bucket: str
    stream: str | None = None
    prefix: str | None = None
    s3: StoreOptions = field(default_factory=StoreOptions)
    bounds: Bounds = field(default_factory=Bounds)
    max_partition_bytes: int = 0  # 0: a partition per segment
    min_partitions: int = 1
    arrow: bool = True  # hand Spark Arrow batches; false: a Python tuple per row (only to compare)
    server: Server | None = None  # where the part not tiered yet is read (include_hot)
    json_schema: StructType | None = None  # the struct of the `value` column, parsed from each JSON message

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {k.lower(): v for k, v in options.items()}
        known = OPTIONS + _S3_OPTIONS + _PACKING + _SERVER
        unknown = sorted(set(opts) - set(known))
        if unknown:
            raise ValueError(f"unknown rill option(s) {unknown}; known: {sorted(known)}")
        store, bucket = opts.get("store") or opts.get("path"), opts.get("bucket")
        if not store:
            raise ValueError("option 'store' is required (s3://bucket/prefix or file:///dir)")
        if urlsplit(store).scheme not in ("s3", "file", ""):
            raise ValueError(f"unsupported store URL {store!r}: use s3://bucket/prefix or file:///dir")
        if not bucket or "/" in bucket:
            raise ValueError(f"option 'bucket' is required and may not contain '/': {bucket!r}")
        if opts.get("stream") is not None and opts.get("prefix") is not None:
            raise ValueError("options 'stream' and 'prefix' are exclusive")
        path_style = opts.get("path_style")
        if path_style is not None and path_style.lower() not in ("true", "false"):
            raise ValueError(f"option 'path_style' must be true or false, not {path_style!r}")
        s3 = StoreOptions(
            endpoint_url=opts.get("s3_endpoint_url"),
            region=opts.get("region"),
            access_key_id=opts.get("access_key_id"),
            secret_access_key=opts.get("secret_access_key"),
            session_token=opts.get("session_token"),
            path_style=None if path_style is None else path_style.lower() == "true",
        )
        offsets, times = Range(), Range()
        if opts.get("from_offset"):
            offsets = offsets.above(_token(opts["from_offset"], "from_offset"), False)
        if opts.get("to_offset"):
            offsets = offsets.below(_token(opts["to_offset"], "to_offset"), True)
        if opts.get("start_time"):
            times = times.above(micros(opts["start_time"], "start_time"), False)
        if opts.get("end_time"):
            times = times.below(micros(opts["end_time"], "end_time"), True)
        bounds = Bounds(offsets=offsets, times=times)
        packing = _count(opts.get("max_partition_bytes"), "max_partition_bytes", 0)
        spread = _count(opts.get("min_partitions"), "min_partitions", 1)
        arrow = opts.get("arrow", "true").strip().lower()
        if arrow not in ("true", "false"):
            raise ValueError(f"option 'arrow' must be true or false, not {arrow!r}")
        server = _server(opts)
        value = parse_ddl(opts["json_schema"]) if opts.get("json_schema") else None
        return cls(
            store, bucket, opts.get("stream"), opts.get("prefix"), s3, bounds, packing, spread,
            arrow=arrow == "true", server=server, json_schema=value,
        )  # fmt: skip


def _server(opts: Mapping[str, str]) -> Server | None:
    """The server the hot tail is read from; None when the read is of the cold tier only."""
    hot = opts.get("include_hot", "true").strip().lower()
    if hot not in ("true", "false"):
        raise ValueError(f"option 'include_hot' must be true or false, not {opts['include_hot']!r}")
    url = opts.get("url")
    if url is not None and urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"option 'url' must be a Rill server's http:// or https:// base URL, not {url!r}")
    if hot == "false":
        return None
    if not url:
        raise ValueError(
            "option 'url' (a Rill server, e.g. http://127.0.0.1:4437) is needed to read what is not tiered yet; "
            "set include_hot=false to read only the cold tier"
        )
    return Server(url, opts.get("token") or None)


def narrow(bounds: Bounds, f: sds.Filter, bucket: str) -> Bounds:
    """`bounds` tightened by one pushed-down filter it understands (others leave it as it is)."""
    attr: tuple[str, ...] = getattr(f, "attribute", ())
    value: Any = getattr(f, "value", None)
    column = attr[0] if len(attr) == 1 else None
    if column in ("stream", "bucket") and isinstance(f, sds.EqualTo | sds.In):
        values = {v for v in (value if isinstance(f, sds.In) else [value]) if isinstance(v, str)}
        if column == "stream":
            return bounds.only_streams(values)
        return bounds if bucket in values else replace(bounds, nothing=True)
    if column == "offset" and isinstance(value, str):
        return replace(bounds, offsets=_compare(bounds.offsets, f, value))
    if column == "append_time" and isinstance(value, dt.datetime):
        return replace(bounds, times=_compare(bounds.times, f, micros(value, "append_time")))
    return bounds


def _compare(rng: Range, f: sds.Filter, value: Any) -> Range:
    if isinstance(f, sds.GreaterThan | sds.GreaterThanOrEqual):
        return rng.above(value, isinstance(f, sds.GreaterThan))
    if isinstance(f, sds.LessThan | sds.LessThanOrEqual):
        return rng.below(value, isinstance(f, sds.LessThan))
    if isinstance(f, sds.EqualTo):
        return rng.above(value, False).below(value, False)
    return rng
