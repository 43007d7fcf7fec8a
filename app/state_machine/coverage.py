"""Which subscriptions cover which streams, kept as streams and subscriptions come and go.

Derived from the replicated state (built at load, updated at apply), so every replica holds the
same index. An append finds the subscriptions it wakes, and an ack checks its stream, without a
scan of all streams: a pattern is matched once per stream that could match it, when either of
them is created. A stream that is some subscription's wake stream belongs to no subscription, so
no wake can wake anything (a pattern covering its own wake stream, or two subscriptions covering
each other's, would otherwise loop forever).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.state_machine import records as r
from app.state_machine.glob import Glob, compile_glob, literal_prefix

_NONE: frozenset[bytes] = frozenset()
Name = tuple[str, str]  # (bucket, stream name)
StreamsUnder = Callable[[str, str], Iterable[r.StreamMeta]]  # (bucket, name prefix) -> its streams


@dataclass(frozen=True)
class Scope:
    """What of a subscription decides its streams."""

    bucket: str
    prefix: str  # its root and a slash, or "" for a whole bucket
    glob: Glob | None
    explicit: frozenset[str]  # full stream names
    wake: str | None  # the full name of its wake stream (pull-wake)
    scan_prefix: str  # every stream the pattern can match starts with this

    @classmethod
    def of(cls, sub: r.Subscription) -> Scope:
        prefix = f"{sub.root}/" if sub.root else ""
        glob = compile_glob(sub.pattern) if sub.pattern is not None else None
        wake = prefix + sub.wake_stream if sub.wake_stream is not None else None
        scan = prefix + literal_prefix(sub.pattern) if sub.pattern is not None else prefix
        return cls(sub.bucket, prefix, glob, frozenset(prefix + p for p in sub.explicit), wake, scan)

    def matches(self, bucket: str, name: str) -> bool:
        if self.glob is None or bucket != self.bucket or not name.startswith(self.scan_prefix):
            return False
        return self.glob.matches(name[len(self.prefix) :])


class Coverage:
    def __init__(self) -> None:
        self.scopes: dict[bytes, Scope] = {}
        self._patterns: dict[str, set[bytes]] = {}  # bucket -> its subscriptions with a pattern
        self._matched: dict[bytes, set[int]] = {}  # subscription -> streams its pattern matches
        self._by_stream: dict[int, set[bytes]] = {}  # stream -> subscriptions whose pattern matches it
        self._by_name: dict[Name, set[bytes]] = {}  # explicit links, by name: the stream may not exist
        self._wakes: Counter[Name] = Counter()
        # Pull-wake subscriptions an append may wake: not held, and not yet woken for their
        # generation. An append looks only at these, so one with many quiet subscriptions stays cheap.
        self._armed: set[bytes] = set()
        # Subscriptions to look at again: their streams grew, or they changed. Drained by the
        # leader's deliveries; elsewhere it holds each subscription at most once.
        self.woken: set[bytes] = set()

    def put(self, key: bytes, sub: r.Subscription, streams_under: StreamsUnder) -> None:
        """Sets a subscription's scope, matching its pattern against the streams it could cover."""
        scope = Scope.of(sub)
        if self.scopes.get(key) != scope:
            self._set_scope(key, scope, streams_under)
        if sub.type == "pull-wake" and sub.holder is None and sub.woke_generation != sub.generation:
            self._armed.add(key)
        else:
            self._armed.discard(key)

    def _set_scope(self, key: bytes, scope: Scope, streams_under: StreamsUnder) -> None:
        self.remove(key)
        self.scopes[key] = scope
        for name in scope.explicit:
            self._by_name.setdefault((scope.bucket, name), set()).add(key)
        if scope.wake is not None:
            self._wakes[(scope.bucket, scope.wake)] += 1
        if scope.glob is not None:
            self._patterns.setdefault(scope.bucket, set()).add(key)
            matched = self._matched[key] = set()
            for meta in streams_under(scope.bucket, scope.scan_prefix):
                if scope.matches(meta.bucket, meta.name):
                    matched.add(meta.sid)
                    self._by_stream.setdefault(meta.sid, set()).add(key)

    def remove(self, key: bytes) -> None:
        self._armed.discard(key)
        scope = self.scopes.pop(key, None)
        if scope is None:
            return
        for name in scope.explicit:
            _discard(self._by_name, (scope.bucket, name), key)
        if scope.wake is not None:
            self._wakes[(scope.bucket, scope.wake)] -= 1
            if self._wakes[(scope.bucket, scope.wake)] <= 0:
                del self._wakes[(scope.bucket, scope.wake)]
        if scope.glob is not None:
            _discard(self._patterns, scope.bucket, key)
            for sid in self._matched.pop(key, ()):
                _discard(self._by_stream, sid, key)
        self.woken.discard(key)

    def patterns_in(self, bucket: str) -> int:
        return len(self._patterns.get(bucket, ()))

    def stream_added(self, meta: r.StreamMeta) -> None:
        for key in self._patterns.get(meta.bucket, ()):
            if self.scopes[key].matches(meta.bucket, meta.name):
                self._matched[key].add(meta.sid)
                self._by_stream.setdefault(meta.sid, set()).add(key)

    def stream_dropped(self, meta: r.StreamMeta) -> None:
        for key in self._by_stream.pop(meta.sid, ()):
            self._matched[key].discard(meta.sid)

    def is_wake_stream(self, bucket: str, name: str) -> bool:
        return (bucket, name) in self._wakes

    def waking(self, meta: r.StreamMeta) -> list[bytes]:
        """The armed pull-wake subscriptions the stream belongs to, in key order (a held one is woken
        by the leader's `Wake` once its lease runs out)."""
        armed = self._armed
        if not armed or (meta.bucket, meta.name) in self._wakes:
            return []
        found = armed & self._by_stream.get(meta.sid, _NONE)  # a set intersection walks the smaller set
        named = self._by_name.get((meta.bucket, meta.name))
        if named:
            found |= armed & named
        return sorted(key for key in found if self.scopes[key].wake is not None)

    def covering(self, meta: r.StreamMeta) -> set[bytes]:
        """The subscriptions the stream belongs to."""
        if (meta.bucket, meta.name) in self._wakes:
            return set()
        return self._by_stream.get(meta.sid, set()) | self._by_name.get((meta.bucket, meta.name), set())

    def matched(self, key: bytes) -> set[int]:
        return self._matched.get(key, set())

    def wake(self, streams: Iterable[r.StreamMeta]) -> None:
        for meta in streams:
            self.woken |= self.covering(meta)

    def take_woken(self) -> set[bytes]:
        woken, self.woken = self.woken, set()
        return woken


def _discard(index: dict[Any, set[bytes]], key: object, value: bytes) -> None:
    values = index.get(key)
    if values is not None:
        values.discard(value)
        if not values:
            del index[key]
