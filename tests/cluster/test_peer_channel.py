"""The receiving end of a peer channel (`Inbound`) on a fake transport: frames delivered in order, and
acknowledged together a moment later rather than one write per frame."""

from __future__ import annotations

import asyncio

import msgspec

from app.cluster import channel as ch
from app.cluster.peer_channel import ACK_DELAY, ACK_SECONDS, Inbound
from app.raft.messages import AppendResponse, Message

KEY = b"k" * 32


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _inbound(delivered: list[list[Message]]) -> tuple[Inbound, FakeTransport]:
    inbound = Inbound(KEY, 2, 1, 1 << 20, delivered.append, lambda _: None, lambda _: None)
    transport = FakeTransport()
    inbound.connection_made(transport)  # type: ignore[arg-type]
    return inbound, transport


def _frames(writer: ch.FrameWriter, count: int) -> bytes:
    payload = msgspec.msgpack.encode([AppendResponse(term=1, src=2, dst=1, success=True, match_index=0)])
    return b"".join(bytes(piece) for _ in range(count) for piece in writer.frame([payload]))


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
