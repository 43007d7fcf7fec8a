"""`rill token create`: a new opaque token and the TOML entry that admits it, and nothing else."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from app.cli.program import main
from app.config import Settings
from app.security.scopes import Action
from app.security.tokens import PREFIX, TokenConfig, TokenTable, digest
from tests.security.helpers import AUDIENCE, ISSUER, JWKSServer, SigningKeys, mint
from tests.server import RillProcess


def create(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str, str]:
    """Runs `rill token create ARGS`: (token, TOML, stderr)."""
    main(["token", "create", *args])
    out, err = capsys.readouterr()
    token, blank, toml = out.partition("\n\n")
    assert blank, out
    return token, toml, err


def entry_of(toml: str) -> TokenConfig:
    tables = tomllib.loads(toml)
    assert list(tables) == ["auth"] and list(tables["auth"]) == ["tokens"], tables
    (entry,) = tables["auth"]["tokens"]
    return TokenConfig.model_validate(entry)


def test_the_printed_entry_admits_the_printed_token(capsys: pytest.CaptureFixture[str]) -> None:
    token, toml, err = create(capsys, "--scope", "write:acme", "--scope", "read:*")
    assert re.fullmatch(PREFIX + r"[A-Za-z0-9_-]{43}", token), token
    assert toml.startswith("[[auth.tokens]]\n")
    config = entry_of(toml)
    assert config.sha256 == digest(token)
    assert config.scopes == ["write:acme", "read:*"]
    assert config.name == "" and config.expires_at is None
    principal = TokenTable([config]).lookup(token)
    assert principal is not None
    assert principal.may(Action.WRITE, "acme") and principal.may(Action.READ, "zeta")
    assert not principal.may(Action.WRITE, "zeta") and not principal.may(Action.ADMIN, "acme")
    assert "not stored anywhere" in err  # the advice goes to stderr; stdout is the token and the entry
    assert token not in toml


def test_name_and_expiry(capsys: pytest.CaptureFixture[str]) -> None:
    token, toml, _ = create(
        capsys, "--scope", "admin:acme", "--name", 'ci "deploy" bot', "--expires-at", "2037-03-01T12:30:00+02:00"
    )
    config = entry_of(toml)
    assert config.name == 'ci "deploy" bot'
    assert config.expires_at == datetime(2037, 3, 1, 10, 30, tzinfo=UTC)
    principal = TokenTable([config]).lookup(token)
    assert principal is not None and principal.subject == 'ci "deploy" bot'
    assert principal.expires_at == int(datetime(2037, 3, 1, 10, 30, tzinfo=UTC).timestamp() * 1000)


def test_the_entry_loads_as_part_of_a_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    token, toml, _ = create(capsys, "--scope", "read:acme", "--expires-at", "2030-01-01T00:00:00Z")
    settings = Settings(**tomllib.loads('host = "0.0.0.0"\n\n[auth]\nmode = "on"\npublic_read = []\n\n' + toml))
    assert settings.auth.mode == "on"
    principal = TokenTable(settings.auth.tokens).lookup(token)
    assert principal is not None and principal.expires_at == 1_893_456_000_000


def test_every_run_makes_a_new_token(capsys: pytest.CaptureFixture[str]) -> None:
    first, _, _ = create(capsys, "--scope", "read")
    second, _, _ = create(capsys, "--scope", "read")
    assert first != second


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "root"], "a scope is read, write or admin"),
        (["--scope", "read:acme", "--scope", "write:"], "a scope is read, write or admin"),
        (["--scope", "read", "--expires-at", "2027-01-01T00:00:00"], "needs a time zone"),
        (["--scope", "read", "--expires-at", "next tuesday"], "must be an RFC 3339 timestamp"),
        (["--scope", "read", "--expires-at", "2020-01-01T00:00:00Z"], "has passed"),
        (["--scope", "read:ACME"], "a bucket id"),
    ],
)
def test_bad_arguments_print_no_token(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["token", "create", *args])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


def test_a_scope_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["token", "create", "--name", "x"])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--scope" in err


def test_the_rill_command() -> None:
    """The real entry point, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "token", "create", "--scope", "write:acme", "--name", "ops"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token, _, toml = done.stdout.partition("\n\n")
    config = entry_of(toml)
    assert config.name == "ops"
    principal = TokenTable([config]).lookup(token)
    assert principal is not None and principal.may(Action.WRITE, "acme")


def test_a_real_server_admits_the_token(tmp_path: Path, keys: SigningKeys) -> None:
    """`rill token create`, its entry pasted into the config file, `rill serve --config`: the token
    works, and a JWT whose kid would break the WWW-Authenticate header still gets a clean 401."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "token", "create", "--scope", "write:acme", "--scope", "admin:acme"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token, _, entry = done.stdout.partition("\n\n")
    with JWKSServer(keys.jwks()) as jwks:
        config = tmp_path / "rill.toml"
        jwt_table = f'[auth.jwt]\nissuer = "{ISSUER}"\naudience = "{AUDIENCE}"\njwks_url = "{jwks.url}"\n'
        config.write_text(f'[auth]\nmode = "on"\n\n{jwt_table}\n{entry}')
        server = RillProcess(tmp_path / "data", None, "--config", str(config)).start()
        try:
            with httpx.Client(base_url=server.url, timeout=10) as client:
                auth = {"authorization": f"Bearer {token}"}
                assert client.put("/ds/acme").status_code == 401
                assert client.put("/ds/acme", headers=auth).status_code == 201
                put = client.put("/ds/acme/s", content=b"hi", headers={**auth, "content-type": "text/plain"})
                assert put.status_code == 201
                read = client.get("/ds/acme/s", params={"offset": "-1"}, headers=auth)
                assert read.content == b"hi"
                assert client.get("/ds/zeta", headers=auth).status_code == 404
                bad = mint(keys.rsa, kid='k"\r\nset-cookie: x=1', scope="admin:*")
                resp = client.get("/ds/acme", headers={"authorization": f"Bearer {bad}"})
                assert resp.status_code == 401, resp.text
                assert "set-cookie" not in resp.headers
                assert resp.headers["www-authenticate"].startswith('Bearer realm="rill", error="invalid_token"')
        finally:
            server.stop()
