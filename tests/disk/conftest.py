"""A small tmpfs of its own for each test that fills a disk (mounting needs root, or gets skipped)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

MIB = 1 << 20


class Tmpfs:
    def __init__(self, path: Path) -> None:
        self.path = path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def resize(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def fill(self, name: str = "filler") -> Path:
        """Writes a file until the filesystem has no byte left."""
        filler = self.path / name
        with open(filler, "ab", buffering=0) as fh:
            for chunk in (1 << 16, 1):
                try:
                    while True:
                        fh.write(b"\0" * chunk)
                except OSError:
                    pass
        return filler


@pytest.fixture()
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Tmpfs]]:
    """`tmpfs(size)` mounts a fresh tmpfs of `size` bytes under tmp_path; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(size: int) -> Tmpfs:
        path = tmp_path / f"mnt{len(mounted)}"
        path.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
        mounted.append(path)
        return Tmpfs(path)

    yield mount
    for path in mounted:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
