"""The first messages of a JSON record, found one at a time (reader.json_prefix): what a fork at a
sub-offset keeps, on every node, without an object per message of the whole record."""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest

from app.state_machine.reader import json_prefix, split_json_record

MESSAGES = [b"0", b"-1.5e3", b'"a,b"', b'"\\",["', b"{}", b'{"a": [1, {"b": ","}]}', b"[ [ ] ]", b"null", b"true"]


def _record(rng: random.Random, count: int) -> bytes:
    blanks = [b"", b" ", b"\n\t ", b"  \r\n"]
    return b",".join(rng.choice(blanks) + rng.choice(MESSAGES) + rng.choice(blanks) for _ in range(count)).strip()


@pytest.mark.parametrize("seed", range(30))
def test_the_prefix_is_the_first_messages_of_a_split(seed: int) -> None:
    rng = random.Random(seed)
    record = _record(rng, rng.randrange(1, 12))
    messages = split_json_record(record)
    for count in range(len(messages) + 2):
        expected = b",".join(messages[:count]) if count <= len(messages) else None
        assert json_prefix(record, count) == expected, (record, count)
    json.loads(b"[" + (json_prefix(record, len(messages)) or b"") + b"]")


def test_a_prefix_of_a_huge_record_of_tiny_messages_holds_no_object_per_message() -> None:
    record = b",".join([b"0"] * (2 << 20))  # 4 MiB, 2 M messages
    tracemalloc.start()
    try:
        assert json_prefix(record, 3) == b"0,0,0"
        assert json_prefix(memoryview(record), 10_000) == b",".join([b"0"] * 10_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # the 10,000 messages kept; a split of the record would hold about 130 MB


def test_a_long_run_of_blanks_between_messages_is_skipped_in_one_step() -> None:
    record = b"1" + b" " * (8 << 20) + b",2"
    assert json_prefix(record, 2) == b"1,2"
