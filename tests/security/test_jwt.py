"""app/security/jwt_tokens.py: JWT access tokens checked against a JWKS file or URL, and their scopes.

The keys are made here (an RSA and an EC P-256 key), the tokens signed with PyJWT, and the JWKS
served from a file or from a small HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pydantic
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from app.domain.errors import ProtocolError
from app.security.authenticator import Authenticator, AuthSettings
from app.security.jwks import JWKSUnavailable
from app.security.jwt_tokens import InvalidToken, JWTConfig, JWTVerifier
from app.security.scopes import Action, Principal
from tests.security.helpers import (
    AUDIENCE,
    ISSUER,
    JWKSServer,
    SigningKeys,
    jwt_config,
    mint,
    public_jwk,
    write_jwks,
)

NOW = int(time.time())


@pytest.fixture(autouse=True)
def _fresh_now() -> None:
    """Times in these tests are relative to NOW: take it when each test starts, not at collection."""
    global NOW
    NOW = int(time.time())


@pytest.fixture()
def verifier(jwks_file: Path) -> JWTVerifier:
    return JWTVerifier(jwt_config(jwks_file))


def verified(verifier: JWTVerifier, token: str) -> Principal:
    return asyncio.run(verifier.verify(token))


def rejected(verifier: JWTVerifier, token: str) -> str:
    with pytest.raises(InvalidToken) as info:
        verified(verifier, token)
    return str(info.value)


def test_a_valid_rsa_token(verifier: JWTVerifier, keys: SigningKeys) -> None:
    token = mint(keys.rsa, scope="write:acme read:*", sub="svc-42", exp=NOW + 600)
    assert verified(verifier, token) == Principal(
        "svc-42", {"acme": Action.WRITE, "*": Action.READ}, (NOW + 600) * 1000
    )


def test_a_valid_ec_token(verifier: JWTVerifier, keys: SigningKeys) -> None:
    principal = verified(verifier, mint(keys.ec, kid="ec-1", alg="ES256", scope="admin:zeta"))
    assert principal.grants == {"zeta": Action.ADMIN}


def test_an_eddsa_token(tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "ed-1", "alg": "EdDSA"}]}
    verifier = JWTVerifier(jwt_config(write_jwks(tmp_path / "jwks.json", jwks)))
    assert verified(verifier, mint(key, kid="ed-1", alg="EdDSA", scope="read")).grants == {"*": Action.READ}


@pytest.mark.parametrize("typ", ["at+jwt", "AT+JWT", "application/at+jwt"])
def test_access_token_types(verifier: JWTVerifier, keys: SigningKeys, typ: str) -> None:
    assert verified(verifier, mint(keys.rsa, typ=typ, scope="read")).grants == {"*": Action.READ}


def test_a_token_without_kid_when_the_jwks_has_one_key(keys: SigningKeys, tmp_path: Path) -> None:
    jwk = public_jwk(keys.rsa, "rsa-1", "RS256")
    del jwk["kid"]
    verifier = JWTVerifier(jwt_config(write_jwks(tmp_path / "jwks.json", {"keys": [jwk]})))
    assert verified(verifier, mint(keys.rsa, kid=None, scope="read")).subject == "alice"


def test_a_jwks_file_key_for_encryption_verifies_nothing(keys: SigningKeys, tmp_path: Path) -> None:
    """As with a JWKS URL: a key published for encryption (`use: enc`) is no signing key."""
    jwk = {**public_jwk(keys.rsa, "rsa-1", "RS256"), "use": "enc"}
    verifier = JWTVerifier(jwt_config(write_jwks(tmp_path / "jwks.json", {"keys": [jwk]})))
    with pytest.raises(InvalidToken):
        verified(verifier, mint(keys.rsa, scope="read"))


def test_exp_and_nbf_within_the_leeway(verifier: JWTVerifier, keys: SigningKeys) -> None:
    """PyJWT allows `leeway_seconds` (30) of clock skew; the Authenticator then holds exp exactly."""
    assert verified(verifier, mint(keys.rsa, exp=NOW - 10)).expires_at == (NOW - 10) * 1000
    assert verified(verifier, mint(keys.rsa, nbf=NOW + 10)).subject == "alice"


@pytest.mark.parametrize(
    ("claims", "grants"),
    [
        ({"scope": "read:acme write:zeta"}, {"acme": Action.READ, "zeta": Action.WRITE}),
        ({"scp": ["read:acme", "admin:zeta"]}, {"acme": Action.READ, "zeta": Action.ADMIN}),
        ({"scope": "openid profile read:acme email api://other/.default"}, {"acme": Action.READ}),
        ({"scp": ["openid", "write:*", "User.Read"]}, {"*": Action.WRITE}),
        ({"scope": "read:acme", "scp": ["admin:*"]}, {"acme": Action.READ}),  # scope wins over scp
        ({"scope": "  read:acme   write:acme  "}, {"acme": Action.WRITE}),
        ({"scope": "openid profile"}, {}),
        ({}, {}),
        ({"scp": ["read:acme", 7, None, {"admin": "*"}]}, {"acme": Action.READ}),
    ],
)
def test_scopes_from_scope_or_scp(
    verifier: JWTVerifier, keys: SigningKeys, claims: dict[str, Any], grants: dict[str, Action]
) -> None:
    assert verified(verifier, mint(keys.rsa, **claims)).grants == grants


@pytest.mark.parametrize("scope", [42, True, {"admin:*": True}, ["admin:*"], None])
def test_a_scope_claim_of_another_type_grants_nothing_and_does_not_crash(
    verifier: JWTVerifier, keys: SigningKeys, scope: object
) -> None:
    """A number used to raise TypeError (a 500), and an object granted its keys (admin:*)."""
    token = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "s", "exp": NOW + 60, "scope": scope},
        keys.rsa,
        algorithm="RS256",
        headers={"kid": "rsa-1", "typ": "at+jwt"},
    )
    expected = {"*": Action.ADMIN} if scope == ["admin:*"] else {}  # a list in `scope` reads like `scp`
    assert verified(verifier, token).grants == expected


def test_wrong_audience(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert "audience" in rejected(verifier, mint(keys.rsa, aud="another-api", scope="admin:*")).lower()


def test_audience_list_must_name_this_service(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert verified(verifier, mint(keys.rsa, aud=["another-api", AUDIENCE])).subject == "alice"
    rejected(verifier, mint(keys.rsa, aud=["another-api", "third-api"]))


def test_wrong_issuer(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert "issuer" in rejected(verifier, mint(keys.rsa, iss="https://evil.example")).lower()


def test_expired_past_the_leeway(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert "expired" in rejected(verifier, mint(keys.rsa, iat=NOW - 600, exp=NOW - 60)).lower()


def test_not_yet_valid(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert "not yet valid" in rejected(verifier, mint(keys.rsa, nbf=NOW + 120)).lower()


@pytest.mark.parametrize("claim", ["exp", "iss", "aud", "sub"])
def test_required_claims(verifier: JWTVerifier, keys: SigningKeys, claim: str) -> None:
    omitted: dict[str, Any] = {claim: None}
    assert claim in rejected(verifier, mint(keys.rsa, **omitted))


@pytest.mark.parametrize("typ", [None, "JWT", "jwt", "id_token+jwt", "at+jwt2"])
def test_only_access_tokens(verifier: JWTVerifier, keys: SigningKeys, typ: str | None) -> None:
    """An ID token signed by the same issuer must not pass for an access token (RFC 9068 section 4)."""
    assert rejected(verifier, mint(keys.rsa, typ=typ)) == "not an access token (typ must be at+jwt)"


def test_typ_not_required_when_configured(keys: SigningKeys, jwks_file: Path) -> None:
    verifier = JWTVerifier(jwt_config(jwks_file, require_typ=False))
    assert verified(verifier, mint(keys.rsa, typ=None)).subject == "alice"
    assert verified(verifier, mint(keys.rsa, typ="JWT")).subject == "alice"


def test_unknown_kid(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert rejected(verifier, mint(keys.rsa, kid="rsa-2")) == "no key in the JWKS matches the token's kid"


def test_no_kid_when_the_jwks_has_several_keys(verifier: JWTVerifier, keys: SigningKeys) -> None:
    assert rejected(verifier, mint(keys.rsa, kid=None)) == "no key in the JWKS matches the token's kid"


def test_bad_signature_from_another_key(verifier: JWTVerifier) -> None:
    impostor = rsa.generate_private_key(65537, 2048)
    assert "signature" in rejected(verifier, mint(impostor, kid="rsa-1", scope="admin:*")).lower()


def test_tampered_payload(verifier: JWTVerifier, keys: SigningKeys) -> None:
    header, _, signature = mint(keys.rsa, scope="read:acme").split(".")
    payload = _b64({"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": NOW + 300, "scope": "admin:*"})
    assert "signature" in rejected(verifier, f"{header}.{payload}.{signature}").lower()


def test_a_key_of_another_type_under_the_kid(verifier: JWTVerifier, keys: SigningKeys) -> None:
    rejected(verifier, mint(keys.ec, kid="rsa-1", alg="ES256"))


def test_algorithms_outside_the_list(verifier: JWTVerifier, keys: SigningKeys) -> None:
    rejected(verifier, mint(keys.rsa, alg="RS384"))
    # The public key as an HMAC secret (algorithm confusion): HS256 is not accepted.
    pem = keys.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = _b64({"alg": "HS256", "kid": "rsa-1", "typ": "at+jwt"})
    payload = _b64({"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": NOW + 60, "scope": "admin:*"})
    mac = hmac.new(pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()  # PyJWT refuses to sign this
    signature = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    assert "alg" in rejected(verifier, f"{header}.{payload}.{signature}").lower()


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def test_unsigned_token(verifier: JWTVerifier) -> None:
    token = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": NOW + 60, "scope": "admin:*"},
        "",
        algorithm="none",
        headers={"kid": "rsa-1", "typ": "at+jwt"},
    )
    rejected(verifier, token)


@pytest.mark.parametrize("token", ["not-a-jwt", "a.b.c", "", "...."])
def test_garbage(verifier: JWTVerifier, token: str) -> None:
    rejected(verifier, token)


def test_exactly_one_jwks_source(jwks_file: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly one of jwks_file or jwks_url"):
        JWTConfig(issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(pydantic.ValidationError, match="exactly one of jwks_file or jwks_url"):
        JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=jwks_file, jwks_url="http://127.0.0.1:1/jwks")


def test_leeway_is_bounded(jwks_file: Path) -> None:
    with pytest.raises(pydantic.ValidationError):
        jwt_config(jwks_file, leeway_seconds=301)


@pytest.fixture()
def jwks_server(keys: SigningKeys) -> Iterator[JWKSServer]:
    with JWKSServer(keys.jwks()) as server:
        yield server


def url_verifier(server: JWKSServer) -> JWTVerifier:
    return JWTVerifier(JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=server.url))


def test_jwks_url_valid_tokens(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    verifier = url_verifier(jwks_server)
    assert verifier.remote
    assert verified(verifier, mint(keys.rsa, scope="read:acme")).grants == {"acme": Action.READ}
    assert verified(verifier, mint(keys.ec, kid="ec-1", alg="ES256", scp=["write:acme"])).grants == {
        "acme": Action.WRITE
    }
    assert jwks_server.fetches == 1  # the set is cached


def test_jwks_url_refuses_what_the_file_refuses(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    verifier = url_verifier(jwks_server)
    rejected(verifier, mint(keys.rsa, aud="another-api"))
    rejected(verifier, mint(keys.rsa, iss="https://evil.example"))
    rejected(verifier, mint(keys.rsa, exp=NOW - 60))
    rejected(verifier, mint(keys.rsa, typ="JWT"))
    rejected(verifier, mint(rsa.generate_private_key(65537, 2048), kid="rsa-1"))
    assert "unable to find a signing key" in rejected(verifier, mint(keys.rsa, kid="rsa-9")).lower()


def test_jwks_url_picks_up_a_rotated_key(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    """A new kid makes the verifier fetch the set again, at most once per `refetch_seconds` (10 s)."""
    verifier = url_verifier(jwks_server)
    assert verified(verifier, mint(keys.rsa)).subject == "alice"
    new_key = ec.generate_private_key(ec.SECP256R1())
    jwks_server.jwks = {"keys": [*jwks_server.jwks["keys"], public_jwk(new_key, "ec-2", "ES256")]}
    rotated = mint(new_key, kid="ec-2", alg="ES256", scope="read")
    rejected(verifier, rotated)  # within the refetch interval: the cached set, no new fetch
    assert jwks_server.fetches == 1
    assert verifier.remote is not None
    verifier.remote.refetch_seconds = 0
    assert verified(verifier, rotated).grants == {"*": Action.READ}
    assert jwks_server.fetches == 2


def test_jwks_url_unreachable_is_unavailable(keys: SigningKeys) -> None:
    """Not an invalid token: the key is unknown, not wrong (the Authenticator answers 503)."""
    with socket.socket() as bound:  # bound, never listening: connections are refused, and no one else gets the port
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}/jwks"
        verifier = JWTVerifier(JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url))
        started = time.monotonic()
        with pytest.raises(JWKSUnavailable) as info:
            verified(verifier, mint(keys.rsa))
        assert "cannot be fetched" in str(info.value)
        assert 1 <= info.value.retry_after <= 10
        assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_authenticator_with_a_jwks_url(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    config = JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks_server.url)
    auth = Authenticator(AuthSettings(mode="on", jwt=config), lambda: NOW * 1000)
    assert auth.configured
    principal = await auth.principal({"authorization": "Bearer " + mint(keys.rsa, scope="admin:acme")})
    assert principal is not None and principal.grants == {"acme": Action.ADMIN}
    with pytest.raises(ProtocolError) as info:
        await auth.principal({"authorization": "Bearer " + mint(keys.rsa, aud="another-api")})
    assert info.value.status == 401
    assert info.value.headers["www-authenticate"].startswith(
        'Bearer realm="rill", error="invalid_token", error_description="the token is not valid: '
    )


async def _verified_once(jwks_file: Path, token: str) -> tuple[Authenticator, list[int], dict[str, str]]:
    """An authenticator on a clock (the list's one element, ms) that has verified `token` once."""
    now = [NOW * 1000]
    auth = Authenticator(AuthSettings(mode="on", jwt=jwt_config(jwks_file)), lambda: now[0])
    header = {"authorization": f"Bearer {token}"}
    assert await auth.principal(header) is not None
    return auth, now, header


@pytest.mark.anyio
async def test_authenticator_checks_a_cached_jwt_for_expiry(
    jwks_file: Path, keys: SigningKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth, now, header = await _verified_once(jwks_file, mint(keys.rsa, exp=NOW + 30, scope="read"))
    calls = []
    assert auth.jwt is not None

    async def verify(token: str) -> None:
        calls.append(token)

    monkeypatch.setattr(auth.jwt, "verify", verify)
    assert await auth.principal(header) is not None  # from the cache: no second verification
    assert calls == []
    now[0] = (NOW + 30) * 1000
    with pytest.raises(ProtocolError) as info:
        await auth.principal(header)
    assert info.value.headers["www-authenticate"].endswith('error_description="the token has expired"')


@pytest.mark.anyio
async def test_a_cached_jwt_is_verified_again_after_a_minute(
    jwks_file: Path, keys: SigningKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the keys as they are then: one the provider withdrew stops verifying its tokens."""
    auth, now, header = await _verified_once(jwks_file, mint(keys.rsa, exp=NOW + 3600, scope="read"))
    assert auth.jwt is not None

    async def withdrawn(token: str) -> None:
        raise InvalidToken("no key for its kid")

    monkeypatch.setattr(auth.jwt, "verify", withdrawn)
    now[0] += 59_000
    assert await auth.principal(header) is not None
    now[0] += 1_000
    with pytest.raises(ProtocolError) as info:
        await auth.principal(header)
    assert info.value.status == 401


@pytest.mark.anyio
async def test_authenticator_holds_exp_exactly_despite_the_leeway(jwks_file: Path, keys: SigningKeys) -> None:
    """Within PyJWT's leeway the signature checks out, but an expired token is still refused."""
    auth = Authenticator(AuthSettings(mode="on", jwt=jwt_config(jwks_file)), lambda: NOW * 1000)
    with pytest.raises(ProtocolError) as info:
        await auth.principal({"authorization": "Bearer " + mint(keys.rsa, exp=NOW - 5)})
    assert info.value.headers["www-authenticate"].endswith('error_description="the token has expired"')


@pytest.mark.anyio
async def test_opaque_tokens_are_tried_before_jwts(jwks_file: Path, keys: SigningKeys) -> None:
    from app.security.tokens import TokenConfig, digest

    jwt_token = mint(keys.rsa, scope="read")
    opaque = TokenConfig(name="pinned", sha256=digest(jwt_token), scopes=["admin:*"])
    auth = Authenticator(AuthSettings(mode="on", tokens=[opaque], jwt=jwt_config(jwks_file)), lambda: NOW * 1000)
    principal = await auth.principal({"authorization": f"Bearer {jwt_token}"})
    assert principal is not None and principal.subject == "pinned"


@pytest.mark.anyio
@pytest.mark.parametrize("kid", ['x"y', "a\r\nSet-Cookie: pwned=1", "\u2603", "back\\slash"])
async def test_the_challenge_stays_a_valid_header_whatever_the_kid(
    jwks_server: JWKSServer, keys: SigningKeys, kid: str
) -> None:
    """PyJWKClient quotes the unknown kid in its error, and the error went into error_description
    as it was: quotes broke the header's syntax, CR/LF made the server fail the response (uvicorn
    refuses such a header), non-Latin-1 failed its encoding."""
    config = JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks_server.url)
    auth = Authenticator(AuthSettings(mode="on", jwt=config), lambda: NOW * 1000)
    with pytest.raises(ProtocolError) as info:
        await auth.principal({"authorization": "Bearer " + mint(keys.rsa, kid=kid)})
    challenge = info.value.headers["www-authenticate"]
    prefix = 'Bearer realm="rill", error="invalid_token", error_description="'
    assert challenge.startswith(prefix) and challenge.endswith('"')
    description = challenge[len(prefix) : -1]
    assert re.fullmatch(r"[\x20\x21\x23-\x5b\x5d-\x7e]+", description), description
    assert "unable to find a signing key" in description.lower()
    assert kid in info.value.message  # the JSON body keeps the message as it was


@pytest.mark.parametrize(
    "url",
    ["http://login.example.com/jwks", "http://10.0.0.5/jwks", "ftp://127.0.0.1/jwks", "file:///etc/jwks.json", "jwks"],
)
def test_a_jwks_url_others_could_change_on_the_way_is_refused(url: str) -> None:
    """Keys fetched over plain HTTP from another machine can be replaced on the way, and the replacer
    can then sign any token: only https://, or http:// to this machine."""
    with pytest.raises(pydantic.ValidationError, match="jwks_url must be https://"):
        JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url)


@pytest.mark.parametrize(
    "url", ["https://login.example.com/jwks", "http://127.0.0.1:8080/jwks", "http://[::1]/jwks", "http://localhost/j"]
)
def test_a_jwks_url_over_https_or_to_this_machine_is_taken(url: str) -> None:
    assert JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url).jwks_url == url
