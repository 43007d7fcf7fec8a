"""Deterministic simulations of a Rill cluster, each seed replayable exactly.

- `core.py`: the pure Raft core, log store and state machine, driven by hand on a fake clock
  (`python -m tests.simulation.core --seeds N`, `--seed S -v`).
- `driver/`: the real asyncio driver (`RaftNode`) on a virtual-time event loop, with simulated disks
  (`python -m tests.simulation.driver --seeds N`, `--seed S -v`).
- `seeds.py`: runs seeds in worker processes for the tests (`test_core.py`, `test_driver.py`).
"""
