"""The recovery point on a real node: state backups in its cold store, and how much is unprotected."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from app.state_machine import backup
from tests.observability.helpers import scrape, value
from tests.server import RillProcess

TEXT = {"content-type": "text/plain"}
ENV = {
    "RILL_STATE_CHECKPOINT_INTERVAL": "1",
    "RILL_SEGMENT_MAX_AGE": "600",  # nothing is sealed during the test: the appends stay unprotected
    "RILL_STATE_CHECKPOINT_KEEP": "2",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    process = RillProcess(tmp_path_factory.mktemp("recovery") / "data", env=ENV).start()
    yield process
    process.stop()


def _until(check: object, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def _backups(node: RillProcess) -> list[str]:
    root = node.data_dir / "cold" / backup.KEY_PREFIX
    return sorted(p.name for p in root.glob("*.state")) if root.exists() else []


def test_the_leader_backs_up_its_state_and_reports_what_is_unprotected(node: RillProcess) -> None:
    _until(lambda: _backups(node))  # a new leader backs up at once
    url = node.url + "/v1/stream/unprotected"
    assert httpx.put(url, headers=TEXT).status_code == 201
    assert httpx.post(url, headers=TEXT, content=b"x" * 1000).status_code == 204
    health = httpx.get(node.url + "/healthz").json()["recovery_point"]
    assert health["unprotected_bytes"] >= 1000 and health["backups_written"] >= 1
    samples = scrape(node.url)
    assert value(samples, "rill_unprotected_bytes") >= 1000
    assert value(samples, "rill_recovery_point_age_seconds") > 0  # the append is not sealed
    # The change is backed up within the interval; only the newest two backups are kept.
    first = health["last_backup"]["index"]
    _until(lambda: httpx.get(node.url + "/healthz").json()["recovery_point"]["last_backup"]["index"] > first)
    for _ in range(3):
        assert httpx.post(url, headers=TEXT, content=b"y").status_code == 204
        time.sleep(1.2)
    assert 1 <= len(_backups(node)) <= 2
    assert value(scrape(node.url), "rill_state_backups_total") >= 3
