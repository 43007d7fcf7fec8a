"""What the tiering worker and its packer share: their settings, and what they need of their node."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Protocol

from app.state_machine.commands import Command, Outcome
from app.state_machine.machine import StateMachine


@dataclass
class TieringConfig:
    segment_max_bytes: int = 8 << 20
    segment_max_age: float = 60.0  # seconds after the first unsealed byte
    segment_max_records: int = 100_000  # bounds the boundary list a TierSegment entry carries
    pack_below_bytes: int = 1 << 20  # streams sealing less than this share a pack with their bucket's others
    merge_min_segments: int = 16  # a stream's small segments are merged into one once it has this many
    local_disk_budget: int = 1 << 30
    interval: float = 0.5
    retry_base: float = 1.0  # seconds before a failing stream's first retry; doubles per failure
    retry_max: float = 300.0
    retry_jitter: float = 0.2  # each delay is shortened by up to this fraction, at random


class Proposer(Protocol):
    """What the worker needs of its node: the applied state, a clock, and a way to propose."""

    machine: StateMachine

    @property
    def uploading(self) -> Container[str]:
        """Keys being uploaded by others (snapshot publishes): never collected."""
        ...

    @property
    def is_leader(self) -> bool: ...

    def now_ms(self) -> int: ...

    async def submit(self, command: Command) -> Outcome: ...

    async def read_barrier(self) -> None: ...
