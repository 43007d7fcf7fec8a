"""From an `Authorization: Bearer` header to a Principal: configured opaque tokens first, then JWTs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, Field

from app.domain.errors import ProtocolError
from app.security.jwks import JWKSUnavailable
from app.security.jwt_tokens import InvalidToken, JWTConfig, JWTVerifier
from app.security.scopes import Principal
from app.security.tokens import TokenConfig, TokenTable

_VERIFIED_CACHE = 4096  # JWTs seen recently, so a signature is checked once per token, not per request
_VERIFIED_FOR_MS = 60_000  # then checked again: against the JWKS as it is now (a key may be withdrawn)


class AuthSettings(BaseModel):
    """The `[auth]` table."""

    mode: Literal["off", "on"] = Field(default="off", description="on: every data route needs a token with a scope")
    tokens: list[TokenConfig] = Field(default_factory=list)
    jwt: JWTConfig | None = None
    public_read: list[str] = Field(default_factory=list, description="buckets anyone may read without a token")


def unauthorized(message: str, error: str | None = None) -> ProtocolError:
    challenge = 'Bearer realm="rill"'
    if error is not None:
        challenge += f', error="{error}", error_description="{_description(message)}"'
    return ProtocolError(401, "unauthorized", message, {"www-authenticate": challenge})


def _description(message: str) -> str:
    """The message as RFC 6750 allows it in error_description (%x20-21 / %x23-5B / %x5D-7E): it can quote
    a token's own header (a JWT's kid), so quotes, backslashes, CR/LF and non-ASCII must not reach it."""
    return "".join(c if " " <= c <= "~" and c != "\\" else "?" for c in message.replace('"', "'"))


class Authenticator:
    def __init__(self, settings: AuthSettings, clock: Callable[[], int]) -> None:
        self.enabled = settings.mode == "on"
        self.public_read = frozenset(settings.public_read)
        self.tokens = TokenTable(settings.tokens)
        self.jwt = JWTVerifier(settings.jwt) if settings.jwt is not None else None
        self.clock = clock
        self._verified: dict[str, tuple[Principal, int]] = {}  # token -> (principal, until when, ms)

    @property
    def configured(self) -> bool:
        """Whether any credential could be accepted at all."""
        return bool(self.tokens) or self.jwt is not None

    async def principal(self, headers: Mapping[str, str]) -> Principal | None:
        """Who the request's bearer token stands for; None without one; 401 for a bad or expired one."""
        raw = headers.get("authorization")
        if raw is None:
            return None
        scheme, _, token = raw.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("use 'Authorization: Bearer <token>'", "invalid_request")
        principal = self.tokens.lookup(token)
        if principal is None and self.jwt is not None and token.count(".") == 2:
            principal = await self._verify_jwt(token)
        if principal is None:
            raise unauthorized("the token is not valid", "invalid_token")
        if principal.expired(self.clock()):
            raise unauthorized("the token has expired", "invalid_token")
        return principal

    async def _verify_jwt(self, token: str) -> Principal:
        assert self.jwt is not None
        cached = self._verified.get(token)
        if cached is not None and cached[1] > self.clock():
            return cached[0]
        try:
            principal = await self.jwt.verify(token)
        except InvalidToken as exc:
            raise unauthorized(f"the token is not valid: {exc}", "invalid_token") from None
        except JWKSUnavailable as exc:
            # Not a 401: the token may well be valid, and a client told so would only fetch another
            # token with the same kid. A 503 says to come back, and when.
            message = "the token's key is not known yet and the JWKS cannot be fetched now"
            raise ProtocolError(503, "jwks_unavailable", message, {"retry-after": str(exc.retry_after)}) from None
        if len(self._verified) >= _VERIFIED_CACHE:
            self._verified.clear()
        self._verified[token] = principal, self.clock() + _VERIFIED_FOR_MS
        return principal
