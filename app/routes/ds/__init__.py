"""`/ds/{bucket}`, `/ds/{bucket}/{stream}` and its sub-resources: the primary family, with buckets."""

from __future__ import annotations

from app.domain.paths import DS_PREFIX
from app.protocol.buckets import validate_bucket
from app.protocol.extensions import Extension
from app.protocol.target import ControlTarget, StreamTarget, split_control, split_subroute, validate_stream_id
from app.state_machine.table import BUILTIN_BUCKETS


def target(path: str) -> StreamTarget | Extension | ControlTarget | str:
    """The stream (or stream sub-resource) a /ds path names, or the bucket id when it names a bucket
    (a built-in bucket too: its listing is here, its streams under their own family)."""
    bucket, slash, name = path[len(DS_PREFIX) :].partition("/")
    if not slash and bucket in BUILTIN_BUCKETS:
        return bucket
    validate_bucket(bucket)
    if not slash:
        return bucket
    base = f"{DS_PREFIX}{bucket}/"
    control = split_control(bucket, base, name.split("/"))
    if control is not None:
        return control
    extension = split_subroute(name.split("/"))
    if extension is not None:
        stream, kind, arg = extension
        validate_stream_id(stream, ds=True)
        return Extension(StreamTarget(bucket, stream, base), kind, arg)
    validate_stream_id(name, ds=True)
    return StreamTarget(bucket, name, base)
