"""Keys, tokens, JWTs and in-process nodes shared by the security tests."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from app.security.jwt_tokens import JWTConfig
from app.security.scopes import Action
from app.security.tokens import TokenConfig, digest, new_token
from tests.inprocess import Node

ISSUER = "https://issuer.rill.test"
AUDIENCE = "rill-api"
CHALLENGE = 'Bearer realm="rill"'  # WWW-Authenticate without a token
INVALID_TOKEN = 'Bearer realm="rill", error="invalid_token"'  # ... and the start of it for a bad one

# Buckets of the auth node: one private, one only the "other" token sees, one anyone may read.
PRIVATE, OTHER, PUBLIC = "acme", "zeta", "open"
LEGACY, COMPAT = "legacy.streams", "compat.v1"

# Opaque tokens of the auth node, by role: (scopes, expires_at).
ROLES: dict[str, tuple[list[str], datetime | None]] = {
    "root": (["admin:*"], None),
    "acme-read": ([f"read:{PRIVATE}"], None),
    "acme-write": ([f"write:{PRIVATE}"], None),
    "acme-admin": ([f"admin:{PRIVATE}"], None),
    "zeta-admin": ([f"admin:{OTHER}"], None),
    "legacy-read": ([f"read:{LEGACY}"], None),
    "legacy-write": ([f"write:{LEGACY}"], None),
    "legacy-admin": ([f"admin:{LEGACY}"], None),
    "compat-read": ([f"read:{COMPAT}"], None),
    "compat-write": ([f"write:{COMPAT}"], None),
    "compat-admin": ([f"admin:{COMPAT}"], None),
    "scratch-admin": (["admin:scratch"], None),
    "expired": (["admin:*"], datetime(2020, 1, 1, tzinfo=UTC)),
}
TOKENS: dict[str, str] = {role: new_token() for role in ROLES}


def token_configs(roles: dict[str, tuple[list[str], datetime | None]], tokens: dict[str, str]) -> list[TokenConfig]:
    return [
        TokenConfig(name=role, sha256=digest(tokens[role]), scopes=scopes, expires_at=expires)
        for role, (scopes, expires) in roles.items()
    ]


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class SigningKeys:
    """An RSA and an EC P-256 key, published under the kids "rsa-1" and "ec-1"."""

    rsa: rsa.RSAPrivateKey
    ec: ec.EllipticCurvePrivateKey

    def jwks(self) -> dict[str, Any]:
        return {"keys": [public_jwk(self.rsa, "rsa-1", "RS256"), public_jwk(self.ec, "ec-1", "ES256")]}


def make_keys() -> SigningKeys:
    return SigningKeys(rsa.generate_private_key(65537, 2048), ec.generate_private_key(ec.SECP256R1()))


def public_jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str, alg: str) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    else:
        jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def write_jwks(path: Path, jwks: dict[str, Any]) -> Path:
    path.write_text(json.dumps(jwks))
    return path


class JWKSServer:
    """Serves `self.jwks` at http://127.0.0.1:{port}/jwks and counts the fetches. While `answering` is
    clear, a request is read and left without an answer (until it is set again, or the server stops)."""

    def __init__(self, jwks: dict[str, Any]) -> None:
        self.jwks = jwks
        self.fetches = 0
        self.answering = threading.Event()
        self.answering.set()
        self.stopping = False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner.fetches += 1
                owner.answering.wait()
                if owner.stopping:
                    return  # its client gave up long ago
                body = json.dumps(owner.jwks).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> JWKSServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping = True
        self.answering.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


_UNSET: Any = object()


def mint(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    *,
    kid: str | None = "rsa-1",
    alg: str = "RS256",
    typ: str | None = "at+jwt",
    scope: Any = _UNSET,
    **claims: Any,
) -> str:
    """An access token: iss, aud, sub, iat and exp (in 5 minutes) unless given; a claim given as None is left out."""
    now = int(time.time())
    body: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300}
    if scope is not _UNSET:
        body["scope"] = scope
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    headers: dict[str, Any] = {"typ": typ}  # None: no typ at all (PyJWT would otherwise say "JWT")
    if kid is not None:
        headers["kid"] = kid
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def jwt_config(jwks_file: Path, **overrides: Any) -> JWTConfig:
    return JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=jwks_file, **overrides)


def error_of(resp: httpx.Response) -> dict[str, str]:
    """The protocol's error object of a JSON error response."""
    assert resp.headers.get("content-type") == "application/json", (resp.status_code, resp.headers, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    err: dict[str, str] = body["error"]
    return err


def assert_unauthorized(resp: httpx.Response, *, invalid: bool) -> None:
    """401 with the Bearer challenge: bare without a token, `error="invalid_token"` for a bad one."""
    assert resp.status_code == 401, (resp.status_code, resp.text)
    challenge = resp.headers.get("www-authenticate", "")
    if invalid:
        assert challenge.startswith(INVALID_TOKEN + ", error_description="), challenge
    else:
        assert challenge == CHALLENGE, challenge
    if resp.request.method != "HEAD":
        assert error_of(resp)["code"] == "unauthorized"


def assert_forbidden(resp: httpx.Response) -> None:
    assert resp.status_code == 403, (resp.status_code, resp.text)
    assert "www-authenticate" not in resp.headers
    if resp.request.method != "HEAD":
        assert error_of(resp)["code"] == "forbidden"


FAMILY_BASE = {"ds": f"/ds/{PRIVATE}/", "legacy": "/streams/", "compat": "/v1/stream/"}
FAMILY_BUCKET = {"ds": PRIVATE, "legacy": LEGACY, "compat": COMPAT}
# The opaque token each case of a family uses: exactly the level an action needs, or another bucket's.
FAMILY_ROLES = {
    "ds": {Action.READ: "acme-read", Action.WRITE: "acme-write", Action.ADMIN: "acme-admin", "other": "zeta-admin"},
    "legacy": {
        Action.READ: "legacy-read",
        Action.WRITE: "legacy-write",
        Action.ADMIN: "legacy-admin",
        "other": "acme-admin",
    },
    "compat": {
        Action.READ: "compat-read",
        Action.WRITE: "compat-write",
        Action.ADMIN: "compat-admin",
        "other": "acme-admin",
    },
}


@dataclass(frozen=True)
class World:
    """A text stream holding "a", "b" and "c" (three appends); in /ds, snapshots at the first two offsets."""

    family: str
    bucket: str
    base: str  # the prefix of its stream ids: "/ds/acme/", "/streams/" or "/v1/stream/"
    stream: str
    offsets: tuple[str, str, str]  # the tail after each append


async def make_world(client: httpx.AsyncClient, family: str, bucket: str | None = None) -> World:
    root = bearer(TOKENS["root"])
    bucket = bucket or FAMILY_BUCKET[family]
    base = f"/ds/{bucket}/" if family == "ds" else FAMILY_BASE[family]
    stream = "s-" + uuid.uuid4().hex[:12]
    resp = await client.put(base + stream, headers={**root, "content-type": "text/plain"})
    assert resp.status_code == 201, resp.text
    offsets = []
    for part in (b"a", b"b", b"c"):
        resp = await client.post(base + stream, content=part, headers={**root, "content-type": "text/plain"})
        assert resp.status_code == 204, resp.text
        offsets.append(resp.headers["stream-next-offset"])
    if family == "ds":
        for offset, blob in zip(offsets[:2], (b"s1", b"s2"), strict=True):
            resp = await client.put(f"{base}{stream}/snapshot/{offset}", content=blob, headers=root)
            assert resp.status_code == 201, resp.text
    o1, o2, o3 = offsets
    return World(family, bucket, base, stream, (o1, o2, o3))


def missing_world(world: World) -> World:
    """The same names where nothing exists: another bucket in /ds, another stream in the built-in buckets."""
    if world.family == "ds":
        bucket = uuid.uuid4().hex[: len(world.bucket)]  # as long, so even Content-Length cannot tell
        return replace(world, bucket=bucket, base=f"/ds/{bucket}/")
    return replace(world, stream="missing-" + uuid.uuid4().hex[:12])


@dataclass(frozen=True)
class Op:
    """One request of the matrix. `path` is formatted with the world: {base}, {stream}, {bucket},
    {o1}..{o3} and {new} (a fresh stream id)."""

    id: str
    method: str
    path: str
    needs: Action
    ok: int  # the status with a token of exactly the level it needs
    body: bytes = b""
    content_type: str | None = None
    query: str = ""
    reference: tuple[str, str] | None = None  # (method, path) a missing target is probed with, if not this op

    def url(self, world: World) -> str:
        o1, o2, o3 = world.offsets
        new = "n-" + uuid.uuid4().hex[:12]
        path = self.path.format(base=world.base, stream=world.stream, bucket=world.bucket, o1=o1, o2=o2, o3=o3, new=new)
        return f"{path}?{self.query}" if self.query else path

    async def send(self, client: httpx.AsyncClient, world: World, token: str | None) -> httpx.Response:
        headers = bearer(token)
        if self.content_type is not None:
            headers["content-type"] = self.content_type
        return await client.request(self.method, self.url(world), content=self.body, headers=headers)

    async def send_missing(self, client: httpx.AsyncClient, nowhere: World) -> httpx.Response:
        """What the request answers an all-powerful token in `nowhere` (see `missing_world`)."""
        if self.reference is None:
            return await self.send(client, nowhere, TOKENS["root"])
        method, path = self.reference
        return await Op("reference", method, path, Action.READ, 404).send(client, nowhere, TOKENS["root"])


CASES = ("no-token", "expired", "wrong-audience", "other-bucket", "read-only", "write-only", "allowed", "public")


def cases_for(op: Op, family: str) -> list[str]:
    skip = set()
    if op.needs < Action.WRITE:
        skip.add("read-only")
    if op.needs < Action.ADMIN:
        skip.add("write-only")
    if family != "ds":
        skip.add("public")  # the public_read bucket is a /ds one
    return [case for case in CASES if case not in skip]


def comparable(resp: httpx.Response, bucket: str) -> tuple[int, dict[str, str], str]:
    """A response's status, headers and body, with the bucket's name blanked out of the body."""
    return resp.status_code, dict(resp.headers), resp.text.replace(repr(bucket), "'<bucket>'")


async def deny(node: Node, send: Awaitable[httpx.Response]) -> httpx.Response:
    """Sends a request that must be refused before it touches anything: the stores are unchanged."""
    with node.unchanged():
        return await send


Verify = Callable[[httpx.AsyncClient, World, httpx.Response], Awaitable[None]]


async def check_case(
    client: httpx.AsyncClient, node: Node, keys: SigningKeys, family: str, op: Op, case: str, verify: Verify
) -> None:
    """One cell of the matrix: the request `op` in a fresh world, as `case` says, and its answer."""
    roles = FAMILY_ROLES[family]
    world = await make_world(client, family, PUBLIC if case == "public" else None)
    if case == "no-token":
        assert_unauthorized(await deny(node, op.send(client, world, None)), invalid=False)
    elif case == "expired":
        resp = await deny(node, op.send(client, world, TOKENS["expired"]))
        assert_unauthorized(resp, invalid=True)
        assert resp.headers["www-authenticate"].endswith('error_description="the token has expired"')
    elif case == "wrong-audience":
        token = mint(keys.rsa, aud="another-api", scope="admin:*")
        resp = await deny(node, op.send(client, world, token))
        assert_unauthorized(resp, invalid=True)
        assert "audience" in resp.headers["www-authenticate"].lower()
    elif case == "other-bucket":
        resp = await deny(node, op.send(client, world, TOKENS[roles["other"]]))
        assert resp.status_code == 404, (resp.status_code, resp.text)
        # Indistinguishable from a bucket (or stream) that does not exist: status, headers and body.
        nowhere = missing_world(world)
        missing = await op.send_missing(client, nowhere)
        assert comparable(resp, world.bucket) == comparable(missing, nowhere.bucket)
    elif case == "read-only":
        assert_forbidden(await deny(node, op.send(client, world, TOKENS[roles[Action.READ]])))
    elif case == "write-only":
        assert_forbidden(await deny(node, op.send(client, world, TOKENS[roles[Action.WRITE]])))
    elif case == "allowed":
        resp = await op.send(client, world, TOKENS[roles[op.needs]])
        assert resp.status_code == op.ok, (resp.status_code, resp.text)
        await verify(client, world, resp)
    elif case == "public":
        if op.needs is Action.READ:
            resp = await op.send(client, world, None)
            assert resp.status_code == op.ok, (resp.status_code, resp.text)
            await verify(client, world, resp)
        else:
            assert_unauthorized(await deny(node, op.send(client, world, None)), invalid=False)
    else:
        raise AssertionError(case)
