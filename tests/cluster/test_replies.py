"""Replies on the response: a receiver holds the response of a batch that calls for an answer and
returns its node's messages to the sender in it, signed so they can be neither forged nor passed
off as a request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from app.cluster.transport import PATH, REPLY_PATH, Transport, Verifier, sign
from app.domain.errors import ProtocolError
from app.raft.messages import AppendEntries, AppendResponse, Message

pytestmark = pytest.mark.anyio
SECRET = b"s3cret"
NOWHERE = "http://127.0.0.1:9"  # senders to it fail quietly: these tests look at what is held


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def _follower() -> AsyncIterator[Transport]:
    transport = Transport(2, {1: NOWHERE, 2: NOWHERE, 3: NOWHERE}, SECRET)
    transport.start()
    try:
        yield transport
    finally:
        await transport.close()


def _append(src: int = 1, dst: int = 2) -> AppendEntries:
    return AppendEntries(term=1, src=src, dst=dst, prev_index=0, prev_term=0, entries=[], commit=0)


def _ack(src: int = 2, dst: int = 1) -> AppendResponse:
    return AppendResponse(term=1, src=src, dst=dst, success=True, match_index=5)


async def test_replies_sent_while_a_response_is_held_go_in_it_and_not_in_the_queue() -> None:
    async with _follower() as follower:
        held = asyncio.ensure_future(follower.replies_for(1, [_append()]))
        await asyncio.sleep(0)
        await follower.send([_ack(), _ack(dst=3)])
        assert list(follower._queues[1]) == [] and list(follower._queues[3]) == [_ack(dst=3)]
        assert await held == [_ack()]
        await follower.send([_ack()])  # nothing held any more: queued for the sender
        assert list(follower._queues[1]) == [_ack()]


async def test_a_batch_that_calls_for_no_answer_is_not_held() -> None:
    async with _follower() as follower:
        # Held, it would wait the minute it is given.
        assert await asyncio.wait_for(follower.replies_for(1, [_ack(src=1, dst=2)], timeout=60), 5) == []


async def test_a_held_response_gives_up_after_the_wait() -> None:
    async with _follower() as follower:
        assert await asyncio.wait_for(follower.replies_for(1, [_append()], timeout=0.05), 5) == []
        await follower.send([_ack()])
        assert list(follower._queues[1]) == [_ack()]


class _Leader:
    """A leader's transport taking replies, with what it delivered."""

    def __init__(self) -> None:
        self.delivered: list[Message] = []
        self.transport = Transport(
            1, {1: NOWHERE, 2: NOWHERE}, SECRET, verifier=Verifier(SECRET, 1), deliver=self.delivered.append
        )
        self.transport.start()

    def take(self, peer: int, signature: str, body: bytes) -> None:
        self.transport._take_reply(peer, signature, body)


async def test_a_signed_reply_is_delivered_and_anything_else_is_refused() -> None:
    async with _follower() as follower:
        leader = _Leader()
        try:
            body, signature = follower.signed_reply(1, [_ack()])
            leader.take(2, signature, body)
            assert leader.delivered == [_ack()]
            leader.take(2, signature, body)  # the same reply again: a replay
            body, signature = follower.signed_reply(1, [_ack()])
            leader.take(2, signature, body + b"\x00")  # not the body signed
            leader.take(3, signature, body)  # from another node than the one asked
            request_signature = sign(SECRET, 2, 1, PATH, body)
            leader.take(2, request_signature, body)  # signed as a request, not a reply
            assert leader.delivered == [_ack()]
            body, signature = follower.signed_reply(1, [_ack(src=3)])
            leader.take(2, signature, body)  # a message in it claims another sender
            assert leader.delivered == [_ack()]
        finally:
            await leader.transport.close()


def test_a_reply_cannot_pass_as_a_request() -> None:
    body = b"\x90"
    reply_signature = sign(SECRET, 2, 1, REPLY_PATH, body)
    with pytest.raises(ProtocolError):
        Verifier(SECRET, 1).check(reply_signature, PATH)


async def test_a_sender_whose_address_this_node_does_not_know_is_answered_on_the_response() -> None:
    """A node joining with --peers that do not name the leader learns of it from the log alone:
    until then the leader's requests are its only way to answer."""
    async with _follower() as follower:
        held = asyncio.ensure_future(follower.replies_for(7, [_append(src=7)]))
        await asyncio.sleep(0)
        await follower.send([_ack(dst=7)])
        assert await held == [_ack(dst=7)]
        await follower.send([_ack(dst=7)])  # nothing held, and nowhere to queue it: dropped
        assert 7 not in follower._queues
