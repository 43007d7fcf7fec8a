"""A server process seen from outside through /proc (Linux): resident memory, its peak, open fds."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.bench.servers import cpu_seconds

MIB = 1024 * 1024


def status_bytes(pid: int, name: str) -> int:
    """A `VmXxx:  N kB` line of /proc/<pid>/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"{name} not in /proc/{pid}/status")


def rss(pid: int) -> int:
    return status_bytes(pid, "VmRSS")


def peak_rss(pid: int) -> int:
    return status_bytes(pid, "VmHWM")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; its parent just has not reaped it


def reset_peak(pid: int) -> bool:
    """Resets VmHWM to the current RSS (Linux 4.0+, writing 5 to clear_refs); False where not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def wait_idle(pid: int, quiet_cpu: float = 0.01, interval: float = 0.25, timeout: float = 15.0) -> None:
    """Returns once the process used under `quiet_cpu` CPU seconds in two intervals running."""
    deadline = time.monotonic() + timeout
    quiet, before = 0, cpu_seconds(pid)
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(interval)
        now = cpu_seconds(pid)
        quiet = quiet + 1 if now - before < quiet_cpu else 0
        before = now


@dataclass
class Samples:
    """RSS (bytes) and open fds of one process over a run: first, largest, last."""

    pid: int
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds since the first sample
    start: float = 0.0  # time.monotonic() of the first sample

    def take(self) -> None:
        if alive(self.pid):
            now = time.monotonic()
            if not self.times:
                self.start = now
            self.times.append(now - self.start)
            self.rss.append(rss(self.pid))
            self.fds.append(open_fds(self.pid))

    def trend(self, points: int = 12) -> list[tuple[float, float, int]]:
        """(seconds, RSS MiB, fds) at up to `points` samples spread evenly over the run."""
        n, k = len(self.rss), min(points, len(self.rss))
        picks = sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})
        return [(self.times[i], self.rss[i] / MIB, self.fds[i]) for i in picks]

    def summary(self) -> dict[str, Any]:
        if not self.rss:
            return {}
        return {
            "rss_start_mib": self.rss[0] / MIB,
            "rss_max_mib": max(self.rss) / MIB,
            "rss_end_mib": self.rss[-1] / MIB,
            "fds_start": self.fds[0],
            "fds_max": max(self.fds),
            "fds_end": self.fds[-1],
            "samples": len(self.rss),
            "trend": self.trend(),
        }
