"""A message to a peer whose channel is idle is written at once, not by the sender task after the rest of
the loop's iteration (app/cluster/transport.py: `Transport.send`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from app.cluster.transport import SEND_NOW_BYTES, Transport
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message

SECRET = b"s" * 32


class FakeChannel:
    def __init__(self) -> None:
        self.frames: list[list[Message]] = []
        self.idle = True
        self.is_open = True

    def send(self, payload: Sequence[bytes | memoryview]) -> None:
        self.frames.append(msgspec.msgpack.decode(b"".join(payload), type=list[Message]))


def _ack(n: int) -> AppendResponse:
    return AppendResponse(term=1, src=1, dst=2, success=True, match_index=n)


def _transport(channel: FakeChannel) -> Transport:
    """Senders never started: what they would send stays in the peer's queue."""
    transport = Transport(1, {1: "", 2: "http://127.0.0.1:9"}, SECRET, channels=True)
    transport._outbound[2] = channel  # type: ignore[assignment]
    return transport


def test_messages_to_an_idle_channel_go_at_once_in_one_frame() -> None:
    async def scenario() -> None:
        channel = FakeChannel()
        transport = _transport(channel)
        await transport.send([_ack(1), _ack(2)])
        assert channel.frames == [[_ack(1), _ack(2)]]
        assert not transport._queues[2]

    asyncio.run(scenario())


def test_a_busy_channel_or_a_queue_keeps_the_order_through_the_sender() -> None:
    async def scenario() -> None:
        channel = FakeChannel()
        transport = _transport(channel)
        channel.idle = False  # the socket has not taken the last frame yet
        await transport.send([_ack(1)])
        channel.idle = True
        await transport.send([_ack(2)])  # idle again, but 1 waits in the queue: 2 goes after it
        assert channel.frames == []
        assert list(transport._queues[2]) == [_ack(1), _ack(2)]

    asyncio.run(scenario())


def test_what_passes_the_size_for_now_waits_for_the_sender_after_what_went() -> None:
    async def scenario() -> None:
        channel = FakeChannel()
        transport = _transport(channel)
        big = AppendEntries(1, 1, 2, 0, 0, [Entry(1, 1, bytes(SEND_NOW_BYTES))], 0)
        await transport.send([_ack(1), big, _ack(2)])
        assert channel.frames == [[_ack(1)]]
        assert list(transport._queues[2]) == [big, _ack(2)]

    asyncio.run(scenario())


def test_a_closed_channel_leaves_every_message_to_the_sender() -> None:
    async def scenario() -> None:
        channel = FakeChannel()
        channel.is_open = False
        transport = _transport(channel)
        await transport.send([_ack(1)])
        assert channel.frames == [] and list(transport._queues[2]) == [_ack(1)]

    asyncio.run(scenario())
