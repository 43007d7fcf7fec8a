"""The edge's limits, the file-descriptor maths behind the default connection cap, and how often a
refusal at a limit is logged."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# The soft RLIMIT_NOFILE is raised to the hard limit, but no further than this.
FD_CEILING = 65536
MAX_BACKLOG = 2048
# After an error answer the connection drains what the client still sends for at most this long.
LINGER_SECONDS = 2.0
# A refusal at a connection cap is logged at most this often per kind.
WARNING_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """What one connection may cost; the Settings fields of the same names document each."""

    max_connections: int = 1024
    max_connections_per_client: int = 256  # 0: no per-client limit
    header_timeout: float = 10.0
    keepalive_timeout: float = 5.0
    body_timeout: float = 30.0
    body_min_rate: float = 1024.0
    max_header_bytes: int = 64 * 1024
    backlog: int = MAX_BACKLOG


def raise_fd_limit(ceiling: int = FD_CEILING) -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit (at most `ceiling`); returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ceiling
    target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. macOS refuses past kern.maxfilesperproc
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def listen_backlog(fd_limit: int) -> int:
    """The listen queue's length. The event loop accepts everything queued before it can refuse any
    connection, so a full queue's worth of fds must fit beside the cap."""
    return max(16, min(MAX_BACKLOG, fd_limit // 16))


def plan_limits(
    *,
    max_connections: int | None,
    fd_reserve: int,
    max_connections_per_client: int | None = None,
    header_timeout: float,
    keepalive_timeout: float,
    body_timeout: float,
    body_min_rate: float,
    max_header_bytes: int,
) -> EdgeLimits:
    """The limits for this process; raises the fd limit first, so call it before opening the stores.

    Connections get what the fd limit leaves after `fd_reserve` (RocksDB, Raft peers, the cold
    store) and the listen backlog; an explicit `max_connections` larger than that is lowered to it.
    One client address gets a quarter of the connections unless `max_connections_per_client` says
    otherwise (0: no per-client limit).
    """
    fd_limit = raise_fd_limit()
    backlog = listen_backlog(fd_limit)
    budget = fd_limit - fd_reserve - backlog
    if budget < 1:
        raise ValueError(
            f"the open-file limit ({fd_limit}) leaves no room for connections after fd_reserve ({fd_reserve})"
            f" and the listen backlog ({backlog}): raise `ulimit -n` or lower fd_reserve"
        )
    cap = budget if max_connections is None else min(max_connections, budget)
    if max_connections is not None and max_connections > budget:
        logger.warning(
            "max_connections %d does not fit the open-file limit %d (fd_reserve %d, backlog %d): using %d",
            max_connections,
            fd_limit,
            fd_reserve,
            backlog,
            cap,
        )
    return EdgeLimits(
        max_connections=cap,
        max_connections_per_client=per_client_cap(cap, max_connections_per_client),
        header_timeout=header_timeout,
        keepalive_timeout=keepalive_timeout,
        body_timeout=body_timeout,
        body_min_rate=body_min_rate,
        max_header_bytes=max_header_bytes,
        backlog=backlog,
    )


def per_client_cap(max_connections: int, setting: int | None) -> int:
    """One address's share of the connections: a quarter unless set (0: unlimited).

    A quarter: it takes four addresses to fill the server, and one greedy client, whatever it does,
    leaves three quarters to the others; yet a busy host (a backend tailing many streams over
    long-polls, many users behind one NAT) gets thousands of connections at the default fd limit.
    """
    if setting is None:
        return max(1, max_connections // 4)
    return min(setting, max_connections)


class Warnings:
    """When each kind of refusal was last logged: a flood is logged once per period, not per connection."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def due(self, kind: str, now: float) -> bool:
        if now - self._last.get(kind, float("-inf")) < WARNING_SECONDS:
            return False
        self._last[kind] = now
        return True
