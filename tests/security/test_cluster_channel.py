"""The channel between nodes: signatures bound to a node, a path, a body and a moment, refused
when replayed; internal routes that read no body before the signature header checks out and cap
what they read; and membership changes that need an admin token, never the cluster secret."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from app.cluster.checkpoints import PATH as CHECKPOINT_PATH
from app.cluster.transport import (
    AUTH_HEADER,
    BATCH_BYTES,
    PATH,
    WINDOW_SECONDS,
    Verifier,
    message_cap,
    parse,
    sign,
)
from app.domain.errors import ProtocolError
from app.raft import leader
from app.raft.messages import AppendEntries, Entry, Message
from app.security.authenticator import AuthSettings
from tests.inprocess import Node, client_for, running_node
from tests.security.helpers import ROLES, TOKENS, bearer, token_configs
from tests.server import RillCluster

SECRET = b"s3cret"
NOW = 1_700_000_000.0
EMPTY = b"\x90"  # an empty msgpack array: a valid, empty batch of Raft messages


def _verifier(clock: list[float], node_id: int = 2, **kwargs: float) -> Verifier:
    return Verifier(SECRET, node_id, clock=lambda: clock[0], **kwargs)  # type: ignore[arg-type]


def _refused(verifier: Verifier, header: str | None, path: str = PATH) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        verifier.check(header, path)
    return caught.value


def test_a_signature_binds_time_nodes_path_and_body() -> None:
    clock = [NOW]
    header = sign(SECRET, 1, 2, PATH, b"body", now_ms=int(NOW * 1000))
    sig = _verifier(clock).check(header, PATH)
    assert (sig.ts, sig.src, sig.dst) == (int(NOW * 1000), 1, 2)
    assert Verifier.body_matches(sig, hashlib.sha256(b"body").hexdigest())
    assert not Verifier.body_matches(sig, hashlib.sha256(b"bodY").hexdigest())  # a tampered body


def test_a_message_for_another_node_is_refused() -> None:
    header = sign(SECRET, 1, 3, PATH, b"", now_ms=int(NOW * 1000))
    err = _refused(_verifier([NOW], node_id=2), header)
    assert err.status == 403 and "addressed to node 3" in err.message


@pytest.mark.parametrize("offset", [-WINDOW_SECONDS - 0.01, WINDOW_SECONDS + 0.01, -3600.0, 3600.0])
def test_stale_and_future_signatures_are_refused(offset: float) -> None:
    header = sign(SECRET, 1, 2, PATH, b"", now_ms=int((NOW + offset) * 1000))
    assert _refused(_verifier([NOW]), header).status == 403


@pytest.mark.parametrize("offset", [-WINDOW_SECONDS + 0.01, 0.0, WINDOW_SECONDS - 0.01])
def test_signatures_inside_the_window_are_accepted(offset: float) -> None:
    header = sign(SECRET, 1, 2, PATH, b"", now_ms=int((NOW + offset) * 1000))
    assert _verifier([NOW]).check(header, PATH).src == 1


def test_a_replay_inside_the_window_is_refused_and_after_it_is_stale() -> None:
    clock = [NOW]
    verifier = _verifier(clock)
    header = sign(SECRET, 1, 2, PATH, EMPTY, now_ms=int(NOW * 1000))
    verifier.check(header, PATH)
    for _ in range(3):
        clock[0] += 1.0
        err = _refused(verifier, header)
        assert (err.status, err.code) == (409, "replayed")
    clock[0] = NOW + WINDOW_SECONDS + 1
    assert _refused(verifier, header).status == 403
    # The same body signed again is a new message (a new nonce), accepted once.
    again = sign(SECRET, 1, 2, PATH, EMPTY, now_ms=int(clock[0] * 1000))
    verifier.check(again, PATH)
    assert _refused(verifier, again).status == 409


def test_a_signature_is_bound_to_its_path_sender_and_secret() -> None:
    header = sign(SECRET, 1, 2, PATH, b"x", now_ms=int(NOW * 1000))
    assert _refused(_verifier([NOW]), header, CHECKPOINT_PATH).status == 403  # another route
    assert _refused(_verifier([NOW]), header.replace("src=1", "src=3")).status == 403  # another sender
    assert _refused(_verifier([NOW]), header.replace(header[-64:], "0" * 64)).status == 403  # another MAC
    other = sign(b"other secret", 1, 2, PATH, b"x", now_ms=int(NOW * 1000))
    assert _refused(_verifier([NOW]), other).status == 403
    # Another body's digest in the header: the MAC no longer matches.
    tampered = header.replace(hashlib.sha256(b"x").hexdigest(), hashlib.sha256(b"y").hexdigest())
    assert _refused(_verifier([NOW]), tampered).status == 403


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        "v1 ts=1 src=1 dst=2",
        "v2 ts=1700000000000 src=1 dst=2 nonce=0011223344556677 sha256=" + "a" * 64 + " mac=" + "b" * 64,
        "v1 ts=-1 src=1 dst=2 nonce=0011223344556677 sha256=" + "a" * 64 + " mac=" + "b" * 64,
        "v1 ts=1700000000000 src=1 dst=2 nonce=xyz sha256=" + "a" * 64 + " mac=" + "b" * 64,
        "v1 ts=1700000000000 src=1 dst=2 nonce=0011223344556677 sha256=" + "a" * 63 + " mac=" + "b" * 64,
    ],
)
def test_a_missing_or_malformed_header_is_refused(header: str | None) -> None:
    assert parse(header) is None
    assert _refused(_verifier([NOW]), header).status == 403


def test_a_node_without_a_secret_accepts_nothing() -> None:
    header = sign(b"", 1, 2, PATH, b"", now_ms=int(NOW * 1000))
    assert _refused(Verifier(b"", 2, clock=lambda: NOW), header).status == 403


def test_remembered_signatures_are_forgotten_after_the_window_and_bounded() -> None:
    clock = [NOW]
    verifier = _verifier(clock, capacity=100)
    for i in range(100):
        verifier.check(sign(SECRET, 1, 2, PATH, b"%d" % i, now_ms=int(clock[0] * 1000)), PATH)
    full = _refused(verifier, sign(SECRET, 1, 2, PATH, b"one more", now_ms=int(clock[0] * 1000)))
    assert full.status == 503  # refused rather than forgetting a signature still inside the window
    clock[0] += 2 * WINDOW_SECONDS + 1
    verifier.check(sign(SECRET, 1, 2, PATH, b"later", now_ms=int(clock[0] * 1000)), PATH)
    assert verifier._count == 1


def test_append_entries_stay_within_the_byte_budget() -> None:
    big = [Entry(1, i, b"x" * (1 << 20)) for i in range(1, 11)]
    assert len(leader._within_budget(big)) == leader.MAX_BYTES_PER_MESSAGE >> 20
    huge = [Entry(1, 1, b"x" * (leader.MAX_BYTES_PER_MESSAGE * 2)), Entry(1, 2, b"y")]
    assert len(leader._within_budget(huge)) == 1  # one entry larger than the budget still goes, alone
    assert message_cap(1 << 20) >= BATCH_BYTES + leader.MAX_BYTES_PER_MESSAGE // 4


@pytest.fixture(scope="module")
async def auth_on(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    auth = AuthSettings(mode="on", tokens=token_configs(ROLES, TOKENS))
    async with running_node(tmp_path_factory.mktemp("members"), auth=auth) as node:
        yield node


@pytest.fixture(scope="module", params=["on", "off"])
async def either_mode(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, Node]]:
    auth = AuthSettings(mode=request.param, tokens=token_configs(ROLES, TOKENS))
    async with running_node(tmp_path_factory.mktemp(f"members-{request.param}"), auth=auth) as node:
        yield request.param, node


@pytest.mark.anyio
async def test_with_auth_on_members_and_node_details_need_an_admin_token(auth_on: Node) -> None:
    async with client_for(auth_on) as client:
        assert (await client.get("/_rill/members")).status_code == 401
        assert (await client.get("/_rill/members", headers=bearer(TOKENS["acme-read"]))).status_code == 403
        assert (await client.get("/_rill/members", headers=bearer(TOKENS["acme-admin"]))).status_code == 403
        assert (await client.get("/_rill/members", headers=bearer("rill_not-a-token"))).status_code == 401
        listed = await client.get("/_rill/members", headers=bearer(TOKENS["root"]))
        assert listed.status_code == 200 and "voters" in listed.json()

        for headers in ({}, bearer(TOKENS["acme-read"]), bearer(TOKENS["expired"])):
            resp = await client.get("/healthz", headers=headers)
            assert resp.status_code == 200 and resp.json() == {"status": "ok"}
        full = (await client.get("/healthz", headers=bearer(TOKENS["root"]))).json()
        assert full["status"] == "ok" and full["role"] == "leader" and "peers" in full


@pytest.mark.anyio
async def test_membership_changes_need_admin_whatever_the_mode(either_mode: tuple[str, Node]) -> None:
    mode, node = either_mode
    async with client_for(node) as client:
        new = {"id": 9, "url": "http://127.0.0.1:9"}
        assert (await client.post("/_rill/members", json=new)).status_code == 401
        assert (await client.delete("/_rill/members/9")).status_code == 401
        assert (await client.delete("/_rill/members/9", headers=bearer(TOKENS["acme-read"]))).status_code == 403
        assert (await client.delete("/_rill/members/9", headers=bearer(TOKENS["acme-admin"]))).status_code == 403
        assert (await client.delete("/_rill/members/9", headers=bearer(TOKENS["root"]))).status_code == 404
        if mode == "off":
            assert (await client.get("/_rill/members")).status_code == 200  # listing stays public
            assert "role" in (await client.get("/healthz")).json()


# A small entry limit keeps the internal routes' cap (and a test that fills it) small.
SMALL = {"RILL_MAX_BODY_BYTES": str(1 << 20), "RILL_SNAPSHOT_MAX_BYTES": str(1 << 20)}
CAP = message_cap(1 << 20)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path_factory.mktemp("channel"), env=SMALL).start()
    yield nodes
    nodes.stop()


def _memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB: its resident memory now and at its peak."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _blast(port: int, head: bytes, body: Iterator[bytes]) -> tuple[bytes, int]:
    """Sends `head` and then `body` as fast as the server takes it, while reading the response:
    (the response's head, or b"" if the connection was reset first; body bytes sent before the end)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent = 0

    def pump() -> None:
        nonlocal sent
        try:
            sock.sendall(head)
            for chunk in body:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection: that is the point

    sender = threading.Thread(target=pump, daemon=True)
    sender.start()
    response = b""
    try:
        while b"\r\n\r\n" not in response:
            data = sock.recv(65536)
            if not data:
                break
            response += data
    except OSError:
        pass
    sender.join(60)
    sock.close()
    return response, sent


def _chunks(total: int, size: int = 1 << 20, chunked: bool = False) -> Iterator[bytes]:
    block = b"\0" * size
    for _ in range(total // size):
        yield b"%x\r\n%s\r\n" % (size, block) if chunked else block
    if chunked:
        yield b"0\r\n\r\n"


def _head(port: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(response: bytes) -> int | None:
    return int(response[9:12]) if response.startswith(b"HTTP/1.1 ") else None


def test_oversized_internal_posts_are_refused_without_buffering(cluster: RillCluster) -> None:
    node = cluster.nodes[1]
    assert node.proc is not None
    pid, port = node.proc.pid, node.port
    rss_before, peak_before = _memory_kib(pid)
    declared = 512 << 20
    now_ms = int(time.time() * 1000)
    valid = sign(RillCluster.SECRET.encode(), 2, 1, PATH, b"not the body", now_ms)
    cases = {
        "unsigned, 512 MiB declared": ({"Content-Length": str(declared)}, _chunks(declared), 403),
        "unsigned, chunked 512 MiB": ({"Transfer-Encoding": "chunked"}, _chunks(declared, chunked=True), 403),
        "forged signature, 512 MiB": (
            {"Content-Length": str(declared), AUTH_HEADER: sign(b"guess", 2, 1, PATH, b"", now_ms)},
            _chunks(declared),
            403,
        ),
        "signed, 512 MiB declared": ({"Content-Length": str(declared), AUTH_HEADER: valid}, _chunks(declared), 413),
    }
    report = []
    for name, (headers, body, expected) in cases.items():
        started = time.monotonic()
        response, sent = _blast(port, _head(port, headers), body)
        status = _status(response)
        assert status in (expected, None), (name, response[:200])  # None: reset before the answer was read
        assert sent < 64 << 20, (name, sent)  # the server stopped taking the body almost at once
        report.append(f"{name}: {status}, {sent >> 20} MiB accepted, {time.monotonic() - started:.2f} s")
    rss_refused, peak_refused = _memory_kib(pid)
    mib = (rss_before >> 10, rss_refused >> 10, peak_before >> 10, peak_refused >> 10)
    report.append("server RSS {} -> {} MiB, peak {} -> {} MiB".format(*mib))
    assert peak_refused - peak_before < 8 << 10  # KiB: none of the 512 MiB bodies was buffered
    # Signed and chunked past the cap: read up to the cap (12 MiB here), then 413.
    signed = sign(RillCluster.SECRET.encode(), 2, 1, PATH, b"never sent", int(time.time() * 1000))
    headers = {"Transfer-Encoding": "chunked", AUTH_HEADER: signed}
    response, sent = _blast(port, _head(port, headers), _chunks(256 << 20, chunked=True))
    assert _status(response) in (413, None) and sent < CAP + (64 << 20)
    report.append(f"signed, chunked past the {CAP >> 20} MiB cap: {_status(response)}, {sent >> 20} MiB accepted")

    rss_after, peak_after = _memory_kib(pid)
    report.append(f"server RSS -> {rss_after >> 10} MiB, peak -> {peak_after >> 10} MiB")
    print("\n" + "\n".join(report))
    assert peak_after - peak_refused < (CAP >> 10) * 2  # at most the cap (and one copy) was held
    assert cluster.health(1) is not None  # and the node is fine


def test_a_signed_body_must_be_the_one_signed(cluster: RillCluster) -> None:
    url = cluster.nodes[1].url + PATH
    header = sign(RillCluster.SECRET.encode(), 2, 1, PATH, EMPTY)
    resp = httpx.post(url, content=b"\x91\xc0", headers={AUTH_HEADER: header})
    assert resp.status_code == 403 and "not the one that was signed" in resp.text


def test_a_message_posted_to_the_wrong_node_is_refused(cluster: RillCluster) -> None:
    header = sign(RillCluster.SECRET.encode(), 2, 3, PATH, EMPTY)  # for node 3, posted to node 1
    resp = httpx.post(cluster.nodes[1].url + PATH, content=EMPTY, headers={AUTH_HEADER: header})
    assert resp.status_code == 403 and "addressed to node 3" in resp.text


def test_membership_needs_an_admin_token_not_the_cluster_secret(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    target = cluster.nodes[leader].url + "/_rill/members"
    new = {"id": 9, "url": "http://127.0.0.1:9"}
    assert httpx.post(target, json=new).status_code == 401
    assert httpx.post(target, json=new, headers={"authorization": f"Bearer {RillCluster.SECRET}"}).status_code == 401
    assert httpx.delete(target + "/9", headers=bearer(RillCluster.READ_TOKEN)).status_code == 403
    assert httpx.delete(target + "/9", headers=cluster.admin).status_code == 404
    assert httpx.get(target).status_code == 200  # auth is off: the list stays public


def test_a_replayed_heartbeat_is_refused_and_cannot_keep_a_stopped_leader_in_place(cluster: RillCluster) -> None:
    """The issue's attack: a captured heartbeat replayed every 100 ms to a follower of a SIGSTOPped
    leader kept the follower from voting, so no new leader was elected for 20 s."""
    leader = cluster.wait_for_leader()
    health = cluster.health(leader)
    assert health is not None
    follower = next(i for i in cluster.nodes if i != leader)
    heartbeat: list[Message] = [AppendEntries(int(health["term"]), leader, follower, 0, 0, [], 0)]  # type: ignore[call-overload]
    body = msgspec.msgpack.encode(heartbeat)
    # What the leader's transport sends: signed by the leader, for this follower, now.
    captured = {AUTH_HEADER: sign(RillCluster.SECRET.encode(), leader, follower, PATH, body)}
    url = cluster.nodes[follower].url + PATH
    assert httpx.post(url, content=body, headers=captured).status_code == 204  # the original, accepted

    cluster.nodes[leader].pause()
    try:
        started = time.monotonic()
        statuses: list[int] = []
        new_leader = None
        while time.monotonic() - started < 10 and new_leader is None:
            statuses.append(httpx.post(url, content=body, headers=captured, timeout=2).status_code)
            time.sleep(0.1)
            for i in cluster.nodes:
                if i != leader and (h := cluster.health(i)) and h.get("role") == "leader":
                    new_leader = i
        elapsed = time.monotonic() - started
        print(f"\nnew leader {new_leader} after {elapsed:.1f} s; {len(statuses)} replays, answered {set(statuses)}")
        assert statuses and statuses[0] == 409 and set(statuses) <= {403, 409}
        assert new_leader is not None, f"no new leader in {elapsed:.1f} s"
    finally:
        cluster.nodes[leader].resume()
    cluster.wait_for_leader()
