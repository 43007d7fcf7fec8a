"""StateStore: a staged store replaces the live one only once marked complete (the driver accepted
it), and a crash at any step of the swap leaves a whole store to open, never an empty one."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.storage.kv import Batch
from app.storage.state_store import StateStore

CFS = ["default", "sm_meta"]


def _with(store: StateStore, value: bytes, staged: bool) -> None:
    kv = store.begin_staging() if staged else store.open()
    batch = Batch()
    batch.put("sm_meta", b"applied", value)
    kv.write(batch, sync=True)
    if staged:
        store.complete_staging(kv)
    else:
        kv.close()


def _applied(root: Path) -> bytes | None:
    kv = StateStore(root, CFS).open()  # a restart
    try:
        return kv.get("sm_meta", b"applied")
    finally:
        kv.close()


def test_a_staged_store_never_accepted_is_dropped_at_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path, CFS)
    _with(store, b"live@150", staged=False)
    _with(store, b"checkpoint@100", staged=True)  # received, then refused (the node had caught up)
    assert _applied(tmp_path) == b"live@150"


@pytest.mark.parametrize("crash_at", ["state", "state.staging", "unlink"])
def test_a_crash_during_a_swap_leaves_a_whole_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    store = StateStore(tmp_path, CFS)
    _with(store, b"live@150", staged=False)
    _with(store, b"checkpoint@200", staged=True)
    store.mark_complete()
    rename, unlink = Path.rename, Path.unlink

    def crashing_rename(self: Path, target: Path) -> Path:
        if self.name == crash_at:
            raise KeyboardInterrupt(f"power lost renaming {self.name}")
        return rename(self, target)

    def crashing_unlink(self: Path, missing_ok: bool = False) -> None:
        if crash_at == "unlink" and self.name == "COMPLETE":
            raise KeyboardInterrupt("power lost unlinking the marker")
        unlink(self, missing_ok)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "rename", crashing_rename)
        patch.setattr(Path, "unlink", crashing_unlink)
        with pytest.raises(KeyboardInterrupt):
            store.swap()
    assert _applied(tmp_path) == b"checkpoint@200"  # accepted before the crash: the swap is finished
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]
