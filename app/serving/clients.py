"""Connections per client address: the edge refuses one past `max_connections_per_client`, so that no
single client (a leaking pool, a flood from one host) holds every slot of `max_connections`.

A client is its remote IP address: an IPv4 address as is, an IPv6 address by its /64 (the unit a
host or a LAN is given; one host can pick any of its 2^64 addresses), an IPv4-mapped IPv6 address as
the IPv4 one. Loopback counts like any other address.

The other nodes of a cluster are not counted: their Raft messages and the writes they forward come
from their addresses, many clients' requests over few connections, and refusing them would starve
the cluster. They are recognised by address, the one thing known before a byte is read: the
addresses the peers' URLs name, resolved when the membership changes and every minute (every few
seconds while a name does not resolve: a peer's container may not be up yet). A node reaching this
one from another address (another interface of a multi-homed host) is counted like a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("uvicorn.error")

_HOST_BITS = (1 << 64) - 1
RESOLVE_SECONDS = 60.0  # how often the peers' names are resolved again
RETRY_SECONDS = 5.0  # the same while one does not resolve


def client_key(peername: Any) -> str | None:
    """The address a connection from `peername` counts against; None if it has no IP address (a Unix socket)."""
    if not isinstance(peername, tuple) or not peername or not isinstance(peername[0], str):
        return None
    host: str = peername[0]
    if ":" not in host:
        return host  # IPv4: the common case, without parsing
    try:
        address = ipaddress.IPv6Address(host.partition("%")[0])  # without a link-local zone
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return f"{ipaddress.IPv6Address(int(address) & ~_HOST_BITS)}/64"


class ClientSlots:
    """Open connections per client address, and the addresses (the cluster's nodes) not counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no per-client limit
        self.counts: dict[str, int] = {}
        self.exempt: frozenset[str] = frozenset()
        self._changed: asyncio.Event | None = None

    def counted(self, key: str | None) -> bool:
        return self.limit > 0 and key is not None and key not in self.exempt

    def take(self, key: str) -> bool:
        """Counts a connection from `key`; False (nothing counted) if it already holds `limit`."""
        held = self.counts.get(key, 0)
        if held >= self.limit:
            return False
        self.counts[key] = held + 1
        return True

    def give(self, key: str) -> None:
        held = self.counts[key] - 1
        if held:
            self.counts[key] = held
        else:
            del self.counts[key]  # the map holds only addresses with open connections

    async def follow_peers(self, peers: Callable[[], Iterable[str]]) -> None:
        """Keeps the addresses of `peers()` (the other nodes' URLs) exempt, until cancelled."""
        changed = self._changed = asyncio.Event()
        while True:
            changed.clear()
            resolved = await self.exempt_peers(peers())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESOLVE_SECONDS if resolved else RETRY_SECONDS):
                    await changed.wait()

    def peers_changed(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def exempt_peers(self, urls: Iterable[str]) -> bool:
        """Exempts the addresses the peers' URLs name (a host name: every address it resolves to);
        False if a name did not resolve."""
        loop = asyncio.get_running_loop()
        resolved = True
        keys: set[str] = set()
        for url in urls:
            host = urlsplit(url).hostname if url else None
            if not host:
                continue
            try:
                keys.add(client_key((str(ipaddress.ip_address(host)), 0)) or host)
                continue
            except ValueError:
                pass
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as exc:
                logger.info("peer %s does not resolve yet (%s): its connections count as a client's", host, exc)
                resolved = False
                continue
            keys.update(key for *_, sockaddr in infos if (key := client_key(sockaddr)) is not None)
        self.exempt = frozenset(keys)
        return resolved
