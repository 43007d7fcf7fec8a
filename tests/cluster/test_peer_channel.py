"""The receiving end of a peer channel (`Inbound`) on a fake transport: frames delivered in order, and
acknowledged together a moment later rather than one write per frame."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from app.cluster import channel as ch
from app.cluster import peer_channel
from app.cluster.peer_channel import ACK_DELAY, ACK_SECONDS, FIRST_FRAME_CAP, Inbound, Outbound
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message

KEY = b"k" * 32


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _inbound(delivered: list[list[Message]], max_payload: int = 1 << 20) -> tuple[Inbound, FakeTransport]:
    inbound = Inbound(KEY, 2, 1, max_payload, delivered.append, lambda _: None, lambda _: None)
    transport = FakeTransport()
    inbound.connection_made(transport)  # type: ignore[arg-type]
    return inbound, transport


def _frames(writer: ch.FrameWriter, count: int) -> bytes:
    payload = msgspec.msgpack.encode([AppendResponse(term=1, src=2, dst=1, success=True, match_index=0)])
    return b"".join(bytes(piece) for _ in range(count) for piece in writer.frame([payload]))


def _frames_of(writer: ch.FrameWriter, payload: bytes) -> bytes:
    return b"".join(bytes(piece) for piece in writer.frame([payload]))


def _acked(written: list[bytes]) -> list[int]:
    reader = ch.AckReader(KEY)
    return [reader.feed(data) for data in written]


def test_frames_are_acknowledged_together_after_a_short_delay() -> None:
    async def scenario() -> None:
        delivered: list[list[Message]] = []
        inbound, transport = _inbound(delivered)
        writer = ch.FrameWriter(KEY)
        wire = _frames(writer, 20)
        for start in range(0, len(wire), 37):  # in pieces, as TCP may split them
            inbound.data_received(wire[start : start + 37])
        assert len(delivered) == 20 and transport.written == []  # no write per frame
        await asyncio.sleep(ACK_DELAY + 0.05)
        assert _acked(transport.written) == [20]  # one acknowledgement for all of them
        inbound.data_received(_frames(writer, 1))
        await asyncio.sleep(ACK_DELAY + 0.05)
        assert _acked(transport.written) == [20, 21]
        await asyncio.sleep(ACK_DELAY + 0.05)
        assert len(transport.written) == 2  # nothing new, nothing written

    asyncio.run(scenario())


def test_a_steady_flow_of_frames_is_acknowledged_as_it_goes() -> None:
    """Frames that never stop still get acknowledgements, one per delay, not only once they stop."""

    async def scenario() -> None:
        inbound, transport = _inbound([])
        writer = ch.FrameWriter(KEY)
        loop = asyncio.get_running_loop()
        end = loop.time() + 4 * ACK_DELAY
        while loop.time() < end:
            inbound.data_received(_frames(writer, 1))
            await asyncio.sleep(ACK_DELAY / 10)
        acked = _acked(transport.written)
        assert len(acked) >= 3 and acked == sorted(acked) and acked[-1] >= writer.seq - 12

    asyncio.run(scenario())


def test_the_delay_leaves_the_dialer_time_to_see_a_stalled_connection() -> None:
    assert ACK_DELAY * 4 <= ACK_SECONDS  # a live peer's acknowledgements come well inside the dialer's limit


def test_a_closed_channel_writes_no_acknowledgement() -> None:
    async def scenario() -> None:
        inbound, transport = _inbound([])
        inbound.data_received(_frames(ch.FrameWriter(KEY), 3))
        inbound.close()
        await asyncio.sleep(ACK_DELAY + 0.05)
        assert transport.closed and transport.written == []

    asyncio.run(scenario())


def test_a_forged_frame_closes_the_channel_and_delivers_nothing() -> None:
    async def scenario() -> None:
        delivered: list[list[Message]] = []
        inbound, transport = _inbound(delivered)
        inbound.data_received(_frames(ch.FrameWriter(b"x" * 32), 1))
        assert transport.closed and delivered == []
        await asyncio.sleep(ACK_DELAY + 0.05)
        assert transport.written == []

    asyncio.run(scenario())


def test_before_its_first_frame_a_channel_buffers_no_more_than_the_first_frame_cap() -> None:
    """Anyone may open a channel; a first frame as long as the cap on every frame (tens of MiB) was
    buffered whole before its tag could show it came from no peer."""

    async def scenario() -> None:
        delivered: list[list[Message]] = []
        inbound, transport = _inbound(delivered, max_payload=4 * FIRST_FRAME_CAP)
        writer = ch.FrameWriter(KEY)
        head = _frames_of(writer, b"x" * (FIRST_FRAME_CAP + 1))[:12]
        inbound.data_received(head)  # refused from its head alone
        assert transport.closed and delivered == []

        inbound, transport = _inbound(delivered, max_payload=4 * FIRST_FRAME_CAP)
        writer = ch.FrameWriter(KEY)
        batch = [AppendEntries(1, 2, 1, 0, 0, [Entry(1, 1, b"x" * (FIRST_FRAME_CAP + 1))], 0)]
        proof = _frames_of(writer, msgspec.msgpack.encode([]))  # the dialer's first frame
        inbound.data_received(proof + _frames_of(writer, msgspec.msgpack.encode(batch)))  # in one read
        assert not transport.closed and delivered == [batch], "once proven, the channel's own cap"
        inbound.close()

    asyncio.run(scenario())


def test_a_closed_channel_lets_go_of_its_buffer_and_its_timer() -> None:
    """A closed channel's first-frame timer kept it, and what it had buffered, for 10 s."""

    async def scenario() -> None:
        inbound, transport = _inbound([])
        inbound.data_received(_frames(ch.FrameWriter(KEY), 1)[:-5])  # a frame, cut short
        assert len(inbound._frames._buffer) > 0 and inbound._deadline is not None
        inbound.close()
        assert len(inbound._frames._buffer) == 0 and inbound._deadline is None
        inbound.data_received(b"more")  # whatever still arrives is ignored
        assert len(inbound._frames._buffer) == 0

    asyncio.run(scenario())


class FakeWriter:
    def __init__(self) -> None:
        self.written = 0
        self.closed = self.aborted = False
        self.transport = self

    def abort(self) -> None:
        self.closed = self.aborted = True

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        self.written += sum(len(piece) for piece in pieces)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_a_large_frame_gets_time_to_travel_before_its_channel_counts_as_stalled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ACK_SECONDS was the same for every frame: a 56 MiB append to a peer reading 16 MiB/s was
    never acknowledged in time, so its channel was redialed and the append sent again, forever."""

    async def scenario() -> None:
        now = [1000.0]
        monkeypatch.setattr(peer_channel.time, "monotonic", lambda: now[0])
        out = Outbound(asyncio.StreamReader(), FakeWriter(), KEY)  # type: ignore[arg-type]
        out.send([b"x" * 100])
        now[0] += ACK_SECONDS + 0.5
        assert not out.is_open, "a small frame unacknowledged this long: the path is gone"
        out = Outbound(asyncio.StreamReader(), FakeWriter(), KEY)  # type: ignore[arg-type]
        out.send([memoryview(bytes(48 << 20))])
        now[0] += ACK_SECONDS + 0.5
        assert out.is_open, "48 MiB take 3 s at the slowest rate a peer may read"
        now[0] += 3.0
        assert not out.is_open
        out.close()

    asyncio.run(scenario())


def test_a_channel_given_up_on_drops_what_it_has_not_sent() -> None:
    """Closed gracefully, a connection the dialer gave up on kept sending its buffered frames, which
    could then arrive after the first frames of the channel dialed in its place."""

    async def scenario() -> None:
        writer = FakeWriter()
        out = Outbound(asyncio.StreamReader(), writer, KEY)  # type: ignore[arg-type]
        out.send([b"frame"])
        out.close()
        assert writer.aborted and not out.is_open

    asyncio.run(scenario())
