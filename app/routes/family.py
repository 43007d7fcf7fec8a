"""A route family that maps every path under a prefix to streams of one built-in bucket."""

from __future__ import annotations

from dataclasses import dataclass

from app.protocol.target import ControlTarget, StreamTarget, split_control, validate_stream_id


@dataclass(frozen=True)
class BuiltinFamily:
    bucket: str
    prefix: str

    def target(self, path: str) -> StreamTarget | ControlTarget:
        name = path[len(self.prefix) :]
        control = split_control(self.bucket, self.prefix, name.split("/"))
        if control is not None:
            return control
        validate_stream_id(name)
        return StreamTarget(self.bucket, name, self.prefix)
