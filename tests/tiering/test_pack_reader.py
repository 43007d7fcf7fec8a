"""PackReader's footer cache, shared by the threads that read cold slices at once."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from app.tiering import pack


@pytest.fixture
def often_switching() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between any two bytecodes
    yield
    sys.setswitchinterval(interval)


def test_threads_sharing_a_small_footer_cache_never_lose_an_entry(
    monkeypatch: pytest.MonkeyPatch, often_switching: None
) -> None:
    class Footerless:  # no object store: only the cache's bookkeeping runs
        def __init__(self, _file: object, metadata: object = None) -> None:
            self.metadata = metadata or object()

    monkeypatch.setattr(pack.pq, "ParquetFile", Footerless)
    monkeypatch.setattr(pack, "RangedFile", lambda *args: None)
    monkeypatch.setattr(pack, "rows_of", lambda *args: None)
    reader = pack.PackReader(None, max_footers=2)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def read(n: int) -> None:
        try:
            for i in range(20_000):
                reader.rows(f"pack-{(7 * i + n) % 5}", 1, 0, 0, 1, [])
        except Exception as exc:  # noqa: BLE001 - any error is the finding
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(reader._footers) <= 2
