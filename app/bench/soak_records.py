"""The soak's appends as recognisable records, the ledger of what the server answered, and the check
that every acknowledged append is stored exactly once.

A binary append is one record `<<` + 12-digit id + `:` + 8-digit filler length + `>>` + random filler,
so a stream's bytes parse back into ids front to back. A JSON append is one object or an array of
objects `{"id": ..., "part": k, "parts": n, "pad": ...}`; the server stores each array item as its own
message, so a JSON append is stored when every one of its parts is, once.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

HEADER = re.compile(rb"<<(\d{12}):(\d{8})>>")
HEADER_SIZE = 25


def binary_record(ident: str, filler: int, rng: random.Random) -> bytes:
    return b"<<%s:%08d>>" % (ident.encode(), filler) + rng.randbytes(filler)


def json_messages(ident: str, parts: int, pad: int) -> list[dict[str, Any]]:
    return [{"id": ident, "part": k, "parts": parts, "pad": "x" * pad} for k in range(parts)]


def json_body(messages: list[dict[str, Any]], as_array: bool) -> bytes:
    return json.dumps(messages if as_array or len(messages) > 1 else messages[0]).encode()


def json_keys(ident: str, parts: int) -> list[str]:
    return [f"{ident}/{k}" for k in range(parts)]


def parse_binary(data: bytes, partial_tail: bool = False) -> tuple[list[str], int]:
    """(ids in order, bytes that are not records). With `partial_tail`, a cut last record is fine:
    catch-up reads end at a size limit, not at a record boundary."""
    ids: list[str] = []
    pos, junk = 0, 0
    while pos < len(data):
        match = HEADER.match(data, pos)
        if match is None:
            if partial_tail and len(data) - pos < HEADER_SIZE:
                return ids, junk  # the cut fell inside the last record's header
            resync = HEADER.search(data, pos + 1)
            end = resync.start() if resync else len(data)
            junk += end - pos
            pos = end
            continue
        end = match.end() + int(match.group(2))
        if end > len(data) and not partial_tail:
            junk += len(data) - pos
            return ids, junk
        ids.append(match.group(1).decode())
        pos = end
    return ids, junk


def parse_json(data: bytes) -> tuple[list[str], int]:
    """(keys of the messages in a JSON read, messages that are not ours); raises ValueError on bad JSON."""
    messages = json.loads(data)
    if not isinstance(messages, list):
        raise ValueError("a JSON stream read is not an array")
    keys, junk = [], 0
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("id"), str) and isinstance(m.get("part"), int):
            keys.append(f"{m['id']}/{m['part']}")
        else:
            junk += 1
    return keys, junk


@dataclass
class Attempt:
    stream: str
    keys: list[str]
    outcome: str = "unknown"  # acked (2xx), rejected (4xx or abandoned by us), unknown (no answer, 5xx)


@dataclass
class Verdict:
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    rejected_but_stored: int = 0  # a 4xx or an abandoned request that still left data: a bug
    unknown: int = 0  # no answer: stored once or not at all are both fine
    unknown_stored: int = 0
    torn: int = 0  # some messages of one JSON append stored, others not: appends must be atomic
    foreign: int = 0  # stored records the ledger never sent, or bytes that are not records
    examples: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.rejected_but_stored or self.torn or self.foreign)


@dataclass
class Ledger:
    attempts: dict[str, Attempt] = field(default_factory=dict)

    def add(self, ident: str, stream: str, keys: list[str]) -> Attempt:
        attempt = Attempt(stream, keys)
        self.attempts[ident] = attempt
        return attempt

    def verify(self, stored: dict[str, Counter[str]], junk: dict[str, int]) -> Verdict:
        """`stored`: per stream, how many times each key was read back; `junk`: unparseable units."""
        v = Verdict(foreign=sum(junk.values()))
        expected: dict[str, set[str]] = {}
        for ident, a in self.attempts.items():
            expected.setdefault(a.stream, set()).update(a.keys)
            counts = [stored.get(a.stream, Counter())[k] for k in a.keys]
            if a.outcome == "acked":
                v.acknowledged += 1
                if min(counts) == 0:
                    v.lost += 1
                    _example(v, f"lost: {ident} on {a.stream}")
            elif a.outcome == "rejected" and max(counts) > 0:
                v.rejected_but_stored += 1
                _example(v, f"rejected but stored: {ident} on {a.stream}")
            elif a.outcome == "unknown":
                v.unknown += 1
                v.unknown_stored += min(counts) > 0
            if 0 < sum(c > 0 for c in counts) < len(counts):
                v.torn += 1
                _example(v, f"torn: {ident} on {a.stream}")
            if max(counts) > 1:
                v.duplicated += 1
                _example(v, f"duplicated: {ident} on {a.stream} ({max(counts)} copies)")
        for stream, found in stored.items():
            v.foreign += sum(n for key, n in found.items() if key not in expected.get(stream, ()))
        return v


def _example(v: Verdict, text: str) -> None:
    if len(v.examples) < 10:
        v.examples.append(text)
