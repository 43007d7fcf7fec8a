"""The leader's state backups: the applied state, now and then, as immutable objects in the store.

A backup is written at most every `interval` seconds, and sooner once `entries` entries have been
applied since the last one (but not within `MIN_GAP_SECONDS` of it, nor before `MAX_SHARE` of the
time since it has gone into taking it: its cost grows with the state, and a busy leader must not
spend more of its time on backups as its state grows). It is built from a RocksDB checkpoint of
the state store, a consistent view taken in a moment, encoded in a child process (which leaves the
server's GIL alone) and uploaded on the thread pools: appends go on meanwhile. The newest `keep`
backups are kept; older ones are deleted.

With the segments the tiering worker seals, a backup is what `rill restore` rebuilds a node from
when every node's disk is lost. `recovery_point` says how far behind the object store is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.runtime import blocking
from app.state_machine import backup
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.storage.state_store import StateStore
from app.tiering import backup_writer
from app.tiering.store import ObjectStore, StoreUnavailable

log = logging.getLogger("rill.backups")

MIN_GAP_SECONDS = 5.0
MAX_SHARE = 0.05  # of the leader's time that backups sooner than `interval` may take
RETRY_SECONDS = 10.0
HEADER_BYTES = 64 << 10  # read of a backup's start that holds its header


@dataclass
class BackupConfig:
    interval: float = 60.0  # seconds: the longest the metadata goes unprotected while it changes
    entries: int = 10_000  # applied entries that make a backup due before the interval
    keep: int = 3  # newest backups kept in the store


class Leader(Protocol):
    machine: StateMachine

    @property
    def is_leader(self) -> bool: ...

    def now_ms(self) -> int: ...


@dataclass
class Written:
    key: str
    index: int
    created_at: int  # ms
    size: int
    took_ms: int = 0  # from the start of its checkpoint to its upload's end


class StateBackups:
    def __init__(
        self, node: Leader, node_id: int, store: ObjectStore, state_store: StateStore | None, config: BackupConfig
    ) -> None:
        self.node = node
        self.node_id = node_id
        self.store = store
        self.state_store = state_store  # None: the state machine's store is not RocksDB (tests)
        self.config = config
        self.last: Written | None = None
        self.written = 0
        self.errors = 0
        self.last_error: str | None = None
        self._retry_at = 0
        self._leading_since: int | None = None
        self._kept: list[int] | None = None  # the indexes of the backups in the store; None: not listed yet
        self._taking: int | None = None  # a backup under way was taken at this index or later
        self._store_newest: Written | None = None  # the newest backup in the store when this node began leading
        self._child: subprocess.Popen[bytes] | None = None  # the latest backup's writer (backup_writer.py)

    def due(self, now: int) -> bool:
        if not self.node.is_leader or now < self._retry_at:
            return False
        applied = self.node.machine.applied_index
        last = self.last
        if last is None:
            return True  # a new leader knows of no backup of its own: one now sets the recovery point
        if applied <= last.index:
            return False
        elapsed = (now - last.created_at) / 1000
        if elapsed >= self.config.interval:
            return True
        soonest = max(MIN_GAP_SECONDS, last.took_ms / 1000 / MAX_SHARE)
        return applied - last.index >= self.config.entries and elapsed >= soonest

    async def run_forever(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            now = self.node.now_ms()
            if not self.node.is_leader:
                self.last, self._leading_since, self._kept, self._store_newest = None, None, None, None
                continue
            if self._leading_since is None:
                await self.begin_leading(now)
            if self.due(now):
                await self.write_once()

    async def write_once(self) -> Written | None:
        """Takes, uploads and prunes one backup; None (logged, retried later) if that failed."""
        now, started = self.node.now_ms(), time.monotonic()
        self._taking = self.node.machine.applied_index
        try:
            header, key, size = await self._write(now)
            took_ms = int((time.monotonic() - started) * 1000)  # not the wall clock: a step must not count
            self.last = Written(key, header.index, header.created_at, size, took_ms)
            self.written += 1
            self.last_error = None
            if self._kept is not None:  # the store holds it now, whatever pruning does next
                self._kept = sorted({*self._kept, header.index})
            await blocking.run("backups", self._prune)
        except Exception as exc:  # the store is down, the disk is full: try again later, never crash
            # An upload may have landed unlisted (its check or the pruning failed): until the store is
            # listed again, the floor holds every object, so none the new backup names is deleted.
            self._kept = None
            self.errors += 1
            self.last_error = str(exc) or type(exc).__name__
            self._retry_at = now + int(RETRY_SECONDS * 1000)
            log.warning("state backup failed (retrying in %.0f s): %s", RETRY_SECONDS, self.last_error)
            return None
        finally:
            self._taking = None
        log.info("state backup %s: index %d, %d bytes", self.last.key, self.last.index, self.last.size)
        return self.last

    async def _write(self, now: int) -> tuple[backup.Header, str, int]:
        """Takes and uploads a backup; returns its header, key and size."""
        kv = self.node.machine.kv
        if self.state_store is None or not isinstance(kv, RocksKV):
            header, data = backup.encode(kv, now, self.node_id)  # an in-memory store: encoded here, in one go
            key = backup.backup_key(header.index, data)
            await blocking.run("backups", self.store.put, key, data)
            return header, key, len(data)
        path = await blocking.run("backups", self.state_store.checkpoint, kv, "backup")
        try:
            return await blocking.run("backups", self._write_from, path, now)
        except asyncio.CancelledError:  # the node is stopping: the backup is abandoned, not finished
            if self._child is not None:
                self._child.kill()  # its thread then ends at once, uploading nothing
            raise
        finally:
            await blocking.run("backups", _remove, path)  # after that thread, on the same one

    def _write_from(self, checkpoint: Path, now: int) -> tuple[backup.Header, str, int]:
        """Writes the backup of a checkpoint to a file beside it a frame at a time, in a child process
        (app/tiering/backup_writer.py), then uploads the file (in parts on S3): a large state is never
        held in memory whole, nor encoded under the server's GIL."""
        file = checkpoint.with_name(checkpoint.name + ".state")
        try:
            header, sha256 = backup_writer.encode_in_child(checkpoint, file, now, self.node_id, self._started)
            key, size = backup.key_for(header.index, sha256), file.stat().st_size
            self.store.put_file(key, file, sha256)
            info = self.store.stat(key)
            if info is None or info.size != size or info.sha256 not in (None, sha256):
                with contextlib.suppress(Exception):  # not what its key names: a restore must not take it
                    self.store.delete(key)
                raise StoreUnavailable(f"uploaded {key} but the store holds something else")
            return header, key, size
        finally:
            file.unlink(missing_ok=True)

    def _started(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child

    async def begin_leading(self, now: int) -> None:
        self._leading_since = now
        await blocking.run("backups", self._look_at_the_store)

    def _look_at_the_store(self) -> None:
        """A new leader learns which backups the store keeps (the floor) and when the newest was taken
        (the recovery point, until its own first backup): an earlier leader may have written them."""
        try:
            found = self._listed()
            self._kept = [index for index, _ in found]
            if found:
                index, key = found[-1]
                header = backup.read_header(self.store.get_range(key, 0, HEADER_BYTES))
                self._store_newest = Written(key, index, header.created_at, 0)
        except (StoreUnavailable, KeyError, backup.BackupError) as exc:
            log.info("the state backups in the store could not be looked at: %s", exc)

    def _listed(self) -> list[tuple[int, str]]:
        """(index, key) of the backups in the store, oldest first."""
        keys = self.store.list(backup.KEY_PREFIX)
        return sorted((parsed[0], key) for key in keys if (parsed := backup.parse_key(key)) is not None)

    def _prune(self) -> None:
        """Deletes all but the newest `keep` backups (by index), whoever wrote them."""
        found = self._listed()
        pruned = max(0, len(found) - self.config.keep)
        for _, key in found[:pruned]:
            self.store.delete(key)
        self._kept = [index for index, _ in found[pruned:]]

    def floor(self) -> int | None:
        """The index of the newest backup in the store, or of the one under way if lower; None when
        there is none. The objects the newest backup names stay (the worker deletes only what an
        entry after it released), so that restoring it finds every one: 0 until this leader has
        listed the backups. Older kept backups may name objects deleted since (keeping those too
        would hold a released object until `keep` more backups, which an idle node never takes)."""
        if self._kept is None:
            return 0
        held = [*self._kept[-1:], *([] if self._taking is None else [self._taking])]
        return min(held) if held else None

    def recovery_point_age(self, now: int, oldest_unsealed: int | None) -> float | None:
        """Seconds of acknowledged writes the store may not hold: since the last backup if the state
        changed after it, and since the oldest record not yet sealed. None where this node does not
        lead (the leader writes backups and seals segments)."""
        if not self.node.is_leader or self._leading_since is None:
            return None
        last = self.last or self._store_newest  # this leader's, else the newest an earlier one wrote
        since = last.created_at if last is not None else self._leading_since
        metadata = 0 if last is not None and self.node.machine.applied_index <= last.index else now - since
        records = 0 if oldest_unsealed is None else now - oldest_unsealed
        return max(0, metadata, records) / 1000

    def status(self, now: int, oldest_unsealed: int | None) -> dict[str, object]:
        """What /healthz reports: how much acknowledged data the object store may not hold yet."""
        age = self.recovery_point_age(now, oldest_unsealed)
        last = self.last
        return {
            "unprotected_bytes": self.node.machine.untiered_bytes,
            "recovery_point_age_seconds": None if age is None else round(age, 3),
            "last_backup": None if last is None else {"key": last.key, "index": last.index, "at": last.created_at},
            "backups_written": self.written,
            "backup_errors": self.errors,
            "last_error": self.last_error,
        }


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
