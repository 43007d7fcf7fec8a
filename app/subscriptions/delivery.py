"""The leader's delivery loop: wakes the consumers of subscriptions whose streams have data past
their acknowledgement.

- A webhook subscription is claimed for the delivery (a new generation, wake id and callback
  token) and notified with a signed POST. An answer of `{"done": true}` acknowledges every stream
  at the tail the notification showed; otherwise the consumer acknowledges through the callback
  route before the lease runs out. A failed delivery releases the lease and is retried after
  1 s, doubling to 60 s, less up to 20% at random.
- A pull-wake subscription's wake event is appended by the state machine itself, in the apply of
  the entry that made data pending, once per generation. The leader proposes a `Wake` only when that
  could not be done (the wake stream was missing or closed then), retried after 1 s, doubling to
  5 min, logged at most once a minute; or when a worker's lease ran out with data still pending.

Driven by apply, not by a scan: the state machine's coverage index names the subscriptions whose
streams grew or that changed, and a timer comes back for a lease that runs out or a retry that
falls due. Only the leader delivers; a new leader starts by looking at every subscription once,
so a wake may be repeated (deliveries are at least once) but an acknowledged position never moves
back.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import httpx
import msgspec

from app.domain.errors import ProtocolError
from app.domain.offsets import format_offset
from app.runtime import blocking
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import Ack, Claim, Code, Command, Outcome, Wake
from app.state_machine.machine import StateMachine
from app.subscriptions.leases import acked_offset, token_digest
from app.subscriptions.pinned import post_pinned
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.trouble import DeliveryTrouble
from app.subscriptions.urls import IPAddress, Network, check_webhook_url

log = logging.getLogger("rill.subscriptions")

WEBHOOK = "webhook"  # the holder name of a webhook delivery's lease
TIMEOUT_SECONDS = 10.0
IDLE_SECONDS = 1.0  # the longest the loop sleeps: how soon it notices it leads
LOG_EVERY_MS = 60_000  # one subscription's failing wakes are logged at most this often


class Node(Protocol):
    machine: StateMachine
    webhooks: WebhookSettings | None

    @property
    def is_leader(self) -> bool: ...

    def now_ms(self) -> int: ...

    async def submit(self, command: Command) -> Outcome: ...


def notification(sub: r.Subscription, token: str, streams: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "subscription_id": sub.id,
        "wake_id": sub.wake_id,
        "generation": sub.generation,
        "callback_url": f"{sub.base_url}/__ds/subscriptions/{sub.id}/callback",
        "callback_token": token,
        "streams": streams,
    }


Post = Callable[[str, Sequence[IPAddress], bytes, dict[str, str]], Awaitable[httpx.Response]]
Check = Callable[[str, list[Network]], Awaitable[Sequence[IPAddress]]]


async def _check_in_thread(url: str, allowed: list[Network]) -> Sequence[IPAddress]:
    return await blocking.run("webhook_dns", check_webhook_url, url, allowed)  # resolving a name blocks


class Deliveries:
    """`post`, `check` (the SSRF rules at delivery time, which also pick the addresses to connect
    to) and `rng` (tokens, jitter) are the real ones unless given: the simulation gives its own,
    so a seed replays exactly."""

    def __init__(
        self,
        node: Node,
        post: Post | None = None,
        check: Check | None = None,
        rng: random.Random | None = None,
        trouble: DeliveryTrouble | None = None,
    ) -> None:
        self.node = node
        self.rng = rng
        self.trouble = trouble or DeliveryTrouble(rng)
        self.backoff, self.wake_backoff = self.trouble.backoff, self.trouble.wake_backoff
        self._check = check or _check_in_thread
        self._in_flight: dict[bytes, asyncio.Task[None]] = {}
        self._logged: dict[bytes, int] = {}
        self._dirty: set[bytes] = set()
        self._timers: list[tuple[int, bytes]] = []  # a heap of (due ms, subscription)
        self._due: dict[bytes, int] = {}
        self._leading = False
        self._poked: asyncio.Event | None = None
        self._client: httpx.AsyncClient | None = None
        self._post = post or self._http_post
        self.delivered = 0
        self.failed = 0
        self.passes = 0

    def poke(self) -> None:
        """Called after an apply that woke subscriptions."""
        if self._poked is not None:
            self._poked.set()

    async def run_forever(self) -> None:
        self._poked = asyncio.Event()
        self.node.machine.on_woken = self.poke
        try:
            while True:
                await self._sleep()
                if not self.node.is_leader or self.node.webhooks is None:
                    self._step_down()
                    continue
                try:
                    await self.run_once()
                except Exception:  # a bug must not stop deliveries for good
                    log.exception("subscription delivery pass failed")
        finally:
            for task in self._in_flight.values():
                task.cancel()
            if self._client is not None:
                await self._client.aclose()

    async def _sleep(self) -> None:
        assert self._poked is not None
        timeout = IDLE_SECONDS
        if self._timers and self._leading:
            timeout = min(timeout, max(0.0, (self._timers[0][0] - self.node.now_ms()) / 1000))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._poked.wait()
        self._poked.clear()

    def _step_down(self) -> None:
        self._leading = False
        self.backoff.clear()
        self.wake_backoff.clear()
        self._dirty.clear()
        self._timers.clear()
        self._due.clear()

    def _later(self, key: bytes, at_ms: int) -> None:
        """Looks at the subscription again at `at_ms`: one timer a subscription, the earliest asked for."""
        if self._due.get(key, at_ms + 1) <= at_ms:
            return
        self._due[key] = at_ms
        heapq.heappush(self._timers, (at_ms, key))

    async def run_once(self) -> None:
        """Looks at the subscriptions that were woken, or whose timer fell due."""
        machine = self.node.machine
        if not self._leading:  # a new leader knows nothing of what was delivered: look at everything once
            self._leading = True
            self._dirty.update(machine.subscription_keys())
        now = self.node.now_ms()
        self._dirty |= machine.table.coverage.take_woken()
        while self._timers and self._timers[0][0] <= now:
            at, key = heapq.heappop(self._timers)
            if self._due.get(key) == at:  # else a stale entry: an earlier one has fired
                del self._due[key]
                self._dirty.add(key)
        dirty, self._dirty = self._dirty, set()
        self.passes += 1
        wakes = []
        for key in sorted(dirty):
            if key in self._in_flight:
                continue  # looked at again when it ends
            raw = machine.table.get(r.SUBSCRIPTIONS, key)
            if not raw:
                self._forget(key)
                continue
            sub = r.decode_subscription(raw)
            if sub.type != "webhook" and sub.woke_generation == sub.generation:
                continue  # its workers were told of this generation already
            pending = rules.pending(machine.table, sub)
            if not pending:
                continue
            if sub.holder is not None and now < sub.lease_until:
                self._later(key, sub.lease_until)  # back when the lease runs out, if still pending
                continue
            if sub.type == "webhook":
                failure = self.backoff.failures.get(key)
                if failure is not None and now < failure.retry_at:
                    self._later(key, failure.retry_at)
                else:
                    self._in_flight[key] = asyncio.create_task(self._webhook(key, sub))
                continue
            wakes.append(self._wake(key, sub, now))
        await asyncio.gather(*wakes)  # proposed together: they share the log's batches and syncs

    def _forget(self, key: bytes) -> None:
        self._logged.pop(key, None)
        self.backoff.succeeded(key)
        self.wake_backoff.succeeded(key)

    def _streams(self, sub: r.Subscription) -> list[dict[str, Any]]:
        table = self.node.machine.table
        return [
            {"path": path, "tail_offset": format_offset(tail), "acked_offset": acked_offset(acked), "has_pending": True}
            for path, (acked, tail) in sorted(rules.pending(table, sub).items())
        ]

    async def _wake(self, key: bytes, sub: r.Subscription, now: int) -> None:
        """Proposes the wake the apply could not write, with backoff while it keeps failing."""
        failure = self.wake_backoff.failures.get(key)
        if failure is not None and now < failure.retry_at:
            self._later(key, failure.retry_at)
            return
        refused = rules.wake_refusal(self.node.machine.table, sub)  # known refusals are not proposed
        try:  # one subscription's trouble must not hold up the others
            if refused is None:
                wake = Wake(sub.bucket, sub.root, sub.id, sub.generation)
                async with asyncio.timeout(TIMEOUT_SECONDS):
                    refused = await self.node.submit(wake)
            error = None if refused.code is Code.OK else f"{refused.code.value}: {refused.message}"
        except (ProtocolError, TimeoutError) as exc:
            error = getattr(exc, "message", "timed out")
        if error is None:
            self.wake_backoff.succeeded(key)
            self._logged.pop(key, None)
            return
        failure = self.wake_backoff.failed(key, self.node.now_ms(), error)
        self._later(key, failure.retry_at)
        if self.node.now_ms() - self._logged.get(key, -LOG_EVERY_MS) >= LOG_EVERY_MS:
            self._logged[key] = self.node.now_ms()
            log.warning(
                "cannot wake subscription %r on %r (%s); attempt %d, retrying with backoff",
                sub.id, sub.wake_stream, error, failure.attempts,
            )  # fmt: skip

    def _token(self, sub: r.Subscription) -> str:
        assert self.node.webhooks is not None
        nonce = None if self.rng is None else f"{self.rng.getrandbits(128):032x}"
        return self.node.webhooks.leases.issue(sub.bucket, sub.root, sub.id, nonce)

    def _wake_id(self) -> str:
        bits = self.rng.getrandbits(64) if self.rng is not None else random.SystemRandom().getrandbits(64)
        return f"w_{bits:016x}"

    async def _webhook(self, key: bytes, sub: r.Subscription) -> None:
        try:
            # Bounded: a proposal whose outcome never comes (its entry went into a checkpoint this
            # node installed) must not keep the subscription from its next delivery.
            async with asyncio.timeout(3 * TIMEOUT_SECONDS):
                await self._deliver(key, sub)
            self._dirty.add(key)  # data may have come while it was in flight
            self.poke()
        except (ProtocolError, TimeoutError) as exc:  # leadership moved, or no quorum: try again in a while
            log.info("webhook for %r deferred: %s", sub.id, getattr(exc, "message", "timed out"))
            self._later(key, self.node.now_ms() + 1000)
        except Exception:
            log.exception("webhook for %r failed", sub.id)
            self._later(key, self.node.now_ms() + 1000)
        finally:
            self._in_flight.pop(key, None)

    async def _release(self, sub: r.Subscription, token: str, acks: list[tuple[str, int]]) -> None:
        """Ends the delivery's lease, acknowledging `acks` (those of streams it still has: one deleted
        or unlinked since would have the whole ack refused, and the lease held until it runs out)."""
        linked = rules.linked(self.node.machine.table, sub)
        kept = [(path, pos) for path, pos in acks if path in linked]
        ack = Ack(sub.bucket, sub.root, sub.id, sub.wake_id or "", sub.generation, token_digest(token), kept, True)
        outcome = await self.node.submit(ack)
        if outcome.code is Code.NOT_FOUND and kept:  # one went in the meantime: give the lease up alone
            await self.node.submit(msgspec.structs.replace(ack, acks=[]))

    async def _deliver(self, key: bytes, sub: r.Subscription) -> None:
        webhooks, url = self.node.webhooks, sub.webhook_url
        assert webhooks is not None and url is not None
        token = self._token(sub)
        claimed = await self.node.submit(
            Claim(sub.bucket, sub.root, sub.id, WEBHOOK, self._wake_id(), token_digest(token))
        )
        if claimed.code is not Code.OK or claimed.subscription is None:
            return  # a worker holds it, or it is gone
        sub = claimed.subscription
        streams = self._streams(sub)
        body = json.dumps(notification(sub, token, streams), separators=(",", ":")).encode()
        headers = {
            "content-type": "application/json",
            "webhook-signature": webhooks.signer.sign(body, int(time.time())),
        }
        try:
            # Resolved and checked once per delivery (names move), then posted to what was checked.
            addresses = await self._check(url, webhooks.allowed)
            response = await self._post(url, addresses, body, headers)
            if not 200 <= response.status_code < 300:
                raise httpx.HTTPStatusError(
                    f"answered {response.status_code}", request=response.request, response=response
                )
        except Exception as exc:  # whatever the URL or the receiver does, the lease ends and backoff applies
            self.failed += 1
            failure = self.backoff.failed(key, self.node.now_ms(), str(exc) or type(exc).__name__)
            log.info(
                "webhook for %r failed (%s); retrying in %d ms", sub.id, exc, failure.retry_at - self.node.now_ms()
            )
            await self._release(sub, token, [])
            return
        self.delivered += 1
        self.backoff.succeeded(key)
        if _done(response):
            await self._release(sub, token, [(item["path"], int(item["tail_offset"][17:])) for item in streams])

    async def _http_post(
        self, url: str, addresses: Sequence[IPAddress], body: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False, trust_env=False)
        return await post_pinned(self._client, url, addresses, body, headers)


def _done(response: httpx.Response) -> bool:
    try:
        answer = msgspec.json.decode(response.content) if response.content else {}
    except msgspec.DecodeError:
        return False
    return isinstance(answer, dict) and answer.get("done") is True
