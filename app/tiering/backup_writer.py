"""Encodes a state backup from a RocksDB checkpoint into a file, in a process of its own.

On a thread of the server, a backup held the GIL for most of its work, and the event loop waited
up to a switch interval (5 ms) for it each time it woke, so every request in flight slowed down:
opening the checkpoint alone holds it about 20 ms, and walking every pair in Python takes about
1.6 s at 100,000 streams. `python -m app.tiering.backup_writer` shares nothing with the server but
the checkpoint's directory and the file it writes, and prints the header and digest as one JSON
line; starting it costs about 0.15 s of CPU, on whatever core is free.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from app.state_machine import backup
from app.state_machine.records import COLUMN_FAMILIES
from app.storage.rocks import RocksKV

CHILD_TIMEOUT_SECONDS = 3600.0


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


def encode_in_child(checkpoint: Path, out: Path, created_at: int, node: int) -> tuple[backup.Header, str]:
    """`encode` in a child process (blocking: call it from a thread)."""
    argv = [sys.executable, "-m", __name__, str(checkpoint), str(out), str(created_at), str(node)]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=CHILD_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise WriterFailed(f"the backup writer took more than {CHILD_TIMEOUT_SECONDS:.0f} s") from None
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise WriterFailed(f"the backup writer exited with {done.returncode}: {last[0][:300]}")
    result = json.loads(done.stdout)
    return backup.Header(**result["header"]), result["sha256"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.tiering.backup_writer", description=__doc__)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("created_at", type=int)
    parser.add_argument("node", type=int)
    args = parser.parse_args(argv)
    header, sha256 = encode(args.checkpoint, args.out, args.created_at, args.node)
    print(json.dumps({"header": asdict(header), "sha256": sha256}))


if __name__ == "__main__":
    main()
