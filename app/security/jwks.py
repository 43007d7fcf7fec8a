"""The keys of a JWKS URL, fetched when a token names a kid not seen yet, and only as often as that is worth it.

One fetch is in flight at a time, on the "jwks" pool, and verifications that need it wait for it on the
event loop rather than on threads of their own. A fetch has `timeout` seconds; an endpoint that never
answers holds one "jwks" thread and nothing else. A kid not in the set is answered from memory until
`REFETCH_SECONDS` have passed since the last fetch, so tokens with made-up kids cannot make the
server fetch at will, and a key published since is found within that. The set is fetched again when
a token needs it `KEYS_MAX_AGE_SECONDS` after the last fetch, so a key the provider withdrew stops
verifying. The keys of the last good fetch stay in use while the endpoint is failing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import httpx
import jwt

from app.runtime import blocking

log = logging.getLogger("rill.security")

REFETCH_SECONDS = 10.0
KEYS_MAX_AGE_SECONDS = 300.0
MAX_JWKS_BYTES = 1 << 20


class UnknownKid(Exception):
    """No key in the JWKS matches the token's kid."""


class JWKSUnavailable(Exception):
    """The kid is not among the keys fetched so far, and the JWKS URL could not be fetched again."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RemoteJWKS:
    def __init__(self, url: str, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.timeout = timeout
        self.clock = clock
        self.refetch_seconds = REFETCH_SECONDS
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None  # when the last fetch started, whatever came of it
        self._failure: str | None = None  # why the last fetch failed; None after a good one
        self._fetching: asyncio.Future[None] | None = None

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key for `kid`; UnknownKid if the JWKS has none, JWKSUnavailable if it cannot be fetched."""
        key = self._keys.get(kid)
        if key is not None and not self._stale():
            return key
        if self._fetching is None:
            if not self._due():
                if key is not None:
                    return key  # stale, but fetched again too lately to fetch once more
                raise self._missing(kid)
            self._fetching = asyncio.ensure_future(self._refresh())
        try:
            # Shielded: a client that goes away leaves the fetch to the others waiting for it. Bounded here
            # too, as httpx's timeouts cover neither name resolution nor a server that drips its bytes.
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(self._fetching)
        except TimeoutError:
            if key is not None:
                return key  # the last good keys stay in use while the endpoint is failing
            raise JWKSUnavailable("the JWKS URL did not answer in time", self._retry_after()) from None
        key = self._keys.get(kid)
        if key is not None:
            return key
        raise self._missing(kid)

    def _due(self) -> bool:
        return self._fetched_at is None or self.clock() - self._fetched_at >= self.refetch_seconds

    def _stale(self) -> bool:
        return self._fetched_at is not None and self.clock() - self._fetched_at >= KEYS_MAX_AGE_SECONDS

    def _missing(self, kid: str) -> Exception:
        if self._failure is not None:
            return JWKSUnavailable(f"the JWKS URL cannot be fetched: {self._failure}", self._retry_after())
        return UnknownKid(kid)

    def _retry_after(self) -> int:
        since = 0.0 if self._fetched_at is None else self.clock() - self._fetched_at
        return max(1, math.ceil(self.refetch_seconds - since))

    async def _refresh(self) -> None:
        self._fetched_at = self.clock()
        try:
            self._keys = await blocking.run("jwks", self._fetch)
            self._failure = None
        except Exception as exc:  # whatever went wrong, the waiters answer 503 and the next fetch is later
            self._failure = str(exc) or type(exc).__name__
            log.warning("fetching the JWKS from %s failed: %s", _without_credentials(self.url), self._failure)
        finally:
            self._fetching = None

    def _fetch(self) -> dict[str, jwt.PyJWK]:
        """The signing keys at the URL, by kid (keys without a kid, or for encryption, are left out)."""
        with (
            httpx.Client(timeout=self.timeout, follow_redirects=False) as client,
            client.stream("GET", self.url, headers={"accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"the JWKS is over {MAX_JWKS_BYTES} bytes")
        document = json.loads(body)
        if not isinstance(document, dict):
            raise ValueError("the JWKS is not a JSON object")
        keys = jwt.PyJWKSet.from_dict(document).keys
        return {k.key_id: k for k in keys if k.key_id and k.public_key_use in ("sig", None)}


def _without_credentials(url: str) -> str:
    """The URL as a log may show it: a user and password in it left out."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
