"""A client's transport: its sockets, the receive loop, and which reply answers which request.

Requests go out on a ``PUSH`` connected to the server's request port. Replies come in on a
``SUB`` subscribed to the client's identity or, under CURVE, on a ``DEALER`` that announces
it (:func:`~bertserve.client.security.reply_socket`): before every request, and again every
second while waiting, since a restarted sink knows no route until told. Monitors on both
sockets (:class:`~bertserve.client.security.HandshakeWatch`) tell a refused CURVE handshake
from a server that is down, and a :class:`~bertserve.client.probe.ServerProbe`, once asked,
tells a server on this machine that is down from one that is slow to answer.

Every wait is a poll with a deadline (the ZeroMQ guide's Lazy Pirate client): :meth:`send`
and :meth:`await_any` return ``False`` or ``None`` when it runs out, and the caller says
which error that is. A request whose answer someone will collect is *pending*, with a tag
the caller chooses; a reply to a pending request that comes while waiting for another is
held for later, and a reply nobody waits for any more (its request timed out) is dropped.

The sockets belong to the thread using the client: the transport does no locking.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import zmq

from .errors import AuthenticationError
from .options import Curve
from .probe import ServerProbe
from .protocol import ProtocolError, Reply, decode_reply
from .security import HandshakeWatch, announce, reply_socket
from .window import ReplyWindow

logger = logging.getLogger("bertserve.client")

_ANNOUNCE_EVERY_MS = 1000  # how often a client waiting for replies announces its route again (CURVE)
_SEND_CHECK_MS = 100  # how often a send waiting for room looks for a refused handshake

TagT = TypeVar("TagT")


def tcp_address(host: str, port: int) -> str:
    """The ZeroMQ endpoint of ``port`` on ``host`` (an IPv6 address in brackets)."""
    bracketed = f"[{host}]" if ":" in host else host
    return f"tcp://{bracketed}:{port}"


class Transport(Generic[TagT]):
    """The sockets of one client, connected to the server at ``host``: requests to ``port``,
    replies, addressed to ``identity``, from ``port_out``; CURVE sockets if ``curve`` is given.

    A failure while opening them closes what was opened and raises the ``ZMQError``.
    """

    def __init__(self, host: str, port: int, port_out: int, identity: bytes, curve: Curve | None) -> None:
        self.identity = identity
        self.address = tcp_address(host, port)
        self.address_out = tcp_address(host, port_out)
        self._ids = itertools.count(1)
        self._pending: dict[int, TagT] = {}  # requests whose replies someone will collect
        self._held: dict[int, Reply] = {}  # their replies that came while waiting for another
        self.window = ReplyWindow()  # sized by the server's CONFIG once the handshake is done

        self._context = zmq.Context()
        try:
            self._push = self._context.socket(zmq.PUSH)
            self._push.setsockopt(zmq.LINGER, 0)
            self._replies = reply_socket(self._context, identity, routed=curve is not None)
            for sock in (self._push, self._replies):
                sock.setsockopt(zmq.IPV6, ":" in host)
                if curve is not None:  # must come before connect
                    sock.curve_serverkey = curve.server
                    sock.curve_publickey = curve.public
                    sock.curve_secretkey = curve.secret
            self._watch = HandshakeWatch(
                {self.address: self._push, self.address_out: self._replies},
                public_key=None if curve is None else curve.public,
            )
            self._push.connect(self.address)
            self._replies.connect(self.address_out)
            self._poller = zmq.Poller()
            for sock in (self._replies, *self._watch.monitors):
                self._poller.register(sock, zmq.POLLIN)
        except BaseException:
            self._context.destroy(linger=0)
            raise
        self._probe = ServerProbe(self._context, host, self.address)

    # -- sending -----------------------------------------------------------------------

    def new_id(self) -> int:
        """A request id this client has not used."""
        return next(self._ids)

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
                    self.window.sent(request_id)
                    return True
                except zmq.Again:  # the connection the poll saw went away (its handshake refused) before the send
                    time.sleep(0.01)
            # A handshake refused for good ends the wait: the caller reports it (Connection.timeout_error).
            if time.monotonic() >= deadline or self._watch.error(certain_only=True) is not None:
                return False

    # -- correlation -------------------------------------------------------------------

    @property
    def pending(self) -> Mapping[int, TagT]:
        """The requests whose replies someone will collect, with their tags (read-only)."""
        return MappingProxyType(self._pending)

    def expect(self, request_id: int, tag: TagT) -> None:
        """Keep the reply to ``request_id`` if it comes while waiting for another."""
        self._pending[request_id] = tag

    def take(self, request_id: int) -> TagT:
        """Stop expecting ``request_id``, whose reply was collected or will not come; its tag."""
        return self._pending.pop(request_id)

    def give_up(self, request_ids: Iterable[int]) -> None:
        """Stop expecting ``request_ids``: their replies, if they come, are dropped (each
        keeps its place in :attr:`window` until it does)."""
        now = time.monotonic()
        for request_id in request_ids:
            self._pending.pop(request_id, None)
            self._held.pop(request_id, None)
            self.window.abandoned(request_id, now)

    def await_any(self, wanted: Collection[int], deadline: float) -> Reply | None:
        """The first reply to one of ``wanted``, or ``None`` at the deadline. Replies to
        other pending requests are held for later; replies nobody expects are dropped."""
        for request_id in sorted(wanted):
            if request_id in self._held:
                return self._held.pop(request_id)
        while (reply := self._receive(deadline)) is not None:
            if reply.request_id in wanted:
                return reply
            self._keep(reply)
        return None

    def _keep(self, reply: Reply) -> None:
        """Hold ``reply`` for later if someone will collect it, else drop it."""
        if reply.request_id in self._pending:
            self._held[reply.request_id] = reply
        else:
            logger.debug("dropping a late reply to request %d", reply.request_id)

    def _make_room(self, deadline: float) -> bool:
        """Read replies until :attr:`window` has room for one more request; ``False`` at ``deadline``."""
        while not self.window.has_room(time.monotonic()):
            if time.monotonic() >= deadline:
                return False
            # A second at a time: an abandoned request's place frees itself when its grace runs out.
            reply = self._receive(min(deadline, time.monotonic() + 1.0))
            if reply is not None:
                self._keep(reply)
        return True

    def refusal(self, *, certain_only: bool = False) -> AuthenticationError | None:
        """Why the server may never have seen this client: a refused handshake, if one was
        seen (with ``certain_only``, only one that retrying cannot mend)."""
        return self._watch.error(certain_only=certain_only)

    def nobody_listens(self, waited_s: float) -> bool:
        """Whether the server is on this machine and nothing listens at its request port
        (see :class:`ServerProbe`), asked after ``waited_s`` without an answer."""
        return self._probe.nobody_listens(waited_s)

    def stop_probing(self) -> None:
        """Close the probe :meth:`nobody_listens` started, if any."""
        self._probe.close()

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Forget every request, close the sockets and discard queued messages."""
        self._pending.clear()
        self._held.clear()
        self._probe.close()
        self._watch.close()
        self._push.close(linger=0)
        self._replies.close(linger=0)
        self._context.term()

    def destroy(self) -> None:
        """Close every socket at once, as a client that failed to connect does."""
        self._context.destroy(linger=0)

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
            try:
                reply = decode_reply([frame.buffer for frame in frames])
            except ProtocolError as exc:
                logger.warning("ignoring a malformed reply from %s: %s", self.address, exc)
                continue
            if reply.client_id == self.identity:  # not another client whose id we prefix
                self.window.answered(reply.request_id)
                return reply


def _remaining_ms(deadline: float) -> int:
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
