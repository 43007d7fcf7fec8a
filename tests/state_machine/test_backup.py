"""State backups: every pair of the state but the records sealed segments hold, read back exactly."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.commands import Producer
from app.state_machine.export import load
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import B, dump
from tests.state_machine.tiering_helpers import TH


def _state() -> TH:
    h = TH()
    h.create("sealed")
    for i in range(4):
        h.append("sealed", b"record-%d;" % i, producer=Producer("p", 0, i))
    h.tier("sealed")  # everything so far is in a segment
    h.append("sealed", b"after")  # and this is not
    h.create("open", body=b"only local")
    return h


def _restore(data: bytes) -> MemoryKV:
    kv = MemoryKV(r.COLUMN_FAMILIES)
    header, frames = backup.decode(data, backup.parse_key(backup.backup_key(1, data))[1])  # type: ignore[index]
    for frame in frames:
        load(kv, frame)
    assert header.format == backup.FORMAT
    return kv


def test_a_backup_holds_the_state_but_not_the_records_segments_hold() -> None:
    h = _state()
    header, data = backup.encode(h.kv, created_at=123, node=7)
    assert (header.index, header.created_at, header.node, header.streams) == (h.sm.applied_index, 123, 7, 2)
    sealed = h.m("sealed")
    assert header.skipped_bytes >= sealed.tiered  # the four records' bytes, with their headers
    restored = dump(_restore(data))
    original = dump(h.kv)
    for cf in r.COLUMN_FAMILIES:
        if cf == r.DATA:
            kept = [
                (k, v) for k, v in original[cf] if r.data_sid_pos(k)[0] != sealed.sid or r.data_pos(k) >= sealed.tiered
            ]
            assert restored[cf] == kept
        elif cf == r.SM_META:
            assert restored[cf] == [(k, v) for k, v in original[cf] if k != r.SYNCED_KEY]
        else:
            assert restored[cf] == original[cf], cf
    machine = StateMachine(_restore(data))
    meta = machine.lookup(B, "sealed")
    assert meta is not None and (meta.tail, meta.tiered) == (sealed.tail, sealed.tiered)
    assert machine.applied_index == h.sm.applied_index
    assert r.decode_producer(machine.kv.get(r.PRODUCERS, r.producer_key(meta.sid, "p"))).seq == 3  # type: ignore[arg-type]


def test_the_key_names_the_index_and_the_digest_and_nothing_else_parses() -> None:
    data = backup.encode(_state().kv, 1, 1)[1]
    key = backup.backup_key(42, data)
    assert key.startswith(backup.KEY_PREFIX) and backup.parse_key(key) is not None
    assert backup.parse_key(key)[0] == 42  # type: ignore[index]
    for other in ("b/s/manifest.json", ".rill/state/42.state", key + ".tmp", key.replace(".state", ".json")):
        assert backup.parse_key(other) is None
    digest = "0" * 64
    assert backup.parse_key(f"{backup.KEY_PREFIX}{backup.MAX_INDEX:020d}-{digest}.state") is not None
    for index in ("9" * 20, "\u0661" * 20, f"{backup.MAX_INDEX + 1:020d}"):  # past any log; Arabic-Indic digits
        assert backup.parse_key(f"{backup.KEY_PREFIX}{index}-{digest}.state") is None


def test_a_wrong_digest_a_foreign_object_or_a_corrupt_body_is_refused() -> None:
    data = backup.encode(_state().kv, 1, 1)[1]
    with pytest.raises(backup.BackupError, match="digest"):
        backup.decode(data, "0" * 64)
    with pytest.raises(backup.BackupError, match="not a Rill state backup"):
        backup.decode(b"PAR1" + data)
    header_end = len(backup.MAGIC) + 4 + struct.unpack_from(">I", data, len(backup.MAGIC))[0]
    with pytest.raises(backup.BackupError, match="corrupt"):
        list(backup.decode(data[:header_end] + b"\x00garbage")[1])


def test_a_newer_format_is_refused_and_an_older_family_list_is_renumbered() -> None:
    h = _state()
    header, data = backup.encode(h.kv, 1, 1)
    head_at = len(backup.MAGIC) + 4
    length = struct.unpack_from(">I", data, len(backup.MAGIC))[0]
    body = data[head_at + length :]

    def with_header(**changes: object) -> bytes:
        head = json.dumps(dataclasses.asdict(dataclasses.replace(header, **changes))).encode()  # type: ignore[arg-type]
        return backup.MAGIC + struct.pack(">I", len(head)) + head + body

    with pytest.raises(backup.BackupError, match="newer"):
        backup.decode(with_header(format=backup.FORMAT + 1))
    with pytest.raises(backup.BackupError, match="column family"):
        list(backup.decode(with_header(column_families=["default", "no_such_family"]))[1])
    # Families are named, not numbered: a backup listing them in another order still loads each pair right.
    swapped = list(r.COLUMN_FAMILIES)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    frames = list(backup.decode(with_header(column_families=swapped))[1])
    positions = {p for frame in frames for p, _, _ in frame}
    original = {p for frame in backup.decode(data)[1] for p, _, _ in frame}
    assert positions == {({1: 2, 2: 1}.get(p, p)) for p in original}
