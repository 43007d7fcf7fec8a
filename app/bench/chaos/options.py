"""What `rill bench chaos` takes: kept apart from the tool itself, so the CLI's parser can name the
flags without importing the cluster, the proxy and the clients at every `rill` start."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("partition", "oneway", "pause", "kill", "delay", "disk", "quiet", "membership")


@dataclass
class ChaosOptions:
    nodes: int = 3
    seconds: float = 60.0
    faults: str = ",".join(KINDS)
    seed: int = 1
    broken: str = ""  # a deliberately broken build: "commit-alone" or "read-without-barrier"
    keep: bool = False  # keep the nodes' data and logs (printed) instead of deleting them
