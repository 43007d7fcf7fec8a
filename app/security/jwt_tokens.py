"""JWT access tokens (RFC 9068) verified with PyJWT against a JWKS file or URL.

The signature, `iss`, `aud`, `exp` and `nbf` are checked by PyJWT; the header's `typ` must be
`at+jwt` (RFC 9068 section 4) unless configured otherwise. Scopes come from the `scope` claim
(space-separated) or `scp` (a list); scopes that are not Rill's are ignored. Keys at a JWKS URL
are fetched as `jwks.RemoteJWKS` says.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from urllib.parse import urlsplit

import jwt
from pydantic import BaseModel, Field, field_validator, model_validator

from app.security.jwks import RemoteJWKS, UnknownKid
from app.security.scopes import Principal, known_scopes, parse_scopes

_ACCESS_TOKEN_TYPES = {"at+jwt", "application/at+jwt"}


class JWTConfig(BaseModel):
    """The `[auth.jwt]` table."""

    issuer: str = Field(description="the `iss` every token must carry")
    audience: str = Field(description="the `aud` a token must name: this service")
    jwks_file: Path | None = Field(None, description="a JWKS document on disk")
    jwks_url: str | None = Field(None, description="a JWKS URL, fetched and cached (keys are refetched on a new kid)")
    jwks_timeout_seconds: float = Field(5.0, gt=0, le=60, description="how long a fetch of jwks_url may take")
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "EdDSA"])
    leeway_seconds: int = Field(30, ge=0, le=300, description="clock skew allowed on exp and nbf")
    require_typ: bool = Field(True, description='the header must say typ "at+jwt", as RFC 9068 asks')

    @field_validator("jwks_url")
    @classmethod
    def _https(cls, url: str | None) -> str | None:
        # Whoever can change the keys on the way can sign any token: plain HTTP only to this machine.
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme != "https" and not (parts.scheme == "http" and is_loopback(parts.hostname or "")):
                raise ValueError("jwks_url must be https:// (http:// only to a loopback address)")
        return url

    @model_validator(mode="after")
    def _one_source(self) -> JWTConfig:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("[auth.jwt] needs exactly one of jwks_file or jwks_url")
        return self


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class InvalidToken(Exception):
    pass


class JWTVerifier:
    def __init__(self, config: JWTConfig) -> None:
        self.config = config
        self.remote = RemoteJWKS(config.jwks_url, config.jwks_timeout_seconds) if config.jwks_url else None
        self._keys: dict[str, jwt.PyJWK] = {}
        if config.jwks_file is not None:
            keys = jwt.PyJWKSet.from_dict(json.loads(config.jwks_file.read_text())).keys
            self._keys = {k.key_id or "": k for k in keys if k.public_key_use in ("sig", None)}  # as the URL's

    async def verify(self, token: str) -> Principal:
        """The principal a valid access token stands for; InvalidToken otherwise, and JWKSUnavailable when
        the token's kid is new and the JWKS URL cannot be fetched. Waits only for a JWKS fetch."""
        try:
            header = jwt.get_unverified_header(token)
            if self.config.require_typ and str(header.get("typ", "")).lower() not in _ACCESS_TOKEN_TYPES:
                raise InvalidToken("not an access token (typ must be at+jwt)")
            key = await self._key(header.get("kid"))
            claims = jwt.decode(
                token,
                key,
                algorithms=self.config.algorithms,
                audience=self.config.audience,
                issuer=self.config.issuer,
                leeway=self.config.leeway_seconds,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise InvalidToken(str(exc)) from None
        return Principal(str(claims["sub"]), parse_scopes(known_scopes(_scopes(claims))), int(claims["exp"]) * 1000)

    async def _key(self, kid: object) -> jwt.PyJWK:
        if self.remote is not None:
            if not isinstance(kid, str):
                raise InvalidToken("the token's kid is missing or not a string")
            try:
                return await self.remote.key(kid)
            except UnknownKid:
                shown = kid if len(kid) <= 64 else kid[:64] + "..."  # it goes into WWW-Authenticate
                raise InvalidToken(f'Unable to find a signing key that matches: "{shown}"') from None
        if isinstance(kid, str) and kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        raise InvalidToken("no key in the JWKS matches the token's kid")


def _scopes(claims: dict[str, object]) -> list[str]:
    """`scope` (space-separated) or `scp` (a list of strings); anything else in them grants nothing."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list):
        return [s for s in raw if isinstance(s, str)]
    return []
