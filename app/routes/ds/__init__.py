"""`/ds/{bucket}` and `/ds/{bucket}/{stream}`: the primary family, with buckets."""

from __future__ import annotations

from app.protocol.buckets import validate_bucket
from app.protocol.target import DS_SUBROUTES, StreamTarget, validate_stream_id

PREFIX = "/ds/"


def target(path: str) -> StreamTarget | str:
    """The stream a /ds path names, or the bucket id when it names a bucket."""
    bucket, slash, name = path[len(PREFIX) :].partition("/")
    validate_bucket(bucket)
    if not slash:
        return bucket
    validate_stream_id(name, reserved=DS_SUBROUTES)
    return StreamTarget(bucket, name, f"{PREFIX}{bucket}/")
