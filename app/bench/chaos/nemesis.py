"""The nemesis: a schedule of faults derived from the seed alone (so a run can be replayed), and the
hands that inject and heal them. One fault at a time, each healed before the next; a fault's
target is named by role ("leader", "follower") or by chance, and resolved when it starts."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.bench.chaos.cluster import ChaosCluster, fill, unfill
from app.bench.chaos.history import Fault
from app.bench.chaos.proxy import Fault as LinkFault
from app.bench.chaos.proxy import Mode

QUIET_SECONDS = 7.0  # longer than every idle timeout: keep-alive (5 s), forwarded writes' pool (4 s)


@dataclass(frozen=True)
class Step:
    kind: str
    at: float  # seconds into the run
    seconds: float  # how long the fault lasts
    variant: str
    target: str  # "leader", "follower" or "any"
    pick: int  # a number the step's random choices come from, fixed by the seed


def plan(seed: int, kinds: list[str], seconds: float, warmup: float = 4.0, settle: float = 6.0) -> list[Step]:
    """The faults of a run: kinds in turn (shuffled by the seed), each 2-6 s, with 2-4 s between."""
    rng = random.Random(seed)
    steps: list[Step] = []
    at = warmup
    order: list[str] = []
    while True:
        if not order:
            order = list(kinds)
            rng.shuffle(order)
        kind = order.pop()
        length = QUIET_SECONDS if kind == "quiet" else rng.uniform(2.0, 6.0)
        if kind == "membership":
            length = 8.0  # a budget: the change takes what it takes, healed when it is undone
        if at + length + settle > seconds:
            return steps
        variant = rng.choice(VARIANTS[kind])
        steps.append(
            Step(kind, round(at, 2), round(length, 2), variant, rng.choice(TARGETS[kind]), rng.randrange(1 << 30))
        )
        at += length + rng.uniform(2.0, 4.0)


VARIANTS: dict[str, tuple[str, ...]] = {
    "partition": ("isolate", "split", "bridge"),  # a node alone; a minority; a node reaching one peer only
    "oneway": ("outbound", "inbound"),  # the node cannot send; it cannot receive
    "pause": ("stop",),
    "kill": ("sigkill",),
    "delay": ("slow", "lossy"),
    "disk": ("full",),
    "quiet": ("idle",),
    "membership": ("add-remove",),
}
TARGETS: dict[str, tuple[str, ...]] = {
    "partition": ("leader", "leader", "follower"),
    "oneway": ("leader", "follower"),
    "pause": ("leader", "follower"),
    "kill": ("leader", "leader", "follower"),
    "delay": ("any",),
    "disk": ("disk",),
    "quiet": ("any",),
    "membership": ("leader",),
}


@dataclass
class Nemesis:
    cluster: ChaosCluster
    quiet: threading.Event
    now: Callable[[], float]
    faults: list[Fault] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    spare: int = 0  # the next spare node id for a joiner
    leader: int = 0  # the leader when the current fault started

    def run(self, steps: list[Step], stopping: threading.Event) -> None:
        """Every step at its time, or 2 s after the last heal where an earlier fault ran late."""
        for step in steps:
            ready = max(step.at, self.faults[-1].healed + 2.0 if self.faults else 0.0)
            while self.now() < ready and not stopping.is_set():
                time.sleep(0.05)
            if stopping.is_set():
                return
            self.inject(step)

    def inject(self, step: Step) -> None:
        rng = random.Random(step.pick)
        target, leader = self._target(step.target, rng)
        self.leader = leader
        role = "leader" if target == leader else "follower"
        fault = Fault(step.kind, f"{step.variant} node {target} ({role})", self.now())
        self.faults.append(fault)
        try:
            getattr(self, "_" + step.kind)(step, rng, target, fault)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be made is reported, the run goes on
            fault.detail += f"; the nemesis failed: {exc!r}"
            self.log.append(f"{step.kind} at {fault.start:.1f} s: {exc!r}")
        finally:
            self.cluster.hub.heal_all()
            for m in self.cluster.members.values():
                self.cluster.resume(m.id)
            self.quiet.clear()
            fault.healed = self.now()

    def _target(self, role: str, rng: random.Random) -> tuple[int, int]:
        """The node a step strikes, and the leader when it starts (0 if none is agreed on)."""
        voters = sorted(self.cluster.voters)
        try:
            leader = self.cluster.leader(timeout=10)
        except RuntimeError:
            leader = 0
        if role == "disk" and self.cluster.disk_node is not None:
            return self.cluster.disk_node, leader
        if role == "leader" and leader:
            return leader, leader
        if role == "follower":
            return rng.choice([n for n in voters if n != leader]), leader
        return rng.choice(voters), leader

    def _cut(self, a: int, b: int, mode: Mode) -> None:
        self.cluster.hub.set((a, b), LinkFault(mode))

    def _partition(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        voters = sorted(self.cluster.voters)
        others = [n for n in voters if n != target]
        mode = rng.choice((Mode.DROP, Mode.BLACKHOLE))
        if step.variant == "bridge":  # the target reaches one peer only
            keep = rng.choice(others)
            cut = [(target, n) for n in others if n != keep]
            fault.detail += f" (reaches only node {keep})"
        else:
            side = {target}
            if step.variant == "split" and len(voters) > 3:
                side.add(rng.choice(others))  # a minority of two
            cut = [(a, b) for a in side for b in voters if b not in side]
            fault.detail = f"{step.variant} {sorted(side)} from the rest (node {self.leader or '?'} led)"
        fault.detail += f", {mode.name.lower()}"
        for a, b in cut:
            self._cut(a, b, mode)
            self._cut(b, a, mode)
        time.sleep(step.seconds)

    def _oneway(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        mode = rng.choice((Mode.DROP, Mode.BLACKHOLE))
        fault.detail += f", {mode.name.lower()}"
        for n in self.cluster.voters - {target}:
            if step.variant == "outbound":
                self._cut(target, n, mode)
            else:
                self._cut(n, target, mode)
        time.sleep(step.seconds)

    def _pause(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        self.cluster.pause(target)
        time.sleep(step.seconds)
        self.cluster.resume(target)

    def _kill(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        self.cluster.kill(target)
        time.sleep(step.seconds)
        self.cluster.start(target)

    def _delay(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        if step.variant == "slow":
            link = LinkFault(Mode.DELAY, delay=rng.uniform(0.05, 0.4))
            fault.detail = f"every link +{link.delay * 1000:.0f} ms"
        else:
            link = LinkFault(Mode.FLAKY, delay=0.02, loss=rng.uniform(0.01, 0.08))
            fault.detail = f"every link resets {link.loss:.0%} of chunks"
        self.cluster.hub.set_all(link)
        time.sleep(step.seconds)

    def _disk(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        if self.cluster.disk_node is None or self.cluster.disk_skipped:
            fault.detail = f"skipped: {self.cluster.disk_skipped or 'no disk node'}"
            return
        written = fill(self.cluster.members[target].data_dir)
        fault.detail += f", {written >> 20} MiB of filler"
        try:
            time.sleep(step.seconds)
        finally:
            unfill(self.cluster.members[target].data_dir)

    def _quiet(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        fault.detail = f"no client request for {step.seconds:.0f} s"
        self.quiet.set()
        time.sleep(step.seconds)

    def _membership(self, step: Step, rng: random.Random, target: int, fault: Fault) -> None:
        """Adds a new node and removes it again, killing the leader during each change."""
        joiner = self.cluster.size + 1 + self.spare
        self.spare += 1
        if joiner not in self.cluster.members:
            fault.detail = "skipped: no spare node id left"
            return
        self.cluster.start(joiner, join=True)
        url = self.cluster.members[joiner].url
        added = self._changing(lambda: self.cluster.change("POST", "/_rill/members", {"id": joiner, "url": url}), rng)
        self.cluster.voters.add(joiner)
        removed = self._changing(lambda: self.cluster.change("DELETE", f"/_rill/members/{joiner}"), rng)
        self.cluster.voters.discard(joiner)
        self.cluster.kill(joiner)
        fault.detail = (
            f"add node {joiner} (leader {added or 'not'} killed), remove it (leader {removed or 'not'} killed)"
        )

    def _changing(self, change: Callable[[], int], rng: random.Random) -> int:
        """Repeats `change` until it is done, killing the leader once while it runs; the node killed, if any."""
        killed: list[int] = []

        def kill_leader() -> None:
            time.sleep(rng.uniform(0.05, 0.5))
            try:
                leader = self.cluster.leader(timeout=5)
            except RuntimeError:
                return
            self.cluster.kill(leader)
            killed.append(leader)

        killer = threading.Thread(target=kill_leader)
        killer.start()
        deadline = time.monotonic() + 90
        done = False
        try:
            while not done and time.monotonic() < deadline:
                done = change() in (200, 404)  # 404: a removal that an earlier try (cut short) already made
                if not done:
                    time.sleep(0.5)
        finally:
            killer.join()
            for node in killed:
                time.sleep(1.0)
                self.cluster.start(node)
        if not done:
            raise RuntimeError("the membership change did not go through in 90 s")
        return killed[0] if killed else 0
