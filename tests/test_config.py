"""app/config.py: where each setting comes from. Flags win over RILL_* variables, which win over the
file, key by key within a table (as the README says)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import load_settings, parse_peers

FILE = """
port = 4437
long_poll_timeout = 7.0
[auth]
mode = "off"
public_read = ["open"]
"""


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rill.toml"
    path.write_text(FILE)
    return path


def test_the_environment_wins_over_the_file(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RILL_PORT", "5555")
    monkeypatch.setenv("RILL_AUTH__MODE", "on")
    settings = load_settings(config)
    assert settings.port == 5555
    assert settings.auth.mode == "on"  # not left off by the file: that would serve without auth
    assert settings.auth.public_read == ["open"]  # the file's other keys of the table stay
    assert settings.long_poll_timeout == 7.0


def test_flags_win_over_the_environment(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RILL_PORT", "5555")
    assert load_settings(config, port=6666).port == 6666


def test_without_a_file_the_environment_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RILL_LONG_POLL_TIMEOUT", "3")
    assert load_settings().long_poll_timeout == 3.0


def test_a_bad_value_from_the_environment_is_a_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RILL_PEERS", "{not json")
    with pytest.raises(ValueError):
        load_settings()


def test_peer_ids_are_ascii_integers_a_node_can_have() -> None:
    assert parse_peers("1=http://a:1, 2=http://b:2/") == {1: "http://a:1", 2: "http://b:2"}
    for bad in ("²=http://a:1", "0=http://a:1", f"{1 << 63}=http://a:1", "x=http://a:1", "1=", "1"):
        with pytest.raises(ValueError):
            parse_peers(bad)
