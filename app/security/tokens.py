"""Opaque bearer tokens from configuration, kept only as SHA-256 digests.

A token is `rill_` and 32 random bytes in URL-safe base64, so its digest cannot be reversed by
guessing; a lookup by digest therefore leaks nothing useful through timing.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime

from pydantic import BaseModel, Field, field_validator

from app.security.scopes import Principal, parse_scopes

PREFIX = "rill_"


class TokenConfig(BaseModel):
    """One `[[auth.tokens]]` entry."""

    name: str = Field(default="", description="who holds it, for logs and for you")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the token")
    scopes: list[str] = Field(min_length=1, description='e.g. ["read:*", "write:acme", "admin:*"]')
    expires_at: datetime | None = Field(default=None, description="RFC 3339; the token is refused from then on")

    @field_validator("scopes")
    @classmethod
    def _valid_scopes(cls, scopes: list[str]) -> list[str]:
        parse_scopes(scopes)  # raises ScopeError, a ValueError: pydantic reports it
        return scopes

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("expires_at needs a time zone, e.g. 2027-01-01T00:00:00Z")
        return value


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def _toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML also wants escaped."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_entry(token: str, scopes: list[str], name: str = "", expires_at: str | None = None) -> str:
    """The `[[auth.tokens]]` table that admits `token`."""
    fields = [f"name = {_toml_string(name)}"] if name else []
    fields += [f'sha256 = "{digest(token)}"', "scopes = [" + ", ".join(_toml_string(s) for s in scopes) + "]"]
    if expires_at:
        fields.append(f"expires_at = {expires_at}")
    return "[[auth.tokens]]\n" + "\n".join(fields) + "\n"


class TokenTable:
    def __init__(self, tokens: list[TokenConfig]) -> None:
        self._by_digest = {
            t.sha256: Principal(
                subject=t.name or f"token:{t.sha256[:8]}",
                grants=parse_scopes(t.scopes),
                expires_at=int(t.expires_at.timestamp() * 1000) if t.expires_at else None,
            )
            for t in tokens
        }

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def lookup(self, token: str) -> Principal | None:
        """The principal a token stands for; None if no entry admits it (expiry is the caller's check)."""
        return self._by_digest.get(digest(token))
