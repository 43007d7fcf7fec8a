"""What a chaos run records: every operation a client tried, when it started and ended (seconds since
the run began, one monotonic clock), and what came back; the faults the nemesis injected; and each
node's content of each stream once everything was healed. The checker reads nothing else."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# An append's payload is its id followed by this byte, so a stream's content splits back into ids.
SEPARATOR = ";"


@dataclass
class Append:
    """One attempt; a producer's retry of the same seq is another attempt with the same payload id."""

    client: str
    node: int
    stream: str
    payload: str
    start: float
    end: float
    outcome: str  # "ok", "refused" (a 4xx: surely not stored), "unknown" (5xx, timeout, connection lost)
    status: int = 0
    next_offset: str = ""
    producer: str = ""  # producer id, "" for a plain append
    seq: int = -1


@dataclass
class Read:
    """One answer to a reader: a catch-up chunk, a long-poll answer, or an SSE data/control pair."""

    reader: str
    node: int
    stream: str
    kind: str  # "catch-up", "long-poll" or "sse"
    start: float  # when the request (the SSE connection) was sent
    end: float  # when this answer arrived
    from_offset: str
    next_offset: str
    position: int  # the reader's content length after this answer: the byte position of next_offset
    up_to_date: bool
    added: list[str] = field(default_factory=list)  # payload ids completed by this answer


@dataclass
class Claim:
    worker: str
    node: int
    start: float
    end: float
    status: int
    generation: int = 0
    wake_id: str = ""
    acked: dict[str, str] = field(default_factory=dict)  # stream -> acknowledged offset the claim showed


@dataclass
class Ack:
    worker: str
    node: int
    start: float
    end: float
    status: int
    generation: int
    offsets: dict[str, str] = field(default_factory=dict)


@dataclass
class Fault:
    kind: str
    detail: str
    start: float
    healed: float = -1.0  # -1: not healed (a bug in the run, reported)


@dataclass
class History:
    seed: int
    nodes: int
    appends: list[Append] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    final_leader: int = 0  # whose content the others are compared with
    # After healing: node -> stream -> content (payload ids in stream order); None where unreadable.
    final: dict[int, dict[str, list[str] | None]] = field(default_factory=dict)
    final_offsets: dict[int, dict[str, str]] = field(default_factory=dict)  # node -> stream -> tail offset
    subscription_final: dict[str, str] = field(default_factory=dict)  # stream -> acknowledged offset at the end
    skipped: list[str] = field(default_factory=list)  # faults not run here, with the reason
    nemesis_errors: list[str] = field(default_factory=list)  # faults that could not be made as planned
    links: dict[str, int] = field(default_factory=dict)  # the proxies' totals: bytes, connections, resets, drops

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        kinds = {"appends": Append, "reads": Read, "claims": Claim, "acks": Ack, "faults": Fault}
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = data.get(f.name)
            if raw is None:
                continue
            if f.name in kinds:
                values[f.name] = [kinds[f.name](**item) for item in raw]
            elif f.name in ("final", "final_offsets"):
                values[f.name] = {int(node): streams for node, streams in raw.items()}
            else:
                values[f.name] = raw
        return cls(**values)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text()))


def split_payloads(content: str) -> tuple[list[str], str]:
    """The complete payload ids in `content` and the incomplete rest (a chunk may end mid-payload)."""
    *done, rest = content.split(SEPARATOR)
    return done, rest
