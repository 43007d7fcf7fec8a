"""Deterministic simulation of a Rill cluster through the real asyncio driver (`RaftNode`).

`tests/simulation/core.py` drives the pure Raft core by hand; this one runs real `RaftNode`s (group
commit, the persister, applying, ReadIndex reads, checkpoint install between Readys, compaction)
in one asyncio event loop on virtual time, so a seed replays exactly:

- Virtual time (`loop.py`): `VirtualTimeLoop` is an asyncio loop whose clock moves only when
  nothing is ready, straight to the next timer. Ticks, timeouts and delays cost no wall time.
- Disks (`disk.py`): every store is a `DiskKV`, a MemoryKV that tracks which writes are synced.
  The driver's persister is a `Persister`: one job at a time, each finishing after a virtual fsync
  delay (sometimes a stall of seconds), instead of a thread.
- Network (`network.py`): every message is encoded, then dropped, delayed, duplicated or
  reordered; partitions cut nodes off, sometimes in one direction only.
- Crashes (`process.py`, `world.py`): a node is stopped gracefully, killed (unsynced writes
  survive in the OS) or loses power (only a prefix of its unsynced writes survives); its tasks,
  persister jobs and clients' connections to it die with it. A restart is a new `RaftNode` over
  what its disks hold.
- Checkpoints (`checkpoints.py`): logs are compacted often, so lagging and restarted nodes catch
  up from the leader's state store, copied pair by pair after a virtual delay (or failing) and
  installed through the driver's own path.
- Membership (`membership.py`, `faults.py`): midway a fourth node joins as a learner, is promoted,
  and an original voter leaves; now and then the leader hands leadership over.

Clients (`clients.py`) append with idempotent producers through `RaftNode.propose` and retry across
NotLeader, ProposalDropped, timeouts, crashes and leader changes; readers ask `read_barrier` on any
node.

    python -m tests.simulation.driver --seeds 200       # run many seeds
    python -m tests.simulation.driver --seed 42 -v      # replay one, printing its events

Checks (`checks.py`): at most one leader per term; every replica applies a prefix of the same log,
without gaps (so compaction never outruns durable state); every acknowledged append is in its
stream exactly once, in order; a read barrier never returns below an append acknowledged before it
was asked; acknowledgements and votes never outrun the disk (what they promise is synced); no
driver fails; after healing, the members' state stores are identical.
"""

from tests.simulation.driver.run import Result, run_seed

__all__ = ["Result", "run_seed"]
