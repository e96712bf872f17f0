"""The asyncio driver's sockets: sends that wait on the loop, and a reader task that hands
each reply to the call awaiting it.

The sockets are :func:`~bertserve.client.sockets.open_sockets`'s, wrapped as pyzmq's asyncio
sockets. Every request in flight has a future, its tag in the
:class:`~bertserve.client.core.replies.ReplyBook`, and a single reader task hands each reply to
the future the book says it answers; a reply nobody waits for any more (its caller gave up) is
dropped.

Nothing here blocks the event loop: sends are ``NOBLOCK`` and, while the queue to the server
is full, wait for room on the loop; the reader hands out at most :data:`READ_BATCH` replies
that have already arrived before it lets the loop run the callers they woke; and each reply
costs the reader one JSON header, the rest of the work (the vectors) falls to its caller.
Under CURVE the route is announced before every request and, while requests wait, every
second, since a restarted sink knows no route until told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from ..core.options import Curve
from ..core.replies import ReplyBook
from ..core.window import ReplyWindow
from ..errors import BertClientError, ClientClosedError
from ..protocol import Reply
from ..security import announce
from ..sockets import open_sockets
from .places import AsyncPlaces

logger = logging.getLogger("bertserve.client")

READ_BATCH = 16
"""How many replies that have already arrived the reader hands out before it yields to the loop."""
_ANNOUNCE_EVERY_S = 1.0  # how often a client with requests in flight announces its route again (CURVE)
_SEND_CHECK_MS = 100  # how often a send waiting for room looks for a refused handshake


class TimedOut(Exception):
    """A request's deadline passed before its reply came: ``sent`` says whether it went out at
    all (if not, the queue to the server stayed full)."""

    def __init__(self, sent: bool) -> None:
        super().__init__("sent, and not answered in time" if sent else "the send queue stayed full")
        self.sent = sent


class AsyncTransport:
    """The sockets of one asyncio client, connected to the server at ``host``: requests to
    ``port``, replies, addressed to ``identity``, from ``port_out``; CURVE sockets if ``curve``
    is given. :meth:`start` starts reading on the running loop; :meth:`close` ends it all.

    With ``shared``, ``identity`` is the prefix of many client ids, whose replies all come in
    here (the HTTP front end's callers: :class:`~bertserve.client.core.replies.ReplyBook`).
    ``seen``, if given, is shown every reply as it is read, before its caller gets it.

    A failure while opening the sockets closes what was opened and raises the ``ZMQError``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        port_out: int,
        identity: bytes,
        curve: Curve | None,
        *,
        shared: bool = False,
        seen: Callable[[Reply], None] | None = None,
    ) -> None:
        # The sockets are made plain, for HandshakeWatch (its monitors are plain sockets of the same
        # context) and for the reads and sends that must not wait; asyncio wrappers share them to wait.
        self._sockets = sockets = open_sockets(host, port, port_out, identity, curve)
        try:
            self._push = zmq.asyncio.Socket.from_socket(sockets.push)
            self._replies = zmq.asyncio.Socket.from_socket(sockets.replies)
        except BaseException:
            sockets.destroy()
            raise
        self.identity = identity
        self.address, self.address_out = sockets.address, sockets.address_out
        self._watch, self._probe = sockets.watch, sockets.probe
        self.book: ReplyBook[asyncio.Future[Reply]] = ReplyBook(identity, sockets.address, shared=shared)
        self._seen = seen
        self._places = AsyncPlaces(self.book.window)
        self._reader: asyncio.Task[None] | None = None
        self._announcer: asyncio.TimerHandle | None = None
        self.closed = False
        self._routed = curve is not None  # replies on a DEALER that announces its route

    def start(self) -> None:
        """Start the reader and the announcer on the running loop."""
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="bertserve-client-reader")
        self._keep_announced()

    @property
    def window(self) -> ReplyWindow:
        """The places of the requests the server may still answer."""
        return self.book.window

    @property
    def in_flight(self) -> int:
        """How many requests wait for their replies."""
        return len(self.book.awaited)

    # -- requests ----------------------------------------------------------------------

    def expect(self) -> tuple[int, asyncio.Future[Reply]]:
        """A new request id, and the future its reply will be handed to."""
        request_id = self.book.new_id()
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.book.expect(request_id, future)
        return request_id, future

    async def exchange(
        self, request_id: int, frames: list[bytes], deadline: float, withdraw: list[bytes] | None = None
    ) -> Reply:
        """Send request ``request_id`` (its ``frames``) and await its reply; :class:`TimedOut` if
        none came by ``deadline`` (``time.monotonic()``). If the caller gives up on a request
        that went out (cancelled, or out of time), its ``withdraw`` frames (a CANCEL) are sent,
        if given: the server drops its work before it runs."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.book.expect(request_id, future)
        sent = answered = False
        timer: asyncio.TimerHandle | None = None
        try:
            if not await self.send(request_id, frames, deadline):
                raise TimedOut(sent=False)
            sent = True
            timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), _expire, future)
            try:
                reply = await future
            except _Expired:
                raise TimedOut(sent=True) from None
            answered = True
            return reply
        finally:
            if timer is not None:
                timer.cancel()
            if sent and not answered and withdraw is not None:
                self.cancel(request_id, withdraw)
            else:
                self.forget(request_id)

    def forget(self, request_id: int) -> None:
        """Stop waiting for the reply to ``request_id``: if it comes, it is dropped (a request
        sent keeps its place in :attr:`window` until it does)."""
        self.book.give_up((request_id,), time.monotonic())

    def cancel(self, request_id: int, frames: list[bytes]) -> None:
        """Withdraw ``request_id`` from the server (sending its CANCEL ``frames``) and forget it.
        Never waits: with the queue to the server full the CANCEL is dropped, and the request's
        deadline ends it."""
        self.forget(request_id)
        if self.closed:
            return
        with contextlib.suppress(zmq.Again, zmq.ZMQError):
            self._sockets.push.send_multipart(frames, zmq.NOBLOCK)

    async def send(self, request_id: int, frames: list[bytes], deadline: float) -> bool:
        """Queue request ``request_id``'s ``frames`` for the server; ``False`` if the queue
        stayed full until ``deadline`` (``time.monotonic()``), or a handshake was refused for
        good meanwhile.

        It first waits, in turn with the other sends, for a place in :attr:`window`: at most as
        many requests are unanswered as the server's reply queue holds, so however late the
        reader runs, no reply is past what the server queues for this client."""
        if self.closed:
            raise ClientClosedError("the client was closed before the request was sent")
        if not await self._places.take(deadline, lambda: self.closed):
            if self.closed:
                raise ClientClosedError("the client was closed while the request waited to be sent")
            return False
        placed = True  # a place is reserved for this request until it is sent
        try:
            self._announce()  # under CURVE: where the reply goes, as the sink may be new
            while True:
                try:
                    self._sockets.push.send_multipart(frames, zmq.NOBLOCK, copy=False)
                    self.book.window.sent(request_id, reserved=True)
                    placed = False
                    return True
                except zmq.Again:
                    pass
                if not await self._room_to_send(deadline):
                    return False
        finally:
            if placed:
                self._places.give_back()

    async def _room_to_send(self, deadline: float) -> bool:
        """Wait a little for room in the queue to the server; ``False`` once ``deadline`` has
        passed or a handshake was refused for good."""
        remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0 or self._watch.error(certain_only=True) is not None:
            return False
        try:
            await self._push.poll(min(remaining_ms, _SEND_CHECK_MS), zmq.POLLOUT)  # type: ignore[call-arg]
        except asyncio.CancelledError:
            if self.closed:  # close() cancels what waits on the sockets
                raise ClientClosedError("the client was closed while the request waited to be sent") from None
            raise
        return True

    def refusal(self, *, certain_only: bool = False) -> BertClientError | None:
        """Why the server may never have seen this client: a refused handshake, or a port that
        is not the server's, if one was seen (with ``certain_only``, only what retrying cannot mend)."""
        return self._watch.error(certain_only=certain_only)

    def nobody_listens(self, waited_s: float) -> bool:
        """Whether the server is on this machine and nothing listens at its request port
        (see :class:`~bertserve.client.probe.ServerProbe`), asked after ``waited_s`` without an
        answer. Never waits."""
        return self._probe.nobody_listens(waited_s)

    def stop_probing(self) -> None:
        """Close the probe :meth:`nobody_listens` started, if any."""
        self._probe.close()

    # -- lifecycle ---------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """Fail every request in flight with :class:`ClientClosedError` (``reason``), stop
        reading and close the sockets, discarding queued messages; calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        for future in self.book.clear():
            if not future.done():
                with contextlib.suppress(RuntimeError):  # its loop already closed
                    future.set_exception(ClientClosedError(reason))
        with contextlib.suppress(RuntimeError):  # its loop already closed
            self._places.wake_all()  # each waiting send sees `closed` and raises
        if self._announcer is not None:
            self._announcer.cancel()
        if self._reader is not None:
            with contextlib.suppress(RuntimeError):
                self._reader.cancel()
        self._probe.close()
        self._watch.close()
        for sock in (self._push, self._replies):
            with contextlib.suppress(RuntimeError):  # the wrapper unregisters from a loop that may be closed
                sock.close(linger=0)
        self._sockets.destroy()

    async def wait_closed(self) -> None:
        """Wait for the reader to end, after :meth:`close`."""
        if self._reader is not None and self._reader is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([self._reader])

    # -- internals ---------------------------------------------------------------------

    def _announce(self) -> None:
        """Tell a CURVE server where this client's replies go (nothing for a plain one)."""
        if not self._routed:
            return
        announce(self._sockets.replies, self.identity)
        # A send can take the descriptor's edge for a reply already in: have the wrapper look again.
        self._replies.get(zmq.EVENTS)

    def _keep_announced(self) -> None:
        if self.book.awaited:
            self._announce()
        self._watch.drain()  # keep the monitors' queues empty
        self._announcer = asyncio.get_running_loop().call_later(_ANNOUNCE_EVERY_S, self._keep_announced)

    async def _read(self) -> None:
        """Hand every reply to the future of its request, for as long as the client is open."""
        try:
            while True:
                self._deliver(await self._replies.recv_multipart(copy=False))
                # Replies already in are read without waiting, a batch at a time: awaiting a reply
                # that is there does not yield, and each one read wakes a caller whose turn comes
                # next, so a burst read whole would hold the loop for as long as the burst.
                for _ in range(READ_BATCH - 1):
                    try:
                        frames = self._sockets.replies.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._deliver(frames)
                else:
                    await asyncio.sleep(0)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.ETERM, zmq.ENOTSOCK):
                logger.error("the reply socket of %s failed: %s", self.address_out, exc)
                self.close(f"the reply socket failed: {exc}")

    def _deliver(self, frames: list[Any]) -> None:
        reply = self.book.read([frame.buffer for frame in frames])
        if reply is None:
            return
        self._places.hand_out()  # its place is free
        if self._seen is not None:
            self._seen(reply)
        future = self.book.claim(reply)
        if future is not None and not future.done():
            future.set_result(reply)


class _Expired(Exception):
    """The answer to a request did not come by its deadline."""


def _expire(future: asyncio.Future[Reply]) -> None:
    if not future.done():
        future.set_exception(_Expired())
