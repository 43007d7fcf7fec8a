"""Encodes a state backup from a RocksDB checkpoint into a file, in a process of its own.

On a thread of the server, a backup held the GIL for most of its work, and the event loop waited
up to a switch interval (5 ms) for it each time it woke, so every request in flight slowed down:
opening the checkpoint alone holds it about 20 ms, and walking every pair in Python takes about
1.6 s at 100,000 streams. `python -m app.tiering.backup_writer` shares nothing with the server but
the checkpoint's directory and the file it writes, and prints the header and digest as one JSON
line; starting it costs about 0.15 s of CPU, on whatever core is free.

The child holds the read end of a pipe whose write end only the server has: when the server dies
(even by SIGKILL) the pipe reads end-of-file and the child exits, rather than finish a backup
nobody will upload.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from app.state_machine import backup
from app.state_machine.records import COLUMN_FAMILIES
from app.storage.rocks import RocksKV

CHILD_TIMEOUT_SECONDS = 3600.0
ORPHANED_EXIT = 3  # the child's exit status when its parent went away


class WriterFailed(Exception):
    """The child process did not write the backup."""


def encode(checkpoint: Path, out: Path, created_at: int, node: int) -> tuple[backup.Header, str]:
    """Writes the backup of the checkpoint to `out`; its header and SHA-256."""
    view = RocksKV(checkpoint, COLUMN_FAMILIES)
    try:
        with open(out, "wb") as file:
            return backup.write(view, created_at, node, file)
    finally:
        view.close()


def encode_in_child(
    checkpoint: Path,
    out: Path,
    created_at: int,
    node: int,
    started: Callable[[subprocess.Popen[bytes]], None] = lambda child: None,
) -> tuple[backup.Header, str]:
    """`encode` in a child process (blocking: call it from a thread). `started` is given the child,
    which the caller may kill to abandon the backup (the node stopping)."""
    alive, held = os.pipe()  # both ends are not inherited: only `alive` goes to this child
    argv = [sys.executable, "-m", __name__, str(checkpoint), str(out), str(created_at), str(node)]
    argv += ["--parent-fd", str(alive)]
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(alive,)) as child:
            started(child)
            try:
                stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                raise WriterFailed(f"the backup writer took more than {CHILD_TIMEOUT_SECONDS:.0f} s") from None
    finally:
        os.close(alive)
        os.close(held)
    if child.returncode != 0:
        last = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise WriterFailed(f"the backup writer exited with {child.returncode}: {last[0][:300]}")
    result = json.loads(stdout)
    return backup.Header(**result["header"]), result["sha256"]


def exit_with_parent(fd: int) -> threading.Thread:
    """Ends this process once `fd` (a pipe's read end whose write end only the parent holds) reads
    end-of-file, that is once the parent is gone."""

    def watch() -> None:
        while os.read(fd, 1):
            pass
        os._exit(ORPHANED_EXIT)  # the main thread may be deep in RocksDB: no cleanup to wait for

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.tiering.backup_writer", description=__doc__)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("created_at", type=int)
    parser.add_argument("node", type=int)
    parser.add_argument("--parent-fd", type=int, help="exit when this pipe reads end-of-file")
    args = parser.parse_args(argv)
    if args.parent_fd is not None:
        exit_with_parent(args.parent_fd)
    header, sha256 = encode(args.checkpoint, args.out, args.created_at, args.node)
    print(json.dumps({"header": asdict(header), "sha256": sha256}))


if __name__ == "__main__":
    main()
