"""The default connection cap: what the fd limit leaves after the reserve and the listen backlog."""

from __future__ import annotations

import resource
from typing import Any

import pytest

from app.serving import limits
from app.serving.limits import plan_limits, raise_fd_limit

TIMEOUTS: dict[str, Any] = dict(
    header_timeout=10.0, keepalive_timeout=5.0, body_timeout=30.0, body_min_rate=1024.0, max_header_bytes=65536
)


@pytest.fixture()
def fd_limit(monkeypatch: pytest.MonkeyPatch) -> Any:
    def set_limit(value: int) -> None:
        monkeypatch.setattr(limits, "raise_fd_limit", lambda: value)

    return set_limit


def test_the_cap_is_what_the_reserve_and_backlog_leave(fd_limit: Any) -> None:
    fd_limit(1024)
    edge = plan_limits(max_connections=None, fd_reserve=256, **TIMEOUTS)
    assert (edge.max_connections, edge.backlog) == (1024 - 256 - 64, 64)
    fd_limit(65536)
    edge = plan_limits(max_connections=None, fd_reserve=256, **TIMEOUTS)
    assert (edge.max_connections, edge.backlog) == (65536 - 256 - 2048, 2048)


def test_an_explicit_cap_is_kept_unless_the_fds_cannot_hold_it(fd_limit: Any) -> None:
    fd_limit(1024)
    assert plan_limits(max_connections=100, fd_reserve=256, **TIMEOUTS).max_connections == 100
    assert plan_limits(max_connections=5000, fd_reserve=256, **TIMEOUTS).max_connections == 704


def test_no_room_for_connections_is_an_error(fd_limit: Any) -> None:
    fd_limit(256)
    with pytest.raises(ValueError, match="ulimit"):
        plan_limits(max_connections=None, fd_reserve=256, **TIMEOUTS)


def test_the_soft_fd_limit_is_raised_to_the_hard_one_within_the_ceiling() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip("the hard limit is too low to test raising the soft one")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
        assert raise_fd_limit(ceiling=2048) == 2048
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 2048
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_one_client_gets_a_quarter_of_the_connections_unless_set(fd_limit: Any) -> None:
    fd_limit(1024)
    assert plan_limits(max_connections=None, fd_reserve=256, **TIMEOUTS).max_connections_per_client == 704 // 4
    assert plan_limits(max_connections=100, fd_reserve=256, **TIMEOUTS).max_connections_per_client == 25
    assert plan_limits(max_connections=2, fd_reserve=256, **TIMEOUTS).max_connections_per_client == 1
    explicit = dict(max_connections=100, fd_reserve=256, **TIMEOUTS)
    assert plan_limits(**explicit, max_connections_per_client=10).max_connections_per_client == 10
    assert plan_limits(**explicit, max_connections_per_client=0).max_connections_per_client == 0  # off
    assert plan_limits(**explicit, max_connections_per_client=500).max_connections_per_client == 100
