"""What every workload gets: the servers' stream URLs, a stop signal (Ctrl-C) and progress bars."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


@dataclass
class Run:
    urls: list[str]  # stream prefixes: a stream named n lives at f"{url}/{n}"; several = round-robin
    console: Console = field(default_factory=lambda: Console(stderr=True))
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    def stopped(self) -> bool:
        return self._stop.is_set()

    async def progress(self, label: str, seconds: float, tasks: Sequence[asyncio.Future[Any]]) -> None:
        """Shows a time bar until the tasks end, `seconds` pass, or the run is stopped."""
        columns = [TextColumn("[bold]{task.description}"), BarColumn(), TimeRemainingColumn()]
        loop = asyncio.get_running_loop()
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(label, total=seconds)
            start = loop.time()
            while not self.stopped() and not all(t.done() for t in tasks):
                bar.update(task, completed=min(loop.time() - start, seconds))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await self._stop.wait()
