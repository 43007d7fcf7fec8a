from __future__ import annotations

import functools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.state_machine.glob import (
    MAX_DOUBLE_STARS,
    MAX_PATTERN_LENGTH,
    Glob,
    PatternRejected,
    compile_glob,
    literal_prefix,
    matches,
    validate_pattern,
)


def _reference_tokens(pattern: str) -> list[str]:
    """The tokenizer subscriptions.py had: `**` first, then `*`, then a literal up to the next star."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append("**")
            i += 2
        elif pattern[i] == "*":
            out.append("*")
            i += 1
        else:
            j = pattern.find("*", i)
            j = len(pattern) if j < 0 else j
            out.append(pattern[i:j])
            i = j
    return out


def reference(pattern: str, path: str) -> bool:
    """The obvious recursive definition, memoized so it stays quick on short inputs."""
    tokens = _reference_tokens(pattern)

    @functools.cache
    def at(t: int, p: int) -> bool:
        if t == len(tokens):
            return p == len(path)
        token = tokens[t]
        if token == "**":
            return any(at(t + 1, q) for q in range(p, len(path) + 1))
        if token == "*":
            stop = path.find("/", p)
            return any(at(t + 1, q) for q in range(p, (len(path) if stop < 0 else stop) + 1))
        return path.startswith(token, p) and at(t + 1, p + len(token))

    return at(0, 0)


def legacy(pattern: str, path: str) -> bool:
    """The `re` translation subscriptions.py used (safe only on short inputs)."""
    parts = (".*" if t == "**" else "[^/]*" if t == "*" else re.escape(t) for t in _reference_tokens(pattern))
    return re.fullmatch("".join(parts), path) is not None


@settings(max_examples=600, deadline=None)
@given(st.text("ab/*", max_size=10), st.text("ab/", max_size=12))
def test_matches_the_reference(pattern: str, path: str) -> None:
    expected = reference(pattern, path)
    assert legacy(pattern, path) == expected
    assert Glob(pattern).matches(path) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "/", "ab", "*", "**"]), max_size=8), st.data())
def test_matches_the_reference_on_paths_made_from_the_pattern(tokens: list[str], data: st.DataObject) -> None:
    """Random paths rarely match; these are built to (each star filled in), then perhaps changed in one place."""
    pattern = "".join(tokens)
    fill = {"*": st.text("ab", max_size=4), "**": st.text("ab/", max_size=6)}
    path = "".join(data.draw(fill[t]) if t in fill else t for t in _reference_tokens(pattern))
    if path and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(path) - 1))
        path = path[:at] + data.draw(st.sampled_from(["", "a", "b", "/", "//"])) + path[at + 1 :]
    assert Glob(pattern).matches(path) == reference(pattern, path)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("events/*", "events/x", True),
        ("events/*", "events/", True),
        ("events/*", "events/x/y", False),
        ("events/*", "event/x", False),
        ("events/**", "events/x/y", True),
        ("events/**", "events/", True),
        ("events/**", "events", False),
        ("**", "", True),
        ("**", "a/b/c", True),
        ("*", "abc", True),
        ("*", "a/b", False),
        ("a*b", "ab", True),
        ("a*b", "axxb", True),
        ("a*b", "ax/b", False),
        ("a**b", "ax/b", True),
        ("a*b", "aba", False),
        ("*/*", "a/b", True),
        ("*/*", "a/b/c", False),
        ("**/x", "x", False),
        ("**/x", "/x", True),
        ("**/x", "a/b/x", True),
        ("a/**/b", "a/b", False),
        ("a/**/b", "a//b", True),
        ("a/**/b", "a/x/y/b", True),
        ("*.log", "app.log", True),
        ("*.log", "dir/app.log", False),
        ("**.log", "dir/app.log", True),
        ("ab*ba", "aba", False),
        ("ab**ba", "abba", True),
        ("exact", "exact", True),
        ("exact", "exactly", False),
        ("", "", True),
        ("", "a", False),
        ("a?[b]", "a?[b]", True),  # no classes: every character other than `*` is literal
        ("a?", "ab", False),
    ],
)
def test_table(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected
    assert reference(pattern, path) is expected


def test_runs_of_stars_mean_what_the_regex_did() -> None:
    for pattern in ("a***b", "a****b", "a*****b"):
        assert matches(pattern, "a/x/b") and matches(pattern, "ab")


NAME = "a" * 1024
SEGMENTS = "/".join(["a"] * 512)  # 1023 characters


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("**a" * 8 + "**b", NAME, False),
        ("**a" * 8 + "**b", SEGMENTS, False),
        ("**a" * 8 + "**", SEGMENTS, True),
        ("**/" * 8 + "a", SEGMENTS, True),
        ("**/" * 8 + "b", SEGMENTS, False),
        ("*a" * 128, NAME, True),
        ("*a" * 126 + "*b*", NAME, False),
        ("*a" * 128, SEGMENTS, False),
        ("*a/" * 84 + "**", SEGMENTS, True),
        ("**/*/" * 8 + "b*", SEGMENTS, False),
        ("**a*/" * 8 + "*b*", SEGMENTS, False),
        ("**" + "a*" * 126 + "b*", NAME, False),
        ("**" + "a*" * 126 + "b*", NAME + "b", True),
    ],
)
def test_adversarial_patterns_are_answered(pattern: str, name: str, expected: bool) -> None:
    """~1 KiB names: each is one pass over the name; a backtracking matcher would not come back."""
    assert matches(pattern, name) is expected


def test_over_long_unvalidated_patterns_stay_bounded() -> None:
    """Stored patterns are validated, but the matcher does not rely on it."""
    assert not matches("**a" * 200 + "**b", NAME)
    assert not matches("*a" * 1000 + "*b*", NAME)
    assert matches("*a" * 1000 + "*", NAME)


def test_compile_is_cached() -> None:
    assert compile_glob("events/*") is compile_glob("events/*")


def test_literal_prefix() -> None:
    assert literal_prefix("events/*") == "events/"
    assert literal_prefix("a/b/**/c") == "a/b/"
    assert literal_prefix("**") == ""
    assert literal_prefix("exact") == "exact"


@pytest.mark.parametrize("pattern", ["events/*", "**", "*", "a/**/b/*.log", "**a" * MAX_DOUBLE_STARS])
def test_validate_accepts(pattern: str) -> None:
    validate_pattern(pattern)
    validate_pattern("x" * MAX_PATTERN_LENGTH)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "empty"),
        ("x" * (MAX_PATTERN_LENGTH + 1), "longer than"),
        ("**/" * (MAX_DOUBLE_STARS + 1), "more than"),
        ("**a" * 8 + "**b", "more than"),  # the pattern that stalled the replicas has nine
        ("a/***", "***"),
        ("a\nb", "control character"),
        ("a\x00", "control character"),
        ("a\x7f", "control character"),
        ("a\x85", "control character"),
    ],
)
def test_validate_rejects(pattern: str, message: str) -> None:
    with pytest.raises(PatternRejected, match=re.escape(message)):
        validate_pattern(pattern)
