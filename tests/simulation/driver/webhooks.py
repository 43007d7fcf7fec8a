"""Webhook deliveries in the simulation: every incarnation runs the real delivery loop
(app/subscriptions/delivery.py) against a receiver that fails at random while the faults last,
then always answers `{"done": true}`. Checked at the end: every message of every stream reached
the receiver in a successful delivery at least once."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx

from app.cluster.driver_errors import NotLeader, ProposalDropped
from app.domain.errors import ProtocolError
from app.state_machine.commands import Command, Outcome, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.subscriptions.delivery import Deliveries
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.signing import WebhookSigner
from app.subscriptions.urls import IPAddress

if TYPE_CHECKING:
    from tests.simulation.driver.process import Incarnation
    from tests.simulation.driver.world import Simulation

HOOKS = (COMPAT_BUCKET, "", "hooks")
URL = "http://receiver.sim/in"
RECEIVER = ipaddress.ip_address("203.0.113.7")
SETTINGS = WebhookSettings(WebhookSigner.from_secret(b"simulation"))


class SimNode:
    """What the delivery loop needs of a node, over one incarnation's RaftNode."""

    webhooks = SETTINGS

    def __init__(self, incarnation: Incarnation) -> None:
        self.incarnation = incarnation

    @property
    def machine(self) -> StateMachine:
        return self.incarnation.raft.machine

    @property
    def is_leader(self) -> bool:
        return self.incarnation.raft.is_leader

    def now_ms(self) -> int:
        return int(self.incarnation.sim.now() * 1000)

    async def submit(self, command: Command) -> Outcome:
        try:
            outcome = await self.incarnation.raft.propose(encode_envelope(self.now_ms(), command))
        except (NotLeader, ProposalDropped):
            raise ProtocolError(503, "retry", "leadership changed") from None
        assert isinstance(outcome, Outcome)
        return outcome


def deliveries(incarnation: Incarnation) -> Deliveries:
    sim = incarnation.sim

    async def post(url: str, addresses: Sequence[IPAddress], body: bytes, headers: dict[str, str]) -> httpx.Response:
        request = httpx.Request("POST", url)
        if not sim.healing and sim.rng.random() < 0.3:
            if sim.rng.random() < 0.5:
                raise httpx.ConnectError("the receiver is down", request=request)
            return httpx.Response(503, request=request)
        sim.delivered.append(httpx.Response(200, content=body, request=request).json())
        return httpx.Response(200, content=b'{"done":true}', request=request)

    async def check(url: str, allowed: object) -> list[IPAddress]:
        return [RECEIVER]  # no names to resolve here

    return Deliveries(SimNode(incarnation), post=post, check=check, rng=sim.rng)


def _shown(sim: Simulation) -> dict[str, int]:
    """Each stream's highest tail a delivery the receiver took showed."""
    shown: dict[str, int] = {}
    for note in sim.delivered:
        for stream in note["streams"]:
            shown[stream["path"]] = max(shown.get(stream["path"], 0), int(stream["tail_offset"][17:]))
    return shown


def _missing(sim: Simulation, tails: dict[str, int]) -> list[tuple[str, int, int]]:
    """(stream, highest tail shown, tail) of each stream written since the webhook was made whose
    tail no delivery showed."""
    shown, since = _shown(sim), sim.hooked_at or {}
    return [
        (stream, shown.get(stream, 0), tail)
        for stream, tail in tails.items()
        if tail > since.get(stream, 0) and shown.get(stream, 0) < tail
    ]


def delivered_all(sim: Simulation, tails: dict[str, int]) -> bool:
    return sim.hooked_at is not None and not _missing(sim, tails)


def check_delivered(sim: Simulation, tails: dict[str, int]) -> None:
    """Every stream's tail was shown in a delivery the receiver took: each message reached it."""
    assert sim.hooked_at is not None, "the webhook subscription was never made"
    for stream, shown, tail in _missing(sim, tails):
        raise AssertionError(f"the webhook never got {stream} past {shown} (its tail: {tail})")
