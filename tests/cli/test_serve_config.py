"""`rill serve` with a bad configuration: one line on stderr naming the problem, exit status 2, no
traceback, and no server started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

ROOT = Path(__file__).resolve().parents[2]
PEERS = "1=http://127.0.0.1:1,2=http://127.0.0.1:2"
SECRET = "hunter2-not-in-output"


def serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Runs `rill serve` expecting a configuration error; returns its one line of stderr."""
    cmd = [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(tmp_path / "data"), *args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RILL_")}
    done = subprocess.run(cmd, cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rill: error: "), done.stderr
    assert not (tmp_path / "data").exists(), "nothing may start before the configuration is valid"
    return lines[0].removeprefix("rill: error: ")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    issued, other = ca.issue_cert("127.0.0.1"), ca.issue_cert("localhost")
    paths = {name: root / f"{name}.pem" for name in ("ca", "cert", "key", "other_key")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    issued.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    issued.private_key_pem.write_to_path(str(paths["key"]))
    other.private_key_pem.write_to_path(str(paths["other_key"]))
    return paths


def test_a_cluster_without_a_secret(tmp_path: Path) -> None:
    message = serve(tmp_path, "--peers", PEERS, "--node-id", "1")
    assert message.startswith("a cluster needs --cluster-secret")


def test_a_node_outside_its_peers(tmp_path: Path) -> None:
    message = serve(tmp_path, "--peers", PEERS, "--node-id", "3", "--cluster-secret", SECRET)
    assert message.startswith("node 3 is not among the peers [1, 2]")


def test_an_empty_cluster_secret_file(tmp_path: Path) -> None:
    secret = write(tmp_path, "secret", "\n")
    message = serve(tmp_path, "--peers", PEERS, "--node-id", "1", "--cluster-secret-file", str(secret))
    assert message == f"the cluster secret file {secret} is empty"


def test_a_missing_cluster_secret_file(tmp_path: Path) -> None:
    message = serve(tmp_path, "--cluster-secret-file", str(tmp_path / "nope"))
    assert message == f"cannot read {tmp_path / 'nope'}: No such file or directory"


def test_a_port_out_of_range(tmp_path: Path) -> None:
    assert serve(tmp_path, "--port", "99999") == "invalid settings: port: Input should be less than or equal to 65535"


def test_an_invalid_value_from_the_environment(tmp_path: Path) -> None:
    message = serve(tmp_path, env={"RILL_PORT": "abc"})
    assert message.startswith("invalid settings: port: Input should be a valid integer")


def test_a_missing_config_file(tmp_path: Path) -> None:
    message = serve(tmp_path, "--config", str(tmp_path / "rill.toml"))
    assert message == f"cannot read {tmp_path / 'rill.toml'}: No such file or directory"


def test_a_config_file_that_is_not_toml(tmp_path: Path) -> None:
    config = write(tmp_path, "rill.toml", "port = \n")
    assert serve(tmp_path, "--config", str(config)).startswith("the --config file is not valid TOML: ")


def test_a_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    config = tmp_path / "rill.toml"
    config.write_bytes(b'host = "\xff"\n')
    assert "not UTF-8" in serve(tmp_path, "--config", str(config))


def test_unknown_and_invalid_settings_are_named_together(tmp_path: Path) -> None:
    config = write(tmp_path, "rill.toml", 'bogus = 1\nlong_poll_timeout = -1\n[auth]\nmode = "maybe"\n')
    message = serve(tmp_path, "--config", str(config))
    assert message.startswith("invalid settings: ")
    assert "bogus: unknown setting" in message
    assert "long_poll_timeout: Input should be greater than 0" in message
    assert "auth.mode: Input should be 'off' or 'on'" in message


def test_setting_values_are_not_echoed(tmp_path: Path) -> None:
    """A misplaced secret must not end up in a terminal or a log."""
    config = write(tmp_path, "rill.toml", f'cluster_secret = ["{SECRET}"]\n')
    message = serve(tmp_path, "--config", str(config))
    assert message == "invalid settings: cluster_secret: Input should be a valid string"


def test_a_missing_tls_key_file(tmp_path: Path, certs: dict[str, Path]) -> None:
    missing = tmp_path / "key.pem"
    message = serve(tmp_path, "--tls-cert", str(certs["cert"]), "--tls-key", str(missing))
    assert message == f"--tls-key {missing}: No such file or directory"


def test_a_tls_cert_without_its_key(tmp_path: Path, certs: dict[str, Path]) -> None:
    assert serve(tmp_path, "--tls-cert", str(certs["cert"])) == "--tls-cert and --tls-key go together"


@pytest.mark.parametrize(("cert", "key"), [("cert", "other_key"), ("key", "key"), ("cert", "cert")])
def test_a_tls_cert_and_key_that_do_not_go_together(
    tmp_path: Path, certs: dict[str, Path], cert: str, key: str
) -> None:
    message = serve(tmp_path, "--tls-cert", str(certs[cert]), "--tls-key", str(certs[key]))
    assert message.startswith(f"--tls-cert {certs[cert]} and --tls-key {certs[key]} are not a PEM certificate")


def test_a_tls_ca_without_certificates(tmp_path: Path, certs: dict[str, Path]) -> None:
    message = serve(tmp_path, "--tls-ca", str(certs["key"]))
    assert message == f"--tls-ca {certs['key']} holds no PEM certificate"


def test_an_unknown_unsafe_test_fault(tmp_path: Path) -> None:
    message = serve(tmp_path, env={"RILL_UNSAFE_TEST_FAULT": "lose-everything"})
    assert "unsafe_test_fault" in message


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    taken = write(tmp_path, "taken", "")
    for data_dir in (taken, taken / "data"):
        message = serve(tmp_path, "--data-dir", str(data_dir))
        assert message == f"--data-dir {data_dir} cannot be used: {taken} is not a directory"


def test_a_stopped_server_does_not_wait_for_stuck_blocking_calls_to_exit() -> None:
    """Python joins every pool thread at exit: after Ctrl-C, a call stuck on a stalled object store
    held the stopped server's process for its timeout (about a minute)."""
    script = """
import asyncio, threading
from app.cli.program import leave_stuck_calls
from app.runtime import blocking

async def main():
    asyncio.ensure_future(blocking.run("backups", threading.Event().wait))  # never returns
    await asyncio.sleep(0.1)

asyncio.run(main())
try:
    raise KeyboardInterrupt
finally:
    leave_stuck_calls()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert b"exiting with 1 blocking call(s) still running" in done.stderr
