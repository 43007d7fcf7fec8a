"""A state backup encoded in a child process: the same bytes as encoded here, and a clear error when
the child cannot write it, and no child left working once its server is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def _writers_of(out: Path) -> list[int]:
    """The pids of backup writers writing `out`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"app.tiering.backup_writer" in cmdline and str(out).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def test_a_child_whose_server_was_killed_exits_instead_of_finishing(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    out = tmp_path / "blocked.state"
    os.mkfifo(out)  # opening it to write blocks until a reader comes: the child stays mid-backup
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from app.tiering import backup_writer as w; "
            "w.encode_in_child(*map(__import__('pathlib').Path, sys.argv[1:3]), 1, 1)",
            str(checkpoint),
            str(out),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 30
        while not (children := _writers_of(out)):
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)  # the child has reached its blocking open, or soon will: it must not matter
        assert _writers_of(out) == children
        server.kill()
        server.wait()
        deadline = time.monotonic() + 10
        while _writers_of(out):
            assert time.monotonic() < deadline, "the backup writer outlived the server"
            time.sleep(0.05)
    finally:
        server.kill()
        for pid in _writers_of(out):
            os.kill(pid, signal.SIGKILL)


def test_the_watch_ends_the_process_at_end_of_file_only() -> None:
    alive, held = os.pipe()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from app.tiering import backup_writer as w; "
            "w.exit_with_parent(int(sys.argv[1])); time.sleep(30)",
            str(alive),
        ],
        pass_fds=(alive,),
        cwd=Path(__file__).resolve().parents[2],
    )
    os.close(alive)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)  # the write end is open: the child keeps working
        os.write(held, b"x")  # a stray byte is not the end
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
        os.close(held)
        held = -1
        assert child.wait(timeout=10) == backup_writer.ORPHANED_EXIT
    finally:
        if held >= 0:
            os.close(held)
        child.kill()
