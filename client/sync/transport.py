"""The sync driver's sockets: sending with a deadline, and waiting for a reply with one.

Every wait is a poll with a deadline (the ZeroMQ guide's Lazy Pirate client): :meth:`Transport.send`
and :meth:`Transport.await_any` return ``False`` or ``None`` when it runs out, and the caller
says which error that is. Which reply answers which request, and what is held for later or
dropped, is the :class:`~bertserve.client.core.replies.ReplyBook`'s. Under CURVE the route is
announced before every request and again every second while waiting, since a restarted sink
knows no route until told.

The sockets belong to the thread using the client: the transport does no locking.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Generic, TypeVar

import zmq

from ..core.options import Curve
from ..core.replies import ReplyBook
from ..core.window import ReplyWindow
from ..errors import BertClientError
from ..protocol import Reply
from ..security import announce
from ..sockets import open_sockets

_ANNOUNCE_EVERY_MS = 1000  # how often a client waiting for replies announces its route again (CURVE)
_SEND_CHECK_MS = 100  # how often a send waiting for room looks for a refused handshake

TagT = TypeVar("TagT")


class Transport(Generic[TagT]):
    """The sockets of one client, connected to the server at ``host`` (see
    :func:`~bertserve.client.sockets.open_sockets`), and the book of its requests whose
    replies are awaited, each with a tag the caller chooses."""

    def __init__(self, host: str, port: int, port_out: int, identity: bytes, curve: Curve | None) -> None:
        self._sockets = sockets = open_sockets(host, port, port_out, identity, curve)
        self.identity = identity
        self.address = sockets.address
        self.book: ReplyBook[TagT] = ReplyBook(identity, sockets.address)
        self._push, self._replies, self._watch, self._probe = (
            sockets.push,
            sockets.replies,
            sockets.watch,
            sockets.probe,
        )
        self._poller = zmq.Poller()
        for sock in (self._replies, *self._watch.monitors):
            self._poller.register(sock, zmq.POLLIN)

    @property
    def window(self) -> ReplyWindow:
        """The places of the requests the server may still answer."""
        return self.book.window

    @property
    def pending(self) -> Mapping[int, TagT]:
        """The requests whose replies someone will collect, with their tags (read-only)."""
        return self.book.awaited

    # -- sending -----------------------------------------------------------------------

    def send(self, request_id: int, frames: list[Any], deadline: float) -> bool:
        """Queue request ``request_id``'s ``frames`` for the server; ``False`` if the send
        queue stayed full until ``deadline``, or a handshake was refused for good meanwhile.
        Without a server the frames just queue, so this wait only matters once the queue is full.

        With :attr:`window` full (as many requests unanswered as the server's reply queue
        holds) it first reads replies, keeping those someone will collect, until one more
        request fits: so no reply is ever past what the server queues for this client."""
        if not self._make_room(deadline):
            return False
        announce(self._replies, self.identity)  # under CURVE: where the reply goes, as the sink may be new
        while True:
            if self._push.poll(min(_remaining_ms(deadline), _SEND_CHECK_MS), zmq.POLLOUT):
                try:
                    self._push.send_multipart(frames, zmq.NOBLOCK, copy=False)
                    self.book.window.sent(request_id)
                    return True
                except zmq.Again:  # the connection the poll saw went away (its handshake refused) before the send
                    time.sleep(0.01)
            # A handshake refused for good ends the wait: the caller reports it (Connection.timeout_error).
            if time.monotonic() >= deadline or self._watch.error(certain_only=True) is not None:
                return False

    def _make_room(self, deadline: float) -> bool:
        """Read replies until :attr:`window` has room for one more request; ``False`` at ``deadline``."""
        while not self.book.window.has_room(time.monotonic()):
            if time.monotonic() >= deadline:
                return False
            # A second at a time: an abandoned request's place frees itself when its grace runs out.
            reply = self._receive(min(deadline, time.monotonic() + 1.0))
            if reply is not None:
                self.book.match(reply, ())
        return True

    # -- waiting -----------------------------------------------------------------------

    def await_any(self, wanted: Collection[int], deadline: float) -> Reply | None:
        """The first reply to one of ``wanted``, or ``None`` at the deadline. Replies to
        other pending requests are held for later; replies nobody expects are dropped."""
        if (reply := self.book.held(wanted)) is not None:
            return reply
        while (reply := self._receive(deadline)) is not None:
            if self.book.match(reply, wanted) is not None:
                return reply
        return None

    def give_up(self, request_ids: Iterable[int]) -> None:
        """Stop expecting ``request_ids``: their replies, if they come, are dropped."""
        self.book.give_up(request_ids, time.monotonic())

    def withdraw(self, request_ids: Iterable[int], cancel_frames: Callable[[int], list[bytes]]) -> None:
        """Withdraw from the server each of ``request_ids`` still awaited (sending its CANCEL,
        ``cancel_frames(id)``), so it drops their queued work, and give them up. Never waits:
        with the queue to the server full a CANCEL is dropped, and the request's deadline ends it."""
        ids = list(request_ids)
        for request_id in ids:
            if request_id in self.book.awaited:
                with contextlib.suppress(zmq.Again, zmq.ZMQError):
                    self._push.send_multipart(cancel_frames(request_id), zmq.NOBLOCK)
        self.give_up(ids)

    def refusal(self, *, certain_only: bool = False) -> BertClientError | None:
        """Why the server may never have seen this client: a refused handshake, or a port that
        is not the server's, if one was seen (with ``certain_only``, only what retrying cannot mend)."""
        return self._watch.error(certain_only=certain_only)

    def nobody_listens(self, waited_s: float) -> bool:
        """Whether the server is on this machine and nothing listens at its request port
        (see :class:`~bertserve.client.probe.ServerProbe`), asked after ``waited_s`` without an answer."""
        return self._probe.nobody_listens(waited_s)

    def stop_probing(self) -> None:
        """Close the probe :meth:`nobody_listens` started, if any."""
        self._probe.close()

    def _receive(self, deadline: float) -> Reply | None:
        """The next well-formed reply addressed to this client, or ``None`` at the deadline."""
        while True:
            ready = dict(self._poller.poll(min(_remaining_ms(deadline), _ANNOUNCE_EVERY_MS)))
            if len(ready) > (self._replies in ready):
                self._watch.drain()  # a handshake happened; keep the monitors' queues empty
            if self._replies not in ready:
                if time.monotonic() >= deadline:
                    return None
                # Under CURVE a restarted sink knows no route until told: tell it again while waiting.
                announce(self._replies, self.identity)
                continue
            frames = self._replies.recv_multipart(zmq.NOBLOCK, copy=False)
            if (reply := self.book.read([frame.buffer for frame in frames])) is not None:
                return reply

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Forget every request, close the sockets and discard queued messages."""
        self.book.clear()
        self._probe.close()
        self._watch.close()
        self._push.close(linger=0)
        self._replies.close(linger=0)
        self._sockets.context.term()

    def destroy(self) -> None:
        """Close every socket at once, as a client that failed to connect does."""
        self._sockets.destroy()


def _remaining_ms(deadline: float) -> int:
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
