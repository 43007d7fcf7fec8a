"""The in-memory Raft log (etcd's raftLog): entries past the checkpoint, and how much of it is durable.

Everything up to the checkpoint index has been compacted away: it is applied and covered by the
state machine's durable store, which is what a lagging follower is sent instead. Entries up to
`stable` are synced to disk; those from `unstable_from` on have not yet been handed to the driver.
"""

from __future__ import annotations

from app.raft.messages import NORMAL, Entry


class RaftLog:
    def __init__(self, entries: list[Entry], checkpoint_index: int, checkpoint_term: int) -> None:
        self.entries = list(entries)
        self.checkpoint_index = checkpoint_index
        self.checkpoint_term = checkpoint_term
        self.stable = self.last_index()
        self.unstable_from = self.stable + 1

    def last_index(self) -> int:
        return self.checkpoint_index + len(self.entries)

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.checkpoint_term

    def term_at(self, index: int) -> int | None:
        if index == self.checkpoint_index:
            return self.checkpoint_term
        if self.checkpoint_index < index <= self.last_index():
            return self.entries[index - self.checkpoint_index - 1].term
        return None

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries with lo <= index < hi."""
        return self.entries[lo - self.checkpoint_index - 1 : hi - self.checkpoint_index - 1]

    def append(self, term: int, data: bytes, kind: int = NORMAL) -> int:
        """Appends a leader's new entry; returns its index."""
        index = self.last_index() + 1
        self.entries.append(Entry(term, index, data, kind))
        return index

    def maybe_append(self, prev_index: int, prev_term: int, entries: list[Entry], commit: int) -> int | None:
        """Takes a leader's `entries` following (prev_index, prev_term): the index the log now matches
        the leader's up to, or None when the log lacks that entry. Entries up to `commit` are never
        overwritten."""
        if prev_index < self.checkpoint_index:
            # Already compacted here, so already committed; skip what we have.
            entries = entries[self.checkpoint_index - prev_index :]
            prev_index, prev_term = self.checkpoint_index, self.checkpoint_term
        if self.term_at(prev_index) != prev_term:
            return None
        for i, entry in enumerate(entries):
            existing = self.term_at(entry.index)
            if existing == entry.term:
                continue
            if existing is not None:
                if entry.index <= commit:
                    raise AssertionError("leader asked to overwrite a committed entry")
                self.entries = self.entries[: entry.index - self.checkpoint_index - 1]
                self.stable = min(self.stable, entry.index - 1)
            self.entries.extend(entries[i:])
            self.unstable_from = min(self.unstable_from, entry.index)
            break
        return prev_index + len(entries)

    def take_unstable(self) -> list[Entry]:
        """The entries not yet handed to the driver to persist (from then on, they are its to sync)."""
        if self.unstable_from > self.last_index():
            return []
        entries = self.slice(self.unstable_from, self.last_index() + 1)
        self.unstable_from = self.last_index() + 1
        return entries

    def persisted(self, index: int, term: int) -> bool:
        """The driver synced entries up to (index, term); True when that moved `stable` forward."""
        if self.term_at(index) != term or index <= self.stable:
            return False
        self.stable = index
        return True

    def compact(self, index: int) -> None:
        """Forgets entries up to `index` (applied, and covered by durable state) if they are synced."""
        index = min(index, self.stable)
        if index <= self.checkpoint_index:
            return
        self.checkpoint_term = self.term_at(index) or self.checkpoint_term
        self.entries = self.entries[index - self.checkpoint_index :]
        self.checkpoint_index = index

    def restore(self, index: int, term: int) -> None:
        """Moves the log behind an installed checkpoint at (index, term); entries past it survive
        only if the log agrees with it at `index`."""
        if self.term_at(index) == term:
            self.entries = self.entries[index - self.checkpoint_index :]
        else:
            self.entries = []
            self.stable = index
            self.unstable_from = index + 1
        self.checkpoint_index, self.checkpoint_term = index, term
        self.stable = max(self.stable, index)
        self.unstable_from = max(self.unstable_from, index + 1)
