"""The ZeroMQ sockets of one client, as both drivers open them.

Requests go out on a ``PUSH`` connected to the server's request port. Replies come in on a
``SUB`` subscribed to the client's identity or, under CURVE, on a ``DEALER`` that announces
it (:func:`~bertserve.client.security.reply_socket`). Monitors on both sockets
(:class:`~bertserve.client.security.HandshakeWatch`) tell a refused CURVE handshake from a
server that is down, and a :class:`~bertserve.client.probe.ServerProbe`, once asked, tells a
server on this machine that is down from one that is slow to answer. The sockets are plain
ones; the asyncio driver wraps them to wait on its loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from .core.options import Curve, tcp_address
from .probe import ServerProbe
from .security import HandshakeWatch, reply_socket


@dataclass(frozen=True)
class Sockets:
    """One client's context and sockets, connected to the server at :attr:`address`."""

    context: zmq.Context
    push: zmq.Socket
    replies: zmq.Socket
    watch: HandshakeWatch
    probe: ServerProbe
    address: str
    address_out: str

    def destroy(self) -> None:
        """Close every socket at once, discarding queued messages."""
        self.context.destroy(linger=0)


def open_sockets(host: str, port: int, port_out: int, identity: bytes, curve: Curve | None) -> Sockets:
    """The sockets of a client connected to the server at ``host``: requests to ``port``,
    replies, addressed to ``identity``, from ``port_out``; CURVE sockets if ``curve`` is given.

    A failure while opening them closes what was opened and raises the ``ZMQError``.
    """
    address, address_out = tcp_address(host, port), tcp_address(host, port_out)
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        replies = reply_socket(context, identity, routed=curve is not None)
        for sock in (push, replies):
            sock.setsockopt(zmq.IPV6, ":" in host)
            if curve is not None:  # must come before connect
                sock.curve_serverkey = curve.server
                sock.curve_publickey = curve.public
                sock.curve_secretkey = curve.secret
        watch = HandshakeWatch(
            {address: push, address_out: replies}, public_key=None if curve is None else curve.public
        )
        push.connect(address)
        replies.connect(address_out)
    except BaseException:
        context.destroy(linger=0)
        raise
    return Sockets(context, push, replies, watch, ServerProbe(context, host, address), address, address_out)
