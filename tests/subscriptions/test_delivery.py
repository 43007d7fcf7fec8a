"""The leader's delivery loop (app/subscriptions/delivery.py) over a real state machine, in process:
it looks only at subscriptions that an apply woke or whose timer fell due; wake events come from
the apply itself, once per generation, through streams that cannot loop; a wake that cannot be
written is retried with backoff and never proposed while the applied state refuses it; a webhook
is posted to the address that was checked, not to what its name resolves to later."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import (
    Append,
    Command,
    CreateBucket,
    CreateStream,
    DeleteStream,
    Outcome,
    PutSubscription,
    encode_envelope,
)
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from app.subscriptions.delivery import Deliveries
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.signing import WebhookSigner
from app.subscriptions.urls import IPAddress

B = "bench"
JSON = "application/json"


class FakeNode:
    """A one-node leader: commands apply at once, at a clock the test moves."""

    webhooks = WebhookSettings(WebhookSigner.from_secret(b"test"))
    is_leader = True

    def __init__(self) -> None:
        self.machine = StateMachine(MemoryKV(r.COLUMN_FAMILIES))
        self.clock = 1_000_000
        self.index = 0
        self.proposed: list[Command] = []

    def now_ms(self) -> int:
        return self.clock

    def apply(self, command: Command) -> Outcome:
        self.index += 1
        outcome = self.machine.apply([Entry(1, self.index, encode_envelope(self.clock, command))])[0]
        assert isinstance(outcome, Outcome)
        return outcome

    async def submit(self, command: Command) -> Outcome:
        self.proposed.append(command)
        return self.apply(command)


@pytest.fixture()
def node() -> FakeNode:
    node = FakeNode()
    node.apply(CreateBucket(B))
    return node


def _stream(node: FakeNode, name: str) -> None:
    node.apply(CreateStream(B, name, JSON, True))


def _pull(node: FakeNode, sub_id: str, pattern: str, wake: str) -> None:
    outcome = node.apply(PutSubscription(B, "", sub_id, "pull-wake", pattern, [], None, wake, 30_000, None))
    assert outcome.code.value == "created", outcome


def _events(node: FakeNode, name: str) -> list[dict[str, object]]:
    meta = node.machine.lookup(B, name)
    assert meta is not None
    found = node.machine.local_records(meta, 0, 1 << 20)
    assert found is not None
    return [json.loads(bytes(r.record_payload(record))) for _, record in found[0]]


def _counting_pending(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    looked: list[str] = []
    real = rules.pending

    def pending(table: object, sub: r.Subscription) -> dict[str, tuple[int, int]]:
        looked.append(sub.id)
        return real(table, sub)  # type: ignore[arg-type]

    monkeypatch.setattr(rules, "pending", pending)
    return looked


def test_an_idle_pass_looks_at_no_subscription(node: FakeNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every 100 ms every subscription was matched against every stream."""
    _stream(node, "wake")
    for g in range(50):
        for s in range(4):
            _stream(node, f"g{g}/s{s}")
        _pull(node, f"sub{g}", f"g{g}/*", "wake")
    deliveries = Deliveries(node, rng=random.Random(1))
    asyncio.run(deliveries.run_once())  # a new leader looks at everything once
    looked = _counting_pending(monkeypatch)
    for _ in range(5):
        asyncio.run(deliveries.run_once())
    assert looked == []
    node.apply(Append(B, "g7/s2", JSON, memoryview(b'{"n":1}')))
    asyncio.run(deliveries.run_once())
    assert set(looked) == {"sub7"}  # only the one subscription that covers the stream
    assert [event["subscription_id"] for event in _events(node, "wake")] == ["sub7"]  # written by the apply
    assert node.proposed == []  # no entry of the leader's own
    node.apply(Append(B, "g7/s3", JSON, memoryview(b'{"n":2}')))
    assert len(_events(node, "wake")) == 1  # one wake a generation


def test_wakes_cannot_wake_each_other(node: FakeNode) -> None:
    """Each covers the other's wake stream: before, each wake woke the other, forever."""
    for name in ("a/x", "a/wake", "b/x", "b/wake"):
        _stream(node, name)
    _pull(node, "A", "a/*", "b/wake")
    _pull(node, "B", "b/*", "a/wake")
    deliveries = Deliveries(node, rng=random.Random(1))
    node.apply(Append(B, "a/x", JSON, memoryview(b"1")))
    for _ in range(10):
        asyncio.run(deliveries.run_once())
    assert [event["subscription_id"] for event in _events(node, "b/wake")] == ["A"]
    assert _events(node, "a/wake") == [] and node.proposed == []
    assert set(rules.linked(node.machine.table, rules.find(node.machine.table, B, "", "B"))) == {"b/x"}  # type: ignore[arg-type]


def test_a_wake_that_cannot_be_appended_backs_off(node: FakeNode) -> None:
    """Before: a missing wake stream was proposed to about every 100 ms, forever. Now the leader sees
    the applied state refuse it and proposes nothing, retrying 1, 2, 4 ... s apart."""
    _stream(node, "jobs/1")
    _stream(node, "wake")
    _pull(node, "s", "jobs/*", "wake")
    node.apply(DeleteStream(B, "wake"))
    deliveries = Deliveries(node, rng=random.Random(1))
    node.apply(Append(B, "jobs/1", JSON, memoryview(b"1")))

    async def run_for(seconds: int) -> None:
        for _ in range(seconds * 10):  # a pass every 100 ms of the test's clock
            node.clock += 100
            await deliveries.run_once()

    asyncio.run(run_for(60))
    status = deliveries.trouble.status(r.subscription_key(B, "", "s"), node.clock)
    assert status is not None and "not_found" in status["error"]
    assert 5 <= status["attempts"] <= 7, status  # 1, 2, 4, 8, 16 and 32 s apart (less up to 20%), not 600
    assert node.proposed == []
    _stream(node, "wake")  # made again: the next retry gets the wake through
    asyncio.run(run_for(120))  # the next retry: at most 128 s after the last
    assert [type(c).__name__ for c in node.proposed] == ["Wake"] and len(_events(node, "wake")) == 1
    assert deliveries.trouble.status(r.subscription_key(B, "", "s"), node.clock) is None


class Receiver:
    def __init__(self, host: str) -> None:
        self.hosts: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                receiver.hosts.append(self.headers["host"])
                self.send_response(200)
                self.send_header("content-length", "13")
                self.end_headers()
                self.wfile.write(b'{"done":true}')

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    receiver = Receiver("127.0.0.2")
    yield receiver
    receiver.httpd.shutdown()
    receiver.httpd.server_close()


def test_a_webhook_goes_to_the_address_that_was_checked(node: FakeNode, receiver: Receiver) -> None:
    """Before: the check's addresses were dropped and httpx resolved the name again (DNS rebinding);
    here the name does not resolve at all, so only the checked address can be reached."""
    url = f"http://hooks.invalid:{receiver.port}/in"
    checked: list[str] = []

    async def check(target: str, allowed: object) -> Sequence[IPAddress]:
        checked.append(target)
        return [ipaddress.ip_address("127.0.0.2")]

    _stream(node, "orders/1")
    sub = PutSubscription(B, "", "hook", "webhook", "orders/*", [], url, None, 30_000, None, "http://rill")
    node.apply(sub)
    node.apply(Append(B, "orders/1", JSON, memoryview(b"1")))

    async def deliver() -> None:
        deliveries = Deliveries(node, check=check)
        await deliveries.run_once()
        await asyncio.gather(*deliveries._in_flight.values())
        assert deliveries.delivered == 1, deliveries.backoff.failures

    asyncio.run(deliver())
    assert checked == [url] and receiver.hosts == [f"hooks.invalid:{receiver.port}"]
    found = rules.find(node.machine.table, B, "", "hook")
    assert found is not None and not rules.pending(node.machine.table, found)  # {"done": true} acknowledged it


def test_a_failed_delivery_is_retried_later_not_at_once(node: FakeNode) -> None:
    async def check(target: str, allowed: object) -> Sequence[IPAddress]:
        return [ipaddress.ip_address("127.0.0.2")]

    async def post(url: str, addresses: Sequence[IPAddress], body: bytes, headers: dict[str, str]) -> httpx.Response:
        raise httpx.ConnectError("down", request=httpx.Request("POST", url))

    _stream(node, "orders/1")
    node.apply(PutSubscription(B, "", "h", "webhook", "orders/*", [], "http://x/", None, 30_000, None, "http://r"))
    node.apply(Append(B, "orders/1", JSON, memoryview(b"1")))

    async def run() -> int:
        deliveries = Deliveries(node, post=post, check=check, rng=random.Random(3))
        for _ in range(30):
            await deliveries.run_once()
            await asyncio.gather(*deliveries._in_flight.values())
        return deliveries.failed

    assert asyncio.run(run()) == 1  # the clock has not moved: the retry is not due


def test_a_stream_deleted_while_its_webhook_was_out_does_not_keep_the_lease(node: FakeNode) -> None:
    """The answer acknowledges the streams the notification listed; one deleted meanwhile would have
    the whole ack refused and the lease held until it ran out, every other stream's ack lost."""

    async def check(target: str, allowed: object) -> Sequence[IPAddress]:
        return [ipaddress.ip_address("127.0.0.2")]

    async def post(url: str, addresses: Sequence[IPAddress], body: bytes, headers: dict[str, str]) -> httpx.Response:
        node.apply(DeleteStream(B, "orders/2"))  # while the receiver handles it
        return httpx.Response(200, content=b'{"done":true}', request=httpx.Request("POST", url))

    _stream(node, "orders/1")
    _stream(node, "orders/2")
    node.apply(PutSubscription(B, "", "h", "webhook", "orders/*", [], "http://x/", None, 30_000, None, "http://r"))
    node.apply(Append(B, "orders/1", JSON, memoryview(b"1")))
    node.apply(Append(B, "orders/2", JSON, memoryview(b"2")))

    async def deliver() -> None:
        deliveries = Deliveries(node, post=post, check=check)
        await deliveries.run_once()
        await asyncio.gather(*deliveries._in_flight.values())

    asyncio.run(deliver())
    found = rules.find(node.machine.table, B, "", "h")
    assert found is not None and found.holder is None  # the lease is given up at once
    assert found.acked == {"orders/1": 1} and not rules.pending(node.machine.table, found)
