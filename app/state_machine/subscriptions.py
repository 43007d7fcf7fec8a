"""Rules for subscriptions: their configuration, their streams, acknowledged positions, and the
lease that one holder at a time takes under a new generation.

A subscription's streams are its explicit ones and, with a pattern, every stream of its scope whose
path (below `root`) matches it: `*` within one path segment, `**` across segments (see glob.py);
wake streams belong to none (see coverage.py). Leases are decided with the entry's time (the
proposing leader's clock), never a clock read here. Acknowledged positions only move forward.

A pull-wake subscription's wake event is appended here, in the apply of the entry that made its
data pending (or that ended a lease with data still pending), once per generation: it costs no
entry of its own, and every replica writes the same one. The leader proposes a `Wake` only when
that could not be done then (the wake stream was missing or closed) or when a lease ran out.

Each rule's checks are also exposed on their own (`*_refusal`), so the leader can answer a request
that would be refused from the applied state, without a log entry.
"""

from __future__ import annotations

import bisect
import json

import msgspec

from app.domain.media import media_type
from app.domain.offsets import acked_offset, format_offset
from app.state_machine import records as r
from app.state_machine import streams as stream_rules
from app.state_machine.commands import (
    Ack,
    Append,
    Claim,
    Code,
    DeleteSubscription,
    LinkStreams,
    Outcome,
    PutSubscription,
    Wake,
)
from app.state_machine.coverage import Scope
from app.state_machine.glob import PatternRejected, validate_pattern
from app.state_machine.reader import is_boundary
from app.state_machine.table import StreamTable

# Subscriptions with a pattern in one bucket: each stream created in it is matched against them all,
# on every replica (and each is matched against the bucket's streams at load).
MAX_PATTERNS = 256
MAX_EXPLICIT = 10_000  # streams one subscription names explicitly: each link request's apply reads them all
_CONFIG = ("type", "pattern", "webhook_url", "wake_stream", "lease_ttl_ms", "description")


def find(table: StreamTable, bucket: str, root: str, sub_id: str) -> r.Subscription | None:
    raw = table.get(r.SUBSCRIPTIONS, r.subscription_key(bucket, root, sub_id))
    return r.decode_subscription(raw) if raw else None


def stream_name(sub: r.Subscription, path: str) -> str:
    return f"{sub.root}/{path}" if sub.root else path


def linked(table: StreamTable, sub: r.Subscription) -> dict[str, str]:
    """The subscription's streams that exist now: path -> "explicit" or "glob"."""
    found: dict[str, str] = {}
    prefix = f"{sub.root}/" if sub.root else ""
    coverage = table.coverage
    for sid in coverage.matched(r.subscription_key(sub.bucket, sub.root, sub.id)):
        meta = table.streams.get(sid)
        if meta is not None and not meta.deleted and not coverage.is_wake_stream(meta.bucket, meta.name):
            found[meta.name[len(prefix) :]] = "glob"
    for path in sub.explicit:
        if not coverage.is_wake_stream(sub.bucket, prefix + path):
            found[path] = "explicit"
    return found


def links(table: StreamTable, sub: r.Subscription, path: str) -> bool:
    """Whether `path` is one of the subscription's streams (as `linked` would say, for one path)."""
    name = stream_name(sub, path)
    if table.coverage.is_wake_stream(sub.bucket, name):
        return False
    at = bisect.bisect_left(sub.explicit, path)  # kept sorted
    if at < len(sub.explicit) and sub.explicit[at] == path:
        return True
    sid = table.names.get((sub.bucket, name))
    meta = table.streams.get(sid) if sid is not None else None
    key = r.subscription_key(sub.bucket, sub.root, sub.id)
    return meta is not None and not meta.deleted and meta.sid in table.coverage.matched(key)


def _save(table: StreamTable, sub: r.Subscription) -> Outcome:
    acked = list(sub.acked)
    if acked != sorted(acked):  # stored bytes must not depend on the order a replica met the streams in
        sub = msgspec.structs.replace(sub, acked=dict(sorted(sub.acked.items())))
    key = r.subscription_key(sub.bucket, sub.root, sub.id)
    table.stage(r.SUBSCRIPTIONS, key, r.encode(sub))
    table.cover(key, sub)
    table.coverage.woken.add(key)
    return Outcome(Code.OK, subscription=sub)


def missing() -> Outcome:
    return Outcome(Code.SUBSCRIPTION_NOT_FOUND, "no such subscription")


def put_refusal(table: StreamTable, cmd: PutSubscription) -> Outcome | None:
    """Why `cmd` cannot create its subscription, whatever exists already; None if it can."""
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND, "no such bucket")
    if cmd.pattern is not None:
        try:
            validate_pattern(cmd.pattern)
        except PatternRejected as exc:
            return Outcome(Code.INVALID_PATTERN, str(exc))
        if table.coverage.patterns_in(cmd.bucket) >= MAX_PATTERNS:
            message = f"a bucket holds at most {MAX_PATTERNS} subscriptions with a pattern"
            return Outcome(Code.TOO_MANY_SUBSCRIPTIONS, message)
    if cmd.wake_stream is not None:
        root = f"{cmd.root}/" if cmd.root else ""
        if (cmd.bucket, root + cmd.wake_stream) not in table.names:
            return Outcome(Code.WAKE_STREAM_NOT_FOUND, f"the wake stream {cmd.wake_stream!r} does not exist")
        if cmd.wake_stream in cmd.streams or Scope.of(_wanted(cmd, 0)).matches(cmd.bucket, root + cmd.wake_stream):
            return _covers_wake_stream()
    return None


def _covers_wake_stream() -> Outcome:
    return Outcome(Code.WAKE_STREAM_COVERED, "a subscription cannot cover its own wake stream")


def _wanted(cmd: PutSubscription, now: int) -> r.Subscription:
    return r.Subscription(
        bucket=cmd.bucket, root=cmd.root, id=cmd.id, type=cmd.kind, pattern=cmd.pattern,
        explicit=sorted(set(cmd.streams)), webhook_url=cmd.webhook_url, wake_stream=cmd.wake_stream,
        lease_ttl_ms=cmd.lease_ttl_ms, description=cmd.description, base_url=cmd.base_url, created_at=now,
    )  # fmt: skip


def existing_put(table: StreamTable, cmd: PutSubscription) -> Outcome | None:
    """What a PUT of a subscription that exists answers (it changes nothing); None if it does not exist."""
    found = find(table, cmd.bucket, cmd.root, cmd.id)
    if found is None:
        return None
    wanted = _wanted(cmd, 0)
    if any(getattr(found, f) != getattr(wanted, f) for f in _CONFIG) or found.explicit != wanted.explicit:
        return Outcome(Code.CONFIG_MISMATCH, "the subscription exists with another configuration", subscription=found)
    return Outcome(Code.EXISTS, subscription=found)


def put_subscription(table: StreamTable, cmd: PutSubscription, now: int) -> Outcome:
    answered = existing_put(table, cmd) or put_refusal(table, cmd)
    if answered is not None:
        return answered
    wanted = _wanted(cmd, now)
    key = r.subscription_key(wanted.bucket, wanted.root, wanted.id)
    table.cover(key, wanted)
    wanted.acked = _tails(table, wanted, list(linked(table, wanted)))
    outcome = _save(table, wanted)
    outcome.code = Code.CREATED
    return outcome


def _tails(table: StreamTable, sub: r.Subscription, paths: list[str]) -> dict[str, int]:
    """A new link starts at its stream's tail: a subscription takes what is appended from then on
    (a stream made later starts at its beginning)."""
    out: dict[str, int] = {}
    for path in paths:
        sid = table.names.get((sub.bucket, stream_name(sub, path)))
        if sid is not None:
            out[path] = table.streams[sid].tail
    return out


def delete_subscription(table: StreamTable, cmd: DeleteSubscription, now: int) -> Outcome:
    if find(table, cmd.bucket, cmd.root, cmd.id) is None:
        return missing()
    delete_subscription_key(table, r.subscription_key(cmd.bucket, cmd.root, cmd.id))
    return Outcome(Code.DELETED)


def delete_subscription_key(table: StreamTable, key: bytes) -> None:
    table.unstage(r.SUBSCRIPTIONS, key)
    table.coverage.remove(key)


def link_refusal(table: StreamTable, cmd: LinkStreams) -> Outcome | None:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return missing()
    if sub.wake_stream is not None and sub.wake_stream in cmd.add:
        return _covers_wake_stream()
    if len(_explicit_after(sub, cmd)) > MAX_EXPLICIT:
        return Outcome(Code.TOO_MANY_LINKS, f"a subscription names at most {MAX_EXPLICIT} streams explicitly")
    return None


def link_changes(table: StreamTable, cmd: LinkStreams) -> bool:
    """Whether the link would change the subscription's explicit streams (a request that would not
    is answered without a log entry)."""
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    return sub is None or _explicit_after(sub, cmd) != set(sub.explicit)


def _explicit_after(sub: r.Subscription, cmd: LinkStreams) -> set[str]:
    return (set(sub.explicit) | set(cmd.add)) - set(cmd.remove)


def link_streams(table: StreamTable, cmd: LinkStreams, now: int) -> Outcome:
    refused = link_refusal(table, cmd)
    if refused is not None:
        return refused
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    assert sub is not None
    before = linked(table, sub)
    changed = msgspec.structs.replace(sub, explicit=sorted(_explicit_after(sub, cmd)))
    after = linked(table, changed)  # its pattern, and so what the pattern matches, is the same
    # An unlinked stream's position is forgotten, unless the pattern still covers the stream.
    acked = {path: pos for path, pos in sub.acked.items() if path in after or path not in cmd.remove}
    new = [path for path in cmd.add if path not in acked and path not in before]
    acked.update(_tails(table, sub, new))
    changed.acked = acked
    return _save(table, changed)


def forget_positions(table: StreamTable) -> None:
    """Each subscription forgets the positions of the streams the entry removed, in one write."""
    forgotten, table.forgotten = table.forgotten, {}
    for key in sorted(forgotten):
        raw = table.get(r.SUBSCRIPTIONS, key)
        if raw is None:
            continue
        sub = r.decode_subscription(raw)
        if not forgotten[key].isdisjoint(sub.acked):
            sub.acked = {path: pos for path, pos in sub.acked.items() if path not in forgotten[key]}
            table.stage(r.SUBSCRIPTIONS, key, r.encode(sub))


def claim_refusal(table: StreamTable, cmd: Claim, now: int) -> Outcome | None:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return missing()
    if sub.holder is not None and sub.holder != cmd.holder and now < sub.lease_until:
        return Outcome(Code.ALREADY_CLAIMED, f"held by {sub.holder}", subscription=sub)
    return None


def claim(table: StreamTable, cmd: Claim, now: int) -> Outcome:
    refused = claim_refusal(table, cmd, now)
    if refused is not None:
        return refused
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    assert sub is not None
    taken = msgspec.structs.replace(
        sub, generation=sub.generation + 1, wake_id=cmd.wake_id, holder=cmd.holder,
        lease_until=now + sub.lease_ttl_ms, token_sha256=cmd.token_sha256,
    )  # fmt: skip
    return _save(table, taken)


def ack_refusal(table: StreamTable, cmd: Ack, now: int) -> Outcome | None:
    """Why `cmd` would be refused: no such subscription, a fenced wake, or a stream or position it lacks."""
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return missing()
    current = (sub.generation, sub.wake_id, sub.token_sha256)
    if sub.holder is None or current != (cmd.generation, cmd.wake_id, cmd.token_sha256) or now >= sub.lease_until:
        return Outcome(Code.FENCED, "this wake is no longer the subscription's current one", subscription=sub)
    for path, pos in cmd.acks:
        sid = table.names.get((sub.bucket, stream_name(sub, path)))
        if sid is None or not links(table, sub, path):
            return Outcome(Code.NOT_FOUND, f"{path!r} is not one of the subscription's streams", subscription=sub)
        if pos > table.streams[sid].tail:
            return Outcome(Code.BEYOND_TAIL, f"{path!r} has no position {pos} yet", subscription=sub)
    return None


def ack_boundary_refusal(table: StreamTable, cmd: Ack) -> Outcome | None:
    """An ack inside a JSON message, refused before it is proposed: the next worker resumes from the
    offset and could not read from it. Not an apply rule: acks that earlier versions applied replay
    alike. Below `earliest` the record may be gone, and its boundaries with it (a read answers 410)."""
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return None
    for path, pos in cmd.acks:
        sid = table.names.get((sub.bucket, stream_name(sub, path)))
        meta = table.streams.get(sid) if sid is not None else None
        if meta is not None and meta.json and meta.earliest <= pos <= meta.tail and not is_boundary(table, meta, pos):
            return Outcome(Code.NOT_BOUNDARY, f"{pos} is not a message boundary of {path!r}", subscription=sub)
    return None


def ack_changes(table: StreamTable, cmd: Ack, now: int) -> bool:
    """Whether an ack that is not refused changes anything: it ends the lease, moves a position
    forward, or renews a lease that has run through half its time (an ack is also a heartbeat)."""
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None or cmd.done:
        return True
    if any(pos > sub.acked.get(path, -1) for path, pos in cmd.acks):
        return True
    return sub.lease_until - now < sub.lease_ttl_ms // 2


def ack(table: StreamTable, cmd: Ack, now: int) -> Outcome:
    refused = ack_refusal(table, cmd, now)
    if refused is not None:
        return refused
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    assert sub is not None
    acked = dict(sub.acked)
    for path, pos in cmd.acks:
        acked[path] = max(pos, acked.get(path, -1))  # never backwards
    if cmd.done:
        outcome = _save(table, msgspec.structs.replace(sub, acked=acked, holder=None, lease_until=0, token_sha256=None))
        assert outcome.subscription is not None
        _wake(table, outcome.subscription, now)  # data that came while it was held
        return outcome
    return _save(table, msgspec.structs.replace(sub, acked=acked, lease_until=now + sub.lease_ttl_ms))


def wake_covering(table: StreamTable, now: int) -> None:
    """Wakes the pull-wake subscriptions covering the streams the entry just applied wrote to."""
    grown, table.grown = table.grown, []
    if not table.coverage.scopes:  # no subscriptions: the common case, once per append
        return
    for sid in sorted(set(grown)):
        meta = table.streams.get(sid)
        if meta is None:
            continue
        for key in table.coverage.waking(meta):  # webhooks are the leader's to deliver
            raw = table.get(r.SUBSCRIPTIONS, key)
            if raw:
                _wake(table, r.decode_subscription(raw), now)
    table.grown.clear()  # the wake streams' own records: they cover nothing


def wake(table: StreamTable, cmd: Wake, now: int) -> Outcome:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return missing()
    if sub.generation != cmd.generation:
        return Outcome(Code.OK, subscription=sub)  # claimed since: its worker knows
    written = _wake(table, sub, now)
    return Outcome(Code.OK, subscription=sub) if written is None or written.code is Code.APPENDED else written


def wake_refusal(table: StreamTable, sub: r.Subscription) -> Outcome | None:
    """Why a wake event could not be appended to the subscription's wake stream now, if it could not."""
    sid = table.names.get((sub.bucket, stream_name(sub, sub.wake_stream or "")))
    meta = table.streams.get(sid) if sid is not None else None
    if meta is None or meta.deleted:
        return Outcome(Code.NOT_FOUND, "the wake stream does not exist")
    if meta.closed:
        return Outcome(Code.STREAM_CLOSED, "the wake stream is closed")
    if media_type(meta.content_type) != "application/json":
        return Outcome(Code.CONTENT_TYPE_MISMATCH, "the wake stream is not a JSON stream")
    return None


def _wake(table: StreamTable, sub: r.Subscription, now: int) -> Outcome | None:
    """Appends the wake event if one is due; the append's outcome, or None if none was due."""
    if sub.type != "pull-wake" or sub.wake_stream is None or sub.woke_generation == sub.generation:
        return None
    if sub.holder is not None and now < sub.lease_until:
        return None
    due = pending(table, sub)
    if not due:
        return None
    streams = [
        {"path": path, "tail_offset": format_offset(tail), "acked_offset": acked_offset(acked), "has_pending": True}
        for path, (acked, tail) in sorted(due.items())
    ]
    event = {"subscription_id": sub.id, "generation": sub.generation, "streams": streams}
    body = json.dumps(event, separators=(",", ":")).encode()
    name = stream_name(sub, sub.wake_stream)
    outcome = stream_rules.append(table, Append(sub.bucket, name, "application/json", memoryview(body)), now)
    if outcome.code is Code.APPENDED:
        _save(table, msgspec.structs.replace(sub, woke_generation=sub.generation))
    return outcome


def pending(table: StreamTable, sub: r.Subscription) -> dict[str, tuple[int, int]]:
    """path -> (acked, tail) for each of the subscription's streams with data past its acknowledgement."""
    out: dict[str, tuple[int, int]] = {}
    for path in linked(table, sub):
        sid = table.names.get((sub.bucket, stream_name(sub, path)))
        if sid is None:
            continue
        tail, acked = table.streams[sid].tail, sub.acked.get(path, -1)
        if tail > max(acked, 0):
            out[path] = (acked, tail)
    return out


LAG_SCAN_RECORDS = 10_000  # records a lag count reads at most; past it the count is left out


def lag(table: StreamTable, sub: r.Subscription, path: str) -> tuple[int, int | None]:
    """(bytes, messages) a subscription has yet to acknowledge on one of its streams. Messages are
    counted from records on local disk (JSON ones by their messages), up to LAG_SCAN_RECORDS; None
    when the range is longer or partly in the object store only."""
    sid = table.names.get((sub.bucket, stream_name(sub, path)))
    if sid is None:
        return 0, 0
    meta = table.streams[sid]
    start = max(sub.acked.get(path, -1), meta.earliest, 0)
    if start >= meta.tail:
        return 0, 0
    if start < meta.evicted:
        return meta.tail - start, None
    messages = 0
    scan = table.kv.scan(r.DATA, r.data_key(sid, start), r.data_key(sid, meta.tail))
    for records, (_, value) in enumerate(scan, 1):
        if records > LAG_SCAN_RECORDS:
            return meta.tail - start, None
        messages += len(_JSON_LIST.decode(b"[" + bytes(r.record_payload(value)) + b"]")) if meta.json else 1
    return meta.tail - start, messages


_JSON_LIST = msgspec.json.Decoder(list[msgspec.Raw])
