"""Rules for subscriptions: their configuration, their streams, acknowledged positions, and the
lease that one holder at a time takes under a new generation.

A subscription's streams are its explicit ones and, with a pattern, every stream of its scope whose
path (below `root`) matches it: `*` within one path segment, `**` across segments. Leases are
decided with the entry's time (the proposing leader's clock), never a clock read here.
Acknowledged positions only move forward.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

import msgspec

from app.state_machine import records as r
from app.state_machine.commands import (
    Ack,
    Claim,
    Code,
    DeleteSubscription,
    LinkStreams,
    Outcome,
    PutSubscription,
)
from app.state_machine.table import StreamTable

_DELETED = b""  # a staged deletion: no stored subscription is empty
_CONFIG = ("type", "pattern", "webhook_url", "wake_stream", "lease_ttl_ms", "description")


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = (".*" if part == "**" else "[^/]*" if part == "*" else re.escape(part) for part in _tokens(pattern))
    return re.compile("".join(parts))


def _tokens(pattern: str) -> Iterator[str]:
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            yield "**"
            i += 2
        elif pattern[i] == "*":
            yield "*"
            i += 1
        else:
            j = i
            while j < len(pattern) and pattern[j] != "*":
                j += 1
            yield pattern[i:j]
            i = j


def matches(pattern: str, path: str) -> bool:
    return _glob(pattern).fullmatch(path) is not None


def find(table: StreamTable, bucket: str, root: str, sub_id: str) -> r.Subscription | None:
    key = (r.SUBSCRIPTIONS, r.subscription_key(bucket, root, sub_id))
    if table.staged.get(key) == _DELETED:  # deleted earlier in the batch being applied
        return None
    raw = table.get(*key)
    return r.decode_subscription(raw) if raw else None


def stream_name(sub: r.Subscription, path: str) -> str:
    return f"{sub.root}/{path}" if sub.root else path


def linked(table: StreamTable, sub: r.Subscription) -> dict[str, str]:
    """The subscription's streams that exist now: path -> "explicit" or "glob"."""
    found: dict[str, str] = {}
    prefix = f"{sub.root}/" if sub.root else ""
    if sub.pattern is not None:
        for (bucket, name), sid in table.names.items():
            if bucket == sub.bucket and name.startswith(prefix) and not table.streams[sid].deleted:
                path = name[len(prefix) :]
                if matches(sub.pattern, path):
                    found[path] = "glob"
    for path in sub.explicit:
        found[path] = "explicit"
    return found


def _save(table: StreamTable, sub: r.Subscription) -> Outcome:
    table.stage(r.SUBSCRIPTIONS, r.subscription_key(sub.bucket, sub.root, sub.id), r.encode(sub))
    return Outcome(Code.OK, subscription=sub)


def _missing() -> Outcome:
    return Outcome(Code.SUBSCRIPTION_NOT_FOUND, "no such subscription")


def put_subscription(table: StreamTable, cmd: PutSubscription, now: int) -> Outcome:
    if cmd.bucket not in table.buckets:
        return Outcome(Code.BUCKET_NOT_FOUND, "no such bucket")
    found = find(table, cmd.bucket, cmd.root, cmd.id)
    wanted = r.Subscription(
        bucket=cmd.bucket, root=cmd.root, id=cmd.id, type=cmd.kind, pattern=cmd.pattern,
        explicit=sorted(set(cmd.streams)), webhook_url=cmd.webhook_url, wake_stream=cmd.wake_stream,
        lease_ttl_ms=cmd.lease_ttl_ms, description=cmd.description, base_url=cmd.base_url, created_at=now,
    )  # fmt: skip
    if found is not None:
        same = all(getattr(found, f) == getattr(wanted, f) for f in _CONFIG) and found.explicit == wanted.explicit
        if not same:
            message = "the subscription exists with another configuration"
            return Outcome(Code.CONFIG_MISMATCH, message, subscription=found)
        return Outcome(Code.EXISTS, subscription=found)
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
        return _missing()
    delete_subscription_key(table, r.subscription_key(cmd.bucket, cmd.root, cmd.id))
    return Outcome(Code.DELETED)


def delete_subscription_key(table: StreamTable, key: bytes) -> None:
    table.batch.delete(r.SUBSCRIPTIONS, key)
    table.staged[(r.SUBSCRIPTIONS, key)] = _DELETED


def link_streams(table: StreamTable, cmd: LinkStreams, now: int) -> Outcome:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return _missing()
    explicit = (set(sub.explicit) | set(cmd.add)) - set(cmd.remove)
    acked = {path: pos for path, pos in sub.acked.items() if path not in cmd.remove or path in cmd.add}
    new = [path for path in cmd.add if path not in acked and path not in linked(table, sub)]
    acked.update(_tails(table, sub, new))
    return _save(table, msgspec.structs.replace(sub, explicit=sorted(explicit), acked=acked))


def claim(table: StreamTable, cmd: Claim, now: int) -> Outcome:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return _missing()
    if sub.holder is not None and sub.holder != cmd.holder and now < sub.lease_until:
        return Outcome(Code.ALREADY_CLAIMED, f"held by {sub.holder}", subscription=sub)
    taken = msgspec.structs.replace(
        sub, generation=sub.generation + 1, wake_id=cmd.wake_id, holder=cmd.holder,
        lease_until=now + sub.lease_ttl_ms, token_sha256=cmd.token_sha256,
    )  # fmt: skip
    return _save(table, taken)


def ack(table: StreamTable, cmd: Ack, now: int) -> Outcome:
    sub = find(table, cmd.bucket, cmd.root, cmd.id)
    if sub is None:
        return _missing()
    current = (sub.generation, sub.wake_id, sub.token_sha256)
    if sub.holder is None or current != (cmd.generation, cmd.wake_id, cmd.token_sha256) or now >= sub.lease_until:
        return Outcome(Code.FENCED, "this wake is no longer the subscription's current one", subscription=sub)
    streams = linked(table, sub)
    acked = dict(sub.acked)
    for path, pos in cmd.acks:
        sid = table.names.get((sub.bucket, stream_name(sub, path)))
        if path not in streams or sid is None:
            return Outcome(Code.NOT_FOUND, f"{path!r} is not one of the subscription's streams", subscription=sub)
        if pos > table.streams[sid].tail:
            return Outcome(Code.BEYOND_TAIL, f"{path!r} has no position {pos} yet", subscription=sub)
        acked[path] = max(pos, acked.get(path, -1))  # never backwards
    if cmd.done:
        return _save(table, msgspec.structs.replace(sub, acked=acked, holder=None, lease_until=0, token_sha256=None))
    return _save(table, msgspec.structs.replace(sub, acked=acked, lease_until=now + sub.lease_ttl_ms))


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
