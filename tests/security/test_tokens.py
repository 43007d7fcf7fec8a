"""app/security/tokens.py and the opaque half of the Authenticator: digests, lookup, expiry, the header."""

from __future__ import annotations

import hashlib
import re
import tomllib
from datetime import UTC, datetime, timedelta, timezone

import pydantic
import pytest

from app.config import Settings
from app.domain.errors import ProtocolError
from app.security.authenticator import Authenticator, AuthSettings
from app.security.scopes import Action, Principal
from app.security.tokens import PREFIX, TokenConfig, TokenTable, digest, new_token, toml_entry

pytestmark = pytest.mark.anyio

NOW_MS = 1_800_000_000_000


def entry(token: str, scopes: list[str], name: str = "", expires_at: datetime | None = None) -> TokenConfig:
    return TokenConfig(name=name, sha256=digest(token), scopes=scopes, expires_at=expires_at)


def test_new_tokens_are_prefixed_random_and_url_safe() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert re.fullmatch(PREFIX + r"[A-Za-z0-9_-]{43}", token), token  # 32 bytes in base64url


def test_digest_is_the_hex_sha256_of_the_token() -> None:
    assert digest("rill_abc") == hashlib.sha256(b"rill_abc").hexdigest()


def test_lookup_by_digest() -> None:
    alice, bob = new_token(), new_token()
    table = TokenTable([entry(alice, ["write:acme"], "alice"), entry(bob, ["read:*", "admin:zeta"])])
    assert table
    found = table.lookup(alice)
    assert found == Principal("alice", {"acme": Action.WRITE}, None)
    unnamed = table.lookup(bob)
    assert unnamed is not None
    assert unnamed.subject == f"token:{digest(bob)[:8]}"  # unnamed: a short digest stands for it in logs
    assert unnamed.grants == {"*": Action.READ, "zeta": Action.ADMIN}
    assert table.lookup(new_token()) is None
    assert table.lookup(alice + "x") is None
    assert table.lookup(digest(alice)) is None  # the digest itself is no credential


def test_an_empty_table_is_falsy() -> None:
    assert not TokenTable([])


def test_expiry_in_milliseconds_and_left_to_the_caller() -> None:
    token = new_token()
    when = datetime(2027, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    found = TokenTable([entry(token, ["read"], expires_at=when)]).lookup(token)
    assert found is not None
    assert found.expires_at == 1_798_804_800_250
    assert not found.expired(1_798_804_800_249)
    assert found.expired(1_798_804_800_250)


def test_expiry_honours_the_time_zone() -> None:
    token = new_token()
    when = datetime(2027, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))  # 00:00 UTC
    found = TokenTable([entry(token, ["read"], expires_at=when)]).lookup(token)
    assert found is not None and found.expires_at == 1_798_761_600_000


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sha256": "ab" * 32, "scopes": []}, "at least 1 item"),
        ({"sha256": "ab" * 32, "scopes": ["root"]}, "a scope is read, write or admin"),
        ({"sha256": "AB" * 32, "scopes": ["read"]}, "String should match pattern"),
        ({"sha256": "ab" * 31, "scopes": ["read"]}, "String should match pattern"),
        ({"sha256": "ab" * 32, "scopes": ["read"], "expires_at": "2027-01-01T00:00:00"}, "needs a time zone"),
    ],
)
def test_token_config_validation(fields: dict[str, object], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        TokenConfig.model_validate(fields)


def test_toml_entry_round_trips_through_settings() -> None:
    token = new_token()
    text = toml_entry(token, ["write:acme", "read:*"], 'Ann "ops" \\ on-call', "2027-01-01T00:00:00Z")
    assert text.startswith("[[auth.tokens]]\n")
    config = tomllib.loads('[auth]\nmode = "on"\n' + text)
    settings = Settings(auth=config["auth"])
    (loaded,) = settings.auth.tokens
    assert loaded.name == 'Ann "ops" \\ on-call'
    assert loaded.sha256 == digest(token)
    assert loaded.scopes == ["write:acme", "read:*"]
    assert loaded.expires_at == datetime(2027, 1, 1, tzinfo=UTC)
    found = TokenTable(settings.auth.tokens).lookup(token)
    assert found is not None and found.may(Action.WRITE, "acme") and not found.may(Action.WRITE, "zeta")


@pytest.mark.parametrize("name", ["tab\there", "new\nline", "del\x7f", "ünï ☃", "back\\slash", 'q"uote'])
def test_toml_entry_escapes_names(name: str) -> None:
    """The entry is TOML whatever the name holds (it used to be pasted in between bare quotes)."""
    parsed = tomllib.loads(toml_entry(new_token(), ["read"], name))
    assert parsed["auth"]["tokens"][0]["name"] == name


def test_toml_entry_leaves_out_what_is_not_given() -> None:
    parsed = tomllib.loads(toml_entry(new_token(), ["read"]))
    assert set(parsed["auth"]["tokens"][0]) == {"sha256", "scopes"}


def authenticator(*entries: TokenConfig, now_ms: int = NOW_MS) -> Authenticator:
    return Authenticator(AuthSettings(mode="on", tokens=list(entries)), lambda: now_ms)


def _challenge(info: pytest.ExceptionInfo[ProtocolError]) -> str:
    assert (info.value.status, info.value.code) == (401, "unauthorized")
    return info.value.headers["www-authenticate"]


async def test_no_authorization_header_is_no_principal() -> None:
    assert await authenticator().principal({}) is None


async def test_a_configured_token_is_its_principal() -> None:
    token = new_token()
    auth = authenticator(entry(token, ["admin:acme"], "ops"))
    assert auth.enabled and auth.configured
    found = await auth.principal({"authorization": f"Bearer {token}"})
    assert found == Principal("ops", {"acme": Action.ADMIN}, None)
    # The scheme is case-insensitive and blanks around the token do not matter.
    assert await auth.principal({"authorization": f"bearer   {token} "}) == found


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Token rill_x", "rill_x"])
async def test_a_header_that_is_no_bearer_token_is_invalid_request(header: str) -> None:
    with pytest.raises(ProtocolError) as info:
        await authenticator().principal({"authorization": header})
    assert _challenge(info).startswith('Bearer realm="rill", error="invalid_request"')


async def test_an_unknown_token_is_invalid() -> None:
    auth = authenticator(entry(new_token(), ["read"]))
    with pytest.raises(ProtocolError) as info:
        await auth.principal({"authorization": f"Bearer {new_token()}"})
    assert _challenge(info) == (
        'Bearer realm="rill", error="invalid_token", error_description="the token is not valid"'
    )


async def test_a_jwt_shaped_token_without_a_jwt_config_is_invalid() -> None:
    with pytest.raises(ProtocolError) as info:
        await authenticator().principal({"authorization": "Bearer aaa.bbb.ccc"})
    assert 'error="invalid_token"' in _challenge(info)


async def test_an_expired_token_is_refused_from_its_expiry_on() -> None:
    token = new_token()
    expires = datetime.fromtimestamp(NOW_MS / 1000, UTC)
    with pytest.raises(ProtocolError) as info:
        await authenticator(entry(token, ["read"], expires_at=expires)).principal({"authorization": f"Bearer {token}"})
    assert _challenge(info) == ('Bearer realm="rill", error="invalid_token", error_description="the token has expired"')
    earlier = authenticator(entry(token, ["read"], expires_at=expires), now_ms=NOW_MS - 1)
    found = await earlier.principal({"authorization": f"Bearer {token}"})
    assert found is not None and found.expires_at == NOW_MS


def test_auth_is_off_and_unconfigured_by_default() -> None:
    auth = Authenticator(Settings().auth, lambda: NOW_MS)
    assert not auth.enabled and not auth.configured and auth.public_read == frozenset()


def test_auth_on_as_a_bare_string_in_toml() -> None:
    """`auth = "on"` is short for `[auth] mode = "on"`."""
    assert Settings(auth="on").auth.mode == "on"  # type: ignore[arg-type]
