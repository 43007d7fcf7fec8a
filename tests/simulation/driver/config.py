"""The simulation's knobs: virtual time, phases, workload, compaction."""

TICK = 0.1  # seconds of virtual time per Raft tick
FAULT_SECONDS = 40.0  # virtual time with faults; then the cluster heals
SETTLE_SECONDS = 120.0  # how long a healed cluster may take to finish every client
JOIN_AT = 10.0  # node 4 joins (and later an original voter leaves)
STREAMS = ("s0", "s1", "s2")
CLIENTS = 6
THINK_SECONDS = 0.5  # a client waits up to this long between appends
READERS = 2
COMPACT_EVERY = 30
COMPACT_KEEP = 8
CHECKPOINT_TIMEOUT = 5.0
STATS = (
    "acked", "reads", "installs", "crashes", "syncs", "entries_synced", "largest_sync", "messages", "transfers", "acks",
)  # fmt: skip
