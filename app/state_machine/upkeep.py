"""Which streams and packs the leader's periodic chores concern, kept up to date as they change.

Tiering (its segments, manifests and pack indexes), retention, eviction and the expiry sweep run
every half second to every second. Each used to look at every stream (or pack): with 100,000 idle
streams a tiering pass held the leader's loop for about 110 ms (`rill bench chores`). The table
notes here each stream it writes (`StreamTable.commit`) and each pack record it stages, so every
chore visits only what it may have work for. This is derived state: rebuilt from the streams
whenever a table loads, never stored, and never read by a rule, so no command's outcome depends
on it.

Expiry is kept in time order: a heap of (instant, sid) with the instant each stream was last
scheduled for. A sliding TTL only moves an expiry later, so an append or a touch schedules
nothing: the entry surfaces at the old instant, and the sweeper schedules the stream again for its
real one. Entries left behind by removed streams are dropped as they surface, or all at once when
they outnumber the live ones (a follower never pops its heap).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from app.state_machine import records as r

SHRINK_FROM = 1024


class Upkeep:
    def __init__(self) -> None:
        self.untiered: dict[int, None] = {}  # own records not in the object store yet; oldest first
        self.evictable: set[int] = set()  # tiered records still on local disk
        self.retained: set[int] = set()  # live streams with automatic retention
        self.retention: set[int] = set()  # of those, the ones written since the last take
        self.manifests: set[int] = set()  # streams with cold data that changed: their manifest may be stale
        self.packs: set[str] = set()  # packs whose record changed: their index may be stale
        self.added: set[int] = set()  # streams created since the last take_names
        self.removed: list[tuple[int, str, str]] = []  # (sid, bucket, name) of streams dropped since then
        self._peaks = [0, 0]  # the most untiered and evictable held since each was last copied
        self._expiry: list[tuple[int, int]] = []  # (instant in ms, sid), a heap
        self._scheduled: dict[int, int] = {}  # sid -> the instant its live heap entry holds

    def note(self, meta: r.StreamMeta) -> None:
        """Brings the sets up to `meta` as just written."""
        sid = meta.sid
        if meta.tail > meta.tiered:
            self.untiered.setdefault(sid)
            if len(self.untiered) > self._peaks[0]:
                self._peaks[0] = len(self.untiered)
        elif sid in self.untiered:
            del self.untiered[sid]
            self._shrink()
        if meta.evicted < meta.tiered:
            self.evictable.add(sid)
            if len(self.evictable) > self._peaks[1]:
                self._peaks[1] = len(self.evictable)
        elif sid in self.evictable:
            self.evictable.discard(sid)
            self._shrink()
        if meta.tiered > meta.fork_pos:
            self.manifests.add(sid)
        live = not meta.deleted
        if live and (meta.retention_age is not None or meta.retention_bytes is not None):
            self.retained.add(sid)
            self.retention.add(sid)
        else:
            self.retained.discard(sid)
        if live and (meta.ttl is not None or meta.expires_at is not None):
            self.schedule(sid, meta.expiry() or 0)
        else:
            self._scheduled.pop(sid, None)

    def _shrink(self) -> None:
        """Copies a set the passes iterate once it is a quarter of its peak: a dict or set never
        shrinks on its own, and iterating one costs its peak size, not what it holds now."""
        untiered, evictable = len(self.untiered), len(self.evictable)
        if self._peaks[0] > SHRINK_FROM and untiered * 4 < self._peaks[0]:
            self.untiered = dict(self.untiered)
            self._peaks[0] = untiered
        if self._peaks[1] > SHRINK_FROM and evictable * 4 < self._peaks[1]:
            self.evictable = set(self.evictable)
            self._peaks[1] = evictable

    def forget(self, meta: r.StreamMeta) -> None:
        """The stream is gone."""
        sid = meta.sid
        self.removed.append((sid, meta.bucket, meta.name))
        self.untiered.pop(sid, None)
        self.evictable.discard(sid)
        self._shrink()
        self.retained.discard(sid)
        self.retention.discard(sid)
        self.manifests.discard(sid)
        if self._scheduled.pop(sid, None) is not None and len(self._expiry) > 2 * len(self._scheduled) + 64:
            self._expiry = [(at, s) for at, s in self._expiry if self._scheduled.get(s) == at]
            heapq.heapify(self._expiry)

    def schedule(self, sid: int, at: int) -> None:
        """Looks at the stream again at `at` (ms), unless it is due to be looked at sooner."""
        known = self._scheduled.get(sid)
        if known is None or at < known:
            self._scheduled[sid] = at
            heapq.heappush(self._expiry, (at, sid))

    @property
    def expiring(self) -> int:
        """How many streams are on the expiry schedule."""
        return len(self._scheduled)

    def is_expiring(self, sid: int) -> bool:
        return sid in self._scheduled

    def may_have_expired(self, now: int) -> Iterator[int]:
        """Takes off the schedule, and yields, each stream scheduled at or before `now`: the caller
        removes those that expired and schedules the others again."""
        heap, scheduled = self._expiry, self._scheduled
        while heap and heap[0][0] <= now:
            at, sid = heapq.heappop(heap)
            if scheduled.get(sid) == at:
                del scheduled[sid]
                yield sid

    def take_names(self) -> tuple[set[int], list[tuple[int, str, str]]]:
        """The streams created, and those dropped, since the last call."""
        taken = self.added, self.removed
        self.added, self.removed = set(), []
        return taken

    def take_retention(self) -> set[int]:
        """The streams with retention written since the last call."""
        taken, self.retention = self.retention, set()
        return taken

    def take_packs(self) -> set[str]:
        """The packs whose index may need publishing, since the last call."""
        taken, self.packs = self.packs, set()
        return taken

    def take_manifests(self) -> set[int]:
        """The streams whose manifest may need publishing, since the last call."""
        taken, self.manifests = self.manifests, set()
        return taken
