"""The leader's delivery loop: wakes the consumers of subscriptions whose streams have data past
their acknowledgement.

- A webhook subscription is claimed for the delivery (a new generation, wake id and callback
  token) and notified with a signed POST. An answer of `{"done": true}` acknowledges every stream
  at the tail the notification showed; otherwise the consumer acknowledges through the callback
  route before the lease runs out. A failed delivery releases the lease and is retried after
  1 s, doubling to 60 s, less up to 20% at random.
- A pull-wake subscription gets a wake event appended to its wake stream; workers claim it.

Only the leader delivers; a new leader starts again from the replicated state, so a wake may be
repeated (deliveries are at least once) but an acknowledged position never moves back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import msgspec

from app.domain.errors import ProtocolError
from app.domain.offsets import format_offset
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import Ack, Append, Claim, Code, Command, Outcome
from app.state_machine.machine import StateMachine
from app.subscriptions.leases import acked_offset, token_digest
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.urls import Network, WebhookUrlRejected, check_webhook_url
from app.tiering.backoff import Backoff

log = logging.getLogger("rill.subscriptions")

WEBHOOK = "webhook"  # the holder name of a webhook delivery's lease
TIMEOUT_SECONDS = 10.0
INTERVAL_SECONDS = 0.1


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


Post = Callable[[str, bytes, dict[str, str]], Awaitable[httpx.Response]]
Check = Callable[[str, list[Network]], Awaitable[object]]


async def _check_in_thread(url: str, allowed: list[Network]) -> object:
    return await asyncio.to_thread(check_webhook_url, url, allowed)  # resolving a name blocks


class Deliveries:
    """`post`, `check` (the SSRF rules at delivery time) and `rng` (tokens, jitter) are the real
    ones unless given: the simulation gives its own, so a seed replays exactly."""

    def __init__(
        self, node: Node, post: Post | None = None, check: Check | None = None, rng: random.Random | None = None
    ) -> None:
        self.node = node
        self.rng = rng
        self.backoff: Backoff[bytes] = Backoff(1.0, 60.0, 0.2, rng)
        self._check = check or _check_in_thread
        self._in_flight: dict[bytes, asyncio.Task[None]] = {}
        self._woken: dict[bytes, tuple[tuple[str, int], ...]] = {}  # pull-wake: the tails last announced
        self._client: httpx.AsyncClient | None = None
        self._post = post or self._http_post
        self.delivered = 0
        self.failed = 0

    async def run_forever(self) -> None:
        try:
            while True:
                await asyncio.sleep(INTERVAL_SECONDS)
                if not self.node.is_leader or self.node.webhooks is None:
                    self._woken.clear()
                    self.backoff.clear()
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

    async def run_once(self) -> None:
        machine = self.node.machine
        now = self.node.now_ms()
        for key, raw in list(machine.kv.scan(r.SUBSCRIPTIONS, b"")):
            if key in self._in_flight:
                continue
            sub = r.decode_subscription(raw)
            pending = rules.pending(machine.table, sub)
            if not pending or (sub.holder is not None and now < sub.lease_until):
                continue
            if sub.type == "webhook":
                if self.backoff.ready(key, now):
                    self._in_flight[key] = asyncio.create_task(self._webhook(key, sub))
                continue
            try:  # one subscription's trouble must not hold up the others
                await asyncio.wait_for(self._wake(key, sub, pending), TIMEOUT_SECONDS)
            except (ProtocolError, TimeoutError) as exc:
                log.info("could not wake subscription %r: %s", sub.id, getattr(exc, "message", "timed out"))

    def _streams(self, sub: r.Subscription) -> list[dict[str, Any]]:
        table = self.node.machine.table
        return [
            {"path": path, "tail_offset": format_offset(tail), "acked_offset": acked_offset(acked), "has_pending": True}
            for path, (acked, tail) in sorted(rules.pending(table, sub).items())
        ]

    async def _wake(self, key: bytes, sub: r.Subscription, pending: dict[str, tuple[int, int]]) -> None:
        """Announces new data on the wake stream, once per change of what is pending."""
        tails = tuple(sorted((path, tail) for path, (_, tail) in pending.items()))
        if self._woken.get(key) == tails or sub.wake_stream is None:
            return
        event = {"subscription_id": sub.id, "generation": sub.generation, "streams": self._streams(sub)}
        body = json.dumps(event, separators=(",", ":")).encode()
        outcome = await self.node.submit(
            Append(sub.bucket, rules.stream_name(sub, sub.wake_stream), "application/json", memoryview(body))
        )
        if outcome.code is Code.APPENDED:
            self._woken[key] = tails
        else:
            log.info("could not wake subscription %r on %r: %s", sub.id, sub.wake_stream, outcome.code.value)

    def _token(self, size: int) -> str:
        if self.rng is None:
            return secrets.token_hex(size)
        return f"{self.rng.getrandbits(8 * size):0{2 * size}x}"

    async def _webhook(self, key: bytes, sub: r.Subscription) -> None:
        try:
            # Bounded: a proposal whose outcome never comes (its entry went into a checkpoint this
            # node installed) must not keep the subscription from its next delivery.
            await asyncio.wait_for(self._deliver(key, sub), 3 * TIMEOUT_SECONDS)
        except (ProtocolError, TimeoutError) as exc:  # leadership moved, or no quorum: a later pass tries again
            log.info("webhook for %r deferred: %s", sub.id, getattr(exc, "message", "timed out"))
        except Exception:
            log.exception("webhook for %r failed", sub.id)
        finally:
            self._in_flight.pop(key, None)

    async def _release(self, sub: r.Subscription, token: str, acks: list[tuple[str, int]]) -> None:
        """Ends the delivery's lease, acknowledging `acks`."""
        ack = Ack(sub.bucket, sub.root, sub.id, sub.wake_id or "", sub.generation, token_digest(token), acks, True)
        await self.node.submit(ack)

    async def _deliver(self, key: bytes, sub: r.Subscription) -> None:
        webhooks, url = self.node.webhooks, sub.webhook_url
        assert webhooks is not None and url is not None
        token = self._token(24)
        claimed = await self.node.submit(
            Claim(sub.bucket, sub.root, sub.id, WEBHOOK, "w_" + self._token(8), token_digest(token))
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
            await self._check(url, webhooks.allowed)  # names may have moved since the subscription was made
            response = await self._post(url, body, headers)
            if not 200 <= response.status_code < 300:
                raise httpx.HTTPStatusError(
                    f"answered {response.status_code}", request=response.request, response=response
                )
        except (httpx.HTTPError, WebhookUrlRejected, OSError) as exc:
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

    async def _http_post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False)
        return await self._client.post(url, content=body, headers=headers)


def _done(response: httpx.Response) -> bool:
    try:
        answer = msgspec.json.decode(response.content) if response.content else {}
    except msgspec.DecodeError:
        return False
    return isinstance(answer, dict) and answer.get("done") is True
