"""Subscription patterns: globs over stream paths, `*` within one path segment, `**` across segments.

Matching runs in every replica's apply and again at replay, so its cost must be bounded by the sizes
alone: O(len(pattern) x len(path)) at worst, with no backtracking (a regex `.*` per `**` can take
exponential time and stall the whole group). Patterns are checked with `validate_pattern` when a
subscription is put.
"""

from __future__ import annotations

import functools

MAX_PATTERN_LENGTH = 256  # characters
MAX_DOUBLE_STARS = 8

_STAR, _DOUBLE = "*", "**"


class PatternRejected(ValueError):
    """A pattern a subscription may not use; the message says why."""


def validate_pattern(pattern: str) -> None:
    if not pattern:
        raise PatternRejected("pattern is empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternRejected(f"pattern is longer than {MAX_PATTERN_LENGTH} characters")
    if any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in pattern):
        raise PatternRejected("pattern has a control character")
    if "***" in pattern:
        raise PatternRejected("pattern has `***`: use `*` (one segment) or `**` (any segments)")
    if pattern.count("**") > MAX_DOUBLE_STARS:
        raise PatternRejected(f"pattern has more than {MAX_DOUBLE_STARS} `**`")


def literal_prefix(pattern: str) -> str:
    """The text before the first `*`: every matching path starts with it."""
    return pattern.partition("*")[0]


def _tokens(pattern: str) -> list[str]:
    """Literals, `*` and `**`; a run of stars is one wildcard (`**` if it holds one, else `*`)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        j = i
        if pattern[i] == "*":
            while j < len(pattern) and pattern[j] == "*":
                j += 1
            out.append(_DOUBLE if pattern.startswith("**", i) else _STAR)
        else:
            j = pattern.find("*", i)
            j = len(pattern) if j < 0 else j
            out.append(pattern[i:j])
        i = j
    return out


class Glob:
    """One pattern, compiled: its literal ends checked first, then the part between them by a greedy
    scan (when its wildcards are all `**`) or a bit-parallel NFA, one pass over the path either way."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        tokens = _tokens(pattern)
        self.exact = "*" not in pattern
        self.prefix = tokens.pop(0) if tokens and tokens[0] not in (_STAR, _DOUBLE) else ""
        self.suffix = tokens.pop() if tokens and tokens[-1] not in (_STAR, _DOUBLE) else ""
        # Between the literal ends: starts and ends with a wildcard (empty for a pattern without one).
        self.greedy = _STAR not in tokens
        self.one_segment = tokens == [_STAR]
        self.literals = [t for t in tokens if t != _DOUBLE]
        # The NFA's states are positions in those tokens' elements (each literal character, `*`, `**`);
        # bit i set means the first i elements have matched the path so far.
        elements: list[str] = []
        for token in tokens:
            elements.extend([token] if token in (_STAR, _DOUBLE) else token)
        self.by_char: dict[str, int] = {}
        self.stars = self.doubles = 0
        for i, element in enumerate(elements):
            if element == _DOUBLE:
                self.doubles |= 1 << i
                self.stars |= 1 << i
            elif element == _STAR:
                self.stars |= 1 << i
            else:
                self.by_char[element] = self.by_char.get(element, 0) | 1 << i
        self.accept = 1 << len(elements)
        # Once the last element, a `**`, is reached, the rest of the path matches whatever it holds.
        self.done = self.accept >> 1 if elements and elements[-1] == _DOUBLE else 0

    # Equal by pattern, not identity: a subscription's saved scope is compared with the one it had,
    # and compile_glob's cache may hand out another object for the same pattern.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Glob) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def matches(self, path: str) -> bool:
        if self.exact:
            return path == self.pattern
        start, end = len(self.prefix), len(path) - len(self.suffix)
        if end < start or not path.startswith(self.prefix) or not path.endswith(self.suffix):
            return False
        if self.greedy:
            return self._scan(path, start, end)
        if self.one_segment:
            return path.find("/", start, end) < 0
        return self._run(path, start, end)

    def _scan(self, path: str, start: int, end: int) -> bool:
        """Only `**` between the literals: placing each literal at its earliest place never loses a match."""
        at = start
        for literal in self.literals:
            found = path.find(literal, at, end)
            if found < 0:
                return False
            at = found + len(literal)
        return True

    def _run(self, path: str, start: int, end: int) -> bool:
        """Steps every live state at once per character: len(path) steps of a few len(pattern)-bit operations."""
        by_char, stars, doubles, done = self.by_char, self.stars, self.doubles, self.done
        live = 1 | (1 & stars) << 1  # the first element is a wildcard, which may match nothing
        for ch in path[start:end]:
            live = (live & by_char.get(ch, 0)) << 1 | live & (doubles if ch == "/" else stars)
            if not live:
                return False
            live |= (live & stars) << 1  # a wildcard may be skipped; no two are adjacent, so one pass
            if live & done:
                return True
        return bool(live & self.accept)


@functools.lru_cache(maxsize=4096)
def compile_glob(pattern: str) -> Glob:
    return Glob(pattern)


def matches(pattern: str, path: str) -> bool:
    """Whether the whole of `path` matches `pattern`."""
    return compile_glob(pattern).matches(path)
