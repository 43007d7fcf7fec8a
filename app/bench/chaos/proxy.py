"""A fault-injecting TCP proxy for the directed links between cluster nodes (chaos runs, no root needed).

A Link listens on 127.0.0.1 and forwards to one target port; its Fault can change at run time and applies at once
to new and existing connections. A ProxyHub runs many Links on its own event loop in a daemon thread, so sync code
or another event loop can drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

HOST = "127.0.0.1"
HIGH_WATER = 1024 * 1024  # a transport's write buffer past this pauses reading from the other side
# Delayed bytes waiting per direction before reading pauses: the window caps a delayed link at QUEUE_LIMIT / delay.
QUEUE_LIMIT = 8 * 1024 * 1024
T = TypeVar("T")
Name = tuple[int, int]


class Mode(enum.Enum):
    PASS = "pass"
    DROP = "drop"
    BLACKHOLE = "blackhole"
    DELAY = "delay"
    RESET = "reset"
    FLAKY = "flaky"


@dataclass(frozen=True)
class Fault:
    mode: Mode = Mode.PASS
    delay: float = 0.0  # seconds, one way (DELAY and FLAKY)
    loss: float = 0.0  # FLAKY: chance per forwarded chunk that the connection is reset

    def __post_init__(self) -> None:
        if self.delay < 0 or not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"bad fault {self}")


@dataclass
class Counters:
    accepted: int = 0
    to_target: int = 0  # bytes written towards the target
    to_client: int = 0  # bytes written back towards the connecting side
    resets: int = 0  # connections reset by RESET or FLAKY
    drops: int = 0  # connections closed by DROP or by healing a BLACKHOLE
    errors: int = 0  # failed connects to the target, and peers that went away with an error


def _reset(transport: asyncio.Transport) -> None:
    # SO_LINGER 0 turns the close into an RST, so the peer sees ECONNRESET rather than a clean EOF.
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Side(asyncio.Protocol):
    """One end of a pipe: role 0 is the accepted client connection, role 1 the connection to the target."""

    def __init__(self, pipe: _Pipe, role: int) -> None:
        self.pipe = pipe
        self.role = role

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(high=HIGH_WATER)
        self.pipe.made(self.role, t)

    def data_received(self, data: bytes) -> None:
        self.pipe.received(self.role, data)

    def connection_lost(self, exc: Exception | None) -> None:
        # No half-close: on EOF the default eof_received lets the transport close itself, which lands here.
        self.pipe.lost(self.role, exc)

    def pause_writing(self) -> None:
        self.pipe.writer_paused(self.role, True)

    def resume_writing(self) -> None:
        self.pipe.writer_paused(self.role, False)


class _Pipe:
    """A proxied connection. Per direction r (bytes read from side r), a queue of (due time, chunk) for delays."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.loop = asyncio.get_running_loop()
        self.client = _Side(self, 0)
        self.transports: list[asyncio.Transport | None] = [None, None]
        self.queues: list[deque[tuple[float, bytes]]] = [deque(), deque()]
        self.queued = [0, 0]
        self.timers: list[asyncio.TimerHandle | None] = [None, None]
        self.full = [False, False]  # side r's write buffer is over the high-water mark
        self.ended = [False, False]
        self.silenced = False  # blackholed: the byte stream has a gap, so it never carries data again
        self.closed = False

    def alive(self, r: int) -> bool:
        t = self.transports[r]
        return t is not None and not t.is_closing()

    def made(self, role: int, transport: asyncio.Transport) -> None:
        self.transports[role] = transport
        link = self.link
        if role == 1:
            if self.closed:
                transport.abort()
            elif (client := self.transports[0]) is not None and not client.is_closing():
                client.resume_reading()
            return
        link.counters.accepted += 1
        mode = link.fault.mode
        if mode in (Mode.DROP, Mode.RESET):
            self.end(mode)
            return
        link.pipes.add(self)
        if mode is Mode.BLACKHOLE:
            self.silenced = True  # no target connection: nothing would ever reach it
            return
        transport.pause_reading()  # until the target connection is up
        task = self.loop.create_task(self.connect())
        link.tasks.add(task)
        task.add_done_callback(link.tasks.discard)

    async def connect(self) -> None:
        try:
            await self.loop.create_connection(lambda: _Side(self, 1), HOST, self.link.target_port)
        except OSError:
            if not self.closed:
                self.link.counters.errors += 1
                self.end(Mode.RESET, count=False)  # the nearest thing to the refusal the client would have seen

    def received(self, r: int, data: bytes) -> None:
        if self.closed or self.silenced:
            return  # blackholed bytes are gone for good
        fault = self.link.fault
        if fault.mode is Mode.FLAKY and fault.loss > 0 and self.link.rng.random() < fault.loss:
            self.end(Mode.RESET)
            return
        delay = fault.delay if fault.mode in (Mode.DELAY, Mode.FLAKY) else 0.0
        queue = self.queues[r]
        if delay <= 0 and not queue:
            self.write(r, data)
        else:
            queue.append((self.loop.time() + delay, data))
            self.queued[r] += len(data)
            if self.timers[r] is None:
                self.flush(r)
        self.throttle(r)

    def write(self, r: int, data: bytes) -> None:
        t = self.transports[1 - r]
        if t is None or t.is_closing():
            return
        t.write(data)
        if r == 0:
            self.link.counters.to_target += len(data)
        else:
            self.link.counters.to_client += len(data)

    def flush(self, r: int) -> None:
        # One timer per direction, set for the head of its queue: latency without a throughput cap.
        self.timers[r] = None
        queue, now = self.queues[r], self.loop.time()
        while queue and queue[0][0] <= now:
            data = queue.popleft()[1]
            self.queued[r] -= len(data)
            self.write(r, data)
        if queue:
            self.timers[r] = self.loop.call_at(queue[0][0], self.flush, r)
        elif self.ended[r]:
            self.end(None)
            return
        self.throttle(r)

    def throttle(self, r: int) -> None:
        t = self.transports[r]
        if t is None or t.is_closing() or not self.alive(1 - r):
            return
        if self.full[1 - r] or self.queued[r] > QUEUE_LIMIT:
            t.pause_reading()
        else:
            t.resume_reading()

    def writer_paused(self, r: int, paused: bool) -> None:
        self.full[r] = paused
        self.throttle(1 - r)

    def lost(self, r: int, exc: Exception | None) -> None:
        if self.closed:
            return
        if exc is not None:
            self.link.counters.errors += 1
        self.ended[r] = True
        if self.silenced:
            # A blackhole carries no FIN either: the other side stays silent until the link heals.
            if not self.alive(0) and not self.alive(1):
                self.end(None)
            return
        self.drop_queue(1 - r)  # nothing more can reach side r
        if not self.queues[r]:
            self.end(None)  # otherwise flush closes once the delayed bytes from side r are delivered

    def drop_queue(self, r: int) -> None:
        if (timer := self.timers[r]) is not None:
            timer.cancel()
            self.timers[r] = None
        self.queues[r].clear()
        self.queued[r] = 0

    def end(self, how: Mode | None, count: bool = True) -> None:
        """None: a clean close (what was written is flushed first); DROP: abort at once; RESET: abort with an RST."""
        if count and how is Mode.RESET:
            self.link.counters.resets += 1
        elif count and how is Mode.DROP:
            self.link.counters.drops += 1
        self.closed = True
        self.link.pipes.discard(self)
        for r in (0, 1):
            self.drop_queue(r)
            if (t := self.transports[r]) is None:
                continue
            if how is None:
                t.close()
            elif how is Mode.RESET:
                _reset(t)
            else:
                t.abort()

    def apply(self, fault: Fault) -> None:
        if fault.mode in (Mode.DROP, Mode.RESET):
            self.end(fault.mode)
        elif fault.mode is Mode.BLACKHOLE:
            self.silenced = True
            for r in (0, 1):
                self.drop_queue(r)
                if (t := self.transports[r]) is not None and not t.is_closing():
                    t.resume_reading()  # keep reading, to discard
        elif self.silenced:
            self.end(Mode.DROP)  # healed: the stream has a gap, so it is closed rather than resumed


class Link:
    """One listening port on 127.0.0.1 forwarding to one target port. Use it on the loop that started it."""

    def __init__(self, target_port: int, listen_port: int = 0, rng: random.Random | None = None) -> None:
        self.target_port = target_port
        self.port = listen_port
        self.rng = rng if rng is not None else random.Random()
        self.fault = Fault()
        self.counters = Counters()
        self.pipes: set[_Pipe] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Pipe(self).client, HOST, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def set(self, fault: Fault) -> None:
        self.fault = fault
        for pipe in list(self.pipes):
            pipe.apply(fault)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self.pipes):
            pipe.end(Mode.DROP, count=False)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self._server.wait_closed()

    def stats(self) -> dict[str, Any]:
        f = self.fault
        return {"port": self.port, "target": self.target_port, "mode": f.mode.value, "delay": f.delay,
                "loss": f.loss, "open": len(self.pipes), **asdict(self.counters)}  # fmt: skip


class ProxyHub:
    """Many Links on a private event loop in a daemon thread. Every method may be called from any thread."""

    def __init__(self, rng_seed: int) -> None:
        self.rng = random.Random(rng_seed)  # shared by the links, so a FLAKY run can be replayed
        self.links: dict[Name, Link] = {}
        self.loop_errors = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProxyHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("hub already started")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._on_error)
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._on_loop_thread():
            raise RuntimeError("stop waits for the hub's loop: call it from another thread")

        async def shutdown() -> None:
            await asyncio.gather(*(link.close() for link in self.links.values()), return_exceptions=True)
            for _ in range(3):
                await asyncio.sleep(0)  # let the aborted transports run connection_lost and close their sockets

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=0.8)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=0.5)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None
        self.links = {}

    def add(self, name: Name, target_port: int, listen_port: int = 0) -> int:
        """Start a link and return its listening port once it is bound."""
        if self._on_loop_thread():
            raise RuntimeError("add blocks: call it from outside the hub's loop (or use Link directly)")

        async def add() -> int:
            if name in self.links:
                raise ValueError(f"link {name} already exists")
            link = Link(target_port, listen_port, self.rng)
            await link.start()
            self.links[name] = link
            return link.port

        return self._run(add())

    def set(self, name: Name, fault: Fault) -> None:
        self._sync(lambda: self.links[name].set(fault))

    def set_all(self, fault: Fault) -> None:
        def apply() -> None:
            for link in self.links.values():
                link.set(fault)

        self._sync(apply)

    def heal_all(self) -> None:
        self.set_all(Fault())

    def stats(self) -> dict[Name, dict[str, Any]]:
        return self._sync(lambda: {name: link.stats() for name, link in self.links.items()})

    def _on_loop_thread(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("hub not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=5)

    def _sync(self, fn: Callable[[], T]) -> T:
        # Blocks until applied, so a fault is in force when set() returns; on the loop's own thread, runs inline.
        if self._on_loop_thread():
            return fn()

        async def call() -> T:
            return fn()

        return self._run(call())

    def _on_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Connection trouble is counted, never raised out of the hub thread; anything else is still logged.
        self.loop_errors += 1
        if not isinstance(context.get("exception"), OSError):
            loop.default_exception_handler(context)
