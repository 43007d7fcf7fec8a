"""post_pinned: a webhook goes to an address the SSRF check approved, never to what its name resolves to
later (DNS rebinding), with the name kept for Host, TLS server name and certificate. All on 127.0.0.0/8."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trustme

from app.subscriptions.pinned import MAX_ANSWER_BYTES, post_pinned
from app.subscriptions.urls import WebhookUrlRejected, check_webhook_url

pytestmark = pytest.mark.anyio
NAME = "hooks.example.test"
BODY = b'{"subscription_id":"s"}'
HEADERS = {"content-type": "application/json", "webhook-signature": "t=1,v1=x"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Receiver:
    """An HTTP/1.1 endpoint that keeps connections open, answers `status` with its own name (or reads
    the request and hangs up when `status` is 0) and keeps what it was sent, with the TLS server name asked for."""

    def __init__(self, name: str, status: int = 200) -> None:
        self.name, self.status = name, status
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.server_names: list[str | None] = []
        self.port = 0

    def server_name(self, _obj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.server_names.append(name)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
                self.requests.append((headers, await reader.readexactly(int(headers.get("content-length", "0")))))
                if not self.status:
                    break
                answer = self.name.encode()
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (self.status, len(answer), answer))
                await writer.drain()
        writer.close()


async def listen(receiver: Receiver, host: str, port: int = 0, tls: ssl.SSLContext | None = None) -> asyncio.Server:
    if tls is not None:
        tls.sni_callback = receiver.server_name
    server = await asyncio.start_server(receiver.serve, host, port, ssl=tls)
    receiver.port = server.sockets[0].getsockname()[1]
    return server


@contextlib.asynccontextmanager
async def serving(receiver: Receiver, host: str, tls: ssl.SSLContext | None = None) -> AsyncIterator[Receiver]:
    async with await listen(receiver, host, tls=tls):
        yield receiver


def answer(host: str, port: Any) -> list[tuple[Any, ...]]:
    return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, int(port or 0)))]


class Rebinding:
    """socket.getaddrinfo for NAME: 127.0.0.2 the first time, 127.0.0.1 after; other hosts as usual."""

    def __init__(self) -> None:
        self.real = socket.getaddrinfo
        self.lookups = 0

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if (host.decode() if isinstance(host, bytes) else host) != NAME:
            return self.real(host, port, *args, **kwargs)
        self.lookups += 1
        return answer("127.0.0.2" if self.lookups == 1 else "127.0.0.1", port)


@pytest.fixture
def rebinding(monkeypatch: pytest.MonkeyPatch) -> Rebinding:
    """check_webhook_url and httpx (anyio, via the event loop's executor) both resolve through it."""
    fake = Rebinding()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving a made-up .test name fails the test: post_pinned must not look names up."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        assert not (host.decode() if isinstance(host, bytes) else str(host)).endswith(".test"), f"resolved {host}"
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@contextlib.asynccontextmanager
async def same_port(receiver: Receiver, loopback: Receiver) -> AsyncIterator[int]:
    """`receiver` on 127.0.0.2 and `loopback` on 127.0.0.1, both on one port."""
    for _ in range(5):  # the port the kernel picks for 127.0.0.2 may be taken on 127.0.0.1
        first = await listen(receiver, "127.0.0.2")
        try:
            second = await listen(loopback, "127.0.0.1", receiver.port)
        except OSError:
            first.close()
            continue
        async with first, second:
            yield receiver.port
        return
    raise OSError("no port free on both 127.0.0.1 and 127.0.0.2")


async def test_a_name_that_rebinds_to_loopback_still_reaches_the_approved_address(rebinding: Rebinding) -> None:
    receiver, loopback = Receiver("receiver"), Receiver("loopback service")
    async with same_port(receiver, loopback) as port, httpx.AsyncClient(timeout=5) as client:
        url = f"http://{NAME}:{port}/hook"
        addresses = check_webhook_url(url, [ipaddress.ip_network("127.0.0.2/32")])
        assert addresses == [ipaddress.ip_address("127.0.0.2")]
        with pytest.raises(WebhookUrlRejected, match="loopback, private"):  # the name has moved on since
            check_webhook_url(url, [ipaddress.ip_network("127.0.0.2/32")])
        lookups = rebinding.lookups

        response = await post_pinned(client, url, addresses, BODY, HEADERS)
        assert (response.status_code, response.text) == (200, "receiver")
        assert rebinding.lookups == lookups  # the name was not resolved again
        [(headers, body)] = receiver.requests
        assert (headers["host"], headers["webhook-signature"], body) == (f"{NAME}:{port}", "t=1,v1=x", BODY)
        assert loopback.requests == []

        # What delivery did before: httpx resolves the name itself and the signed POST lands on loopback.
        assert (await client.post(url, content=BODY, headers=HEADERS)).text == "loopback service"
        assert len(loopback.requests) == 1


def tls_serving(ca: trustme.CA, certified: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(certified).configure_cert(context)
    return context


def trusting(ca: trustme.CA) -> httpx.AsyncClient:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return httpx.AsyncClient(verify=context, timeout=5)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.mark.usefixtures("no_dns")
async def test_https_verifies_the_certificate_for_the_original_name(ca: trustme.CA) -> None:
    at = [ipaddress.ip_address("127.0.0.1")]
    async with serving(Receiver("receiver"), "127.0.0.1", tls=tls_serving(ca, NAME)) as receiver, trusting(ca) as c:
        response = await post_pinned(c, f"https://{NAME}:{receiver.port}/hook", at, BODY, HEADERS)
        assert (response.status_code, response.text) == (200, "receiver")
        assert receiver.server_names == [NAME]
        assert receiver.requests[0][0]["host"] == f"{NAME}:{receiver.port}"

        # The pool knows the connection by 127.0.0.1 and port: another name must not ride on it.
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await post_pinned(c, f"https://other.example.test:{receiver.port}/hook", at, BODY, HEADERS)
        assert len(receiver.requests) == 1


@pytest.mark.usefixtures("no_dns")
async def test_https_refuses_a_certificate_for_another_name(ca: trustme.CA) -> None:
    at = [ipaddress.ip_address("127.0.0.1")]
    tls = tls_serving(ca, "other.example.test")
    async with serving(Receiver("impostor"), "127.0.0.1", tls=tls) as impostor, trusting(ca) as client:
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await post_pinned(client, f"https://{NAME}:{impostor.port}/hook", at, BODY, HEADERS)
        assert impostor.server_names == [NAME]
        assert impostor.requests == []


@pytest.mark.usefixtures("no_dns")
async def test_a_refused_connection_moves_on_to_the_next_address() -> None:
    async with serving(Receiver("receiver"), "127.0.0.2") as receiver, httpx.AsyncClient(timeout=5) as client:
        url = f"http://{NAME}:{receiver.port}/hook"
        addresses = [ipaddress.ip_address("127.0.0.3"), ipaddress.ip_address("127.0.0.2")]  # nothing on .3
        assert (await post_pinned(client, url, addresses, BODY, HEADERS)).text == "receiver"
        with pytest.raises(httpx.ConnectError):
            await post_pinned(client, url, addresses[:1], BODY, HEADERS)


@pytest.mark.usefixtures("no_dns")
@pytest.mark.parametrize(("status", "outcome"), [(500, None), (0, httpx.RemoteProtocolError)])
async def test_once_a_request_is_sent_no_other_address_is_tried(status: int, outcome: type[Exception] | None) -> None:
    first, second = Receiver("first", status), Receiver("second")
    async with same_port(first, second) as port, httpx.AsyncClient(timeout=5) as client:
        addresses = [ipaddress.ip_address("127.0.0.2"), ipaddress.ip_address("127.0.0.1")]
        url = f"http://{NAME}:{port}/hook"
        if outcome is None:
            assert (await post_pinned(client, url, addresses, BODY, HEADERS)).status_code == status
        else:
            with pytest.raises(outcome):
                await post_pinned(client, url, addresses, BODY, HEADERS)
        assert (len(first.requests), second.requests) == (1, [])


async def test_the_request_names_the_ip_literal_and_keeps_the_name_for_host_and_tls() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler), follow_redirects=True) as client:
        headers = {**HEADERS, "Host": "attacker.example"}
        await post_pinned(client, f"https://{NAME}/hook?x=1", [ipaddress.ip_address("2001:db8::1")], BODY, headers)
        await post_pinned(client, f"http://{NAME}:8080/hook", [ipaddress.ip_address("127.0.0.2")], BODY, HEADERS)
    https, http = seen
    assert str(https.url) == "https://[2001:db8::1]/hook?x=1"
    assert (https.headers["host"], https.extensions["sni_hostname"]) == (NAME, NAME)
    assert https.headers["webhook-signature"] == "t=1,v1=x"
    assert str(http.url) == "http://127.0.0.2:8080/hook"
    assert http.headers["host"] == f"{NAME}:8080" and "sni_hostname" not in http.extensions


async def test_a_redirect_is_not_followed() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(307, headers={"location": "http://127.0.0.1/"}))
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as client:
        response = await post_pinned(client, f"http://{NAME}/hook", [ipaddress.ip_address("127.0.0.2")], BODY, HEADERS)
    assert response.status_code == 307


async def test_a_receivers_answer_is_read_up_to_a_bound() -> None:
    """Any endpoint may answer without end: the leader keeps MAX_ANSWER_BYTES of it, not all."""
    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while sent < 1 << 30:
                writer.write(b"x" * 65536)
                sent += 65536
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, httpx.AsyncClient(timeout=5) as client:
        url = f"http://127.0.0.1:{port}/hook"
        response = await post_pinned(client, url, [ipaddress.ip_address("127.0.0.1")], b"{}", {})
    assert response.status_code == 200
    assert len(response.content) == MAX_ANSWER_BYTES
    assert sent < 64 * MAX_ANSWER_BYTES  # it stopped reading, and closed
