"""The channels peers opened to this node, by peer: who may take a place before proving the secret,
and which channel is the live one once several are proven.

Anyone can ask for a channel in a peer's name; only its first frame proves the secret. Asking
costs only other unproven channels their place, once connected, and a proven channel replaces
only the peer's channels accepted before it. Nothing is refused for want of places, so no one
keeps a peer off its channel by holding them: a peer proves its channel within a round trip, and
only that many newer dials in the meantime could displace it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from app.cluster.channel import Hello
from app.cluster.peer_channel import Inbound
from app.raft.messages import Message

log = logging.getLogger("rill.transport")

# Channels not yet proven by a first frame: from one client address in one peer's name this many
# wait, and this many in all; past either, the oldest waiting one is closed. So whoever asks
# without the secret holds at most MAX_UNPROVEN first frames' caps of memory.
MAX_UNPROVEN_PER_ADDRESS = 2
MAX_UNPROVEN = 8


class AcceptedChannels:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.by_peer: dict[int, list[Inbound]] = {}
        self._accepted = itertools.count(1)  # the order channels were accepted in

    def accept(
        self, hello: Hello, key: bytes, deliver: Callable[[list[Message]], None], max_payload: int, client: str
    ) -> Inbound:
        """The protocol for a channel `hello.src` asked for from the address `client`."""
        held = self.by_peer.setdefault(hello.src, [])
        held[:] = [i for i in held if not i.closed]
        inbound = Inbound(
            key, hello.src, self.node_id, max_payload, deliver, self._closed, self._proven,
            client, next(self._accepted), on_connected=self._admitted,
        )  # fmt: skip
        held.append(inbound)
        return inbound

    def drop(self, peer: int) -> None:
        for inbound in self.by_peer.pop(peer, []):
            inbound.close()

    def close(self) -> None:
        for peer in list(self.by_peer):
            self.drop(peer)

    def _admitted(self, inbound: Inbound) -> None:
        """A channel now connected, not yet proven: the oldest unproven one makes way past a cap."""
        unproven = [i for held in self.by_peer.values() for i in held if not i.frames and not i.closed]
        mine = [i for i in unproven if i.client == inbound.client and i.peer == inbound.peer]
        if len(mine) > MAX_UNPROVEN_PER_ADDRESS:
            min(mine, key=lambda i: i.accepted).close()
        elif len(unproven) > MAX_UNPROVEN:
            oldest = min(unproven, key=lambda i: i.accepted)
            log.warning(
                "closed an unproven Raft channel from %s: %d wait for their first frame", oldest.client, MAX_UNPROVEN
            )
            oldest.close()

    def _proven(self, inbound: Inbound) -> None:
        """The peer redialed: what it sent before went over its older channels. A channel proven after
        a newer one (its first frame held up on the way) is the stale one."""
        others = [i for i in self.by_peer.get(inbound.peer, []) if i is not inbound and i.frames and not i.closed]
        if any(other.accepted > inbound.accepted for other in others):
            inbound.close()
            return
        for older in others:
            older.close()

    def _closed(self, inbound: Inbound) -> None:
        held = self.by_peer.get(inbound.peer)
        if held is not None and inbound in held:
            held.remove(inbound)
