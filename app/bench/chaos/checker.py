"""The checker: reads a chaos run's history and says what, if anything, the cluster got wrong.

- Every acknowledged append is in every node's final content exactly once, no payload twice, none
  that no client sent, and a write acknowledged before another began comes first (real-time order).
- Offsets name one byte position each, and a later position always has a greater offset.
- A read never returns bytes that are not in the final content at that place (never committed, or
  a rewind), and a read that says "up to date" includes every append acknowledged before it began.
- A subscription's generation has one holder, an acknowledged offset never moves back, and a fenced
  holder's ack is never accepted.
- After each heal, writes are accepted again within `bound` seconds.
Each violation comes with the few operations that show it."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from app.bench.chaos.history import Ack, Append, Claim, History, Read

UNAVAILABLE_BOUND_SECONDS = 15.0


@dataclass
class Violation:
    kind: str  # lost, duplicated, phantom, order, offsets, diverged, uncommitted-read, stale-read, backwards-read,
    # subscription, unavailable
    message: str
    excerpt: list[dict[str, Any]] = field(default_factory=list)  # the operations that show it
    at: float = 0.0  # when it happened (seconds into the run), to place it on the fault timeline


@dataclass
class Verdict:
    appends: int = 0  # attempts
    acknowledged: int = 0  # distinct payloads acknowledged
    lost: int = 0
    duplicated: int = 0
    stale_reads: int = 0
    backwards_reads: int = 0
    uncommitted_reads: int = 0
    reads: int = 0
    claims: int = 0
    acks: int = 0
    worst_unavailable: float = 0.0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, kind: str, message: str, excerpt: list[Any], at: float) -> None:
        self.violations.append(Violation(kind, message, [_op(x) for x in excerpt], at))


def _op(x: Any) -> dict[str, Any]:
    found = asdict(x) if hasattr(x, "__dataclass_fields__") else dict(x)
    found["op"] = type(x).__name__.lower()
    return found


def check(history: History, bound: float = UNAVAILABLE_BOUND_SECONDS) -> Verdict:
    verdict = Verdict(appends=len(history.appends), reads=len(history.reads))
    verdict.claims, verdict.acks = len(history.claims), len(history.acks)
    final = _converged(history, verdict)
    by_stream: dict[str, list[Append]] = defaultdict(list)
    for a in history.appends:
        by_stream[a.stream].append(a)
    for stream in sorted(set(by_stream) | set(final)):
        content = final.get(stream, [])
        ends = _ends(content)
        _appends(stream, by_stream[stream], content, verdict)
        _offsets(stream, by_stream[stream], [r for r in history.reads if r.stream == stream], ends, verdict)
        _reads(stream, by_stream[stream], [r for r in history.reads if r.stream == stream], content, ends, verdict)
    _subscriptions(history.claims, history.acks, history.subscription_final, verdict)
    _availability(history, bound, verdict)
    return verdict


def _converged(history: History, verdict: Verdict) -> dict[str, list[str]]:
    """One content per stream, which every node must hold after healing; the leader's is the reference."""
    final: dict[str, list[str]] = {}
    for node in sorted(history.final, key=lambda n: (n != history.final_leader, n)):
        for stream, content in history.final[node].items():
            if content is None:
                verdict.add("diverged", f"node {node} could not read {stream} after healing", [], 0.0)
                continue
            reference = final.setdefault(stream, content)
            if content != reference:
                at = next((i for i, (x, y) in enumerate(zip(content, reference, strict=False)) if x != y), None)
                at = min(len(content), len(reference)) if at is None else at
                verdict.add(
                    "diverged",
                    f"node {node} holds {len(content)} payloads of {stream}, the reference {len(reference)}; "
                    f"they differ from payload {at} on: {content[at : at + 3]} against {reference[at : at + 3]}",
                    [],
                    0.0,
                )
    return final


def _ends(content: list[str]) -> dict[str, int]:
    """Payload id -> the byte position just past it in the stream (its first occurrence)."""
    ends: dict[str, int] = {}
    position = 0
    for payload in content:
        position += len(payload.encode()) + 1
        ends.setdefault(payload, position)
    return ends


def _appends(stream: str, appends: list[Append], content: list[str], verdict: Verdict) -> None:
    attempts: dict[str, list[Append]] = defaultdict(list)
    for a in appends:
        attempts[a.payload].append(a)
    counts = Counter(content)
    for payload, n in counts.items():
        tried = attempts.get(payload)
        if tried is None:
            verdict.add("phantom", f"{stream} holds {payload!r}, which no client sent", [], 0.0)
        elif n > 1:
            verdict.duplicated += 1
            verdict.add("duplicated", f"{stream} holds {payload!r} {n} times", tried, tried[0].end)
        elif all(a.outcome == "refused" for a in tried):
            verdict.add("phantom", f"{stream} holds {payload!r}, whose every attempt was refused", tried, tried[0].end)
    for payload, tried in attempts.items():
        acked = [a for a in tried if a.outcome == "ok"]
        if acked:
            verdict.acknowledged += 1
            if payload not in counts:
                verdict.lost += 1
                verdict.add("lost", f"{stream}: {payload!r} was acknowledged and is gone", acked[:1], acked[0].end)
    # Real-time order: if A was acknowledged before B was first sent, A comes first.
    first_start = {p: min(a.start for a in tried) for p, tried in attempts.items()}
    acked_end = {
        p: min(a.end for a in tried if a.outcome == "ok")
        for p, tried in attempts.items()
        if p in counts and any(a.outcome == "ok" for a in tried)
    }
    placed = [p for p in dict.fromkeys(content) if p in attempts]
    earliest: tuple[float, str] | None = None  # the earliest acknowledgement among payloads placed after
    for payload in reversed(placed):
        if earliest is not None and earliest[0] < first_start[payload]:
            first = next(a for a in attempts[earliest[1]] if a.outcome == "ok" and a.end == earliest[0])
            later = min(attempts[payload], key=lambda a: a.start)
            verdict.add(
                "order",
                f"{stream}: {earliest[1]!r} was acknowledged before {payload!r} was sent, yet comes after it",
                [first, later],
                earliest[0],
            )
            break
        if payload in acked_end and (earliest is None or acked_end[payload] < earliest[0]):
            earliest = (acked_end[payload], payload)


def _offsets(stream: str, appends: list[Append], reads: list[Read], ends: dict[str, int], verdict: Verdict) -> None:
    """Every offset a client was given names one byte position, and offsets grow with positions."""
    named: dict[str, tuple[int, Any]] = {}
    first_attempt: dict[str, Append] = {}
    for a in sorted(appends, key=lambda a: a.start):
        first_attempt.setdefault(a.payload, a)
    # A producer's retry may be answered with the tail rather than its own end: only first answers count.
    sources: list[tuple[str, int, Any]] = [
        (a.next_offset, ends[a.payload], a)
        for a in first_attempt.values()
        if a.outcome == "ok" and a.next_offset and a.payload in ends
    ]
    sources += [(r.next_offset, r.position, r) for r in reads if r.next_offset]
    for offset, position, op in sources:
        seen = named.setdefault(offset, (position, op))
        if seen[0] != position:
            verdict.add(
                "offsets",
                f"{stream}: offset {offset} named byte {seen[0]} and byte {position}",
                [seen[1], op],
                op.end,
            )
            return
    ordered = sorted(named.items())
    for (o1, (p1, op1)), (o2, (p2, op2)) in zip(ordered, ordered[1:], strict=False):
        if p2 <= p1:
            verdict.add(
                "offsets", f"{stream}: offset {o1} < {o2} but byte {p1} >= byte {p2}", [op1, op2], max(op1.end, op2.end)
            )
            return


def _reads(
    stream: str, appends: list[Append], reads: list[Read], content: list[str], ends: dict[str, int], verdict: Verdict
) -> None:
    # Stale: an up-to-date answer misses an append acknowledged before its request was sent.
    acked = sorted((a.end, ends.get(a.payload, 0), a) for a in appends if a.outcome == "ok")
    times = [t for t, _, _ in acked]
    running: list[tuple[int, Append | None]] = []
    best: tuple[int, Append | None] = (0, None)
    for _, end, a in acked:
        if end > best[0]:
            best = (end, a)
        running.append(best)
    by_reader: dict[str, list[Read]] = defaultdict(list)
    for r in reads:
        by_reader[r.reader].append(r)
        if not r.up_to_date:
            continue
        i = bisect.bisect_left(times, r.start)
        if i and running[i - 1][0] > r.position:
            verdict.stale_reads += 1
            verdict.add(
                "stale-read",
                f"{stream}: node {r.node} answered up to date at byte {r.position}, but an append acknowledged "
                f"before the read began ends at byte {running[i - 1][0]}",
                [running[i - 1][1], r],
                r.end,
            )
    for reader, got in by_reader.items():
        position, at = 0, 0
        for r in got:
            if r.position < position:
                verdict.backwards_reads += 1
                verdict.add(
                    "backwards-read", f"{stream}: {reader} went from byte {position} back to {r.position}", [r], r.end
                )
                break
            position = r.position
            for payload in r.added:
                if at >= len(content) or content[at] != payload:
                    verdict.uncommitted_reads += 1
                    expected = content[at] if at < len(content) else "the end of the stream"
                    verdict.add(
                        "uncommitted-read",
                        f"{stream}: {reader} read {payload!r} as payload {at}, where the committed stream holds "
                        f"{expected!r}",
                        [r],
                        r.end,
                    )
                    break
                at += 1
            else:
                continue
            break


def _subscriptions(claims: list[Claim], acks: list[Ack], final: dict[str, str], verdict: Verdict) -> None:
    granted = [c for c in claims if c.status == 200]
    holders: dict[int, Claim] = {}
    for c in granted:
        other = holders.setdefault(c.generation, c)
        if other is not c:
            verdict.add("subscription", f"generation {c.generation} was granted twice", [other, c], c.end)
    accepted = [a for a in acks if a.status in (200, 204)]
    for a in accepted:
        newer = [c for c in granted if c.generation > a.generation and c.end < a.start]
        if newer:
            verdict.add(
                "subscription",
                f"an ack of generation {a.generation} was accepted after generation {newer[0].generation} was granted",
                [newer[0], a],
                a.end,
            )
    # An acknowledged offset never moves back: what a claim shows covers every ack accepted before it.
    events: list[tuple[float, float, Ack | Claim, dict[str, str]]] = [(a.start, a.end, a, a.offsets) for a in accepted]
    events += [(c.start, c.end, c, c.acked) for c in granted]
    done: dict[str, tuple[str, Any]] = {}
    for start, end, op, offsets in sorted(events, key=lambda e: e[1]):
        if isinstance(op, Claim):
            for stream, (offset, by) in done.items():
                shown = offsets.get(stream)
                if shown is not None and by.end < start and shown < offset:
                    verdict.add(
                        "subscription",
                        f"{stream}: the acknowledged offset went back from {offset} to {shown}",
                        [by, op],
                        end,
                    )
                    return
        for stream, offset in offsets.items():
            if stream not in done or done[stream][0] < offset:
                done[stream] = (offset, op)
    for stream, (offset, by) in done.items():
        if stream in final and final[stream] < offset:
            verdict.add(
                "subscription",
                f"{stream}: acknowledged {offset} but the subscription ends at {final[stream]}",
                [by],
                by.end,
            )


def _availability(history: History, bound: float, verdict: Verdict) -> None:
    acked = sorted((a.start, a.end) for a in history.appends if a.outcome == "ok")
    starts = [s for s, _ in acked]
    last = max((a.end for a in history.appends), default=0.0)
    for fault in history.faults:
        if fault.healed < 0:
            verdict.add("unavailable", f"{fault.kind} ({fault.detail}) was never healed", [fault], fault.start)
            continue
        i = bisect.bisect_left(starts, fault.healed)
        after = [end for _, end in acked[i : i + 200]]
        waited = (min(after) if after else last) - fault.healed
        verdict.worst_unavailable = max(verdict.worst_unavailable, waited)
        if waited > bound:
            verdict.add(
                "unavailable",
                f"no write was accepted for {waited:.1f} s after {fault.kind} ({fault.detail}) was healed",
                [fault],
                fault.healed,
            )
