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


@pytest.mark.parametrize("family", ["compat", "ds", "legacy"])
def test_conformance_suite(server: RillProcess, family: str) -> None:
    _run_suite(_base(server, family))


@pytest.mark.parametrize("family", ["compat", "ds", "legacy"])
def test_conformance_suite_with_auth_on(secured: tuple[RillProcess, str], family: str) -> None:
    """Auth on: every request of the suite carries a write:* token (conformance.test.ts wraps fetch)."""
    server, token = secured
    base = _base(server, family)
    assert httpx.put(f"{base}/v1/stream/no-token-{family}", headers={"content-type": "text/plain"}).status_code == 401
    _run_suite(base, token)


def test_conformance_suite_through_a_follower(tmp_path: Path) -> None:
    """A 3-node cluster with its defaults, the suite pointed at a follower: writes are forwarded (Node's
    fetch cannot re-send a binary body on a 307), reads served there."""
    cluster = RillCluster(tmp_path, 3, "--long-poll-timeout", str(LONG_POLL_SECONDS), env=WEBHOOKS).start()
    try:
        leader = cluster.wait_for_leader()
        follower = next(i for i in cluster.nodes if i != leader)
        _run_suite(cluster.nodes[follower].url)
    finally:
        cluster.stop()


def _run_suite(base: str, token: str | None = None) -> None:
    env = {
        **os.environ,
        "RILL_CONFORMANCE_URL": base,
        "RILL_LONG_POLL_MS": str(LONG_POLL_SECONDS * 1000),
        "RILL_CONFORMANCE_SUBSCRIPTIONS": "1",
    }
    if token is not None:
        env["RILL_CONFORMANCE_TOKEN"] = token
    result = subprocess.run(
        [str(HERE / "node_modules" / ".bin" / "vitest"), "run", "--reporter=dot"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    summary = re.search(r"Tests\s+(.*)", output)
    assert result.returncode == 0, output[-6000:]
    assert summary is not None and "failed" not in summary.group(1), output[-6000:]
    print(f"{base}: {summary.group(1).strip()}")  # shown with -s
    passed = re.search(r"(\d+) passed", summary.group(1))
    assert passed is not None and int(passed.group(1)) == ALL_TESTS, summary.group(1)  # none skipped
