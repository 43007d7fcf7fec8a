"""Records keep the producer that appended them (record format v2), and v1 records still read."""

from __future__ import annotations

import struct

from app.state_machine import records as r
from app.state_machine.commands import Code
from app.storage.kv import Batch
from tests.state_machine.helpers import T0, TEXT, P
from tests.state_machine.tiering_helpers import TH


def test_records_keep_the_producer_that_appended_them() -> None:
    h = TH()
    h.create("s", TEXT, body=b"init")
    h.append("s", b"plain")
    h.append("s", b"prod", producer=P(3, 0, "prod-ü"))
    h.append("s", b"next", producer=P(3, 1, "prod-ü"))
    h.fork("f", "s", offset=4, sub=2, ct=TEXT)  # a prefix record copied by the fork
    sid = h.m("s").sid
    rows = {r.data_pos(k): v for k, v in h.kv.scan(r.DATA, r.data_key(sid, 0), r.data_key(sid + 1, 0))}
    assert [bytes(r.record_payload(v)) for v in rows.values()] == [b"init", b"plain", b"prod", b"next"]
    assert [r.record_producer(v) for v in rows.values()] == [None, None, ("prod-ü", 3, 0), ("prod-ü", 3, 1)]
    assert all(r.record_time(v) == T0 for v in rows.values())
    fork_rows = list(h.kv.scan(r.DATA, r.data_key(h.m("f").sid, 0), r.data_key(h.m("f").sid + 1, 0)))
    assert [(bytes(r.record_payload(v)), r.record_producer(v)) for _, v in fork_rows] == [(b"pl", None)]
    assert h.text("s") == b"initplainprodnext"


def test_producer_record_encoding_round_trip() -> None:
    for producer in [("p", 0, 0), ("", 2**63 - 1, 2**63 - 1), ("x" * 300, 7, 9), ("日本", 1, 2)]:
        raw = r.encode_record(T0 + 1, b"payload", producer)
        assert raw[0] == 2
        assert r.record_producer(raw) == producer
        assert bytes(r.record_payload(raw)) == b"payload"
        assert r.record_time(raw) == T0 + 1
    raw = r.encode_record(T0, b"")
    assert r.record_producer(raw) is None and bytes(r.record_payload(raw)) == b""


def test_v1_records_still_decode_and_read() -> None:
    v1 = struct.pack(">BQ", 1, T0 + 7) + b"old bytes"
    assert r.encode_record(T0 + 7, b"old bytes") == v1
    assert bytes(r.record_payload(v1)) == b"old bytes"
    assert r.record_producer(v1) is None
    assert r.record_time(v1) == T0 + 7
    # A store written before the producer was kept: v1 records beside v2 ones.
    h = TH()
    h.create("s", TEXT)
    h.append("s", b"new", producer=P(0, 0))
    batch = Batch()
    batch.put(r.DATA, r.data_key(h.m("s").sid, 0), struct.pack(">BQ", 1, T0) + b"new")
    h.kv.write(batch)
    old = TH(h.kv, bucket=None)  # restarted over the old-format record
    raw = h.kv.get(r.DATA, r.data_key(h.m("s").sid, 0))
    assert raw is not None and r.record_producer(raw) is None
    assert old.text("s") == b"new"
    old.append("s", b"+", ct=TEXT)
    assert old.text("s") == b"new+"
    assert old.tier("s").code is Code.OK
    assert old.evict("s").code is Code.OK
    assert old.cold_text("s") == b"new+"
