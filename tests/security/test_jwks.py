"""app/security/jwks.py: a JWKS URL that never answers holds one "jwks" thread and nothing else, made-up
kids cannot make the server fetch, and verifications that need the same fetch share it.

The JWKS is served by a small HTTP server on 127.0.0.1 that can be told to read requests and leave
them unanswered (`JWKSServer.answering`); it counts the requests it gets.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from app.domain.errors import ProtocolError
from app.runtime import blocking
from app.security import jwks
from app.security.authenticator import Authenticator, AuthSettings
from app.security.jwt_tokens import InvalidToken, JWTConfig, JWTVerifier
from app.security.scopes import Action, Principal
from tests.inprocess import client_for, running_node
from tests.security.helpers import AUDIENCE, ISSUER, JWKSServer, SigningKeys, bearer, error_of, mint, public_jwk

pytestmark = pytest.mark.anyio


@pytest.fixture()
def jwks_server(keys: SigningKeys) -> Iterator[JWKSServer]:
    with JWKSServer(keys.jwks()) as server:
        yield server


def config(server: JWKSServer, **overrides: Any) -> JWTConfig:
    return JWTConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=server.url, **overrides)


def authenticator(server: JWKSServer, **overrides: Any) -> Authenticator:
    return Authenticator(AuthSettings(mode="on", jwt=config(server, **overrides)), lambda: int(time.time() * 1000))


def made_up(keys: SigningKeys) -> str:
    """A token signed by a real key under a kid no JWKS has."""
    return mint(keys.rsa, kid=uuid.uuid4().hex, scope="admin:*")


async def refused(auth: Authenticator, token: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        await auth.principal(bearer(token))
    return info.value


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


def thread_name() -> str:
    return threading.current_thread().name


async def test_a_jwks_url_that_never_answers_holds_no_other_work(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    """Eight made-up kids used to take eight 30 s fetches on asyncio's default executor, and every other
    blocking call of the server (tiering, cold reads, checkpoints, snapshots) queued behind them."""
    jwks_server.answering.clear()
    auth = authenticator(jwks_server)
    timeout = config(jwks_server).jwks_timeout_seconds
    waiting = [asyncio.ensure_future(auth.principal(bearer(made_up(keys)))) for _ in range(8)]
    await until(lambda: jwks_server.fetches > 0)

    other_work = asyncio.gather(
        blocking.run("tiering", thread_name), blocking.run("jwks", thread_name), asyncio.to_thread(thread_name)
    )
    tiering, jwks_thread, default = await asyncio.wait_for(other_work, timeout)
    assert tiering.startswith("rill-tiering") and jwks_thread.startswith("rill-jwks")  # the stuck fetch holds one
    assert not any(task.done() for task in waiting)

    answers = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 3 * timeout)
    for answer in answers:
        assert isinstance(answer, ProtocolError), answer
        assert (answer.status, answer.code) == (503, "jwks_unavailable")
        assert 1 <= int(answer.headers["retry-after"]) <= jwks.REFETCH_SECONDS
    assert jwks_server.fetches == 1  # one fetch for all eight

    # Within the refetch interval a new kid is answered without another fetch, and without waiting.
    error = await asyncio.wait_for(refused(auth, made_up(keys)), timeout)
    assert (error.status, error.code) == (503, "jwks_unavailable")
    assert jwks_server.fetches == 1


async def test_known_kids_are_served_while_the_jwks_url_stalls(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    auth = authenticator(jwks_server, jwks_timeout_seconds=1)
    assert await auth.principal(bearer(mint(keys.rsa, sub="a"))) is not None
    jwks_server.answering.clear()
    assert auth.jwt is not None and auth.jwt.remote is not None
    auth.jwt.remote.refetch_seconds = 0
    stuck = asyncio.ensure_future(refused(auth, made_up(keys)))
    await until(lambda: jwks_server.fetches == 2)
    principal = await auth.principal(bearer(mint(keys.ec, kid="ec-1", alg="ES256", scope="read", sub="b")))
    assert principal is not None and principal.subject == "b"
    assert not stuck.done()
    assert (await stuck).status == 503


async def test_made_up_kids_cause_no_more_fetches(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    auth = authenticator(jwks_server)
    at_once = await asyncio.gather(*(refused(auth, made_up(keys)) for _ in range(100)))
    one_by_one = [await refused(auth, made_up(keys)) for _ in range(100)]
    for error in at_once + one_by_one:
        assert error.status == 401
        assert error.headers["www-authenticate"].startswith('Bearer realm="rill", error="invalid_token"')
        assert "unable to find a signing key" in error.message.lower()
    assert jwks_server.fetches == 1
    assert await auth.principal(bearer(mint(keys.rsa))) is not None  # the one fetch brought the real keys
    assert jwks_server.fetches == 1


def _on_a_clock(jwks_server: JWKSServer) -> tuple[JWTVerifier, list[float]]:
    """A verifier of the server's keys whose JWKS cache reads the time from the list returned."""
    verifier = JWTVerifier(config(jwks_server))
    assert verifier.remote is not None
    now = [1000.0]
    verifier.remote.clock = lambda: now[0]
    return verifier, now


async def test_a_kid_published_after_a_fetch_without_it_is_found_at_the_next_refetch(
    jwks_server: JWKSServer, keys: SigningKeys
) -> None:
    """A token naming a kid before the provider publishes it (a junk one, even) does not keep the key
    out for longer than the refetch interval, as the README says."""
    verifier, now = _on_a_clock(jwks_server)
    new_key = ec.generate_private_key(ec.SECP256R1())
    token = mint(new_key, kid="ec-2", alg="ES256")
    with pytest.raises(InvalidToken):
        await verifier.verify(token)  # not published yet
    jwks_server.jwks = {"keys": [*jwks_server.jwks["keys"], public_jwk(new_key, "ec-2", "ES256")]}
    now[0] += jwks.REFETCH_SECONDS - 1
    with pytest.raises(InvalidToken):
        await verifier.verify(token)  # too soon to fetch again
    assert jwks_server.fetches == 1
    now[0] += 1
    assert (await verifier.verify(token)).subject
    assert jwks_server.fetches == 2


async def test_a_key_the_provider_withdrew_stops_verifying(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    verifier, now = _on_a_clock(jwks_server)
    assert (await verifier.verify(mint(keys.rsa))).subject
    jwks_server.jwks = {"keys": [k for k in jwks_server.jwks["keys"] if k["kid"] != "rsa-1"]}
    now[0] += jwks.KEYS_MAX_AGE_SECONDS - 1
    assert (await verifier.verify(mint(keys.rsa))).subject  # known, and not stale yet
    now[0] += 1
    with pytest.raises(InvalidToken):
        await verifier.verify(mint(keys.rsa))  # fetched again: withdrawn
    assert jwks_server.fetches == 2


async def test_made_up_kids_make_at_most_one_fetch_per_interval(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    verifier, now = _on_a_clock(jwks_server)
    for second in range(30):
        now[0] = 1000.0 + second
        with pytest.raises(InvalidToken):
            await verifier.verify(mint(keys.rsa, kid=f"junk-{second}"))
    assert jwks_server.fetches == 3  # at 0, 10 and 20 s


async def test_verifications_of_a_new_kid_share_one_fetch(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    auth = authenticator(jwks_server)
    assert await auth.principal(bearer(mint(keys.rsa))) is not None
    new_key = ec.generate_private_key(ec.SECP256R1())
    jwks_server.jwks = {"keys": [*jwks_server.jwks["keys"], public_jwk(new_key, "ec-2", "ES256")]}
    assert auth.jwt is not None and auth.jwt.remote is not None
    auth.jwt.remote.refetch_seconds = 0  # the key was rotated in just now: a refetch is due at once

    jwks_server.answering.clear()  # the fetch is held until every verification waits for it
    tokens = [mint(new_key, kid="ec-2", alg="ES256", scope="read", sub=f"s{i}") for i in range(20)]
    verifying = [asyncio.ensure_future(auth.principal(bearer(token))) for token in tokens]
    await until(lambda: jwks_server.fetches == 2)
    await asyncio.sleep(0.2)  # time for any second fetch to arrive: there must be none
    jwks_server.answering.set()
    principals = await asyncio.wait_for(asyncio.gather(*verifying), 10)
    assert principals == [Principal(f"s{i}", {"*": Action.READ}, principals[i].expires_at) for i in range(20)]
    assert jwks_server.fetches == 2


async def test_a_stalled_jwks_url_is_a_503_over_http(
    jwks_server: JWKSServer, keys: SigningKeys, tmp_path: Path
) -> None:
    jwks_server.answering.clear()
    auth = AuthSettings(mode="on", jwt=config(jwks_server, jwks_timeout_seconds=1))
    async with running_node(tmp_path, auth=auth) as node, client_for(node) as client:
        resp = await client.get("/ds/acme/s", params={"offset": "-1"}, headers=bearer(made_up(keys)))
        assert resp.status_code == 503, resp.text
        assert error_of(resp)["code"] == "jwks_unavailable"
        assert 1 <= int(resp.headers["retry-after"]) <= jwks.REFETCH_SECONDS


async def test_a_huge_made_up_kid_is_not_echoed_whole(jwks_server: JWKSServer, keys: SigningKeys) -> None:
    auth = authenticator(jwks_server)
    error = await refused(auth, mint(keys.rsa, kid="k" * 30_000))
    assert error.status == 401 and len(error.headers["www-authenticate"]) < 300


def test_a_jwks_url_is_logged_without_its_credentials() -> None:
    assert jwks._without_credentials("https://user:secret@idp.example/keys?a=1") == "https://idp.example/keys?a=1"
    assert jwks._without_credentials("https://idp.example/keys") == "https://idp.example/keys"
