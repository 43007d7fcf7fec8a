"""Per-bucket quotas: how many streams a bucket holds and how many bytes its streams keep.

The leader checks a write against them before proposing it (429 past them). Usage is counted
from the applied state at most `REFRESH_MS` ago plus what this node has written since, so a
check costs a dictionary lookup; a burst from several nodes' clients may overshoot by what
arrived within that window.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from app.domain.errors import ProtocolError
from app.state_machine.commands import Append, AppendBatch, Command, CreateStream, PublishSnapshot
from app.state_machine.machine import StateMachine

REFRESH_MS = 1000


class BucketQuota(BaseModel):
    max_streams: int = Field(default=1_000_000, ge=0, description="streams the bucket may hold; 0: no limit")
    max_bytes: int = Field(
        default=0, ge=0, description="bytes its streams may keep (after retention), snapshots included; 0: no limit"
    )


@dataclass
class _Usage:
    at_ms: int
    streams: int
    bytes: int


@dataclass(frozen=True)
class Charge:
    """What an accepted write adds to its bucket's usage."""

    bucket: str
    streams: int
    bytes: int


class Quotas:
    def __init__(self, machine: StateMachine, default: BucketQuota, buckets: dict[str, BucketQuota]) -> None:
        self.machine = machine
        self.default = default
        self.buckets = buckets
        self._usage: dict[str, _Usage] = {}

    def limits(self, bucket: str) -> BucketQuota:
        return self.buckets.get(bucket, self.default)

    def check(self, command: Command, now_ms: int) -> Charge | None:
        """Raises a 429 if `command` would take its bucket past a quota; else what it will add."""
        bucket, adds = _what(command)
        if bucket is None:
            return None
        quota = self.limits(bucket)
        new_stream = isinstance(command, CreateStream) and self.machine.lookup(bucket, command.stream) is None
        if isinstance(command, PublishSnapshot) and self._published(command):
            return None  # the same snapshot again adds nothing (another at that offset is refused)
        # An append with no byte quota needs no usage: the hot path stays a dictionary lookup.
        if not (new_stream and quota.max_streams) and not (adds and quota.max_bytes):
            return None
        usage = self._current(bucket, now_ms)
        if new_stream and quota.max_streams and usage.streams >= quota.max_streams:
            raise _exceeded(f"bucket {bucket!r} holds its quota of {quota.max_streams} streams")
        if adds and quota.max_bytes and usage.bytes + adds > quota.max_bytes:
            raise _exceeded(f"bucket {bucket!r} would pass its quota of {quota.max_bytes} bytes")
        return Charge(bucket, int(new_stream), adds)

    def _published(self, command: PublishSnapshot) -> bool:
        meta = self.machine.lookup(command.bucket, command.stream)
        return meta is not None and self.machine.snapshot_at(meta.sid, command.pos) is not None

    def charge(self, charge: Charge) -> None:
        """Counts an accepted write until the next refresh sees it in the applied state."""
        usage = self._usage.get(charge.bucket)
        if usage is not None:
            usage.streams += charge.streams
            usage.bytes += charge.bytes

    def _current(self, bucket: str, now_ms: int) -> _Usage:
        usage = self._usage.get(bucket)
        if usage is None or now_ms - usage.at_ms >= REFRESH_MS:
            streams, kept = self.machine.bucket_usage(bucket)
            usage = self._usage[bucket] = _Usage(now_ms, streams, kept)
        return usage


def _what(command: Command) -> tuple[str | None, int]:
    """The bucket a write lands in and the bytes it adds."""
    if isinstance(command, Append | CreateStream):
        return command.bucket, len(command.body)
    if isinstance(command, AppendBatch):
        return command.bucket, sum(len(b) for b in command.bodies)
    if isinstance(command, PublishSnapshot):
        return command.bucket, command.size
    return None, 0


def _exceeded(message: str) -> ProtocolError:
    return ProtocolError(429, "quota_exceeded", message)
