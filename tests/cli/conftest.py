"""Servers and runners for the CLI tests: a real `rill serve` per module, the CLI run in-process
(`invoke`) or as a subprocess (`run`, `Background`) with its own stdin, stdout and stderr."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from app.cli.program import main
from app.security.tokens import new_token, toml_entry
from tests.server import RillProcess

ROOT = Path(__file__).resolve().parents[2]
TOKEN = new_token()
# Small read chunks, short SSE responses and long-polls: reads take many requests, tails reconnect.
FAST = {"RILL_READ_CHUNK_BYTES": "4096", "RILL_SSE_MAX_SECONDS": "1", "RILL_LONG_POLL_TIMEOUT": "1"}


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RILL_URL", "RILL_TOKEN")}
    return {**env, **(extra or {})}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    process = RillProcess(tmp_path_factory.mktemp("cli") / "data", None, env=FAST).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    root = tmp_path_factory.mktemp("cli-auth")
    config = root / "rill.toml"
    config.write_text(toml_entry(TOKEN, ["admin:*"], "cli-test"))
    process = RillProcess(root / "data", None, "--auth", "on", "--config", str(config), env=FAST).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RILL_URL", raising=False)
    monkeypatch.delenv("RILL_TOKEN", raising=False)


def invoke(capsys: pytest.CaptureFixture[bytes], *argv: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    """Runs `rill ARGV` in this process (use the capsysbinary fixture) with `stdin`: exit status,
    stdout, stderr."""
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = saved
    out, err = capsys.readouterr()
    return code, out, err.decode()


def run(*argv: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Runs `rill ARGV` as a subprocess with `stdin` piped in."""
    cmd = [sys.executable, "-m", "app.cli", *argv]
    return subprocess.run(cmd, input=stdin, capture_output=True, cwd=ROOT, env=_clean_env(env), timeout=60)


def _ctrl_c_default() -> None:
    """Ctrl-C as at a terminal: a test suite started in the background (`make test &`, nohup) hands
    its children an ignored SIGINT, and then the tests that press Ctrl-C would wait forever."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Background:
    """A `rill` subprocess (a tail) whose stdout lines are read with a timeout. `launcher` is what
    runs the CLI: `-m app.cli`, or `-c CODE ARGS...` for a script that patches something first."""

    def __init__(self, *argv: str, launcher: Sequence[str] = ("-m", "app.cli")) -> None:
        cmd = [sys.executable, *launcher, *argv]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=_clean_env(),
            preexec_fn=_ctrl_c_default,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def line(self, timeout: float = 15.0) -> bytes:
        return self.lines.get(timeout=timeout)

    def rest(self) -> bytes:
        """Everything not read yet, once the process has exited."""
        self.pump.join(5)
        out = b""
        while not self.lines.empty():
            out += self.lines.get()
        return out

    def wait(self, timeout: float = 15.0) -> tuple[int, str]:
        """The exit status and stderr."""
        code = self.proc.wait(timeout)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
