"""Shared by the state machine tests."""

from __future__ import annotations

from app.state_machine import records as r
from app.storage.kv import KV

B = "b"  # the user bucket the tests create
T0 = 1_700_000_000_000  # a fixed start time, ms


def dump(kv: KV) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key/value of every column family, in key order."""
    return {cf: [(bytes(k), bytes(v)) for k, v in kv.scan(cf, b"")] for cf in r.COLUMN_FAMILIES}
