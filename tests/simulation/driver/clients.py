"""The workload. Clients append with idempotent producers through `RaftNode.propose` and retry across
NotLeader, ProposalDropped, timeouts, crashes and leader changes; readers ask `read_barrier` on any
node."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.cluster.driver import RaftNode
from app.cluster.driver_errors import NotLeader, ProposalDropped
from app.state_machine.commands import Append, Code, CreateStream, Outcome, Producer, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET
from tests.simulation.driver.checks import check_read
from tests.simulation.driver.config import THINK_SECONDS
from tests.simulation.driver.process import Unavailable, call

if TYPE_CHECKING:
    from tests.simulation.driver.world import Simulation


@dataclass
class Client:
    id: int
    stream: str
    acked: list[bytes] = field(default_factory=list)
    target: int = 0  # the node it believes leads
    done: bool = False


async def writer(sim: Simulation, client: Client) -> None:
    """Appends to its stream until the faults end, each append retried until acknowledged."""
    await sim.sleep(0, 1)
    seq = 0
    while not sim.healing:  # appends until the faults end; the last one completes after healing
        data = b"c%d-%d;" % (client.id, seq)
        producer = Producer(f"c{client.id}", 0, seq)
        command = Append(COMPAT_BUCKET, client.stream, "text/plain", data, producer=producer)
        while not await attempt(sim, client, command):
            await sim.sleep(0.05, 0.4)
        client.acked.append(data)
        sim.stats["acked"] += 1
        sim.event(f"client {client.id} acked {seq}")
        seq += 1
        await sim.sleep(0, THINK_SECONDS)
    client.done = True


async def attempt(sim: Simulation, client: Client, command: Append | CreateStream) -> bool:
    """Proposes through the node the client believes leads; True once acknowledged."""
    member = sim.members.get(client.target)
    if member is None or member.current is None:
        up = sim.up()
        member = sim.rng.choice(up) if up else None
    if member is None:
        return False
    envelope = encode_envelope(int(sim.now() * 1000), command)
    try:
        outcome = await call(member, lambda raft: raft.propose(envelope), sim.rng.uniform(0.3, 6.0))
    except NotLeader as exc:
        client.target = exc.leader
        return False
    except (ProposalDropped, Unavailable):
        client.target = 0
        return False
    client.target = member.id
    if not isinstance(outcome, Outcome):
        sim.fail(f"client {client.id} got {outcome!r} for {command}")
        return True
    code = outcome.code
    if isinstance(command, CreateStream):
        if code not in (Code.CREATED, Code.EXISTS):
            sim.fail(f"creating {command.stream}: unexpected outcome {outcome}")
        return True
    if code is Code.NOT_FOUND:  # the first writer creates the stream (idempotently)
        create = CreateStream(COMPAT_BUCKET, command.stream, "text/plain", False)
        while not await attempt(sim, client, create):
            await sim.sleep(0.05, 0.4)
        return False
    if code not in (Code.APPENDED, Code.DUPLICATE):
        sim.fail(f"client {client.id}: unexpected outcome {outcome}")
    elif command.producer is not None and outcome.producer_seq != command.producer.seq:
        sim.fail(f"client {client.id} got the outcome of another append: {outcome} for {command}")
    return True


async def reader(sim: Simulation) -> None:
    """Asks read barriers of random nodes, checking each against what was acknowledged before."""
    while not sim.healing:
        await sim.sleep(0.05, 0.6)
        up = sim.up()
        if not up:
            continue
        member = sim.rng.choice(up)
        incarnation = member.current
        asked = {c.id: len(c.acked) for c in sim.clients}  # acknowledged before the read
        timeout = sim.rng.uniform(0.2, 3.0)
        try:
            await call(member, functools.partial(RaftNode.read_barrier, timeout=timeout), timeout + 1)
        except (NotLeader, TimeoutError, Unavailable):
            continue
        assert incarnation is not None
        check_read(sim, member.id, incarnation.raft.machine, asked)  # type: ignore[arg-type]
