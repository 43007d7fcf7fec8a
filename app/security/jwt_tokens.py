"""JWT access tokens (RFC 9068) verified with PyJWT against a JWKS file or URL.

The signature, `iss`, `aud`, `exp` and `nbf` are checked by PyJWT; the header's `typ` must be
`at+jwt` (RFC 9068 section 4) unless configured otherwise. Scopes come from the `scope` claim
(space-separated) or `scp` (a list); scopes that are not Rill's are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import jwt
from pydantic import BaseModel, Field, model_validator

from app.security.scopes import Principal, known_scopes, parse_scopes

_ACCESS_TOKEN_TYPES = {"at+jwt", "application/at+jwt"}


class JWTConfig(BaseModel):
    """The `[auth.jwt]` table."""

    issuer: str = Field(description="the `iss` every token must carry")
    audience: str = Field(description="the `aud` a token must name: this service")
    jwks_file: Path | None = Field(None, description="a JWKS document on disk")
    jwks_url: str | None = Field(None, description="a JWKS URL, fetched and cached (keys are refetched on a new kid)")
    algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256", "EdDSA"])
    leeway_seconds: int = Field(30, ge=0, le=300, description="clock skew allowed on exp and nbf")
    require_typ: bool = Field(True, description='the header must say typ "at+jwt", as RFC 9068 asks')

    @model_validator(mode="after")
    def _one_source(self) -> JWTConfig:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("[auth.jwt] needs exactly one of jwks_file or jwks_url")
        return self


class InvalidToken(Exception):
    pass


class JWTVerifier:
    def __init__(self, config: JWTConfig) -> None:
        self.config = config
        self.remote = config.jwks_url is not None
        self._client = jwt.PyJWKClient(config.jwks_url, cache_keys=True) if config.jwks_url else None
        self._keys: dict[str, jwt.PyJWK] = {}
        if config.jwks_file is not None:
            keys = jwt.PyJWKSet.from_dict(json.loads(config.jwks_file.read_text())).keys
            self._keys = {k.key_id or "": k for k in keys}

    def verify(self, token: str) -> Principal:
        """The principal a valid access token stands for; InvalidToken otherwise. May block (a JWKS URL)."""
        try:
            header = jwt.get_unverified_header(token)
            if self.config.require_typ and str(header.get("typ", "")).lower() not in _ACCESS_TOKEN_TYPES:
                raise InvalidToken("not an access token (typ must be at+jwt)")
            key = self._key(token, header.get("kid"))
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

    def _key(self, token: str, kid: object) -> jwt.PyJWK:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token)
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
