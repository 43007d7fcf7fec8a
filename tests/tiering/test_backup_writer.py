"""A state backup encoded in a child process: the same bytes as encoded here, and a clear error when
the child cannot write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.state_machine import backup
from app.state_machine import records as r
from app.storage.state_store import StateStore
from app.tiering import backup_writer
from tests.state_machine.tiering_helpers import TH


def _checkpoint(tmp_path: Path) -> Path:
    state_store = StateStore(tmp_path / "node", r.COLUMN_FAMILIES)
    h = TH(kv=state_store.open())  # type: ignore[arg-type]
    for i in range(50):
        h.create(f"s{i}", body=b"%d" % i * 100)
    path = state_store.checkpoint(h.kv, "backup")  # type: ignore[arg-type]
    h.kv.close()
    return path


def test_the_child_writes_the_same_backup_as_this_process(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    here = backup_writer.encode(checkpoint, tmp_path / "here.state", 1234, 2)
    there = backup_writer.encode_in_child(checkpoint, tmp_path / "there.state", 1234, 2)
    assert there == here and here[0].streams == 50
    assert (tmp_path / "there.state").read_bytes() == (tmp_path / "here.state").read_bytes()
    header, pairs = backup.decode((tmp_path / "there.state").read_bytes(), here[1])
    assert header == here[0] and sum(len(frame) for frame in pairs) == header.pairs


def test_a_child_that_cannot_write_the_backup_says_why(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    with pytest.raises(backup_writer.WriterFailed, match="exited with 1: .*No such file or directory"):
        backup_writer.encode_in_child(checkpoint, tmp_path / "missing" / "out.state", 1, 1)
    not_a_store = tmp_path / "file"
    not_a_store.write_bytes(b"not a checkpoint")
    with pytest.raises(backup_writer.WriterFailed, match="exited with 1"):
        backup_writer.encode_in_child(not_a_store, tmp_path / "out.state", 1, 1)
