"""The framed peer channel's handshake and frames (app/cluster/channel.py), with hostile peers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import pytest

from app.cluster import channel as ch
from app.cluster.accepted_channels import MAX_UNPROVEN
from app.cluster.peer_channel import Inbound, Outbound
from app.cluster.transport import MAX_FAILED_DIALS, Transport
from app.raft.messages import RequestVote

SECRET = b"s" * 32


def _pair() -> tuple[ch.FrameWriter, ch.FrameReader]:
    h = ch.hello(1, 2)
    answer, key = ch.welcome(SECRET, h)
    assert ch.accept_welcome(SECRET, h, answer) == key
    return ch.FrameWriter(key), ch.FrameReader(key, 1 << 20)


def _wire(pieces: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def test_a_hello_round_trips_and_hostile_ones_do_not_parse() -> None:
    h = ch.hello(7, 9)
    assert ch.parse_hello(ch.hello_header(h)) == h
    for bad in (None, "", "v1 src=1 dst=2", "v2 src=1 dst=2 nonce=" + "0" * 32, "v1 src=-1 dst=2 nonce=" + "0" * 32,
                "v1 src=1 dst=2 nonce=" + "g" * 32, "v1 src=1 dst=2 nonce=" + "0" * 32 + "\r\nx: y"):  # fmt: skip
        assert ch.parse_hello(bad) is None


def test_a_peer_without_the_secret_is_refused_before_anything_is_sent() -> None:
    h = ch.hello(1, 2)
    forged, _ = ch.welcome(b"another cluster's secret", h)
    with pytest.raises(ch.ChannelError, match="secret"):
        ch.accept_welcome(SECRET, h, forged)
    replayed, _ = ch.welcome(SECRET, ch.hello(1, 2))  # an answer to another connection's hello
    with pytest.raises(ch.ChannelError):
        ch.accept_welcome(SECRET, h, replayed)
    for junk in (None, "", "v1 nonce=x mac=y"):
        with pytest.raises(ch.ChannelError):
            ch.accept_welcome(SECRET, h, junk)


def test_frames_arrive_whole_in_order_however_the_bytes_are_cut() -> None:
    writer, reader = _pair()
    payloads = [b"", b"a", b"bc" * 1000, bytes(range(256))]
    wire = b"".join(_wire(writer.frame([p[: len(p) // 2], p[len(p) // 2 :]])) for p in payloads)
    got = []
    for cut in range(0, len(wire), 7):
        got += reader.feed(wire[cut : cut + 7])
    assert got == payloads


@pytest.mark.parametrize("attack", ["replay", "reorder", "drop", "tamper", "other-key", "oversize", "truncated-tag"])
def test_a_frame_that_was_not_sent_in_order_by_the_peer_ends_the_connection(attack: str) -> None:
    writer, reader = _pair()
    first, second, third = (_wire(writer.frame([p])) for p in (b"one", b"two", b"three"))
    assert reader.feed(first) == [b"one"]
    if attack == "replay":
        wire = first
    elif attack == "reorder":
        wire = third + second
    elif attack == "drop":
        wire = third
    elif attack == "tamper":
        wire = second[:13] + b"T" + second[14:]
    elif attack == "other-key":
        other, _ = _pair()
        other.seq = 1
        wire = _wire(other.frame([b"two"]))
    elif attack == "oversize":
        wire = b"\xff\xff\xff\xff" + second[4:]
    else:
        wire = second[:-1] + b"\x00"
    with pytest.raises(ch.ChannelError):
        reader.feed(wire)


def test_acknowledgements_are_checked_and_only_move_forward() -> None:
    writer, _ = _pair()
    acks = ch.AckReader(writer.key)
    wire = ch.ack(writer.key, 3) + ch.ack(writer.key, 5)
    assert acks.feed(wire[:10]) == 0 and acks.feed(wire[10:]) == 5
    with pytest.raises(ch.ChannelError):
        acks.feed(ch.ack(writer.key, 4))  # backwards
    with pytest.raises(ch.ChannelError):
        ch.AckReader(writer.key).feed(ch.ack(b"k" * 32, 9))  # not the session's key


def test_an_oversized_frame_is_refused_from_its_head_alone() -> None:
    writer, _ = _pair()
    reader = ch.FrameReader(writer.key, max_payload=10)
    head = _wire(writer.frame([b"x" * 11]))[:12]
    with pytest.raises(ch.ChannelError, match="cap"):
        reader.feed(head)  # refused before the body arrives or is buffered


class _Socket(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass


def _accepting(
    transport: Transport,
) -> tuple[Callable[..., tuple[Inbound, _Socket]], Callable[[Inbound], None]]:
    def accept(client: str, src: int = 2) -> tuple[Inbound, _Socket]:
        accepted = transport.accept_channel(ch.hello(src, 1), lambda _: None, 1 << 20, client)
        assert accepted is not None
        inbound, socket = accepted[1], _Socket()
        inbound.connection_made(socket)
        return inbound, socket

    def prove(inbound: Inbound) -> None:
        writer = ch.FrameWriter(inbound._frames.key)
        inbound.data_received(b"".join(bytes(p) for p in writer.frame([msgspec.msgpack.encode([])])))

    return accept, prove


def test_channels_asked_for_in_a_peers_name_never_close_its_proven_one() -> None:
    """Anyone may ask for a channel in node 2's name; without the secret it cannot send a frame, so
    it only displaces other unproven channels. A proven channel replaces only an older proven one."""

    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1"}, SECRET, channels=True)
        accept, prove = _accepting(transport)
        real, real_socket = accept("10.0.0.2")
        prove(real)
        attackers = [accept("10.0.0.66") for _ in range(6)]
        assert not real_socket.closed
        assert sum(not socket.closed for _, socket in attackers) <= 2
        again, again_socket = accept("10.0.0.2")
        prove(again)  # node 2 redialed: its older channel goes
        assert real_socket.closed and not again_socket.closed
        assert transport.accept_channel(ch.hello(3, 1), lambda _: None, 1 << 20, "10.0.0.3") is None  # not a member
        assert transport.accept_channel(ch.hello(2, 7), lambda _: None, 1 << 20, "10.0.0.2") is None  # not this node
        await transport.close()

    asyncio.run(run())


def test_a_flood_of_unproven_channels_is_capped_and_keeps_no_peer_off_its_channel() -> None:
    """Without the secret, a flood of upgrades (from two addresses, in every peer's name) holds at
    most MAX_UNPROVEN places, and holding them refuses no one: a peer dialing afterwards takes the
    oldest one's place, proves itself, and keeps its channel whatever the flood does next. (Places
    that refused newcomers let one address keep every peer of a 5-node cluster on HTTP.)"""

    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1", 3: "http://127.0.0.1:2"}, SECRET, channels=True)
        accept, prove = _accepting(transport)
        flood = [accept(f"10.0.1.{i % 2}", src=2 + i % 2) for i in range(30)]
        flood += [accept("10.0.0.2", src=3) for i in range(30)]  # a peer's address, another peer's name
        assert sum(not socket.closed for _, socket in flood) <= MAX_UNPROVEN
        real, real_socket = accept("10.0.0.2")
        assert not real_socket.closed, "refused, or displaced by the places the flood holds"
        prove(real)
        flood += [accept(f"10.0.1.{i % 2}", src=2) for i in range(30)]
        assert not real_socket.closed and real.frames == 1
        assert sum(not socket.closed for _, socket in flood) <= MAX_UNPROVEN
        await transport.close()

    asyncio.run(run())


def test_a_channel_proven_after_a_newer_one_is_the_one_closed() -> None:
    """The first frame of a dial held up on the path: the dialer gave up and redialed, the new
    channel proved itself, then the old frame arrived. The old channel goes, not the live one."""

    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1"}, SECRET, channels=True)
        accept, prove = _accepting(transport)
        late, late_socket = accept("10.0.0.2")
        live, live_socket = accept("10.0.0.2")
        prove(live)
        prove(late)
        assert late_socket.closed and not live_socket.closed
        await transport.close()

    asyncio.run(run())


class _Channel:
    """An Outbound as the sender sees it: open until it dies, acknowledged or not."""

    def __init__(self, acknowledged: bool) -> None:
        self.acknowledged, self.is_open = acknowledged, True

    def close(self) -> None:
        self.is_open = False

    def send(self, pieces: object) -> None:
        pass

    async def drain(self, timeout: float) -> None:
        pass


def test_only_accepted_channels_in_a_row_that_never_carried_anything_send_the_peer_to_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flood of upgrades in a peer's name could keep displacing its channel before its first frame,
    and the dialer redialed forever. A channel that carried something resets the count, a peer that
    cannot be reached is not counted, and a dead channel counts once."""

    assert MAX_FAILED_DIALS == 3  # what the sequence below is written for

    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1"}, SECRET, channels=True)
        dials: list[bool | None] = []  # per dial: acknowledged later or not; None: the dial fails

        async def dial(*args: object) -> _Channel:
            acknowledged = dials.pop(0)
            if acknowledged is None:
                raise OSError("connection refused")
            return _Channel(acknowledged)

        monkeypatch.setattr(Outbound, "open", dial)

        async def send_after_a_death(acknowledged: bool | None) -> bool:
            out = transport._outbound.get(2)
            if out is not None:
                out.close()
            dials.append(acknowledged)
            return await transport._send_on_channel(2, [b"batch"], 5)

        assert await send_after_a_death(False)
        assert await send_after_a_death(True) and transport._failed_dials[2] == 1  # the first one counted
        assert await send_after_a_death(False) and transport._failed_dials[2] == 0  # it carried something
        assert await send_after_a_death(False) and await send_after_a_death(None)
        assert transport._failed_dials[2] == 2 and 2 not in transport._outbound  # the refused dial: not counted
        assert await send_after_a_death(False) and transport._failed_dials[2] == 2  # nothing was there to count
        assert not await send_after_a_death(False), "the third in a row: HTTP"
        assert transport._http_until[2] > 0 and transport._failed_dials[2] == 0
        await transport.close()

    asyncio.run(run())


def test_a_peer_that_cuts_the_handshake_short_does_not_end_the_sender() -> None:
    """A proxy or peer that accepts and closes mid-handshake (an EOF, not an OSError) once ended the
    sender task for that peer for good: rill bench chaos found a node that never heard from it again."""

    async def run() -> None:
        accepted = 0

        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = Transport(1, {2: f"http://127.0.0.1:{port}"}, SECRET, channels=True)
        transport.start()
        for _ in range(3):
            await transport.send([RequestVote(term=1, src=1, dst=2, last_index=0, last_term=0)])
            await asyncio.sleep(0.2)
        assert accepted >= 3, "every batch dialed again"
        assert not transport._tasks[2].done(), "the sender lives on"
        await transport.close()
        server.close()

    asyncio.run(run())


def test_a_peer_whose_proof_keeps_failing_is_not_redialed_for_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer under another secret answers every dial with a 101 whose proof fails: once that was a
    dial and a warning per batch, for good; now its dials count as failed, and it gets HTTP."""

    async def run() -> None:
        transport = Transport(1, {2: "http://127.0.0.1:1"}, SECRET, channels=True)
        dials = 0

        async def wrong_secret(*args: object) -> Outbound:
            nonlocal dials
            dials += 1
            raise ch.ChannelError("the peer's proof does not match: another cluster secret?")

        monkeypatch.setattr(Outbound, "open", wrong_secret)
        sent = []
        for _ in range(10):  # as the peer's sender does: the channel while it is not on HTTP
            on_http = time.monotonic() < transport._http_until.get(2, 0.0)
            sent.append("http" if on_http else await transport._send_on_channel(2, [b"batch"], 5))
        assert dials == MAX_FAILED_DIALS
        assert sent == [True] * (MAX_FAILED_DIALS - 1) + [False] + ["http"] * (10 - MAX_FAILED_DIALS)
        transport.set_peers({2: "http://127.0.0.1:3"})  # moved: what the old address did is forgotten
        assert 2 not in transport._http_until
        await transport.close()

    asyncio.run(run())


def test_a_sender_stopped_as_its_dial_completes_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport's close came just as a peer's sender finished dialing; `asyncio.wait_for` (Python
    3.11) then returned the connection and dropped the cancellation, the sender went back to waiting
    for messages, and close waited for it for good: a node's shutdown hung (`rill cluster up` failed
    its stop in CI). The close is made to land at that moment here."""

    async def run() -> None:
        async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = Transport(1, {2: f"http://127.0.0.1:{port}"}, SECRET, channels=True)
        dial = asyncio.open_connection
        closing: list[asyncio.Future[None]] = []

        async def dial_then_close(*args: object, **kwargs: object) -> object:
            connection = await dial(*args, **kwargs)  # type: ignore[arg-type]
            closing.append(asyncio.ensure_future(transport.close()))  # its cancel runs before the dial's result
            return connection

        monkeypatch.setattr(asyncio, "open_connection", dial_then_close)
        transport.start()
        await transport.send([RequestVote(term=1, src=1, dst=2, last_index=0, last_term=0)])
        while not closing:
            await asyncio.sleep(0.01)
        done, _ = await asyncio.wait(closing, timeout=5)
        assert done, "the transport's close waits for a sender that was told to stop"
        assert transport._tasks[2].cancelled()
        server.close()

    asyncio.run(run())
