"""The Durable Streams conformance suite (npm) against a real `rill serve`, once per route family,
subscriptions included: the suite's webhook receivers listen on 127.0.0.1, which the nodes allow."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.security.tokens import new_token, toml_entry
from tests.server import RillCluster, RillProcess

HERE = Path(__file__).parent
LONG_POLL_SECONDS = 2
WEBHOOKS = {"RILL_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]'}
# Through a follower the suite idles this long (past the 5 s keep-alive timeout) before every Nth test.
PAUSE_SECONDS, PAUSE_EVERY = 6.0, 80
FAMILIES = ("compat", "ds", "legacy")
ALL_TESTS = 338  # the suite at the version package.json pins, its 6 subscription tests included


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    rill = RillProcess(
        tmp_path_factory.mktemp("conformance") / "data", None, "--long-poll-timeout", str(LONG_POLL_SECONDS),
        env=WEBHOOKS,
    )  # fmt: skip
    rill.start()
    assert httpx.put(rill.url + "/ds/conformance").status_code in (200, 201)
    yield rill
    rill.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RillProcess, str]]:
    """A node with auth on; the suite's token may write everywhere, the admin's creates its bucket."""
    root = tmp_path_factory.mktemp("conformance-auth")
    writer, admin = new_token(), new_token()
    config = root / "rill.toml"
    config.write_text(
        '[auth]\nmode = "on"\n\n'
        + toml_entry(writer, ["write:*"], name="conformance")
        + "\n"
        + toml_entry(admin, ["admin:*"], name="admin")
    )
    rill = RillProcess(
        root / "data", None, "--config", str(config), "--long-poll-timeout", str(LONG_POLL_SECONDS), env=WEBHOOKS
    )
    rill.start()
    as_admin = {"authorization": f"Bearer {admin}"}
    assert httpx.put(rill.url + "/ds/conformance").status_code == 401
    assert httpx.put(rill.url + "/ds/conformance", headers={"authorization": f"Bearer {writer}"}).status_code == 403
    assert httpx.put(rill.url + "/ds/conformance", headers=as_admin).status_code in (200, 201)
    yield rill, writer
    rill.stop()


def _base(server: RillProcess, family: str) -> str:
    return {"compat": server.url, "ds": server.url + "/ds/conformance", "legacy": server.url + "/streams"}[family]


def test_conformance_suite(server: RillProcess) -> None:
    """The three route families at once, against one node (the suite names its streams uniquely)."""
    _check_suites({family: _start_suite(_base(server, family)) for family in FAMILIES})


def test_conformance_suite_with_auth_on(secured: tuple[RillProcess, str]) -> None:
    """Auth on: every request of the suite carries a write:* token (conformance.test.ts wraps fetch)."""
    server, token = secured
    for family in FAMILIES:
        base = _base(server, family)
        assert (
            httpx.put(f"{base}/v1/stream/no-token-{family}", headers={"content-type": "text/plain"}).status_code == 401
        )
    _check_suites({family: _start_suite(_base(server, family), token) for family in FAMILIES})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillCluster]:
    root = tmp_path_factory.mktemp("conformance-cluster")
    cluster = RillCluster(root, 3, "--long-poll-timeout", str(LONG_POLL_SECONDS), env=WEBHOOKS).start()
    assert httpx.put(cluster.nodes[cluster.wait_for_leader()].url + "/ds/conformance").status_code in (200, 201)
    cluster.wait_converged()
    yield cluster
    cluster.stop()


def test_conformance_suite_through_a_follower(cluster: RillCluster) -> None:
    """A 3-node cluster with its defaults, the suite pointed at a follower once per route family, the
    three at once: writes are forwarded (Node's fetch cannot re-send a binary body on a 307), reads
    served there. Now and then each run idles past the nodes' keep-alive timeout (5 s), which closes
    idle peer connections; reads must not notice."""
    leader = cluster.wait_for_leader()
    follower = cluster.nodes[next(i for i in cluster.nodes if i != leader)]
    pause = (PAUSE_SECONDS, PAUSE_EVERY)
    _check_suites(
        {f"{family} through a follower": _start_suite(_base(follower, family), pause=pause) for family in FAMILIES}
    )


def _check_suites(runs: dict[str, subprocess.Popen[str]]) -> None:
    """Waits for every run and checks each; none is left running if one fails."""
    try:
        for name, run in runs.items():
            _check_suite(name, run)
    finally:
        for run in runs.values():
            run.kill()


def _start_suite(base: str, token: str | None = None, pause: tuple[float, int] | None = None) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "RILL_CONFORMANCE_URL": base,
        "RILL_LONG_POLL_MS": str(LONG_POLL_SECONDS * 1000),
        "RILL_CONFORMANCE_SUBSCRIPTIONS": "1",
    }
    if pause is not None:
        env["RILL_CONFORMANCE_PAUSE_MS"] = str(int(pause[0] * 1000))
        env["RILL_CONFORMANCE_PAUSE_EVERY"] = str(pause[1])
    if token is not None:
        env["RILL_CONFORMANCE_TOKEN"] = token
    vitest = [str(HERE / "node_modules" / ".bin" / "vitest"), "run", "--reporter=dot"]
    return subprocess.Popen(vitest, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _check_suite(name: str, run: subprocess.Popen[str]) -> None:
    try:
        stdout, _ = run.communicate(timeout=600)
    finally:
        run.kill()
    output = re.sub(r"\x1b\[[0-9;]*m", "", stdout)
    summary = re.search(r"Tests\s+(.*)", output)
    assert run.returncode == 0, output[-6000:]
    assert summary is not None and "failed" not in summary.group(1), output[-6000:]
    print(f"{name}: {summary.group(1).strip()}")  # shown with -s
    passed = re.search(r"(\d+) passed", summary.group(1))
    assert passed is not None and int(passed.group(1)) == ALL_TESTS, summary.group(1)  # none skipped
