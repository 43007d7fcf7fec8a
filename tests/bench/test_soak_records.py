"""The soak's bookkeeping: records parse back out of a stream, and the ledger tells lost from duplicated."""

from __future__ import annotations

import random
from collections import Counter

from app.bench.soak_records import Ledger, binary_record, json_body, json_keys, json_messages, parse_binary, parse_json


def test_binary_records_parse_back_in_order_whatever_their_bytes() -> None:
    rng = random.Random(7)
    ids = [f"{i:012d}" for i in range(1, 50)]
    data = b"".join(binary_record(i, rng.randint(0, 3000), rng) for i in ids)
    assert parse_binary(data) == (ids, 0)


def test_a_cut_last_record_is_junk_unless_the_read_may_end_mid_record() -> None:
    rng = random.Random(1)
    data = binary_record("000000000001", 100, rng) + binary_record("000000000002", 100, rng)
    assert parse_binary(data[:-10]) == (["000000000001"], 115)
    assert parse_binary(data[:-10], partial_tail=True) == (["000000000001", "000000000002"], 0)
    assert parse_binary(data[:130], partial_tail=True) == (["000000000001"], 0)  # cut inside a header


def test_bytes_that_are_not_records_count_as_junk() -> None:
    rng = random.Random(2)
    data = b"garbage" + binary_record("000000000003", 10, rng)
    assert parse_binary(data) == (["000000000003"], 7)


def test_json_appends_are_one_key_per_message() -> None:
    body = json_body(json_messages("000000000004", 3, 5), as_array=True)
    assert parse_json(b"[" + body[1:-1] + b',{"other":1}]') == (json_keys("000000000004", 3), 1)
    single = json_body(json_messages("000000000005", 1, 5), as_array=False)
    assert parse_json(b"[" + single + b"]") == (["000000000005/0"], 0)


def test_ledger_finds_lost_duplicated_torn_and_rejected_but_stored() -> None:
    ledger = Ledger()
    for ident, outcome in [("ok", "acked"), ("lost", "acked"), ("dup", "acked"), ("bad", "rejected"), ("?", "unknown")]:
        ledger.add(ident, "s", [ident]).outcome = outcome
    ledger.add("torn", "j", ["torn/0", "torn/1"]).outcome = "acked"
    stored = {"s": Counter({"ok": 1, "dup": 2, "bad": 1, "?": 1, "stranger": 1}), "j": Counter({"torn/0": 1})}
    v = ledger.verify(stored, {"s": 0, "j": 0})
    assert (v.acknowledged, v.lost, v.duplicated, v.torn) == (4, 2, 1, 1)  # the torn append is lost too
    assert (v.rejected_but_stored, v.unknown, v.unknown_stored, v.foreign) == (1, 1, 1, 1)
    assert not v.ok()


def test_ledger_accepts_a_clean_run() -> None:
    ledger = Ledger()
    ledger.add("a", "s", ["a"]).outcome = "acked"
    ledger.add("b", "s", ["b"]).outcome = "rejected"
    ledger.add("c", "s", ["c"])  # unanswered, never stored: fine
    v = ledger.verify({"s": Counter({"a": 1})}, {"s": 0})
    assert v.ok() and v.acknowledged == 1 and v.lost == 0
